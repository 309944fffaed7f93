"""BERT-gen visual question generation: one run of the three-step protocol (or an ablation), trained by
the shared engine, then evaluated on a split.

    python -m finetune.vqg --config launch/configs/vqg_demo.yaml step=step1 inputs=caption init=packaged
    bash launch/finetune_vqg.sh            # every step and ablation on the demo, then the report

Steps (Scialom et al. 2020, section 4): step1 caption only from BERT; step2 image only from step 1 with
every BERT weight frozen and only W trained (`train_only_projection`); step2_unfreeze the same with
nothing frozen; step3 image + caption from step 1's BERT and step 2's W, everything trained;
step3_scratch image + caption from BERT with a random W.

`init` gives the BERT weights Θ: a transformers BERT directory, "packaged" (all-MiniLM-L6-v2), a VL-BERT
export (pretrained with this repository; its visual layers are not used, BERT-gen has its own W), or a
BERT-gen run's `model/`. `init_projection` gives W from a BERT-gen run's `model/` (None = random).

`visual_input` says how the image enters: "linear" is the paper's (Θ's BERT, a Linear W over the features);
"vlbert" keeps a VL-BERT export whole (`model.bert_gen.VLBertGen`): its visual embedding, its region words and
word-region alignment, its Fast R-CNN naming the regions, so what pretraining taught about images is kept. It
needs `init` = a VL-BERT export and region features from that export's own detector (`finetune.vqg_features
--model <export>`).

Outputs under engine.run_dir: TensorBoard, checkpoints, `model/` (weights + config + tokenizer +
`bert_gen.json`, which says the step and what it was initialised from), `predictions_<split>.json`
(`[{image_id, question, score}]`), `metrics_<split>.json` (both tokenisations), `xsim_<split>.json`,
`attention/*.png`.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file
from torch import nn
from tqdm import tqdm

from model.bert_gen import BertGen, VLBertGen
from model.config import required
from model.export import is_export_dir, load_config_dir, load_weights, save_pretrained
from model.hf_import import config_from_hf, load_hf_bert
from shards.collate import pad_ids
from shards.tokenizer import bert_source_dir, load_tokenizer, resolve_bert_dir
from train.engine import (
    EngineConfig,
    OptimConfig,
    entry_point,
    to_device,
)
from train.loaders import EpochLoader
from train.run import Task, Training, run

from .generate import DecodeConfig, generate
from .vqg_data import (
    feature_size,
    open_features,
    read_coco_captions,
    read_vqa_questions,
    read_vqg_coco_csv,
    region_tensors,
)
from .vqg_eval import diversity, plot_attention, question_metrics

STEPS = ("step1", "step2", "step2_unfreeze", "step3", "step3_scratch", "custom")


@dataclass
class VQGDataConfig:
    train: str = required()  # VQG_COCO csv, or VQA v1.0 OpenEnded_mscoco_*_questions.json
    val: str = required()
    test: str = required()
    captions: list = required(list)  # COCO captions files
    features: str = ""  # bottom-up TSV (comma-separated list) or shard glob; needed unless inputs=caption
    image_root: str = ""  # image_url (or COCO file_name) relative to it: attention views (empty: a blank canvas)
    tokenizer: str | None = None  # local BERT directory; None = the init's, or the packaged one
    max_caption_tokens: int = 40
    max_question_tokens: int = 20  # word-pieces, the end token included
    max_regions: int = 36


@dataclass
class VQGConfig:
    step: str = "custom"  # step1 | step2 | step2_unfreeze | step3 | step3_scratch | custom: a label
    inputs: str = "caption"  # caption | image | both
    visual_input: str = "linear"  # linear (BERT-gen's W) | vlbert (the export's own visual input, region words)
    init: str = "packaged"
    init_projection: str | None = None
    train_only_projection: bool = False  # Step 2: every other parameter frozen
    batch_size: int = 128  # global
    epochs: float = 5.0
    warmup_fraction: float = 0.1
    label_smoothing: float = 0.0
    eval_split: str = "test"  # val | test
    eval_batch_size: int = 32
    max_eval_images: int = 0  # 0 = all
    meteor: bool = True  # needs java
    attention_views: int = 4  # PNGs of generated questions' attention
    seed: int = 0
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    data: VQGDataConfig = field(default_factory=VQGDataConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=2e-5, weight_decay=0.0))
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(run_dir="runs/vqg/custom", zero_stage=0,
                                                                       checkpoint_every=10_000, log_every=10,
                                                                       image_every=0))


# --- data --------------------------------------------------------------------------------------------

def read_split(path: str) -> list:
    """A split's images with their questions: VQG_COCO's csv, or VQA v1.0's questions json."""
    return read_vqg_coco_csv(path) if path.endswith(".csv") else read_vqa_questions(path)


class VQGSet:
    """An split's images with their questions, captions and region features, tokenised once."""

    def __init__(self, path: str, cfg: VQGDataConfig, tokenizer, captions: dict, features, inputs: str):
        images = read_split(path)
        self.skipped: dict[str, list[str]] = {}
        kept = []
        for im in images:
            if inputs != "image" and not captions.get(im.image_id):
                self.skipped.setdefault("no caption", []).append(im.image_id)
            elif inputs != "caption" and im.image_id not in features:
                self.skipped.setdefault("no region features", []).append(im.image_id)
            else:
                kept.append(im)
        if not kept:
            raise ValueError(f"{path}: no usable images ({ {k: len(v) for k, v in self.skipped.items()} } skipped; "
                             f"captions from {cfg.captions}, features from {cfg.features})")
        self.images, self.features, self.inputs, self.cfg = kept, features, inputs, cfg
        self.tokenizer = tokenizer
        self.caption_text = [captions.get(im.image_id, [""])[0] for im in kept]
        enc = tokenizer(self.caption_text, add_special_tokens=False, truncation=True, max_length=cfg.max_caption_tokens)
        self.caption_ids = enc["input_ids"]
        self.pairs = [(i, q) for i, im in enumerate(kept) for q in im.questions]
        questions = tokenizer([q for _, q in self.pairs], add_special_tokens=False, truncation=True,
                              max_length=cfg.max_question_tokens - 1)["input_ids"]
        self.question_ids = [ids + [tokenizer.sep_token_id] for ids in questions]

    def __len__(self) -> int:
        return len(self.pairs)

    def references(self) -> dict[str, list[str]]:
        return {im.image_id: im.questions for im in self.images}

    def inputs_for(self, image_indices: list[int], inputs: str | None = None) -> dict:
        inputs = inputs or self.inputs
        out = {}
        if inputs != "image":
            ids, mask = pad_ids([torch.tensor(self.caption_ids[i] or [0], dtype=torch.long) for i in image_indices])
            mask &= torch.tensor([[len(self.caption_ids[i]) > 0] for i in image_indices])
            out.update(text_ids=ids, text_mask=mask)
        if inputs != "caption":
            items = [self.features[self.images[i].image_id] for i in image_indices]  # each read and parsed once
            feats, boxes, rmask = region_tensors(items, self.cfg.max_regions)
            out.update(features=feats, boxes=boxes, region_mask=rmask,
                       image_hw=torch.tensor([[r.height, r.width] for r in items], dtype=torch.long))
        return out

    def batch(self, pair_indices: list[int]) -> dict:
        out = self.inputs_for([self.pairs[p][0] for p in pair_indices])
        out["target_ids"], out["target_mask"] = pad_ids([torch.tensor(self.question_ids[p]) for p in pair_indices])
        return out


def model_inputs(batch: dict) -> dict:
    return {k: batch[k] for k in ("text_ids", "text_mask", "features", "boxes", "region_mask", "image_hw")
            if k in batch}


class VQGTask(nn.Module):
    def __init__(self, gen: BertGen, label_smoothing: float):
        super().__init__()
        self.gen, self.label_smoothing = gen, label_smoothing

    def forward(self, batch: dict):
        inp = self.gen.embed_input(**model_inputs(batch))
        loss, acc = self.gen.loss(inp, batch["target_ids"], batch["target_mask"], self.label_smoothing)
        return loss, {"loss/total": loss.detach(), "acc/token": acc.detach()}


# --- building the model ---------------------------------------------------------------------------------

def build_model(cfg: VQGConfig, feature_size: int) -> tuple[BertGen, dict]:
    """BertGen with Θ from `cfg.init` and W from `cfg.init_projection` (or random); returns it and a
    record of where every part came from. visual_input=vlbert: a VLBertGen holding the whole export."""
    if cfg.visual_input == "vlbert":
        return build_vlbert_gen(cfg, feature_size)
    if cfg.visual_input != "linear":
        raise ValueError(f"visual_input: '{cfg.visual_input}' is not 'linear' or 'vlbert'")

    # a VL-BERT export's region words and word-region alignment read its Fast R-CNN's classifiers: BERT-gen maps
    # precomputed features through W and has neither
    gen_updates = {"visual_embedding": "linear", "precomputed_feature_size": feature_size,
                   "region_word_alignment": None}
    source = bert_source_dir(cfg.init) if cfg.init != "random" else None
    record = {"step": cfg.step, "inputs": cfg.inputs, "init": cfg.init, "init_projection": cfg.init_projection,
              "train_only_projection": cfg.train_only_projection}
    if source is None:
        mcfg = config_from_hf(bert_source_dir("packaged"), "base", updates=gen_updates)
        gen = BertGen(mcfg)
        record["theta_from"] = "random init"
    elif is_export_dir(source):
        gen = BertGen(load_config_dir(source, gen_updates))
        state = load_file(str(source / "model.safetensors"))
        w_names = set(gen.projection_parameters())
        own = gen.model.state_dict()
        # everything but W whose name and shape match: a BERT-gen run gives all of Θ; a VL-BERT export its
        # BERT (its visual layers have other names, its RoI head another class count)
        theta = {k: v for k, v in state.items() if k in own and f"model.{k}" not in w_names
                 and own[k].shape == v.shape}
        gen.model.load_state_dict(theta, strict=False)
        record["theta_from"] = f"{source} ({len(theta)} tensors)"
    else:
        mcfg = config_from_hf(source, "base", updates=gen_updates)
        gen = BertGen(mcfg)
        loaded = load_hf_bert(gen.model, source)
        has_head = any(k.startswith("cls.predictions.") for k in loaded["loaded"])
        note = "" if has_head else "; no MLM head in it: the head transform starts random"
        record["theta_from"] = f"{source} (transformers BERT{note})"
    if cfg.init_projection:
        path = Path(cfg.init_projection)
        state = load_file(str(path / "model.safetensors"))
        w = {k: v for k, v in state.items() if f"model.{k}" in set(gen.projection_parameters())}
        own = gen.model.state_dict()
        if len(w) != 2 or any(own[k].shape != v.shape for k, v in w.items()):
            raise ValueError(f"{path}/model.safetensors: no BERT-gen projection W of shape "
                             f"{list(own['vl_bert.embeddings.visual_linear.weight'].shape)}")
        gen.model.load_state_dict(w, strict=False)
        record["projection_from"] = str(path)
    else:
        record["projection_from"] = "random init"
    if cfg.train_only_projection:
        keep = set(gen.projection_parameters())
        for name, p in gen.named_parameters():
            p.requires_grad_(name in keep)
    return gen, record


def build_vlbert_gen(cfg: VQGConfig, feature_size: int) -> tuple[VLBertGen, dict]:
    source = bert_source_dir(cfg.init) if cfg.init != "random" else None
    if source is None or not is_export_dir(source):
        raise ValueError(f"visual_input=vlbert keeps a VL-BERT export's visual input: init must be an export "
                         f"directory (got '{cfg.init}')")
    if cfg.init_projection or cfg.train_only_projection:
        raise ValueError("visual_input=vlbert has no projection W: init_projection / train_only_projection do not "
                         "apply")
    gen = VLBertGen(load_config_dir(source, {"precomputed_feature_size": feature_size}))
    detector_size = gen.bert.fast_rcnn.feature_size
    if detector_size != feature_size:
        raise ValueError(f"data.features: {feature_size}-d region features, the Fast R-CNN of {source} computes "
                         f"{detector_size}-d ones: extract them with `python -m finetune.vqg_features --model "
                         f"{source}`")
    missing, unexpected = load_weights(gen.model, source)
    if missing or unexpected:
        raise ValueError(f"{source}: not a VL-BERT export this model can hold (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})")
    record = {"step": cfg.step, "inputs": cfg.inputs, "init": cfg.init, "visual_input": "vlbert",
              "theta_from": f"{source} (whole: visual embedding, region words, Fast R-CNN frozen)",
              "projection_from": "none (VL-BERT's visual embedding)", "init_projection": None,
              "train_only_projection": False}
    return gen, record


def load_bert_gen(path: str | Path) -> BertGen:
    mcfg = load_config_dir(path)
    gen = VLBertGen(mcfg) if mcfg.visual_embedding == "vlbert" else BertGen(mcfg)
    missing, unexpected = load_weights(gen.model, path)
    if missing or unexpected:
        raise ValueError(f"{path}: not a BERT-gen model directory (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return gen


# --- evaluation -------------------------------------------------------------------------------------------

@torch.no_grad()
def generate_questions(gen: BertGen, data: VQGSet, decode: DecodeConfig, batch_size: int, device="cpu",
                       limit: int = 0, progress: bool = True) -> list[dict]:

    gen.eval()
    n = len(data.images) if not limit else min(limit, len(data.images))
    out = []
    for start in tqdm(range(0, n, batch_size), desc="generate", unit="batch", disable=not progress):
        idx = list(range(start, min(n, start + batch_size)))
        inp = gen.embed_input(**to_device(data.inputs_for(idx), device))
        res = generate(gen, inp, decode, end_id=gen.cfg.sep_token_id, pad_id=gen.cfg.pad_token_id)
        tokens, lengths, scores = res.tokens.cpu(), res.lengths.tolist(), res.scores.tolist()
        r = decode.num_return
        for j, i in enumerate(idx):
            found = [{"question": data.tokenizer.decode(tokens[row, : lengths[row]].tolist(), skip_special_tokens=True),
                      "score": scores[row], "length": lengths[row]} for row in range(j * r, (j + 1) * r)]
            out.append({"image_id": data.images[i].image_id, **found[0]} |
                       ({"alternatives": found[1:]} if r > 1 else {}))
    return out


@torch.no_grad()
def xsim(gen: BertGen, data: VQGSet, batch_size: int = 32, device="cpu", limit: int = 0) -> dict:
    """Cosine between [CLS] of each image fed alone and [CLS] of its caption fed alone, per layer (embedding output
    excluded): `xsim` is its mean over the images, the paper's Figure 3. `xsim_centred` first subtracts each
    modality's mean [CLS] over the split, layer by layer: a [CLS] dominated by what every input shares (a random
    post-LayerNorm BERT's is, cosine ~0.97 whatever the input) then scores near 0, and what is left is how the
    image's and its own caption's deviations from the average agree. `per_image` / `per_image_centred` ([images]
    of [layers]) and `image_ids` allow intervals and paired comparisons over images."""
    gen.eval()
    usable = [i for i, im in enumerate(data.images) if data.caption_ids[i] and im.image_id in data.features]
    usable = usable[:limit] if limit else usable
    if not usable:
        raise ValueError("Xsim needs images with both a caption and region features")
    imgs, caps = [], []
    for start in range(0, len(usable), batch_size):
        b = to_device(data.inputs_for(usable[start: start + batch_size], "both"), device)
        imgs.append(gen.cls_states(gen.embed_input(features=b["features"], boxes=b["boxes"],
                                                   region_mask=b["region_mask"], image_hw=b["image_hw"])
                                   )[1:].float().cpu())
        caps.append(gen.cls_states(gen.embed_input(text_ids=b["text_ids"], text_mask=b["text_mask"]))[1:].float().cpu())
    img, cap = torch.cat(imgs, 1), torch.cat(caps, 1)  # [layers, images, hidden]
    cos = torch.nn.functional.cosine_similarity(img, cap, dim=-1)  # [layers, images]
    centred = torch.nn.functional.cosine_similarity(img - img.mean(1, keepdim=True), cap - cap.mean(1, keepdim=True),
                                                    dim=-1)
    return {"xsim": cos.mean(1).tolist(), "xsim_centred": centred.mean(1).tolist(),
            "per_image": cos.T.tolist(), "per_image_centred": centred.T.tolist(),
            "image_ids": [data.images[i].image_id for i in usable]}


@torch.no_grad()
def attention_view(gen: BertGen, data: VQGSet, index: int, question_ids: list[int], path: Path) -> None:
    """Last-layer attention, averaged over heads and over the pseudo-masks that generated the question,
    from the question to the input's regions and caption words."""

    gen.eval()
    b = data.inputs_for([index])
    inp = gen.embed_input(**b)
    target = torch.tensor([question_ids])
    _, out = gen.teacher_forcing(inp, target, torch.ones_like(target, dtype=torch.bool), output_attentions=True)
    t = target.shape[1]
    weights = out.attentions[-1][0].mean(0)[-t:, : inp.mask.shape[1]].mean(0)  # [P] over input elements
    n_regions = b["region_mask"].shape[1] if "region_mask" in b else 0
    region_w = weights[inp.regions][b["region_mask"][0]].numpy() if n_regions else weights[:0].numpy()
    words, word_w = [], weights[:0].numpy()
    if "text_ids" in b:
        m = b["text_mask"][0]
        words = data.tokenizer.convert_ids_to_tokens(b["text_ids"][0][m].tolist())
        word_w = weights[inp.words][m].numpy()
    im = data.images[index]
    image_path = Path(data.cfg.image_root) / im.url
    if n_regions and image_path.is_file():
        image = Image.open(image_path).convert("RGB")
        boxes = data.features[im.image_id].boxes[: data.cfg.max_regions]
    else:  # caption only: the words alone
        image = Image.new("RGB", (320, 240), (255, 255, 255))
        boxes, region_w = np.zeros((0, 4), np.float32), np.zeros(0, np.float32)
    question = data.tokenizer.decode(question_ids, skip_special_tokens=True)
    plot_attention(image, boxes, region_w, words, word_w, question, path)


def evaluate_run(gen: BertGen, cfg: VQGConfig, data: VQGSet, run_dir: Path, device="cpu") -> dict:
    split = cfg.eval_split
    preds = generate_questions(gen, data, cfg.decode, cfg.eval_batch_size, device, cfg.max_eval_images)
    (run_dir / f"predictions_{split}.json").write_text(json.dumps(preds, indent=1))
    refs = data.references()
    hyp = {p["image_id"]: p["question"] for p in preds}
    metrics = {"step": cfg.step, "split": split, "images": len(preds), "decode": asdict(cfg.decode),
               # beam search on a small model collapses onto a few safe questions: worth seeing next to BLEU
               **diversity([p["question"] for p in preds])}
    for tok in ("ptb", "nqg"):
        metrics[tok] = question_metrics(hyp, refs, tok, meteor=cfg.meteor)
    (run_dir / f"metrics_{split}.json").write_text(json.dumps(metrics, indent=1))
    if data.features is not None and any(data.caption_ids):
        sims = xsim(gen, data, cfg.eval_batch_size, device, cfg.max_eval_images)
        (run_dir / f"xsim_{split}.json").write_text(json.dumps({"step": cfg.step, "split": split, **sims}))
    views = run_dir / "attention"
    views.mkdir(exist_ok=True)
    gen = gen.cpu()  # a few single-image passes; their inputs are built on the host
    for i in range(min(cfg.attention_views, len(preds))):
        ids = data.tokenizer(preds[i]["question"], add_special_tokens=False)["input_ids"]
        ids = ids[: cfg.data.max_question_tokens - 1] + [data.tokenizer.sep_token_id]
        attention_view(gen, data, i, ids, views / f"{preds[i]['image_id']}.png")
    return metrics


# --- main ---------------------------------------------------------------------------------------------------

class VQGRun(Task):
    """One step of the BERT-gen protocol as a `train.run.Task`: train the generator (or load it, --eval-only),
    then generate and score questions on the evaluation split."""
    description = "BERT-gen visual question generation (one step of the protocol)"
    doc = __doc__
    config_cls = VQGConfig
    config_help = "VQGConfig YAML (see launch/configs/vqg_*.yaml)"
    overrides_example = "step=step2 inputs=image epochs=2"

    def add_arguments(self, parser) -> None:
        parser.add_argument("--eval-only", action="store_true", help="evaluate <run_dir>/model without training")

    def build(self, cfg: VQGConfig, args, rank: int, world: int) -> Training | None:
        if cfg.step not in STEPS or cfg.inputs not in ("caption", "image", "both") or \
                cfg.visual_input not in ("linear", "vlbert"):
            raise SystemExit(f"step must be one of {STEPS}, inputs caption|image|both and visual_input "
                             f"linear|vlbert (got {cfg.step}, {cfg.inputs}, {cfg.visual_input})")
        try:
            if not cfg.data.features:
                raise FileNotFoundError("data.features: not set (region features are needed unless inputs=caption)")
            self.features = open_features(cfg.data.features)
        except FileNotFoundError:
            if cfg.inputs != "caption":
                raise
            self.features = None  # caption only: no Xsim, and W sized for 2048-d features
        features = self.features
        size = feature_size(features) if features is not None else 2048
        tok_dir = cfg.data.tokenizer
        if tok_dir is None and cfg.init not in ("random", "packaged") and (Path(cfg.init) / "vocab.txt").exists():
            tok_dir = cfg.init
        self.tok_dir = tok_dir
        self.tokenizer = load_tokenizer(str(resolve_bert_dir(tok_dir)))
        self.captions = read_coco_captions(cfg.data.captions)
        if args.eval_only:
            self.gen = load_bert_gen(Path(cfg.engine.run_dir) / "model")
            return None
        self.gen, self.record = build_model(cfg, size)
        gen, record = self.gen, self.record
        train = VQGSet(cfg.data.train, cfg.data, self.tokenizer, self.captions, features, cfg.inputs)
        micro = max(1, cfg.batch_size // world)
        loader = EpochLoader(train, micro, cfg.seed, rank, world)
        cfg.engine.steps = max(1, math.ceil(cfg.epochs * loader.batches_per_epoch))
        cfg.optim.warmup_steps = int(cfg.warmup_fraction * cfg.engine.steps)
        trainable = sum(p.numel() for p in gen.parameters() if p.requires_grad)
        record.update(trainable_parameters=trainable, total_parameters=sum(p.numel() for p in gen.parameters()),
                      train_pairs=len(train.pairs), train_images=len(train.images), skipped=
                      {k: len(v) for k, v in train.skipped.items()}, steps=cfg.engine.steps)
        if rank == 0:
            print(f"{cfg.step}: inputs={cfg.inputs}, Θ from {record['theta_from']}, W from "
                  f"{record['projection_from']}; {trainable:,} of {record['total_parameters']:,} parameters "
                  f"trained; {len(train.pairs)} pairs, {cfg.engine.steps} steps", flush=True)
        return Training(VQGTask(gen, cfg.label_smoothing), loader, micro, count_batch=count_pairs,
                        run_info={"config": asdict(cfg), "bert_gen": self.record})

    def finish(self, engine, last: dict, cfg: VQGConfig, args, rank: int) -> None:
        run_dir = Path(cfg.engine.run_dir)
        if engine is not None:
            state = engine.consolidated_state_dict()
            if rank == 0:
                state = {k.removeprefix("gen.model."): v for k, v in state.items()}
                save_pretrained(state, self.gen.cfg, run_dir / "model", resolve_bert_dir(self.tok_dir))
                (run_dir / "model" / "bert_gen.json").write_text(json.dumps(self.record, indent=1))
                self.gen = load_bert_gen(run_dir / "model")
        if rank == 0:
            split_path = cfg.data.val if cfg.eval_split == "val" else cfg.data.test
            data = VQGSet(split_path, cfg.data, self.tokenizer, self.captions, self.features, cfg.inputs)
            device = "cuda" if torch.cuda.is_available() else "cpu"
            metrics = evaluate_run(self.gen.to(device), cfg, data, run_dir, device)
            line = ", ".join(f"{k}={v:.4f}" for k, v in metrics["ptb"].items())
            print(f"{cfg.step} on {cfg.eval_split} ({metrics['images']} images, PTB tokenisation): {line}\n"
                  f"outputs: {run_dir}", flush=True)


def count_pairs(batch: dict) -> dict[str, float]:
    return {"samples": float(batch["target_ids"].shape[0]), "tokens": float(batch["target_mask"].sum()),
            "images": 0.0}


def main(argv: list[str] | None = None) -> int:
    return run(VQGRun(), argv)


if __name__ == "__main__":
    sys.exit(entry_point(main))
