"""Supervised warm-up of the Fast R-CNN on box annotations, before VL-BERT pretraining.

    python -m pretrain.detector --config launch/configs/detector_demo.yaml [key=value ...]
    deepspeed --num_gpus N -m pretrain.detector --config ...

VL-BERT's detector comes pretrained on Visual Genome objects and attributes (bottom-up attention), so its
region features already say what each region is before VL-BERT sees them. Where no such weights exist
(the demo's ResNet-18 starts from random; a new domain), this trains the same module (`model.fast_rcnn`)
the same way: ground-truth boxes of a COCO-format `instances.json`, cross-entropy over the object
classes (class id = category id; 0 stays the background) and, when the file has Visual-Genome-style
`attributes` / `attribute_ids`, an attribute head on the same region feature (the Fast R-CNN's
`attribute_classifier`, exported with it: VL-BERT's region word embeddings read it); when it has `sizes` /
`size_id`, a size head on the box geometry (`size_classifier`, read the same way). The size head shares no
input with the CNN (boxes only), so it is fitted apart, after the CNN's steps, on the annotations alone
(`fit_size_classifier`: no image decoded, and the CNN's steps and their gradient clipping are what they are
without it).

Runs on the shared engine (DeepSpeed, checkpoints, `--resume`, TensorBoard). Writes
`<run_dir>/fast_rcnn.pt` (a state dict of `backbone.*`, `box_head.*`, `object_classifier.*`,
`attribute_classifier.*` and `size_classifier.*`, the format `fast_rcnn.weights` loads),
`<run_dir>/fast_rcnn.vocab.json` (the class, attribute and size names in the classifiers' order:
`region_words` of a pretraining config) and `<run_dir>/metrics_val.json`: object, attribute and size
accuracy on the held-out annotations, each next to the majority-class baseline.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from model.boxes import normalise, scale_features
from model.config import FastRCNNConfig, required
from model.fast_rcnn import FastRCNN, real_rois, size_classifier
from shards.coco import read_instances, read_vocabularies
from shards.images import ImageConfig, collate_visual, load_image
from shards.seeding import torch_generator
from shards.skips import SkipLog
from train.engine import (
    EngineConfig,
    OptimConfig,
    entry_point,
    to_device,
)
from train.loaders import EpochLoader, eval_batches
from train.run import Task, Training, run


@dataclass
class DetectorConfig:
    train: str = required()
    val: str | None = None  # held-out COCO instances; None: no held-out evaluation
    image_root: str = required()  # `file_name`s are relative to this
    fast_rcnn: FastRCNNConfig = field(default_factory=FastRCNNConfig)
    short_side: int = 600
    long_side: int = 1000
    max_boxes: int = 100  # per image; more annotations than this are cut (and counted)
    attribute_weight: float = 0.5  # the attribute loss' weight next to the object loss (bottom-up: 0.5)
    # "softmax": cross-entropy over the attributes against the box's normalised multi-hot (bottom-up
    # attention's softmax attribute loss); "bce": binary cross-entropy averaged over every attribute,
    # which with 6 colours and weight 0.5 supervises colour at ~1/12 of the object loss (warm-up colour
    # accuracy 0.64 against 0.9+ with softmax, docs/ABLATION.md)
    attribute_loss: str = "softmax"
    size_fit_steps: int = 300  # full-batch steps of the size head's fit (Adam, lr 0.01) on the training boxes
    batch_size: int = 16  # images per step, global
    epochs: float = 10.0
    num_workers: int = 0
    # every step's images of one orientation (Detectron's ASPECT_RATIO_GROUPING, on by default there too): a batch
    # mixing landscape and portrait pads each image to the square of its long side (the demo: 0.55 of the padded
    # pixels real, 0.82 grouped)
    group_by_aspect: bool = True
    seed: int = 0
    eval_batch_size: int = 32
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, warmup_steps=100))
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(run_dir="runs/detector", export=False))


class BoxSet:
    """Images with their annotated boxes, object labels, multi-hot attributes and sizes, as `batch(indices)`."""

    def __init__(self, path: str, cfg: DetectorConfig, num_classes: int, num_attributes: int, num_sizes: int = 0):
        self.path, self.cfg = path, cfg
        self.image_cfg = ImageConfig(root=cfg.image_root, short_side=cfg.short_side, long_side=cfg.long_side)
        self.num_attributes, self.num_sizes = num_attributes, num_sizes
        images, anns, by_image = read_instances(path)
        self.skips = SkipLog("annotations")
        self.items = []
        for image_id, info in images.items():
            keep = []
            for ann_id in by_image.get(image_id, []):
                a = anns[ann_id]
                where = f"{path}: annotation {ann_id}"
                if a["iscrowd"]:
                    self.skips.skip("crowd", where)
                    continue
                if not 0 < a["category_id"] < num_classes:
                    raise ValueError(f"{where}: category_id {a['category_id']} is outside 1..{num_classes - 1} "
                                     f"(fast_rcnn.num_classes = {num_classes})")
                bad = [k for k in a["attribute_ids"] if not 0 < k <= num_attributes]
                if bad:
                    raise ValueError(f"{where}: attribute_ids {bad} are not among the file's {num_attributes} "
                                     f"attributes")
                if not 0 <= a["size_id"] <= num_sizes:
                    raise ValueError(f"{where}: size_id {a['size_id']} is not among the file's {num_sizes} sizes")
                keep.append(a)
            if len(keep) > cfg.max_boxes:
                for _ in keep[cfg.max_boxes:]:
                    self.skips.skip("over max_boxes", f"{path}: image {image_id}")
                keep = keep[: cfg.max_boxes]
            if keep:
                self.items.append((image_id, info["file_name"], keep, (info["width"], info["height"])))
            else:
                self.skips.skip("image without boxes", f"{path}: image {image_id}")

    def __len__(self) -> int:
        return len(self.items)

    def orientations(self) -> list[bool]:
        """Per image: portrait (taller than wide), the key of `group_by_aspect`."""
        return [h > w for _, _, _, (w, h) in self.items]

    def size_annotations(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every sized box, normalised by its image's (w, h, w, h) [M, 4], and its size index [M] (0-based)."""
        boxes, sizes = [], []
        for _, _, anns, (w, h) in self.items:
            for a in anns:
                if a["size_id"]:
                    boxes.append([a["box"][0] / w, a["box"][1] / h, a["box"][2] / w, a["box"][3] / h])
                    sizes.append(a["size_id"] - 1)
        return torch.tensor(boxes, dtype=torch.float32).view(-1, 4), torch.tensor(sizes, dtype=torch.long)

    def batch(self, indices: list[int]) -> dict:
        pairs, labels, attributes, sizes = [], [], [], []
        for i in indices:
            image_id, name, anns, _ = self.items[i]
            boxes = np.array([a["box"] for a in anns], dtype=np.float32)
            pairs.append(load_image(Path(self.cfg.image_root) / name, boxes, self.image_cfg,
                                    f"{self.path}: image {image_id}"))
            labels.append([a["category_id"] for a in anns])
            sizes.append([a["size_id"] - 1 for a in anns])  # -1: no size (ignored)
            multi_hot = torch.zeros(len(anns), max(1, self.num_attributes))
            for k, a in enumerate(anns):
                multi_hot[k, [j - 1 for j in a["attribute_ids"]]] = 1.0
            attributes.append(multi_hot)
        out = collate_visual(pairs)
        out["roi_index"] = real_rois(out["box_mask"])  # res5 runs on the real boxes alone
        n = out["boxes"].shape[1]
        out["labels"] = torch.full((len(indices), n), -100, dtype=torch.long)  # -100: padding, ignored
        out["attributes"] = torch.zeros(len(indices), n, max(1, self.num_attributes))
        out["sizes"] = torch.full((len(indices), n), -1, dtype=torch.long)
        for i, (lab, att, size) in enumerate(zip(labels, attributes, sizes)):
            out["labels"][i, : len(lab)] = torch.tensor(lab)
            out["attributes"][i, : len(lab)] = att
            out["sizes"][i, : len(size)] = torch.tensor(size)
        return out


class DetectorWarmup(nn.Module):
    """The Fast R-CNN with its attribute head on the region features and its size head on the boxes (element
    0, the whole image, has no label)."""

    def __init__(self, cfg: FastRCNNConfig, num_attributes: int, attribute_weight: float,
                 attribute_loss: str = "softmax", num_sizes: int = 0):
        super().__init__()
        if attribute_loss not in ("softmax", "bce"):
            raise ValueError(f"attribute_loss: '{attribute_loss}' is not softmax or bce")
        if cfg.num_attributes not in (0, num_attributes):
            raise ValueError(f"fast_rcnn.num_attributes is {cfg.num_attributes}, the annotations have "
                             f"{num_attributes} attributes")
        if cfg.num_sizes not in (0, num_sizes):
            raise ValueError(f"fast_rcnn.num_sizes is {cfg.num_sizes}, the annotations have {num_sizes} sizes")
        self.fast_rcnn = FastRCNN(replace(cfg, num_attributes=num_attributes, num_sizes=num_sizes))
        self.num_attributes, self.attribute_weight = num_attributes, attribute_weight
        self.attribute_loss = attribute_loss
        self.num_sizes = num_sizes

    def logits(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Object [B, N, classes], attribute [B, N, A] and size [B, N, S] logits (None without sizes)."""
        out = self.fast_rcnn(batch["images"], batch["image_sizes"], batch["boxes"], batch["box_mask"],
                             class_logits=True, roi_index=batch.get("roi_index"))
        regions = out["appearance"][:, 1:]
        head = self.fast_rcnn.attribute_classifier
        attributes = head(regions) if head is not None else regions.new_zeros(*regions.shape[:2], 1)
        sizes = self.fast_rcnn.size_logits(normalise(batch["boxes"], batch["image_sizes"])) if self.num_sizes \
            else None
        return out["class_logits"][:, 1:], attributes, sizes

    def forward(self, batch: dict):
        cls, att, _ = self.logits(batch)  # the size head is fitted apart (fit_size_classifier)
        labels, valid = batch["labels"], batch["box_mask"]
        loss_obj = F.cross_entropy(cls.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        loss_att = attribute_loss(att, batch["attributes"], valid, self.attribute_loss)
        correct = ((cls.argmax(-1) == labels) & valid).sum() / valid.sum().clamp(min=1)
        total = loss_obj + (self.attribute_weight if self.num_attributes else 0.0) * loss_att
        metrics = {"loss/total": total.detach(), "loss/object": loss_obj.detach(), "loss/attribute": loss_att.detach(),
                   "acc/object": correct.detach()}
        return total, metrics


def fit_size_classifier(head: nn.Module, boxes: torch.Tensor, sizes: torch.Tensor, steps: int = 300,
                        lr: float = 0.01, seed: int = 0) -> float:
    """Fits the Fast R-CNN's size head (`FastRCNN.size_classifier`) to annotated sizes by full-batch
    cross-entropy over the boxes' scale features: boxes [M, 4] normalised, sizes [M]. Returns the final
    training accuracy. Seeded re-initialisation, so the fit depends on the boxes only."""
    if not len(sizes):
        raise ValueError("fit_size_classifier: no sized box in the annotations")
    generator = torch_generator(seed, "size classifier")
    for layer in head:  # head[0] is the first Linear (model.fast_rcnn.size_classifier)
        if isinstance(layer, nn.Linear):
            bound = 1 / math.sqrt(layer.in_features)
            with torch.no_grad():
                layer.weight.uniform_(-bound, bound, generator=generator)
                layer.bias.uniform_(-bound, bound, generator=generator)
    features = scale_features(boxes)
    # fitted on standardised features, then folded into the first layer: (w, h) span a tenth of the logs'
    # range, and unscaled the fit needs ~10x the steps to separate sizes 0.04 apart (measured on the demo)
    mean, std = features.mean(0), features.std(0).clamp(min=1e-6)
    standardised = (features - mean) / std
    optimizer = torch.optim.Adam(head.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(head(standardised), sizes).backward()
        optimizer.step()
    with torch.no_grad():
        first = head[0]
        first.bias -= first.weight @ (mean / std)
        first.weight /= std
        return float((head(features).argmax(-1) == sizes).float().mean())


def attribute_loss(logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor, kind: str) -> torch.Tensor:
    """logits, targets [B, N, A] (multi-hot), valid [B, N]. softmax: mean over boxes with an attribute of
    -sum_a t_a log softmax(logits)_a, t the multi-hot normalised; bce: mean over valid boxes x attributes."""
    logits = logits.float()
    if kind == "softmax":
        counts = targets.sum(-1)  # [B, N]
        scored = valid & (counts > 0)
        per_box = -(targets / counts.clamp(min=1).unsqueeze(-1) * logits.log_softmax(-1)).sum(-1)
        return (per_box * scored).sum() / scored.sum().clamp(min=1)
    weight = valid.unsqueeze(-1).to(logits.dtype)
    bce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    return (bce * weight).sum() / (valid.sum().clamp(min=1) * logits.shape[-1])


@torch.no_grad()
def evaluate(module: DetectorWarmup, data: BoxSet, batch_size: int, device) -> dict:
    """Object accuracy (argmax over the foreground classes), attribute accuracy (the top-scoring attribute
    is one of the region's) and size accuracy, each next to always answering the most frequent label."""

    module.eval()
    obj_hits = att_hits = n = n_att = size_hits = n_size = 0
    label_counts = torch.zeros(module.fast_rcnn.cfg.num_classes)
    attr_counts = torch.zeros(max(1, module.num_attributes))
    size_counts = torch.zeros(max(1, module.num_sizes))
    for _, batch in eval_batches(data, batch_size, desc="detector val"):
        batch = to_device(batch, device)
        cls, att, size = module.logits(batch)
        valid = batch["box_mask"]
        labels = batch["labels"][valid]
        pred = cls[valid][:, 1:].argmax(-1) + 1  # a labelled box is an object: background is not an answer
        obj_hits += int((pred == labels).sum())
        n += int(valid.sum())
        label_counts += torch.bincount(labels.cpu(), minlength=label_counts.numel()).float()
        has_att = batch["attributes"][valid].sum(-1) > 0
        if module.num_attributes and has_att.any():
            target = batch["attributes"][valid][has_att]
            top = att[valid][has_att].argmax(-1)
            att_hits += int(target.gather(1, top.unsqueeze(1)).sum())
            n_att += int(has_att.sum())
            attr_counts += target.sum(0).cpu()
        if size is not None:
            sized = valid & (batch["sizes"] >= 0)
            size_hits += int((size[sized].argmax(-1) == batch["sizes"][sized]).sum())
            n_size += int(sized.sum())
            size_counts += torch.bincount(batch["sizes"][sized].cpu(), minlength=size_counts.numel()).float()
    sizes = {"size_regions": n_size, "size_accuracy": size_hits / n_size,
             "size_majority_baseline": float(size_counts.max() / n_size)} if n_size else {}
    return {"regions": n, "object_accuracy": obj_hits / max(1, n),
            "object_majority_baseline": float(label_counts.max() / max(1, n)),
            "attribute_regions": n_att, "attribute_accuracy": att_hits / max(1, n_att) if n_att else None,
            "attribute_majority_baseline": float(attr_counts.max() / n_att) if n_att else None, **sizes}


def drift(fast_rcnn_state: dict[str, torch.Tensor], cfg: DetectorConfig, device="cpu") -> dict:
    """The held-out object and attribute accuracy of a Fast R-CNN after pretraining (its state dict, as a
    VL-BERT export holds it under `vl_bert.fast_rcnn.`), next to the warm-up's own figures
    (`<engine.run_dir>/metrics_val.json` of the warm-up config `cfg`): how much end-to-end training moved
    what the detector reads off a region."""
    if not cfg.val:
        raise ValueError("detector drift needs the warm-up config's held-out annotations (val)")
    _, attributes, sizes = read_vocabularies(cfg.train)
    num_attributes, num_sizes = max(attributes, default=0), max(sizes, default=0)
    has_attributes = "attribute_classifier.weight" in fast_rcnn_state
    has_sizes = "size_classifier.2.weight" in fast_rcnn_state
    # pretraining loads a batch-norm warm-up as frozen statistics: evaluate it so
    module = DetectorWarmup(replace(cfg.fast_rcnn, weights=None, num_attributes=0, num_sizes=0, norm="frozen"),
                            num_attributes if has_attributes else 0, cfg.attribute_weight, cfg.attribute_loss,
                            num_sizes if has_sizes else 0)
    missing, unexpected = module.fast_rcnn.load_state_dict(fast_rcnn_state, strict=False)
    if missing or unexpected:
        raise ValueError(f"detector drift: the Fast R-CNN state does not match the warm-up's detector: missing "
                         f"{missing[:3]}, unexpected {unexpected[:3]}")
    val = BoxSet(cfg.val, cfg, cfg.fast_rcnn.num_classes, num_attributes, num_sizes)
    after = evaluate(module.to(device), val, cfg.eval_batch_size, device)
    if not has_attributes:  # a detector exported without its attribute head reads no attributes
        after["attribute_accuracy"] = None
    before_path = Path(cfg.engine.run_dir) / "metrics_val.json"
    before = json.loads(before_path.read_text()) if before_path.exists() else None
    return {"after": after, "warm_up": before}


def export_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Fast R-CNN's own weights from the warm-up module's state, in `FastRCNN.load_weights`' format."""
    return {k.removeprefix("fast_rcnn."): v.detach().cpu().clone() for k, v in state.items()
            if k.startswith("fast_rcnn.")}


class DetectorTask(Task):
    """The detector warm-up as a `train.run.Task`: the Fast R-CNN's CNN and classifiers trained on the boxes, then
    the size head fitted, the weights and vocabulary written and the held-out accuracy measured."""
    description = "Supervised Fast R-CNN warm-up on COCO-format boxes"
    doc = __doc__
    config_cls = DetectorConfig
    config_help = "DetectorConfig YAML (see launch/configs/detector_demo.yaml)"
    overrides_example = "epochs=2 optim.lr=5e-4"

    def build(self, cfg: DetectorConfig, args, rank: int, world: int) -> Training:
        self.categories, self.attributes, self.sizes = read_vocabularies(cfg.train)
        self.num_attributes, self.num_sizes = max(self.attributes, default=0), max(self.sizes, default=0)
        self.train = BoxSet(cfg.train, cfg, cfg.fast_rcnn.num_classes, self.num_attributes, self.num_sizes)
        # the steps train the CNN and its classifiers; the size head is fitted after them
        module = DetectorWarmup(replace(cfg.fast_rcnn, num_sizes=0), self.num_attributes, cfg.attribute_weight,
                                cfg.attribute_loss)
        micro = max(1, cfg.batch_size // world // cfg.engine.gradient_accumulation_steps)
        loader = EpochLoader(self.train, micro, cfg.seed, rank, world, cfg.num_workers,
                             groups=self.train.orientations() if cfg.group_by_aspect else None)
        cfg.engine.steps = max(1, math.ceil(cfg.epochs * loader.batches_per_epoch
                                            / cfg.engine.gradient_accumulation_steps))
        cfg.engine.progress_label = "detector"
        if rank == 0:
            print(f"detector warm-up: {len(self.train)} images, {len(self.categories)} categories, "
                  f"{self.num_attributes} attributes, {self.num_sizes} sizes "
                  f"({dict(self.train.skips.reasons) or 'none skipped'}), {cfg.engine.steps} steps", flush=True)
        return Training(module, loader, micro, count_batch=count_boxes,
                        run_info={"config": asdict(cfg), "train_images": len(self.train)})

    def finish(self, engine, last: dict, cfg: DetectorConfig, args, rank: int) -> None:
        state = engine.consolidated_state_dict()
        if rank != 0:
            return
        run_dir = Path(cfg.engine.run_dir)
        num_attributes, num_sizes = self.num_attributes, self.num_sizes
        weights = export_state(state)
        if num_sizes:
            head, (boxes, box_sizes) = size_classifier(num_sizes), self.train.size_annotations()
            accuracy = fit_size_classifier(head, boxes, box_sizes, steps=cfg.size_fit_steps, seed=cfg.seed)
            print(f"size head: training accuracy {accuracy:.3f} on {len(box_sizes)} boxes", flush=True)
            fitted = {f"size_classifier.{k}": v.detach().clone() for k, v in head.state_dict().items()}
            weights.update(fitted)
            state = {**state, **{f"fast_rcnn.{k}": v for k, v in fitted.items()}}
        torch.save(weights, run_dir / "fast_rcnn.pt")
        vocab = {"classes": ["__background__"] + [self.categories.get(k, f"class_{k}") for k in
                                                  range(1, cfg.fast_rcnn.num_classes)],
                 "attributes": [self.attributes[k] for k in range(1, num_attributes + 1)],
                 "sizes": [self.sizes[k] for k in range(1, num_sizes + 1)]}
        (run_dir / "fast_rcnn.vocab.json").write_text(json.dumps(vocab, indent=1))
        if cfg.val:
            module = DetectorWarmup(cfg.fast_rcnn, num_attributes, cfg.attribute_weight, cfg.attribute_loss,
                                    num_sizes)
            module.load_state_dict(state)
            device = "cuda" if torch.cuda.is_available() else "cpu"
            val = BoxSet(cfg.val, cfg, cfg.fast_rcnn.num_classes, num_attributes, num_sizes)
            metrics = evaluate(module.to(device), val, cfg.eval_batch_size, device)
            (run_dir / "metrics_val.json").write_text(json.dumps(metrics, indent=1))
            print("detector val: object accuracy {object_accuracy:.3f} (majority {object_majority_baseline:.3f})"
                  .format(**metrics) + (", attribute accuracy {attribute_accuracy:.3f} (majority "
                                        "{attribute_majority_baseline:.3f})".format(**metrics)
                                        if metrics["attribute_accuracy"] is not None else "")
                  + (", size accuracy {size_accuracy:.3f} (majority {size_majority_baseline:.3f})".format(**metrics)
                     if "size_accuracy" in metrics else ""), flush=True)
        print(f"Fast R-CNN weights: {run_dir / 'fast_rcnn.pt'} (set model.fast_rcnn.weights to it)", flush=True)


def count_boxes(batch: dict) -> dict[str, float]:
    return {"samples": float(batch["box_mask"].shape[0]), "images": float(batch["box_mask"].shape[0]),
            "tokens": float(batch["box_mask"].sum())}


def main(argv: list[str] | None = None) -> int:
    return run(DetectorTask(), argv)


if __name__ == "__main__":
    sys.exit(entry_point(main))
