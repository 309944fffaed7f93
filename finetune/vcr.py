"""VCR visual commonsense reasoning (VL-BERT section 4.2.1, Figure 2a, appendix A.2).

    python -m finetune.vcr --config launch/configs/vcr_demo.yaml subtask=qa     # Q->A
    python -m finetune.vcr --config launch/configs/vcr_demo.yaml subtask=qar    # QA->R
    python -m finetune.vcr --combine runs/vcr/qa/predictions_val.json runs/vcr/qar/predictions_val.json
    bash launch/finetune_vcr.sh                          # the demo: both subtasks, then Q->AR

Reads the official files as distributed: `{train,val,test}.jsonl` (question, answer_choices,
rationale_choices as token lists in which an object reference is a list of indices into `objects`;
answer_label, rationale_label; img_fn, metadata_fn, annot_id) and each image's metadata JSON (boxes
with scores, names, width, height). An object reference becomes words: the object's class name, or for
a person a gender-neutral name cycling through a fixed list (as R2C and the official code do); its
word-pieces take that object's region feature as their visual term. The input regions are the
ground-truth boxes, as the paper does.

Q->A puts the question in segment A and a candidate answer in B; QA->R the question and the right
answer in A and a candidate rationale in B (on a split without labels, the answer chosen by a Q->A run:
`data.answer_from`). A classifier on [CLS] scores each of the 4 candidates: softmax over the 4
(`candidate_loss: softmax`) or a sigmoid per candidate (`sigmoid`, as the official code). Masked RoI
classification with linguistic clues runs alongside during training: regions are hidden (pixels zeroed
before the detector) and their object class predicted. The detector runs once per question; its output
is shared by the 4 candidates.

Outputs: `predictions_<split>.json` ({annot_id: {probs, label, image}}), `metrics_<split>.json` (accuracy);
`--combine` turns a Q->A and a QA->R run into Q->A, QA->R and Q->AR accuracy (right only when both are).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from model.config import required
from model.heads import BertPredictionHeadTransform
from shards.images import collate_visual, load_image
from shards.skips import SkipLog, numbered_lines
from train.engine import entry_point, to_device

from .common import FinetuneConfig, TaskSpec, copy_transform, encode, eval_batches, finetune_main, pad_lists

# R2C's list (and the official VL-BERT code's), "Peyton" twice included: person i gets name i mod 15
GENDER_NEUTRAL_NAMES = ["Casey", "Riley", "Jessie", "Jackie", "Avery", "Jaime", "Peyton", "Kerry", "Jody", "Kendall",
                        "Peyton", "Skyler", "Frankie", "Pat", "Quinn"]


class VCRFormatError(ValueError):
    pass


def read_vcr_jsonl(path: str | Path, need_labels: bool) -> list[dict]:
    out = []
    required = ["question", "answer_choices", "rationale_choices", "objects", "img_fn", "metadata_fn", "annot_id"]
    if not Path(path).is_file():
        raise FileNotFoundError(f"VCR split file {path} not found")
    for where, line in numbered_lines(path):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise VCRFormatError(f"{where}: not JSON ({e})") from None
        missing = [k for k in required if k not in rec]
        if need_labels:
            missing += [k for k in ("answer_label", "rationale_label") if k not in rec]
        if missing:
            raise VCRFormatError(f"{where}: missing {missing}")
        if len(rec["answer_choices"]) != 4 or len(rec["rationale_choices"]) != 4:
            raise VCRFormatError(f"{where}: expected 4 answer and 4 rationale choices")
        rec["where"] = where
        out.append(rec)
    return out


def words_of(tokens: list, objects: list[str]) -> list[tuple[str, int]]:
    """VCR tokens -> (word, region) pairs; an object reference [i, j] becomes 'name_i and name_j', each
    name's region its object (-1: the word takes the whole image)."""
    out: list[tuple[str, int]] = []
    for tok in tokens:
        if isinstance(tok, str):
            out.append((tok, -1))
            continue
        for n, k in enumerate(tok):
            if not isinstance(k, int) or not 0 <= k < len(objects):
                raise VCRFormatError(f"object reference {tok} outside the {len(objects)} objects")
            if n:
                out.append(("and", -1))
            name = GENDER_NEUTRAL_NAMES[k % len(GENDER_NEUTRAL_NAMES)] if objects[k] == "person" else objects[k]
            out.append((name, k))
    return out


def instance_mask(polygons: list, box, size: int = 14, boundary: bool = False) -> torch.Tensor:
    """An object's segmentation (polygons of [x, y] vertices in image pixels) as a [size, size] mask in its
    box's frame, as the official VCR dataset rasterises it (`common/utils/mask.py` generate_instance_mask with
    skimage.draw.polygon): vertices scaled by size / (box side + 1) from the box's corner (float32) and clamped
    to [0, size - 1]; a cell (r, c) is in when its integer point lies inside a polygon.

    Which points on a polygon's boundary count changed with scikit-image 0.18 (its PR #5029, 2020): before,
    the even-odd rule with edges half-open in y (pnpoly), which the released checkpoints were trained with
    (2019, `boundary=False`); since, every point on an edge or a vertex counts (O'Rourke's test,
    `boundary=True`). The box is the polygon's own bounding box, so the two differ along the mask's border.
    All cells of a polygon at once, no loop over pixels."""
    mask = torch.zeros(size, size, dtype=torch.bool)
    x1, y1, x2, y2 = (float(v) for v in box[:4])
    w_ratio, h_ratio = size / (x2 - x1 + 1), size / (y2 - y1 + 1)
    rows = torch.arange(size, dtype=torch.float64).view(size, 1, 1)
    cols = torch.arange(size, dtype=torch.float64).view(1, size, 1)
    for poly in polygons:
        xy = torch.as_tensor(poly, dtype=torch.float32).reshape(-1, 2)
        if len(xy) == 0:
            continue
        x = ((xy[:, 0] - x1) * w_ratio).clamp(0, size - 1).double()
        y = ((xy[:, 1] - y1) * h_ratio).clamp(0, size - 1).double()
        xj, yj = x.roll(1), y.roll(1)  # each edge (j, i), j = i - 1, the last vertex closing to the first
        if not boundary:
            crosses = ((y <= rows) & (rows < yj)) | ((yj <= rows) & (rows < y))  # [size, 1, V]
            dy = torch.where(yj == y, torch.ones_like(y), yj - y)  # a level edge crosses nothing
            mask |= (crosses & (cols < (xj - x) * (rows - y) / dy + x)).sum(-1) % 2 == 1
            continue
        x0, y0, x1r, y1r = x - cols, y - rows, xj - cols, yj - rows  # [size, size, V], relative to the point
        vertex = ((x0.abs() < 1e-12) & (y0.abs() < 1e-12)).any(-1)
        level = torch.where(y1r == y0, torch.ones_like(y0), y1r - y0)
        at = (x0 * y1r - x1r * y0) / level  # where the edge meets the point's row, relative to the point
        right = (((y0 > 0) != (y1r > 0)) & (at > 0)).sum(-1) % 2
        left = (((y0 < 0) != (y1r < 0)) & (at < 0)).sum(-1) % 2
        mask |= vertex | (right != left) | (right == 1)
    return mask.float()


def piece(tokenizer, words: list[tuple[str, int]], max_regions: int) -> tuple[list[int], list[int]]:
    """Word-pieces of the words and the region of each (references beyond max_regions: the whole image)."""
    if not words:
        return [], []
    enc = tokenizer([w for w, _ in words], is_split_into_words=True, add_special_tokens=False)
    ids = enc["input_ids"]
    regions = [words[w][1] if words[w][1] < max_regions else -1 for w in enc.word_ids()]
    return ids, regions


# --- data ---------------------------------------------------------------------------------------------------

@dataclass
class VCRDataConfig:
    root: str = required()  # {split}.jsonl
    images: str = required()  # img_fn and metadata_fn are relative to it (VCR: vcr1images/)
    answer_from: str | None = None  # QA->R on a split without labels: a Q->A run's predictions_<split>.json
    max_a_tokens: int = 64
    max_b_tokens: int = 64
    # each object's segmentation (the metadata's `segms` polygons) as a mask weighting its res5 map before the pool,
    # as the official VCR model does (`region_masks`); mask_size = the res5 map's side (14 with a dilated res5
    # on 14x14 RoIs, the official; 7 otherwise, or roi_output_size / 2)
    segmentation_masks: bool = False
    mask_size: int = 14
    # cells on a polygon's edge count as the object's (scikit-image >= 0.18's rule) or by the even-odd rule (before:
    # what the released checkpoints were trained with); see `instance_mask`
    mask_edges_inside: bool = False


@dataclass
class VCRConfig(FinetuneConfig):
    data: VCRDataConfig = field(default_factory=VCRDataConfig)
    subtask: str = "qa"  # qa (Q->A) | qar (QA->R)
    candidate_loss: str = "softmax"  # softmax over the 4 | sigmoid per candidate
    mrc_weight: float = 1.0  # masked RoI classification with linguistic clues; 0 = off
    mrc_probability: float = 0.15
    classifier_dropout: float = 0.1
    head: str = "cls"  # the candidate score from [CLS]'s output state, or from the pooler ("pooler": the official's)


class VCRSet:
    def __init__(self, cfg: VCRConfig, split: str, tokenizer, object_classes: list[str] | None = None):
        self.skips = SkipLog("examples")
        if cfg.subtask not in ("qa", "qar"):
            raise ValueError(f"subtask: '{cfg.subtask}' is not qa or qar")
        self.cfg, self.split = cfg, split
        path = Path(cfg.data.root) / f"{split}.jsonl"
        records = read_vcr_jsonl(path, need_labels=False)
        labelled = all("answer_label" in r for r in records)
        chosen = None
        if cfg.subtask == "qar" and not labelled:
            if not cfg.data.answer_from:
                raise ValueError(f"{path} has no labels: QA->R needs data.answer_from (a Q->A predictions file)")
            preds = json.loads(Path(cfg.data.answer_from).read_text())
            chosen = {k: int(np.argmax(v["probs"])) for k, v in preds.items()}
        if object_classes is None:
            counts = Counter(name for r in records for name in r["objects"])
            object_classes = [n for n, _ in counts.most_common()]
        self.object_classes = object_classes
        class_index = {n: i for i, n in enumerate(object_classes)}
        m = cfg.image.max_regions
        self.items = []
        for r in records:
            try:
                q = words_of(r["question"], r["objects"])
                if cfg.subtask == "qa":
                    a_words, choices, label = q, r["answer_choices"], r.get("answer_label")
                else:
                    answer = r["answer_label"] if labelled else chosen.get(r["annot_id"])
                    if answer is None:
                        self.skips.skip("no Q->A prediction for QA->R", f"{r['where']} ({r['annot_id']})")
                        continue
                    a_words = q + words_of(r["answer_choices"][answer], r["objects"])
                    choices, label = r["rationale_choices"], r.get("rationale_label")
                a = piece(tokenizer, a_words, m)
                bs = [piece(tokenizer, words_of(c, r["objects"]), m) for c in choices]
            except VCRFormatError as e:
                raise VCRFormatError(f"{r['where']}: {e}") from None
            self.items.append({
                "annot_id": r["annot_id"], "img_fn": r["img_fn"], "metadata_fn": r["metadata_fn"],
                "where": r["where"], "a": tuple(x[: cfg.data.max_a_tokens] for x in a),
                "b": [tuple(x[: cfg.data.max_b_tokens] for x in b) for b in bs], "label": label,
                "classes": [class_index.get(n, -1) for n in r["objects"][:m]]})
        if not self.items:
            raise ValueError(f"VCR {split}: no usable questions ({dict(self.skips.reasons)})")
        self.labelled = labelled

    def __len__(self) -> int:
        return len(self.items)

    def _metadata(self, item: dict) -> tuple[np.ndarray, torch.Tensor | None]:
        """The item's boxes [N, 4] and, with data.segmentation_masks, their instance masks [N, S, S]."""
        path = Path(self.cfg.data.images) / item["metadata_fn"]
        try:
            meta = json.loads(path.read_text())
            boxes = np.asarray(meta["boxes"], dtype=np.float32).reshape(-1, 5)[:, :4]
        except (FileNotFoundError, KeyError, ValueError) as e:
            raise VCRFormatError(f"{item['where']}: metadata {path}: {type(e).__name__} {e}") from None
        if len(boxes) < len(item["classes"]):
            raise VCRFormatError(f"{item['where']}: {len(item['classes'])} objects but {len(boxes)} boxes in {path}")
        boxes = boxes[: self.cfg.image.max_regions]
        if not self.cfg.data.segmentation_masks:
            return boxes, None
        segms = meta.get("segms")
        if not isinstance(segms, list) or len(segms) < len(boxes):
            raise VCRFormatError(f"{item['where']}: metadata {path}: data.segmentation_masks needs a 'segms' list with "
                                 f"one entry per box ({len(boxes)}), got {type(segms).__name__}")
        try:
            masks = torch.stack([instance_mask(segms[k], meta["boxes"][k], self.cfg.data.mask_size,
                                               self.cfg.data.mask_edges_inside)
                                 for k in range(len(boxes))]) if len(boxes) else \
                torch.zeros(0, self.cfg.data.mask_size, self.cfg.data.mask_size)
        except (TypeError, ValueError, RuntimeError) as e:
            raise VCRFormatError(f"{item['where']}: metadata {path}: segms: {e}") from None
        return boxes, masks

    def batch(self, indices: list[int], pixels: bool = True) -> dict:
        image_cfg = self.cfg.image
        meta = [self._metadata(self.items[i]) for i in indices]
        visual = [load_image(Path(self.cfg.data.images) / self.items[i]["img_fn"], boxes, image_cfg,
                             f"{self.items[i]['where']} ({self.items[i]['annot_id']})", pixels)
                  for i, (boxes, _) in zip(indices, meta)]
        out = collate_visual(visual)
        out["image_keys"] = [self.items[i]["img_fn"] for i in indices]
        n = out["boxes"].shape[1]
        if self.cfg.data.segmentation_masks:  # in each box's frame: the resize leaves them as they are
            size = self.cfg.data.mask_size
            out["region_masks"] = torch.zeros(len(indices), n, size, size)
            for r, (_, masks) in enumerate(meta):
                out["region_masks"][r, : len(masks)] = masks
        a = [self.items[i]["a"] for i in indices for _ in range(4)]  # 4 sequences per question
        b = [c for i in indices for c in self.items[i]["b"]]
        out["a_ids"], out["a_mask"] = pad_lists([x[0] for x in a])
        out["a_region"], _ = pad_lists([x[1] for x in a], pad=-1)
        out["b_ids"], out["b_mask"] = pad_lists([x[0] for x in b])
        out["b_region"], _ = pad_lists([x[1] for x in b], pad=-1)
        out["region_class"] = torch.tensor([self.items[i]["classes"] + [-1] * (n - len(self.items[i]["classes"]))
                                            for i in indices])
        out["label"] = torch.tensor([self.items[i]["label"] if self.items[i]["label"] is not None else -1
                                     for i in indices])
        return out


# --- the model --------------------------------------------------------------------------------------------------

class VCRModel(nn.Module):
    """Scores each candidate from [CLS]'s output (`head: cls`) or from the pooler's tanh(W [CLS]) (`head:
    pooler`, the official VCR classifier), and classifies masked regions (MRC, with the MRC head's transform)."""

    def __init__(self, vl_bert, num_object_classes: int, cfg: dict):
        super().__init__()
        h = vl_bert.cfg.hidden_size
        self.vl_bert, self.settings = vl_bert, cfg
        if cfg.get("head", "cls") not in ("cls", "pooler"):
            raise ValueError(f"head: '{cfg['head']}' is not cls or pooler")
        self.classifier = nn.Sequential(nn.Dropout(cfg["classifier_dropout"]), nn.Linear(h, 1))
        self.roi_transform = BertPredictionHeadTransform(vl_bert.cfg, norm=vl_bert.cfg.mrc_head_norm)
        self.roi_classifier = nn.Linear(h, num_object_classes)
        for m in (self.classifier[1], self.roi_classifier):
            nn.init.normal_(m.weight, std=vl_bert.cfg.initializer_range)
            nn.init.zeros_(m.bias)

    def run(self, batch: dict, masked_regions: torch.Tensor | None = None):
        vl = self.vl_bert
        box_mask = batch["box_mask"]
        if masked_regions is None:
            masked_regions = torch.zeros_like(box_mask)
        if "appearance" in batch:  # a RegionFeatureCache's batch: the frozen detector's features
            if self.settings["mrc_weight"] > 0:
                raise ValueError("VCR's masked RoI classification zeroes pixels before the detector: with detector: "
                                 "frozen set mrc_weight=0")
            appearance, boxes_norm = batch["appearance"], batch["boxes_norm"]
        else:
            appearance, boxes_norm, _ = vl.region_features(images=batch["images"], image_sizes=batch["image_sizes"],
                                                           boxes=batch["boxes"], box_mask=box_mask,
                                                           masked_regions=masked_regions,
                                                           region_masks=batch.get("region_masks"))
        rep = {k: batch[k].repeat_interleave(4, 0) for k in ("boxes", "box_mask")}
        out = encode(vl, {**batch, **rep}, visual_input=(appearance.repeat_interleave(4, 0),
                                                         boxes_norm.repeat_interleave(4, 0)),
                     masked_regions=masked_regions.repeat_interleave(4, 0))
        first = out.pooled if self.settings.get("head", "cls") == "pooler" else out.last_hidden_state[:, 0]
        scores = self.classifier(first).view(-1, 4)  # [B, 4]
        return scores, out

    def forward(self, batch: dict):
        s = self.settings
        box_mask = batch["box_mask"]
        masked = None
        if s["mrc_weight"] > 0:
            masked = (torch.rand(box_mask.shape, device=box_mask.device) < s["mrc_probability"]) & box_mask
        scores, out = self.run(batch, masked)
        label = batch["label"]
        if s["candidate_loss"] == "softmax":
            loss = F.cross_entropy(scores, label)
        else:
            loss = F.binary_cross_entropy_with_logits(scores, F.one_hot(label, 4).float())
        metrics = {"loss/candidates": loss.detach(), "acc/choice": (scores.argmax(1) == label).float().mean().detach()}
        if masked is not None:
            target = batch["region_class"].repeat_interleave(4, 0)
            pick = masked.repeat_interleave(4, 0) & (target >= 0)
            regions = out.region_hidden[:, 1:]  # element 0 is the whole image
            # every region is scored and the masked ones weighted in: boolean indexing would sync with the
            # host; an empty selection (nothing masked in this batch) gives 0, not NaN
            logits = self.roi_classifier(self.roi_transform(regions))
            per_region = F.cross_entropy(logits.flatten(0, 1), target.clamp(min=0).flatten(), reduction="none")
            mrc = (per_region * pick.flatten()).sum() / pick.sum().clamp(min=1)
            loss = loss + s["mrc_weight"] * mrc
            metrics["loss/masked_roi"] = mrc.detach()
        metrics["loss/total"] = loss.detach()
        return loss, metrics


class VCRTask(TaskSpec, name="vcr", config=VCRConfig):
    @staticmethod
    def dataset(cfg: VCRConfig, tokenizer, info: dict | None, train: bool):
        if not train:
            return VCRSet(cfg, cfg.eval_split, tokenizer, info["object_classes"])
        data = VCRSet(cfg, "train", tokenizer)
        if not data.labelled:
            raise VCRFormatError(f"{cfg.data.root}/train.jsonl: training needs answer_label and rationale_label")
        return data

    @staticmethod
    def _settings(cfg: VCRConfig) -> dict:
        return {"subtask": cfg.subtask, "candidate_loss": cfg.candidate_loss, "mrc_weight": cfg.mrc_weight,
                "mrc_probability": cfg.mrc_probability, "classifier_dropout": cfg.classifier_dropout, "head": cfg.head}

    @staticmethod
    def build_module(pretrained, cfg: VCRConfig, train: VCRSet):
        settings = VCRTask._settings(cfg)
        model = VCRModel(pretrained.vl_bert, len(train.object_classes), settings)
        copy_transform(model.roi_transform, pretrained.masked_roi_classification.transform)
        return model, {"task": "vcr", "object_classes": train.object_classes, "settings": settings,
                       "image": vars(cfg.image)}

    @staticmethod
    def rebuild(vl_bert, info: dict):
        return VCRModel(vl_bert, len(info["object_classes"]), info["settings"])

    @staticmethod
    def evaluate(model: VCRModel, data: VCRSet, cfg: VCRConfig, run_dir: Path, device) -> dict:
        preds = {}
        for idx, batch in eval_batches(data, cfg.eval_batch_size, cfg.max_eval_examples, "vcr eval"):
            scores, _ = model.run(to_device(batch, device))
            probs = (scores.softmax(1) if model.settings["candidate_loss"] == "softmax" else scores.sigmoid()).cpu()
            for row, i in enumerate(idx):
                item = data.items[i]
                preds[item["annot_id"]] = {"probs": [round(float(p), 5) for p in probs[row]], "label": item["label"],
                                           "image": item["img_fn"]}
        (run_dir / f"predictions_{cfg.eval_split}.json").write_text(json.dumps(preds))
        metrics = {"split": cfg.eval_split, "subtask": cfg.subtask, "questions": len(preds)}
        if data.labelled:
            metrics["accuracy"] = round(100.0 * float(np.mean([np.argmax(p["probs"]) == p["label"]
                                                               for p in preds.values()])), 2)
        return metrics

    @staticmethod
    def summary(metrics: dict) -> str:
        name = {"qa": "Q->A", "qar": "QA->R"}[metrics["subtask"]]
        if "accuracy" not in metrics:
            return f"{name}: {metrics['questions']} predictions written (no labels in this split)"
        return f"{name} accuracy {metrics['accuracy']:.2f} over {metrics['questions']} questions (chance 25.00)"


def q2ar(qa: dict, qar: dict) -> dict:
    """Q->A, QA->R and Q->AR accuracy (percent) over the questions both prediction files hold; Q->AR
    counts a question right only when both its answer and its rationale are."""
    common = sorted(set(qa) & set(qar))
    if not common:
        raise ValueError("the Q->A and QA->R predictions share no annot_id")
    if any(qa[k]["label"] is None or qar[k]["label"] is None for k in common):
        raise ValueError("Q->AR needs labels (this split has none: submit the predictions instead)")
    a = np.array([int(np.argmax(qa[k]["probs"])) == qa[k]["label"] for k in common])
    r = np.array([int(np.argmax(qar[k]["probs"])) == qar[k]["label"] for k in common])
    return {"questions": len(common), "q2a": round(100.0 * a.mean(), 2), "qa2r": round(100.0 * r.mean(), 2),
            "q2ar": round(100.0 * (a & r).mean(), 2), "chance": {"q2a": 25.0, "qa2r": 25.0, "q2ar": 6.25}}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--combine":
        p = argparse.ArgumentParser(description="Q->AR from a Q->A and a QA->R predictions file")
        p.add_argument("--combine", nargs=2, metavar=("QA_PREDICTIONS", "QAR_PREDICTIONS"), required=True)
        p.add_argument("--out", help="write the metrics JSON here too")
        args = p.parse_args(argv)
        qa, qar = (json.loads(Path(x).read_text()) for x in args.combine)
        metrics = q2ar(qa, qar)
        if args.out:
            Path(args.out).write_text(json.dumps(metrics, indent=1))
        print(json.dumps(metrics))
        return 0
    return finetune_main(VCRTask, argv)


if __name__ == "__main__":
    sys.exit(entry_point(main))
