"""RefCOCO+ referring expression comprehension (VL-BERT section 4.2.3, appendix A.2).

    python -m finetune.refcoco --config launch/configs/refcoco_demo.yaml [track=detected] [eval_split=testA]
    bash launch/finetune_refcoco.sh                      # the demo: train, then val, testA and testB

Reads the refer toolkit's files as distributed: `refs(unc).p` (a pickle: untrusted input, read with a
restricted unpickler that admits only plain containers and scalars) and `instances.json` (COCO format,
bbox x, y, w, h). Two tracks: `gt`, every COCO annotation of the image is a candidate region; `detected`,
the regions of a detections file (MAttNet's `[{image_id, box: [x, y, w, h], score}]` list, or a dict
keyed by image id), with the ground-truth boxes added to the training regions as the paper does.

Input `[CLS] query [SEP] [IMG]... [END]`; a per-region binary classifier on the regions' outputs (label:
IoU > 0.5 with the referred box); at inference the highest-scoring region is the answer. Metric:
accuracy at IoU >= 0.5 with the referred box (`metrics_<split>.json`, with the chance level of picking a
candidate at random), predictions in `predictions_<split>.json` (`[{ref_id, sent_id, image_id, box, score, iou}]`).
"""

from __future__ import annotations

import io
import json
import pickle
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from model.boxes import box_iou
from model.config import required
from model.heads import BertPredictionHeadTransform
from shards.coco import CocoFormatError, read_instances, xywh_to_xyxy
from shards.images import collate_visual, load_image
from shards.skips import SkipLog
from train.engine import entry_point, to_device

from .common import FinetuneConfig, TaskSpec, copy_transform, encode, eval_batches, finetune_main, pad_lists

SPLITS = ("train", "val", "testA", "testB", "test")


class RefFormatError(CocoFormatError):
    pass


class RestrictedUnpickler(pickle.Unpickler):
    """Plain containers and scalars only: any class or function reference in the stream is refused, so
    a crafted pickle cannot run code while loading."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: only plain data is accepted")


def safe_pickle_load(path: str | Path):
    data = Path(path).read_bytes()
    try:
        # the refer toolkit's pickles come from Python 2: its byte strings are text
        return RestrictedUnpickler(io.BytesIO(data), encoding="latin1").load()
    except pickle.UnpicklingError as e:
        raise RefFormatError(f"{path}: {e}") from None


def read_refs(path: str | Path) -> list[dict]:
    refs = safe_pickle_load(path)
    if not isinstance(refs, list):
        raise RefFormatError(f"{path}: expected a list of refs, got {type(refs).__name__}")
    for i, ref in enumerate(refs):
        try:
            ok = all(k in ref for k in ("ref_id", "ann_id", "image_id", "split", "sentences")) and all(
                "sent" in s and "sent_id" in s for s in ref["sentences"])
        except TypeError:
            ok = False
        if not ok:
            raise RefFormatError(f"{path}: refs[{i}] lacks ref_id, ann_id, image_id, split or sentences[].sent/sent_id")
    return refs


def read_detections(path: str | Path) -> dict[int, list[list[float]]]:
    """Detected boxes (x1, y1, x2, y2) per image from a MAttNet-style list or a dict keyed by image id."""
    data = json.loads(Path(path).read_text())
    out: dict[int, list[list[float]]] = {}
    items = data.items() if isinstance(data, dict) else [(None, d) for d in data]
    for key, value in items:
        for k, det in enumerate(value if key is not None else [value]):
            try:
                image_id = int(key if key is not None else det["image_id"])
                out.setdefault(image_id, []).append(xywh_to_xyxy(det["box"]))
            except (KeyError, TypeError, ValueError) as e:
                name = f"[{key!r}][{k}]" if key is not None else f"[{k}]"
                raise RefFormatError(f"{path}: detection {name}: bad field {e}") from None
    return out


# --- data --------------------------------------------------------------------------------------------------

@dataclass
class RefDataConfig:
    refs: str = required()
    instances: str = required()
    detections: str = required()
    max_query_tokens: int = 24


@dataclass
class RefConfig(FinetuneConfig):
    data: RefDataConfig = field(default_factory=RefDataConfig)
    track: str = "gt"  # gt | detected
    positive_iou: float = 0.5  # training label: IoU > this with the referred box
    classifier_dropout: float = 0.1
    # the region scorer: "mlp" (dropout, linear, ReLU, dropout, linear; this system's default, docs/FINETUNE.md)
    # or "mvrc", the official code's: the pretrained MRC head's transform, dropout, then a linear layer
    head: str = "mlp"


class RefSet:
    """One example per (ref, sentence) of a split, with its candidate regions."""

    def __init__(self, cfg: RefConfig, split: str, tokenizer, train: bool):
        self.skips = SkipLog("examples")
        if split not in SPLITS:
            raise ValueError(f"RefCOCO split '{split}' is not one of {SPLITS}")
        if cfg.track not in ("gt", "detected"):
            raise ValueError(f"track: '{cfg.track}' is not gt or detected")
        self.cfg, self.split = cfg, split
        refs = [r for r in read_refs(cfg.data.refs) if r["split"] == split]
        if not refs:
            raise ValueError(f"{cfg.data.refs}: no refs in split '{split}'")
        self.images, anns, by_image = read_instances(cfg.data.instances)
        dets = read_detections(cfg.data.detections) if cfg.track == "detected" else {}
        self.items, texts = [], []
        self.regions: dict[int, np.ndarray] = {}
        for ref in refs:
            image_id, ann_id = int(ref["image_id"]), int(ref["ann_id"])
            where = f"{cfg.data.refs}: ref_id {ref['ref_id']}"
            if image_id not in self.images or ann_id not in anns:
                self.skips.skip("image or annotation not in instances", where)
                continue
            if image_id not in self.regions:
                gt = [anns[a]["box"] for a in by_image.get(image_id, [])]
                boxes = gt if cfg.track == "gt" else dets.get(image_id, []) + (gt if train else [])
                self.regions[image_id] = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)[: cfg.image.max_regions]
            if len(self.regions[image_id]) == 0:
                self.skips.skip("image without candidate regions", where)
                continue
            for s in ref["sentences"]:
                self.items.append({"ref_id": ref["ref_id"], "sent_id": s["sent_id"], "image_id": image_id,
                                   "target": anns[ann_id]["box"]})
                texts.append(s["sent"])
        if not self.items:
            raise ValueError(f"RefCOCO {split}: no usable examples ({dict(self.skips.reasons)})")
        self.query_ids = tokenizer(texts, add_special_tokens=False, truncation=True,
                                   max_length=cfg.data.max_query_tokens)["input_ids"]

    def __len__(self) -> int:
        return len(self.items)

    def batch(self, indices: list[int], pixels: bool = True) -> dict:
        image_cfg = self.cfg.image
        visual, ious = [], []
        for i in indices:
            item = self.items[i]
            image = self.images[item["image_id"]]
            regions = self.regions[item["image_id"]]
            visual.append(load_image(Path(image_cfg.root) / image["file_name"], regions, image_cfg,
                                     f"ref_id {item['ref_id']}", pixels))
            iou = box_iou(torch.from_numpy(regions), torch.tensor([item["target"]]))[:, 0]
            ious.append(iou)
        out = collate_visual(visual)
        out["image_keys"] = [str(self.items[i]["image_id"]) for i in indices]
        n = out["boxes"].shape[1]
        out["iou"] = torch.stack([F.pad(iou, (0, n - len(iou)), value=0.0) for iou in ious])  # [B, N]
        out["label"] = (out["iou"] > self.cfg.positive_iou).float()
        out["a_ids"], out["a_mask"] = pad_lists([self.query_ids[i] for i in indices])
        return out


# --- the model ------------------------------------------------------------------------------------------------

class RefModel(nn.Module):
    def __init__(self, vl_bert, dropout: float, head: str = "mlp"):
        super().__init__()
        h = vl_bert.cfg.hidden_size
        self.vl_bert = vl_bert
        if head == "mlp":
            self.scorer = nn.Sequential(nn.Dropout(dropout), nn.Linear(h, h), nn.ReLU(), nn.Dropout(dropout),
                                        nn.Linear(h, 1))
        elif head == "mvrc":  # refcoco/modules/resnet_vlbert_for_refcoco.py's final_mlp, index for index
            self.scorer = nn.Sequential(BertPredictionHeadTransform(vl_bert.cfg, norm=vl_bert.cfg.mrc_head_norm),
                                        nn.Dropout(dropout), nn.Linear(h, 1))
        else:
            raise ValueError(f"head: '{head}' is not mlp or mvrc")
        for m in self.scorer:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=vl_bert.cfg.initializer_range)
                nn.init.zeros_(m.bias)

    def logits(self, batch: dict) -> torch.Tensor:
        """[B, N] one score per candidate region (padding: -inf)."""
        out = encode(self.vl_bert, batch)
        scores = self.scorer(out.region_hidden[:, 1:]).squeeze(-1)  # element 0 is the whole image
        return scores.masked_fill(~batch["box_mask"], float("-inf"))

    def forward(self, batch: dict):
        logits = self.logits(batch)
        valid = batch["box_mask"]
        # the mean over real regions, by weights rather than boolean indexing (which syncs with the host)
        loss = F.binary_cross_entropy_with_logits(logits.masked_fill(~valid, 0.0), batch["label"], weight=valid.float(),
                                                  reduction="sum") / valid.sum().clamp(min=1)
        hit = batch["iou"].gather(1, logits.argmax(1, keepdim=True)) >= 0.5
        return loss, {"loss/total": loss.detach(), "acc/iou_0.5": hit.float().mean().detach()}


class RefTask(TaskSpec, name="refcoco", config=RefConfig):
    @staticmethod
    def dataset(cfg: RefConfig, tokenizer, info: dict | None, train: bool):
        return RefSet(cfg, "train" if train else cfg.eval_split, tokenizer, train=train)

    @staticmethod
    def build_module(pretrained, cfg: RefConfig, train: RefSet):
        model = RefModel(pretrained.vl_bert, cfg.classifier_dropout, cfg.head)
        if cfg.head == "mvrc":  # as the official PARTIAL_PRETRAIN_PREFIX_CHANGES: mvrc_head.transform -> final_mlp.0
            copy_transform(model.scorer[0], pretrained.masked_roi_classification.transform)
        return model, {
            "task": "refcoco", "track": cfg.track, "classifier_dropout": cfg.classifier_dropout, "head": cfg.head,
            "image": vars(cfg.image), "max_query_tokens": cfg.data.max_query_tokens}

    @staticmethod
    def rebuild(vl_bert, info: dict):
        return RefModel(vl_bert, info["classifier_dropout"], info.get("head", "mlp"))

    @staticmethod
    def evaluate(model: RefModel, data: RefSet, cfg: RefConfig, run_dir: Path, device) -> dict:
        preds, hits, chance = [], [], []
        for idx, batch in eval_batches(data, cfg.eval_batch_size, cfg.max_eval_examples, "refcoco eval"):
            logits = model.logits(to_device(batch, device)).float().cpu()
            best = logits.argmax(1)
            for row, i in enumerate(idx):
                item = data.items[i]
                k = int(best[row])
                box = data.regions[item["image_id"]][k]
                iou = float(batch["iou"][row, k])
                hits.append(iou >= 0.5)
                valid = batch["box_mask"][row]
                chance.append(float((batch["iou"][row][valid] >= 0.5).float().mean()))
                preds.append({"ref_id": item["ref_id"], "sent_id": item["sent_id"], "image_id": item["image_id"],
                              "box": [round(float(v), 2) for v in box],
                              "score": float(logits[row, k]), "iou": round(iou, 4)})
        (run_dir / f"predictions_{cfg.eval_split}.json").write_text(json.dumps(preds))
        return {"split": cfg.eval_split, "track": cfg.track, "expressions": len(hits),
                "accuracy": round(100.0 * sum(hits) / len(hits), 2),
                "chance": round(100.0 * sum(chance) / len(chance), 2)}

    @staticmethod
    def summary(metrics: dict) -> str:
        return (f"accuracy@IoU0.5 {metrics['accuracy']:.2f} over {metrics['expressions']} expressions "
                f"({metrics['track']} regions; a random candidate scores {metrics['chance']:.2f})")


def main(argv: list[str] | None = None) -> int:
    return finetune_main(RefTask, argv)


if __name__ == "__main__":
    sys.exit(entry_point(main))
