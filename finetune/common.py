"""What the VQA, VCR and RefCOCO+ finetune scripts share: the pretrained model they start from, images
and boxes into batches, a resumable epoch loader, the text + regions input of VL-BERT (section 3.2,
Figure 2), saving and loading a finetuned model, and one `main` on the shared engine.

A finetuned model directory (`<run_dir>/model`) holds `model.safetensors` (the task module: VL-BERT
and its head), `config.json` (the VLBertConfig and the image preprocessing), `task.json` (which task,
its head's vocabulary, its input settings) and the tokenizer, so `finetune.infer` can answer with it alone.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from tqdm import tqdm

from model.config import model_config
from model.export import image_preprocessing, is_export_dir, load_config_dir, load_pretrained, save_pretrained
from model.hf_import import config_from_hf, load_hf_bert
from model.vl_bert import VLBert, VLBertForPretraining, assemble_text
from shards.caption_inputs import load_box_file
from shards.collate import pad_ids
from shards.images import SIZE_DIVISIBILITY, ImageConfig, collate_visual, load_image
from shards.seeding import torch_generator
from shards.tokenizer import bert_source_dir, load_tokenizer, relation_word_ids, resolve_bert_dir
from train.engine import (
    EngineConfig,
    OptimConfig,
)
from train.loaders import EpochLoader
from train.loaders import eval_batches as eval_in_order
from train.run import Task, Training, run


@dataclass
class BackboneConfig:
    # a VL-BERT export (`<pretrain run>/export`), or a transformers BERT directory / "packaged"
    # (all-MiniLM-L6-v2), whose vision part is then built from model_preset + model (detector random
    # unless model.fast_rcnn.weights names a local ResNet file)
    init: str = "runs/demo/export"
    model_preset: str = "base"
    model: dict = field(default_factory=dict)  # VLBertConfig updates (e.g. {hidden_dropout_prob: 0.2})
    tokenizer: str | None = None  # None: the init's own vocab.txt, else the packaged one
    # the words naming left, right, above and below, in that order: turns on the relation-name channel
    # (model.pair_relation_words, their word-pieces in this backbone's tokenizer); None = off
    relation_names: list | None = None


@dataclass
class FinetuneConfig:
    """Settings every task has; each task's config adds `data` and its head's options."""
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    image: ImageConfig = field(default_factory=ImageConfig)
    batch_size: int = 256  # global, as in the paper (A.2)
    epochs: float = 20.0
    warmup_fraction: float = -1.0  # >= 0: warm-up as a fraction of all steps; < 0: optim.warmup_steps as given
    decay_epochs: list = field(default_factory=list)  # optim.schedule=step: decay at these epochs
    num_workers: int = 0  # loader processes decoding images
    seed: int = 0
    eval_split: str = "val"
    eval_batch_size: int = 32
    max_eval_examples: int = 0  # 0 = all
    # > 0: train on the examples of this many training images only (all their questions, expressions, ...), taken
    # in one seeded order of the images, so a smaller set is inside every larger one: a data-efficiency curve
    train_images: int = 0
    # "train": the Fast R-CNN finetunes with the rest (VL-BERT's end to end). "frozen": it stays as pretrained and
    # its region features are computed once per image before training (RegionFeatureCache), so a step costs the
    # transformer alone, as the official VQA code finetunes on precomputed features (docs/FINETUNE.md)
    detector: str = "train"
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4, warmup_steps=2000))
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(run_dir="runs/finetune", zero_stage=0,
                                                                       checkpoint_every=2000, log_every=10,
                                                                       image_every=0))


# --- the pretrained model ------------------------------------------------------------------------------

def build_pretrained(cfg: BackboneConfig) -> tuple[VLBertForPretraining, str, str]:
    """The model to finetune (with its pretraining heads, whose transforms the task heads start from),
    its tokenizer directory, and a line saying where it came from."""

    path = Path(cfg.init) if cfg.init not in ("packaged", "random") else None
    tok = cfg.tokenizer
    if tok is None and path is not None and (path / "vocab.txt").exists():
        tok = str(path)
    if tok is None and cfg.init == "packaged":
        tok = str(bert_source_dir("packaged"))
    tok = str(resolve_bert_dir(tok))
    updates = dict(cfg.model)
    if cfg.relation_names is not None:
        updates["pair_relation_words"] = relation_word_ids(cfg.relation_names, load_tokenizer(tok),
                                                            "backbone.relation_names")
    if path is not None and is_export_dir(path):
        model, source = load_pretrained(path, updates=updates), f"VL-BERT export {path}"
    elif cfg.init == "random":
        model, source = VLBertForPretraining(model_config(cfg.model_preset, updates=updates)), "random init"
    else:
        if path is not None and not path.exists():
            raise FileNotFoundError(f"backbone.init: {path} does not exist (a VL-BERT export or a BERT directory; "
                                    "run launch/pretrain.sh first, or pass backbone.init=packaged)")
        bert = bert_source_dir(cfg.init)
        model = VLBertForPretraining(config_from_hf(bert, cfg.model_preset, updates=updates))
        load_hf_bert(model, bert)
        source = f"transformers BERT {bert} (vision layers new)"
    return model, tok, source


def read_box_files(paths: str, skips) -> dict:
    """The regions of every image in comma-separated box files, keyed by image path (bad lines counted in
    `skips` with the task's other skips)."""
    boxes = {}
    for path in paths.split(","):
        boxes.update(load_box_file(path, skips))
    return boxes


def box_file_images(image_cfg: ImageConfig, boxes: dict, keys: list[str], wheres: list[str], pixels: bool = True
                    ) -> dict:
    """A batch of images (`keys`: paths under image_cfg.root, as the box file names them) with their box file
    regions, named in `image_keys`; `wheres` name each example in errors."""
    out = collate_visual([load_image(Path(image_cfg.root) / key, boxes[key].boxes[: image_cfg.max_regions], image_cfg,
                                     where, pixels) for key, where in zip(keys, wheres, strict=True)])
    out["image_keys"] = list(keys)
    return out


def copy_transform(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    dst.load_state_dict(src.state_dict())


def pad_lists(seqs: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = pad_ids([torch.tensor(s, dtype=torch.long) for s in seqs], pad)
    return ids, mask


# --- the input sequence -----------------------------------------------------------------------------------

def with_positions(batch: dict) -> dict:
    """Adds `real_positions`: the non-padding positions of `encode(batch)`'s sequences (each text row's
    [CLS] A [SEP] (B [SEP]), and its image's whole-image element, regions and [END]), counted where the batch is
    built, on the host, so that the encoder runs on those alone as in pretraining, without a sync. Text rows
    share images in order (VCR's 4 candidate answers per image: 4 text rows per image row)."""
    if "a_mask" not in batch or "box_mask" not in batch:  # not an `encode` batch (BERT-gen's own layout)
        return batch
    text_rows, image_rows = batch["a_mask"].shape[0], batch["box_mask"].shape[0]
    text = int(batch["a_mask"].sum()) + 2 * text_rows
    if batch.get("b_mask") is not None:
        text += int(batch["b_mask"].sum()) + text_rows
    per_image = text_rows // image_rows
    batch["real_positions"] = text + per_image * (int(batch["box_mask"].sum()) + 2 * image_rows)
    return batch


def encode(vl_bert: VLBert, batch: dict, *, visual_input=None, masked_regions=None, output_hidden_states: bool = False):
    """`[CLS] A [SEP] (B [SEP]) [IMG]... [END]` from a batch with a_ids/a_mask (b_ids/b_mask), optional
    a_region/b_region (the region each word-piece takes its visual feature from, -1 = whole image) and
    images/image_sizes/boxes/box_mask. visual_input: precomputed (appearance, boxes) of `region_features`,
    e.g. one detector pass shared by several candidate answers. output_hidden_states: every layer's states too (the
    analyses' probes)."""
    cfg = vl_bert.cfg
    b_ids, b_mask = batch.get("b_ids"), batch.get("b_mask")
    ids, types, mask = assemble_text(batch["a_ids"], batch["a_mask"], b_ids, b_mask, cls_id=cfg.cls_token_id,
                                     sep_id=cfg.sep_token_id, pad_id=cfg.pad_token_id)
    if visual_input is None and "appearance" in batch:  # a RegionFeatureCache's batch
        visual_input = (batch["appearance"], batch["boxes_norm"])
    word_region = None
    if "a_region" in batch:  # shifted by 2 so that [CLS]/[SEP]/padding (id 1) come out as -1
        b_region = batch["b_region"] + 2 if b_ids is not None else None
        shifted, _, _ = assemble_text(batch["a_region"] + 2, batch["a_mask"], b_region, b_mask, cls_id=1, sep_id=1,
                                      pad_id=1)
        word_region = shifted - 2
    return vl_bert(ids, mask, types, images=batch.get("images"), image_sizes=batch.get("image_sizes"),
                   boxes=batch["boxes"], box_mask=batch["box_mask"], masked_regions=masked_regions,
                   word_region_index=word_region, visual_input=visual_input,
                   real_positions=batch.get("real_positions"), output_hidden_states=output_hidden_states)


class TaskSetView:
    """A view of a task set (`self.data`, set by the subclass) that answers for it whatever it does not change:
    vocabulary, items, skips."""

    def __len__(self) -> int:
        return len(self.data)

    def __getattr__(self, name):  # only called for what is not found on the view itself
        if name == "data":
            raise AttributeError(name)
        return getattr(self.data, name)


class RegionFeatureCache(TaskSetView):
    """A task set whose batches carry the frozen detector's region features (`appearance` [B, 1+N, F] and
    `boxes_norm` [B, 1+N, 4], which `encode` passes as its visual_input) in place of pixels. They are computed
    once, on one pass over the set in order (a progress bar), each image once: a batch names its images in
    `image_keys` (the task set's image file), and an image's regions are the same wherever it appears; after that
    pass a batch reads the image headers alone (`batch(indices, pixels=False)`), decoding nothing. Held in
    host memory (F x 4 bytes a region: 40 MB for the demo's 2,000 images of 10 regions at F = 512); every
    other attribute is the task set's."""

    def __init__(self, data, vl_bert: VLBert, batch_size: int, device, desc: str = "region features"):
        self.data = data
        self.features: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        vl_bert = vl_bert.eval()
        with torch.no_grad():
            for start in tqdm(range(0, len(data), batch_size), desc=f"frozen detector: {desc}", unit="batch"):
                chunk = list(range(start, min(len(data), start + batch_size)))
                keys = self.image_keys(data.batch(chunk, pixels=False))
                first = {k: i for k, i in reversed(list(zip(keys, chunk, strict=True)))}  # each image's first example
                new = [i for k, i in first.items() if k not in self.features]
                if not new:
                    continue
                batch = data.batch(new)  # decoded: the examples of images not seen yet, one each
                keys = self.image_keys(batch)
                # each image on its own canvas (its size padded to the divisibility), as it is alone: on a wider batch
                # canvas the layers see the padding's activations (0 pixels, but each frozen BatchNorm adds its shift)
                # where a canvas edge gives zero padding (-inf in the stem's max-pool), so features along an image's
                # right and bottom edges change, and they must not depend on the batch an image was first seen in
                canvases: dict[tuple[int, int], list[int]] = {}
                for r in range(len(new)):
                    h, w = (-(-int(v) // SIZE_DIVISIBILITY) * SIZE_DIVISIBILITY for v in batch["image_sizes"][r])
                    canvases.setdefault((h, w), []).append(r)
                for (h, w), group in canvases.items():
                    pick = torch.tensor(group)
                    masks = batch.get("region_masks")  # VCR's instance masks: the same for every example of an image
                    appearance, boxes_norm, _ = vl_bert.region_features(
                        images=batch["images"][pick, :, :h, :w].to(device),
                        image_sizes=batch["image_sizes"][pick].to(device), boxes=batch["boxes"][pick].to(device),
                        box_mask=batch["box_mask"][pick].to(device),
                        region_masks=None if masks is None else masks[pick].to(device))
                    for i, r in enumerate(group):
                        n = 1 + int(batch["box_mask"][r].sum())  # the whole image, then the image's boxes
                        self.features[keys[r]] = (appearance[i, :n].float().cpu(), boxes_norm[i, :n].float().cpu())

    @staticmethod
    def image_keys(batch: dict) -> list[str]:
        keys = batch.get("image_keys")
        if keys is None:
            raise ValueError("detector: frozen and train_images need a task set whose batches name their images "
                             "(image_keys)")
        return keys

    def batch(self, indices: list[int]) -> dict:
        out = self.data.batch(indices, pixels=False)  # the boxes alone: the pixels' features are here
        keys = self.image_keys(out)
        n = out["box_mask"].shape[1]
        width = next(iter(self.features.values()))[0].shape[1]
        appearance = torch.zeros(len(keys), 1 + n, width)
        boxes_norm = torch.zeros(len(keys), 1 + n, 4)
        for r, k in enumerate(keys):
            a, b = self.features[k]
            appearance[r, : len(a)], boxes_norm[r, : len(b)] = a, b
        out["appearance"], out["boxes_norm"] = appearance, boxes_norm
        return out


class ImageSubset(TaskSetView):
    """The examples of `images` of a task set's images, drawn in one order (seeded by `seed` alone, not by the
    count, so the first k images of every subset are the same). Image-wise, not example-wise: the examples of one
    image are not independent, and a subset of images is what collecting less data gives."""

    def __init__(self, data, images: int, seed: int, batch_size: int = 256):
        self.data = data
        keys = []
        for start in range(0, len(data), batch_size):
            chunk = list(range(start, min(len(data), start + batch_size)))
            keys += RegionFeatureCache.image_keys(data.batch(chunk, pixels=False))
        distinct = sorted(set(keys))
        if not 0 < images <= len(distinct):
            raise ValueError(f"train_images: {images}, must be in 1..{len(distinct)} (the training images)")
        order = torch.randperm(len(distinct), generator=torch_generator(seed, "training images")).tolist()
        chosen = {distinct[i] for i in order[:images]}
        self.indices = [i for i, k in enumerate(keys) if k in chosen]

    def __len__(self) -> int:
        return len(self.indices)

    def batch(self, indices: list[int], pixels: bool = True) -> dict:
        return self.data.batch([self.indices[i] for i in indices], pixels=pixels)


def freeze_detector(vl_bert: VLBert) -> None:
    if vl_bert.fast_rcnn is None:
        raise ValueError("detector: frozen, but this model has no Fast R-CNN (it reads precomputed features already)")
    vl_bert.fast_rcnn.requires_grad_(False)


def count_batch(batch: dict) -> dict[str, float]:
    """Throughput counts of a task batch: images (= examples; VCR's 4 candidates share one), and tokens
    (every sequence's words and the regions)."""
    n = float(batch["box_mask"].shape[0])
    tokens = batch["a_mask"].sum() + batch["box_mask"].sum() + (batch["b_mask"].sum() if "b_mask" in batch else 0)
    out = {"samples": n, "images": n, "tokens": float(tokens)}
    if "real_positions" in batch:  # the engine logs padding_fraction = 1 - tokens / positions from these
        text_len = batch["a_mask"].shape[1] + 2 + (batch["b_mask"].shape[1] + 1 if "b_mask" in batch else 0)
        out["tokens"] = float(batch["real_positions"])
        out["positions"] = float(batch["a_mask"].shape[0] * (text_len + batch["box_mask"].shape[1] + 2))
    return out


def eval_batches(data, batch_size: int, limit: int = 0, desc: str = "evaluate"):
    """The evaluation pass of a task: in order, each batch with its real positions counted."""
    return eval_in_order(data, batch_size, limit, desc, prepare=with_positions)


# --- finetuned model directories ---------------------------------------------------------------------------

def save_task_model(module: torch.nn.Module, state: dict[str, torch.Tensor], path: Path, tokenizer_dir: str,
                    task: dict) -> Path:
    image = image_preprocessing(task["image"]["short_side"], task["image"]["long_side"], SIZE_DIVISIBILITY,
                                module.vl_bert.cfg)
    save_pretrained(state, module.vl_bert.cfg, path, tokenizer_dir, image=image, source={"task": task["task"]})
    (path / "task.json").write_text(json.dumps(task, indent=1))
    return path


def load_task_model(path: str | Path, build):
    """`build(vl_bert, task_info) -> module` around a VLBert of the saved config; the weights must match
    it exactly."""

    path = Path(path)
    try:
        task = json.loads((path / "task.json").read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no task.json (not a finetuned model directory)") from None
    module = build(VLBert(load_config_dir(path)), task)
    module.load_state_dict(load_file(str(path / "model.safetensors")), strict=True)
    return module.eval(), task


# --- one main for every task ---------------------------------------------------------------------------------

class TaskSpec:
    """One finetune task, declared in its own module as `class VQATask(TaskSpec, name="vqa", config=VQAConfig)`
    (its command's help is that module's docstring), with static methods:
    dataset(cfg, tokenizer, task_info, train) -> the training set (task_info None) or cfg.eval_split's,
    build_module(pretrained, cfg, train_set) -> (module, task_info), rebuild(vl_bert, task_info) -> module,
    evaluate(module, eval_set, cfg, run_dir, device) -> metrics dict (`score` runs it in eval mode without
    gradients), summary(metrics) -> str."""
    name: str
    config_cls: type
    doc: str

    def __init_subclass__(cls, name: str, config: type, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.name, cls.config_cls, cls.doc = name, config, sys.modules[cls.__module__].__doc__

    @classmethod
    def score(cls, module, data, cfg, run_dir: Path, device) -> dict:
        with torch.no_grad():
            return cls.evaluate(module.eval(), data, cfg, run_dir, device)


class FinetuneTask(Task):
    """A finetune task (a `TaskSpec`) as a `train.run.Task`."""

    def __init__(self, spec):
        self.spec = spec
        self.description = f"VL-BERT finetuning: {spec.name}"
        self.doc = spec.doc
        self.config_cls = spec.config_cls
        self.config_help = f"{spec.config_cls.__name__} YAML (see launch/configs/{spec.name}_*.yaml)"
        self.overrides_example = "epochs=2 optim.lr=1e-4"

    def add_arguments(self, parser) -> None:
        parser.add_argument("--eval-only", action="store_true", help="evaluate <run_dir>/model without training")

    def device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")

    def build(self, cfg, args, rank: int, world: int) -> Training | None:
        spec, run_dir = self.spec, Path(cfg.engine.run_dir)
        if args.eval_only:
            self.module, self.info = load_task_model(run_dir / "model", spec.rebuild)
            self.tokenizer = load_tokenizer(str(run_dir / "model"))
            return None
        pretrained, self.tok_dir, source = build_pretrained(cfg.backbone)
        self.tokenizer = load_tokenizer(self.tok_dir)
        train = spec.dataset(cfg, self.tokenizer, None, train=True)
        module, self.info = spec.build_module(pretrained, cfg, train)  # the answer vocabulary of the whole set
        if cfg.train_images:
            train = ImageSubset(train, cfg.train_images, cfg.seed)
        if cfg.detector == "frozen":
            freeze_detector(module.vl_bert)
            train = RegionFeatureCache(train, module.vl_bert.to(self.device()), cfg.eval_batch_size, self.device(),
                                       "training images")
            module.train()
        elif cfg.detector != "train":
            raise ValueError(f"detector: '{cfg.detector}' is not train or frozen")
        micro = max(1, cfg.batch_size // world // cfg.engine.gradient_accumulation_steps)
        loader = EpochLoader(train, micro, cfg.seed, rank, world, cfg.num_workers, prepare=with_positions)
        steps_per_epoch = max(1, loader.batches_per_epoch // cfg.engine.gradient_accumulation_steps)
        cfg.engine.steps = max(1, math.ceil(cfg.epochs * steps_per_epoch))
        if cfg.warmup_fraction >= 0:
            cfg.optim.warmup_steps = int(cfg.warmup_fraction * cfg.engine.steps)
        if cfg.decay_epochs:
            cfg.optim.decay_steps = [int(e * steps_per_epoch) for e in cfg.decay_epochs]
        self.record = {"task": spec.name, "init": source, "train_examples": len(train), "steps": cfg.engine.steps,
                       "train_images": cfg.train_images or None, "skipped": dict(train.skips.reasons)}
        if rank == 0:
            subset = f" of {cfg.train_images} images" if cfg.train_images else ""
            print(f"{spec.name}: from {source}; {len(train)} training examples{subset} "
                  f"({dict(train.skips.reasons) or 'none skipped'}), {cfg.engine.steps} steps", flush=True)
        cfg.engine.progress_label = spec.name
        self.module = module
        return Training(module, loader, micro, count_batch=count_batch,
                        run_info={"config": asdict(cfg), "finetune": self.record})

    def finish(self, engine, last: dict, cfg, args, rank: int) -> None:
        spec, run_dir, device = self.spec, Path(cfg.engine.run_dir), self.device()
        module, info = self.module, self.info
        if engine is not None:
            state = engine.consolidated_state_dict()
            if rank == 0:
                info = dict(info, record=self.record)
                save_task_model(module, state, run_dir / "model", self.tok_dir, info)
                module, info = load_task_model(run_dir / "model", spec.rebuild)  # evaluate what was saved
        if rank == 0:
            data = spec.dataset(cfg, self.tokenizer, info, train=False)
            if cfg.detector == "frozen":
                data = RegionFeatureCache(data, module.vl_bert.to(device), cfg.eval_batch_size, device,
                                          f"{cfg.eval_split} images")
            metrics = spec.score(module.to(device), data, cfg, run_dir, device)
            metrics["skipped"] = data.skips.as_dict()["skipped"]
            (run_dir / f"metrics_{cfg.eval_split}.json").write_text(json.dumps(metrics, indent=1))
            print(f"{spec.name} on {cfg.eval_split}: {spec.summary(metrics)}\noutputs: {run_dir}", flush=True)


def finetune_main(spec, argv: list[str] | None) -> int:
    """The train-then-evaluate flow of every task (`train.run.run` over `FinetuneTask(spec)`)."""
    return run(FinetuneTask(spec), argv)
