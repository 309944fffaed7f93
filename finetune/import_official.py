"""Import an official VL-BERT VQA checkpoint (jackroos/VL-BERT `vqa/modules/resnet_vlbert_for_vqa.py`, e.g.
`vl-bert_base_res101_vqa-best.model`) as a finetuned model directory of ours (`task.json` + weights), which
`finetune.common.load_task_model(path, VQATask.rebuild)` loads.

    python -m finetune.import_official --checkpoint vl-bert_base_res101_vqa-best.model \\
        --answers data/coco/vqa/answers_vqa.txt --out runs/official_vqa [--tokenizer DIR] [--heads 12]

The body (BERT, visual embeddings, the Fast R-CNN or, for the released VQA models, which ran on precomputed
bottom-up features, `obj_downsample` alone) goes through `model.import_official`; this file places the task
head. The official VQA head with CLASSIFIER_TYPE "mlm" (the released configs') is the MLM head's transform
then a linear layer over the answers, read at the [MASK] of `[CLS] question [SEP] [MASK] [SEP]`: our
`VQAModel` exactly. Its answer vocabulary is a text file, one answer per line, in the classifier's row order
(`ANSWER_VOCAB_FILE`); it is not in the checkpoint, so it is required.

A model imported from precomputed features takes them as `region_features` [B, N, 2048] with `image_hw`
(the official tsv's boxes and features; the whole-image element's feature is the mean of the boxes', as the
official dataset computes it when the file has no `image_box_feature`). Not supported (an error names them):
the "1fc"/"2fc" VQA classifiers, and the VCR and RefCOCO+ heads (their input layouts differ from ours).
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

from .vqa import VQAModel

HEAD = "final_mlp."
# the official "mlm" classifier: Sequential(BertPredictionHeadTransform, Dropout, Linear) -> VQAModel's parts
VQA_HEAD = {"final_mlp.0.dense.": "transform.dense.", "final_mlp.0.LayerNorm.": "transform.LayerNorm.",
            "final_mlp.2.": "classifier."}
CLASSIFIER_DROPOUT = 0.1  # the official VQA configs' CLASSIFIER_DROPOUT (used in training only)


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


def vqa_head_state(head: dict[str, torch.Tensor], num_answers: int, answers_file: str | Path) -> dict:
    out, unmapped = {}, []
    for key, value in head.items():
        for theirs, ours in VQA_HEAD.items():
            if key.startswith(theirs):
                out[ours + key.removeprefix(theirs)] = value
                break
        else:
            unmapped.append(key)
    if unmapped or "classifier.weight" not in out:
        raise ValueError(f"not the official VQA 'mlm' classifier (final_mlp.0 = transform, final_mlp.2 = linear): "
                         f"keys {unmapped[:6] or sorted(head)[:6]}; the '1fc'/'2fc' classifiers are not supported")
    rows = out["classifier.weight"].shape[0]
    if rows != num_answers:
        raise ValueError(f"{answers_file}: {num_answers} answers, the checkpoint's classifier has {rows} rows")
    return out


def load_official_vqa(checkpoint: str | Path, answers_file: str | Path, **config_options
                      ) -> tuple[VQAModel, list[str], list[str]]:
    """Our VQAModel computing what the official one does, its answers, and the names of our tensors the
    checkpoint does not have (kept at their initialisation: nothing the VQA forward reads)."""
    state = read_official_checkpoint(checkpoint)
    head = {k: state.pop(k) for k in list(state) if k.startswith(HEAD)}
    if not head:
        raise ValueError(f"{checkpoint}: no '{HEAD}*' keys: not a task checkpoint (a pretraining one imports with "
                         "`python -m model.import_official`)")
    answers = read_answers(answers_file)
    cfg = official_config(state, **config_options)
    model = VQAModel(VLBert(cfg), len(answers), CLASSIFIER_DROPOUT)
    # the body's names are the pretraining model's (`vl_bert.*`), which VQAModel shares
    body = convert_official_state(state, cfg, VLBertForPretraining(cfg).state_dict())
    mapped = {k: v for k, v in body.items() if k.startswith("vl_bert.")}
    stray = sorted(set(body) - set(mapped))  # MLM/MRC heads: a VQA checkpoint has none, a pretraining one has
    if stray:
        raise ValueError(f"{checkpoint}: pretraining heads in a VQA checkpoint: {stray[:4]}")
    mapped.update(vqa_head_state(head, len(answers), answers_file))
    own = model.state_dict()
    wrong = [f"{k}: {list(v.shape)} for {list(own[k].shape)}" for k, v in mapped.items() if own[k].shape != v.shape]
    if wrong:
        raise ValueError(f"official tensors do not fit our VQA model: {wrong[:6]}")
    model.load_state_dict(mapped, strict=False)
    untouched = [k for k in own if k not in mapped]
    return model.eval(), answers, untouched


def import_official_vqa(checkpoint: str | Path, answers_file: str | Path, out: str | Path,
                        tokenizer_dir: str | Path | None = None, **config_options) -> Path:
    """Write the checkpoint as a finetuned VQA model directory; returns it."""
    model, answers, untouched = load_official_vqa(checkpoint, answers_file, **config_options)
    cfg = model.vl_bert.cfg
    image = official_image_preprocessing(cfg)
    out = save_pretrained(model.state_dict(), cfg, out, tokenizer_dir, image=image,
                          source={"task": "vqa", "official_checkpoint": Path(checkpoint).name,
                                  "not_in_checkpoint": ",".join(untouched)})
    task = {"task": "vqa", "answers": answers, "prior": {}, "classifier_dropout": CLASSIFIER_DROPOUT,
            "image": {"short_side": image["short_side"], "long_side": image["long_side"]},
            "region_input": cfg.region_input, "official_checkpoint": Path(checkpoint).name}
    (out / "task.json").write_text(json.dumps(task, indent=1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="official VQA .model file (a torch pickle)")
    ap.add_argument("--answers", required=True, help="the official answer vocabulary (answers_vqa.txt)")
    ap.add_argument("--out", required=True, help="finetuned model directory to write")
    ap.add_argument("--tokenizer", help="directory with the BERT vocab.txt the official model used (copied)")
    ap.add_argument("--heads", type=int, help="attention heads (default hidden/64: 12 base, 16 large)")
    args = ap.parse_args(argv)
    path = import_official_vqa(args.checkpoint, args.answers, args.out, args.tokenizer,
                               num_attention_heads=args.heads)
    task = json.loads((path / "task.json").read_text())
    print(f"wrote {path}: VQA over {len(task['answers'])} answers, region input {task['region_input']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
