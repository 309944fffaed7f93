"""Image-text retrieval (Flickr30k / COCO style): caption -> image and image -> caption, recall@1/5/10.

    python -m finetune.retrieval --config launch/configs/retrieval_demo.yaml [--eval-only] [key=value ...]
    bash launch/finetune_retrieval.sh                    # the demo: train, then rank val's images and captions

Reads Karpathy's split file as distributed (`dataset_flickr30k.json` / `dataset_coco.json`: `images[]` with
`split`, `filename` (COCO: and `filepath`), `sentences[].raw`; COCO's "restval" trains with "train"), images
from a folder and their regions from a box file (`python -m shards.detect` writes one).

A cross-encoder, as VL-BERT scores image-text pairs: `[CLS] caption [SEP] [IMG]... [END]`, a linear scorer on
the pooled [CLS]. Training: each caption of the batch against its image and the `hard_negatives` other images
of the batch it scores highest, and each image against its caption and the other captions it scores highest
(one pass without gradients over all batch x batch pairs finds them, captions of the same image never count
as negatives); a softmax over the positive and its negatives, both directions averaged. Evaluation scores
every (caption, image) pair of the split: text->image recall@K (the caption's image among the top K images),
image->text recall@K (any of the image's captions among the top K captions), their sum (RSUM), the recall of
a random ranking beside each, and 95% intervals from a bootstrap over images. Outputs under engine.run_dir:
`metrics_<split>.json`, `rankings_<split>.json` (each caption's and image's top 10), TensorBoard,
checkpoints, `model/`.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from diagnostics.statistics import clustered_bootstrap
from model.config import required
from shards.skips import SkipLog
from train.engine import entry_point, to_device

from .common import (
    FinetuneConfig,
    RegionFeatureCache,
    TaskSpec,
    box_file_images,
    encode,
    finetune_main,
    pad_lists,
    read_box_files,
    with_positions,
)

RECALL_AT = (1, 5, 10)


@dataclass
class RetrievalDataConfig:
    karpathy: str = required()
    images: str = "images/{filename}"  # relative to image.root; {filepath} is COCO's image folder
    boxes: str = required()  # box file keyed by the image path above
    max_caption_tokens: int = 40


@dataclass
class RetrievalConfig(FinetuneConfig):
    data: RetrievalDataConfig = field(default_factory=RetrievalDataConfig)
    hard_negatives: int = 1  # per caption (images) and per image (captions), the batch's highest-scoring others
    classifier_dropout: float = 0.1
    pair_batch_size: int = 512  # (caption, image) pairs per forward when ranking a split


class RetrievalSet:
    """One example per (image, sentence) of a split; `image_index` names each example's image."""

    def __init__(self, cfg: RetrievalConfig, split: str, tokenizer):
        self.skips = SkipLog("examples")
        self.cfg = cfg
        path = Path(cfg.data.karpathy)
        try:
            images = json.loads(path.read_text())["images"]
        except FileNotFoundError:
            raise FileNotFoundError(f"data.karpathy: {path} not found") from None
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a Karpathy split file (a JSON object with 'images'): {e}") from None
        splits = ("train", "restval") if split == "train" else (split,)
        self.boxes = boxes = read_box_files(cfg.data.boxes, self.skips)
        self.image_paths: list[str] = []  # the box file's key of each image
        self.items: list[tuple[int, int]] = []  # (image index, sentence id)
        texts = []
        for k, image in enumerate(images):
            try:
                if image["split"] not in splits:
                    continue
                rel = cfg.data.images.format(filename=image["filename"], filepath=image.get("filepath", ""))
                sentences = [(int(s.get("sentid", -1)), s["raw"]) for s in image["sentences"]]
            except (KeyError, TypeError, AttributeError) as e:
                raise ValueError(f"{path}: images[{k}] lacks split, filename or sentences[].raw ({e})") from None
            if rel not in boxes:
                self.skips.skip("image without boxes", f"{path}: images[{k}] ({rel})")
                continue
            for sentid, raw in sentences:
                self.items.append((len(self.image_paths), sentid))
                texts.append(raw)
            self.image_paths.append(rel)
        if not self.items:
            raise ValueError(f"{path}: no usable images in split '{split}' ({dict(self.skips.reasons)})")
        self.caption_ids = tokenizer(texts, add_special_tokens=False, truncation=True,
                                     max_length=cfg.data.max_caption_tokens)["input_ids"]
        self.first_example = {}  # image index -> its first example
        for i, (image, _) in enumerate(self.items):
            self.first_example.setdefault(image, i)

    def __len__(self) -> int:
        return len(self.items)

    def batch(self, indices: list[int], pixels: bool = True) -> dict:
        keys = [self.image_paths[self.items[i][0]] for i in indices]
        out = box_file_images(self.cfg.image, self.boxes, keys, [f"sentid {self.items[i][1]}" for i in indices],
                              pixels)
        out["image_index"] = torch.tensor([self.items[i][0] for i in indices])
        out["a_ids"], out["a_mask"] = pad_lists([self.caption_ids[i] for i in indices])
        return out


def all_pairs_positions(caption_tokens: int, captions: int, regions: int, images: int) -> int:
    """The non-padding positions (`with_positions`' count) of every one of `captions` captions (`caption_tokens`
    word-pieces in all, each with [CLS] and [SEP]) paired with every one of `images` images (`regions` regions
    in all, each image with its whole-image element and [END])."""
    return images * (caption_tokens + 2 * captions) + captions * (regions + 2 * images)


def hardest_others(every: torch.Tensor, image: torch.Tensor, k: int):
    """From the [captions, images] scores of a batch's rows (row i: caption i, image i of image index image[i]):
    per caption the k highest-scoring images of other image indices, per image the k highest-scoring captions of
    other images (topk results, [B, k] and [k, B]); fewer than k others leave -inf values."""
    every = every.float().masked_fill(image[:, None] == image[None, :], float("-inf"))
    return every.topk(k, dim=1), every.topk(k, dim=0)


def host_count(batch: dict, captions: torch.Tensor, images: torch.Tensor) -> int | None:
    """`with_positions`' count of the pairs (captions[p], images[p]) where the hard negatives were picked on the
    host (CPU): counting there costs no sync, and the trained pairs skip their padding; on an accelerator it
    would cost one, so they run padded (None). Only where the loader counts positions (`real_positions`)."""
    if captions.device.type != "cpu" or "real_positions" not in batch:
        return None
    pairs = {"a_mask": batch["a_mask"][captions], "box_mask": batch["box_mask"][images]}
    return with_positions(pairs)["real_positions"]


class RetrievalModel(nn.Module):
    def __init__(self, vl_bert, dropout: float, hard_negatives: int = 1):
        super().__init__()
        self.vl_bert = vl_bert
        self.hard_negatives = hard_negatives
        self.scorer = nn.Sequential(nn.Dropout(dropout), nn.Linear(vl_bert.cfg.hidden_size, 1))
        nn.init.normal_(self.scorer[1].weight, std=vl_bert.cfg.initializer_range)
        nn.init.zeros_(self.scorer[1].bias)

    def visual(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's image as (appearance [B, 1+N, F], normalised boxes): cached, or from its pixels."""
        if "appearance" in batch:
            return batch["appearance"], batch["boxes_norm"]
        appearance, boxes_norm, _ = self.vl_bert.region_features(
            images=batch["images"], image_sizes=batch["image_sizes"], boxes=batch["boxes"], box_mask=batch["box_mask"])
        return appearance, boxes_norm

    def pair_scores(self, batch: dict, visual, captions: torch.Tensor, images: torch.Tensor,
                    real_positions: int | None = None) -> torch.Tensor:
        """[P] scores of the pairs (row captions[p]'s caption, row images[p]'s image). real_positions: the
        pairs' non-padding positions, counted on the host (`with_positions`' count), where the caller knows it
        without a sync: the encoder then skips the padding."""
        appearance, boxes_norm = visual
        pair = {"a_ids": batch["a_ids"][captions], "a_mask": batch["a_mask"][captions],
                "boxes": batch["boxes"][images], "box_mask": batch["box_mask"][images],
                "real_positions": real_positions}
        out = encode(self.vl_bert, pair, visual_input=(appearance[images], boxes_norm[images]))
        return self.scorer(out.pooled).squeeze(-1)

    def forward(self, batch: dict):
        image = batch["image_index"]
        b = image.shape[0]
        rows = torch.arange(b, device=image.device)
        k = max(1, min(self.hard_negatives, b - 1))
        visual = self.visual(batch)
        with torch.no_grad():  # the hard negatives: every caption of the batch against every image
            detached = tuple(v.detach() for v in visual)
            # each caption meets each image once: b times the batch's own positions (counted by the loader)
            every_positions = b * batch["real_positions"] if "real_positions" in batch else None
            every = self.pair_scores(batch, detached, rows.repeat_interleave(b), rows.repeat(b),
                                     every_positions).view(b, b)
            hard_images, hard_captions = hardest_others(every, image, k)
        captions = torch.cat([rows, rows.repeat_interleave(k), hard_captions.indices.T.reshape(-1)])
        images = torch.cat([rows, hard_images.indices.reshape(-1), rows.repeat_interleave(k)])
        scores = self.pair_scores(batch, visual, captions, images, host_count(batch, captions, images)).float()
        positive = scores[:b, None]
        # a batch with fewer than k other images leaves -inf picks: they stay out of the softmax
        other_images = scores[b: b + b * k].view(b, k).masked_fill(hard_images.values.isinf(), float("-inf"))
        other_captions = scores[b + b * k:].view(b, k).masked_fill(hard_captions.values.T.isinf(), float("-inf"))
        target = torch.zeros(b, dtype=torch.long, device=scores.device)
        text_to_image = F.cross_entropy(torch.cat([positive, other_images], 1), target)
        image_to_text = F.cross_entropy(torch.cat([positive, other_captions], 1), target)
        loss = (text_to_image + image_to_text) / 2
        wins = (positive[:, 0] > other_images.amax(1)) & (positive[:, 0] > other_captions.amax(1))
        return loss, {"loss/total": loss.detach(), "loss/text_to_image": text_to_image.detach(),
                      "loss/image_to_text": image_to_text.detach(), "acc/beats_hard_negatives": wins.float().mean()}


def random_recall(k: int, relevant: np.ndarray, total: int) -> float:
    """The mean recall@k of a uniformly random ranking of `total` items, each query with `relevant[q]` right
    ones: 1 - C(total - r, k) / C(total, k) (1 when k >= total: every item is in the top k)."""
    if k >= total:
        return 1.0
    return float(np.mean([1.0 - math.comb(total - int(r), k) / math.comb(total, k) for r in relevant]))


def recalls(scores: np.ndarray, caption_image: np.ndarray) -> dict:
    """Recall@K both ways from the [captions, images] score matrix and each caption's image. A tie with the
    right item counts against it (a constant scorer ranks it last, not first). Returns per-query hits."""
    right = scores[np.arange(len(scores)), caption_image]
    text_rank = (scores >= right[:, None]).sum(1) - 1  # the other images scoring at least as high
    # caption c's rank among all captions for its own image, then each image's best over its captions
    caption_rank = (scores[:, caption_image] >= right[None, :]).sum(0) - 1
    image_rank = np.full(scores.shape[1], len(scores), dtype=np.int64)
    np.minimum.at(image_rank, caption_image, caption_rank)
    return {"text_to_image": {k: text_rank < k for k in RECALL_AT},
            "image_to_text": {k: image_rank < k for k in RECALL_AT}}


class RetrievalTask(TaskSpec, name="retrieval", config=RetrievalConfig):
    @staticmethod
    def dataset(cfg: RetrievalConfig, tokenizer, info: dict | None, train: bool):
        return RetrievalSet(cfg, "train" if train else cfg.eval_split, tokenizer)

    @staticmethod
    def build_module(pretrained, cfg: RetrievalConfig, train: RetrievalSet):
        model = RetrievalModel(pretrained.vl_bert, cfg.classifier_dropout, cfg.hard_negatives)
        return model, {"task": "retrieval", "classifier_dropout": cfg.classifier_dropout, "image": vars(cfg.image),
                       "max_caption_tokens": cfg.data.max_caption_tokens}

    @staticmethod
    def rebuild(vl_bert, info: dict):
        return RetrievalModel(vl_bert, info["classifier_dropout"])

    @staticmethod
    def evaluate(model: RetrievalModel, data, cfg: RetrievalConfig, run_dir: Path, device) -> dict:
        if not isinstance(data, RegionFeatureCache):  # each image's regions once, not once per caption
            data = RegionFeatureCache(data, model.vl_bert.to(device), cfg.eval_batch_size, device,
                                      f"{cfg.eval_split} images")
        n_images = len(data.image_paths)
        gallery = data.batch([data.first_example[m] for m in range(n_images)])
        regions = int(gallery["box_mask"].sum())  # on the host: each chunk's positions are counted without a sync
        gallery = to_device(gallery, device)
        visual = (gallery["appearance"], gallery["boxes_norm"])
        caption_image = np.array([image for image, _ in data.items])
        scores = np.zeros((len(data.items), n_images), dtype=np.float32)
        per_chunk = max(1, cfg.pair_batch_size // n_images)
        images = torch.arange(n_images, device=device)
        for start in tqdm(range(0, len(data.items), per_chunk), desc=f"retrieval: ranking {cfg.eval_split}",
                          unit="batch"):
            chunk = list(range(start, min(len(data.items), start + per_chunk)))
            ids, mask = pad_lists([data.caption_ids[i] for i in chunk])
            pairs = dict(gallery, a_ids=ids.to(device).repeat_interleave(n_images, 0),
                         a_mask=mask.to(device).repeat_interleave(n_images, 0))
            rows = torch.arange(len(chunk) * n_images, device=device)
            positions = all_pairs_positions(int(mask.sum()), len(chunk), regions, n_images)
            scores[chunk] = model.pair_scores(pairs, visual, rows, images.repeat(len(chunk)), positions).float().view(
                len(chunk), n_images).cpu().numpy()
        hits = recalls(scores, caption_image)
        per_image = np.bincount(caption_image, minlength=n_images)
        metrics = {"split": cfg.eval_split, "images": n_images, "captions": len(data.items)}
        chance = {"text_to_image": {k: random_recall(k, np.ones(len(caption_image), dtype=np.int64), n_images)
                                    for k in RECALL_AT},
                  "image_to_text": {k: random_recall(k, per_image, len(data.items)) for k in RECALL_AT}}
        clusters = {"text_to_image": caption_image, "image_to_text": np.arange(n_images)}
        for direction, by_k in hits.items():
            metrics[direction] = {}
            for k, hit in by_k.items():
                boot = clustered_bootstrap(hit.astype(np.float64) * 100, clusters[direction])
                metrics[direction][f"R@{k}"] = {"recall": round(boot["mean"], 2),
                                                "ci95": [round(v, 2) for v in boot["ci95"]],
                                                "random": round(100 * chance[direction][k], 2)}
        metrics["rsum"] = round(sum(v["recall"] for d in hits for v in metrics[d].values()), 2)
        metrics["rsum_random"] = round(sum(v["random"] for d in hits for v in metrics[d].values()), 2)
        top = np.argsort(-scores, axis=1, kind="stable")[:, :10]
        top_captions = np.argsort(-scores, axis=0, kind="stable")[:10].T
        rankings = {"text_to_image": [{"sentid": data.items[c][1], "image": data.image_paths[caption_image[c]],
                                       "top10": [data.image_paths[m] for m in top[c]]} for c in range(len(scores))],
                    "image_to_text": [{"image": data.image_paths[m],
                                       "top10": [data.items[c][1] for c in top_captions[m]]} for m in range(n_images)]}
        (run_dir / f"rankings_{cfg.eval_split}.json").write_text(json.dumps(rankings))
        return metrics

    @staticmethod
    def summary(metrics: dict) -> str:
        def line(direction: str) -> str:
            return ", ".join(f"{k} {v['recall']:.2f} (random {v['random']:.2f})"
                             for k, v in metrics[direction].items())
        return (f"{metrics['images']} images, {metrics['captions']} captions; text->image {line('text_to_image')}; "
                f"image->text {line('image_to_text')}; RSUM {metrics['rsum']:.2f} "
                f"(random {metrics['rsum_random']:.2f})")


def main(argv: list[str] | None = None) -> int:
    return finetune_main(RetrievalTask, argv)


if __name__ == "__main__":
    sys.exit(entry_point(main))
