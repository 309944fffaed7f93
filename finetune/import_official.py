"""Import an official VL-BERT task checkpoint (jackroos/VL-BERT) as a finetuned model directory of ours
(`task.json` + weights), which `finetune.common.load_task_model(path, <Task>.rebuild)` loads:

    python -m finetune.import_official --task vqa --checkpoint vl-bert_base_res101_vqa-best.model \\
        --answers data/coco/vqa/answers_vqa.txt --out runs/official_vqa [--tokenizer DIR] [--heads 12]
    python -m finetune.import_official --task refcoco --checkpoint vl-bert_base_res101_refcoco-best.model \\
        --out runs/official_refcoco
    python -m finetune.import_official --task vcr --checkpoint vl-bert_base_res101_vcr_q2a-best.model \\
        --out runs/official_vcr_qa

The body (BERT, visual embeddings, and the Fast R-CNN, or, for the released VQA models, which ran on
precomputed bottom-up features, `obj_downsample` alone) goes through `model.import_official`; this file
places the task head (`final_mlp`):
- VQA (`vqa/modules/resnet_vlbert_for_vqa.py`, CLASSIFIER_TYPE "mlm" as the released configs): the MLM head's
  transform then a linear layer over the answers, read at the [MASK] of `[CLS] question [SEP] [MASK] [SEP]`:
  our `VQAModel` exactly. The answer vocabulary is a text file, one answer per line in the classifier's row
  order (`ANSWER_VOCAB_FILE`); it is not in the checkpoint, so it is required. A model of precomputed
  features takes them as `region_features` [B, N, 2048] with `image_hw`; the whole-image element's feature
  is the mean of the boxes', as the official dataset computes it when its file has no `image_box_feature`.
- RefCOCO+ (`refcoco/modules/resnet_vlbert_for_refcoco.py`): the MVRC transform (dense + GELU), dropout and a
  linear layer on each region's output: our `RefModel(head="mvrc")`. The official model also scores the
  whole-image element (box 0, trained as a negative); ours scores the candidate regions only.
- VCR (`vcr/modules/resnet_vlbert_for_vcr.py`, the released Q->A and QA->R configs): the body under
  TimeDistributed (`vlbert._module.*`), one object linguistic embedding for every region
  (object_word_embed_mode 2), CLASSIFIER_TYPE "1fc" (dropout, linear to 1) on the pooler's output, a sigmoid
  per candidate: our `VCRModel` with `head: pooler`, `candidate_loss: sigmoid`. Each region's res5 map is
  weighted by its object's 14x14 segmentation before the pool: evaluate with `data.segmentation_masks=true`
  (the metadata's `segms`), as task.json says. Words naming an object take its feature (grounding tags), the
  others the whole image's, as ours do. The training-only object classifier on the regions' outputs
  (`cnn_loss_reg`, CNN_LOSS_TOP: the MVRC transform and a linear layer over COCO's 81 classes) becomes our MRC
  head over those classes (`object_classes` in task.json, the official category list).
Not supported (an error names them): the VQA "1fc"/"2fc" classifiers, VCR's "2fc", and IMAGE_SEMANTIC.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from model.export import save_pretrained
from model.import_official import (
    convert_official_state,
    official_config,
    official_image_preprocessing,
    read_official_checkpoint,
)
from model.vl_bert import VLBert, VLBertForPretraining

from .refcoco import RefModel
from .vcr import VCRModel
from .vqa import VQAModel

HEAD = "final_mlp."
# the official configs' CLASSIFIER_DROPOUT (training only)
CLASSIFIER_DROPOUT = {"vqa": 0.1, "refcoco": 0.0, "vcr": 0.1}
# vcr/data/datasets/vcr.py: the object classes of VCR's detections (COCO's, names without spaces), index = class id
VCR_CATEGORIES = [
    "__background__", "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "trafficlight", "firehydrant", "stopsign", "parkingmeter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee", "skis",
    "snowboard", "sportsball", "kite", "baseballbat", "baseballglove", "skateboard", "surfboard", "tennisracket",
    "bottle", "wineglass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich", "orange",
    "broccoli", "carrot", "hotdog", "pizza", "donut", "cake", "chair", "couch", "pottedplant", "bed", "diningtable",
    "toilet", "tv", "laptop", "mouse", "remote", "keyboard", "cellphone", "microwave", "oven", "toaster", "sink",
    "refrigerator", "book", "clock", "vase", "scissors", "teddybear", "hairdrier", "toothbrush"]
# VCRModel's settings (VCRTask._settings but the subtask, which the checkpoint does not say and the model does
# not read) of the released configs: a sigmoid per candidate, the pooler's classifier
VCR_SETTINGS = {"candidate_loss": "sigmoid", "mrc_weight": 0.0, "mrc_probability": 0.15,
                "classifier_dropout": CLASSIFIER_DROPOUT["vcr"], "head": "pooler"}
# the official final_mlp Sequentials -> our heads, index for index:
# VQA, CLASSIFIER_TYPE "mlm": (BertPredictionHeadTransform, Dropout, Linear over answers) -> VQAModel
# RefCOCO+: (VisualLinguisticBertMVRCHeadTransform = dense + GELU, Dropout, Linear to 1) -> RefModel(head="mvrc")
TASK_HEADS = {
    "vqa": {"final_mlp.0.dense.": "transform.dense.", "final_mlp.0.LayerNorm.": "transform.LayerNorm.",
            "final_mlp.2.": "classifier."},
    "refcoco": {"final_mlp.0.dense.": "scorer.0.dense.", "final_mlp.2.": "scorer.2."},
    # VCR, CLASSIFIER_TYPE "1fc": (Dropout, Linear to 1) on the pooled [CLS] -> VCRModel(head="pooler"); and the
    # CNN_LOSS_TOP object classifier (MVRC transform, Dropout, Linear over 81 classes) -> its MRC head
    "vcr": {"cnn_loss_reg.0.dense.": "roi_transform.dense.", "cnn_loss_reg.2.": "roi_classifier.",
            "final_mlp.1.": "classifier.1."},
}
HEAD_SHAPE = {"vqa": "the 'mlm' classifier (final_mlp.0 = the MLM transform, final_mlp.2 = linear; the '1fc'/"
                     "'2fc' classifiers are not supported)",
              "refcoco": "final_mlp.0 = the MVRC transform (dense + GELU), final_mlp.2 = linear to 1",
              "vcr": "the '1fc' classifier (final_mlp.1 = linear to 1; '2fc' is not supported) and cnn_loss_reg"}
# the official VCR module wraps its VisualLinguisticBert in TimeDistributed (one pass per candidate)
TIME_DISTRIBUTED = "vlbert._module."


def read_answers(path: str | Path) -> list[str]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: answer vocabulary not found (the official ANSWER_VOCAB_FILE)")
    answers = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    while answers and not answers[-1]:
        answers.pop()
    empty = [i + 1 for i, a in enumerate(answers) if not a]
    if empty:
        raise ValueError(f"{path}: line {empty[0]} is empty (one answer per line, in the classifier's order)")
    return answers


def head_state(task: str, head: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out, unmapped = {}, []
    for key, value in head.items():
        for theirs, ours in TASK_HEADS[task].items():
            if key.startswith(theirs):
                out[ours + key.removeprefix(theirs)] = value
                break
        else:
            unmapped.append(key)
    last = list(TASK_HEADS[task].values())[-1] + "weight"  # the final linear layer
    if unmapped or last not in out:
        raise ValueError(f"not the official {task} head, {HEAD_SHAPE[task]}: keys {unmapped[:6] or sorted(head)[:6]}")
    return out


def build_task_model(task: str, vl_bert: VLBert, answers: list[str] | None) -> torch.nn.Module:
    if task == "vqa":
        return VQAModel(vl_bert, len(answers), CLASSIFIER_DROPOUT[task])
    if task == "vcr":
        return VCRModel(vl_bert, len(VCR_CATEGORIES), VCR_SETTINGS)
    return RefModel(vl_bert, CLASSIFIER_DROPOUT[task], head="mvrc")


def load_official_task(checkpoint: str | Path, task: str, answers_file: str | Path | None = None,
                       **config_options) -> tuple[torch.nn.Module, list[str] | None, list[str]]:
    """Our task model (VQAModel, RefModel with the official scorer, or VCRModel with the pooler's classifier)
    computing what the official one does, the VQA answers (None for the others), and the names of our tensors
    the checkpoint does not have (kept at their initialisation: nothing the task's forward reads)."""
    if task not in TASK_HEADS:
        raise ValueError(f"task '{task}' is not one of {sorted(TASK_HEADS)}")
    if (task == "vqa") != (answers_file is not None):
        raise ValueError("the VQA import needs its answer vocabulary (--answers); RefCOCO+ and VCR have none")
    state = read_official_checkpoint(checkpoint)
    state = {("vlbert." + k.removeprefix(TIME_DISTRIBUTED) if k.startswith(TIME_DISTRIBUTED) else k): v
             for k, v in state.items()}
    head = {k: state.pop(k) for k in list(state) if k.startswith((HEAD, "cnn_loss_reg."))}
    if not head:
        raise ValueError(f"{checkpoint}: no '{HEAD}*' keys: not a task checkpoint (a pretraining one imports with "
                         "`python -m model.import_official`)")
    answers = read_answers(answers_file) if task == "vqa" else None
    cfg = official_config(state, **config_options)
    model = build_task_model(task, VLBert(cfg), answers)
    # the body's names are the pretraining model's (`vl_bert.*`), which the task models share
    body = convert_official_state(state, cfg, VLBertForPretraining(cfg).state_dict())
    mapped = {k: v for k, v in body.items() if k.startswith("vl_bert.")}
    stray = sorted(set(body) - set(mapped))  # MLM/MRC heads: a task checkpoint has none, a pretraining one has
    if stray:
        raise ValueError(f"{checkpoint}: pretraining heads in a {task} checkpoint: {stray[:4]}")
    mapped.update(head_state(task, head))
    own = model.state_dict()
    if task == "vqa" and mapped["classifier.weight"].shape[0] != len(answers):
        raise ValueError(f"{answers_file}: {len(answers)} answers, the checkpoint's classifier has "
                         f"{mapped['classifier.weight'].shape[0]} rows")
    wrong = [f"{k}: {list(v.shape)} for {list(own[k].shape)}" for k, v in mapped.items() if own[k].shape != v.shape]
    if wrong:
        raise ValueError(f"official tensors do not fit our {task} model: {wrong[:6]}")
    model.load_state_dict(mapped, strict=False)
    untouched = [k for k in own if k not in mapped]
    return model.eval(), answers, untouched


def import_official_task(checkpoint: str | Path, task: str, out: str | Path, answers_file: str | Path | None = None,
                         tokenizer_dir: str | Path | None = None, **config_options) -> Path:
    """Write the checkpoint as a finetuned model directory (`load_task_model(out, <Task>.rebuild)`); returns it."""
    model, answers, untouched = load_official_task(checkpoint, task, answers_file, **config_options)
    cfg = model.vl_bert.cfg
    image = official_image_preprocessing(cfg)
    out = save_pretrained(model.state_dict(), cfg, out, tokenizer_dir, image=image,
                          source={"task": task, "official_checkpoint": Path(checkpoint).name,
                                  "not_in_checkpoint": ",".join(untouched)})
    info = {"task": task, "classifier_dropout": CLASSIFIER_DROPOUT[task],
            "image": {"short_side": image["short_side"], "long_side": image["long_side"]},
            "region_input": cfg.region_input, "official_checkpoint": Path(checkpoint).name}
    if task == "vqa":
        info.update({"answers": answers, "prior": {}})
    elif task == "vcr":
        # VCRTask.rebuild's fields, and how the data must be read to compute what the official model computes
        info.update({"object_classes": VCR_CATEGORIES, "settings": VCR_SETTINGS,
                     "data": {"segmentation_masks": True, "mask_size": 14}})
    else:
        info["head"] = "mvrc"
    (out / "task.json").write_text(json.dumps(info, indent=1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", required=True, choices=sorted(TASK_HEADS))
    ap.add_argument("--checkpoint", required=True, help="official task .model file (a torch pickle)")
    ap.add_argument("--answers", help="VQA: the official answer vocabulary (answers_vqa.txt)")
    ap.add_argument("--out", required=True, help="finetuned model directory to write")
    ap.add_argument("--tokenizer", help="directory with the BERT vocab.txt the official model used (copied)")
    ap.add_argument("--heads", type=int, help="attention heads (default hidden/64: 12 base, 16 large)")
    args = ap.parse_args(argv)
    path = import_official_task(args.checkpoint, args.task, args.out, args.answers, args.tokenizer,
                                num_attention_heads=args.heads)
    info = json.loads((path / "task.json").read_text())
    what = {"vqa": f"VQA over {len(info.get('answers') or [])} answers", "refcoco": "RefCOCO+ region scorer",
            "vcr": "VCR candidate scorer (evaluate with data.segmentation_masks=true; subtask as the checkpoint's)"}
    print(f"wrote {path}: {what[args.task]}, region input {info['region_input']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
