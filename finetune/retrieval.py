"""Image-text retrieval (Flickr30k / COCO style): caption -> image and image -> caption, recall@1/5/10.

    python -m finetune.retrieval --config launch/configs/retrieval_demo.yaml [--eval-only] [key=value ...]
    bash launch/finetune_retrieval.sh                    # the demo: train, then rank val's images and captions

Reads Karpathy's split file as distributed (`dataset_flickr30k.json` / `dataset_coco.json`: `images[]` with
`split`, `filename` (COCO: and `filepath`), `sentences[].raw`; COCO's "restval" trains with "train"), images
from a folder and their regions from a box file (`python -m shards.detect` writes one).

A cross-encoder, as VL-BERT scores image-text pairs: `[CLS] caption [SEP] [IMG]... [END]`, a linear scorer on
the pooled [CLS] (image-text matching, ITM). Training: each caption of the batch against its image and the
`hard_negatives` other images of the batch that score highest, and each image against its caption and the
other captions that score highest (captions of the same image never count as negatives); a softmax over the
positive and its negatives, both directions averaged.

Which pairs score highest, and which pairs evaluation scores, depends on `first_stage`:
- "itc" (the default, as ALBEF, Li et al. 2021): the same encoder also embeds each caption alone
  (`[CLS] caption [SEP]`) and each image alone (`[CLS] [SEP] [IMG]... [END]`), their mean final states
  projected to unit vectors and trained with an in-batch contrastive loss (ITC, a learnt temperature; captions
  of one image are all positives). The hard negatives are the ITC similarities' highest, and evaluation ranks
  every pair by ITC, then re-ranks each caption's `shortlist` best images and each image's `shortlist` best
  captions by the cross-encoder's logit plus ITC's (the rest below them, in ITC's order): at most 2 x shortlist
  x (captions + images) pair passes instead of captions x images.
- "none": one pass without gradients over all batch x batch pairs finds the hard negatives, and evaluation
  scores every (caption, image) pair with the cross-encoder (the paper-style protocol; also `shortlist=0`
  with an ITC model).
Evaluation reports text->image recall@K (the caption's image among the top K images), image->text recall@K
(any of the image's captions among the top K captions), their sum (RSUM), the recall of a random ranking beside
each, 95% intervals from a bootstrap over images, and with a shortlist the first stage's own recall@K and how
often the right item reached the shortlist. Outputs under engine.run_dir: `metrics_<split>.json`,
`rankings_<split>.json` (each caption's and image's top 10), TensorBoard, checkpoints, `model/`.
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
from model.config import ConfigError, required
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
    # "itc": a contrastive first stage picks the hard negatives and the pairs evaluation re-ranks; "none": the
    # cross-encoder scores all batch x batch pairs to mine and every pair of the split to rank (docstring)
    first_stage: str = "itc"
    embed_size: int = 256  # the first stage's unit vectors
    # the contrastive loss' weight beside the cross-encoder's: at 1 it took the shared encoder and the cross-encoder
    # learnt less (docs/FINETUNE.md, session 34)
    itc_weight: float = 0.1
    shortlist: int = 16  # per caption and per image, the first stage's best re-ranked; 0: every pair

    def __post_init__(self):
        if self.first_stage not in ("itc", "none"):
            raise ConfigError(f"first_stage: 'itc' or 'none', not {self.first_stage!r}")
        if self.shortlist < 0:
            raise ConfigError(f"shortlist: >= 0 (0 ranks every pair), not {self.shortlist}")


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


def pairs_positions(caption_tokens: np.ndarray, regions: np.ndarray) -> int:
    """The non-padding positions (`with_positions`' count) of the pairs whose captions have `caption_tokens`
    word-pieces (each with [CLS] and [SEP]) and whose images have `regions` regions (each with its whole-image
    element and [END]), one entry per pair."""
    return int(caption_tokens.sum() + regions.sum()) + 4 * len(caption_tokens)


def shortlists(similarity: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """From [captions, images] first-stage similarities, boolean masks of the same shape: each caption's k most
    similar images (by_caption) and each image's k most similar captions (by_image); ties in index order."""
    by_caption = np.zeros(similarity.shape, dtype=bool)
    np.put_along_axis(by_caption, np.argsort(-similarity, axis=1, kind="stable")[:, :k], True, axis=1)
    by_image = np.zeros(similarity.shape, dtype=bool)
    np.put_along_axis(by_image, np.argsort(-similarity, axis=0, kind="stable")[:k], True, axis=0)
    return by_caption, by_image


def two_stage(first: np.ndarray, second: np.ndarray, shortlisted: np.ndarray) -> np.ndarray:
    """One score matrix for a two-stage ranking: the shortlisted pairs by `second` (the cross-encoder), every one
    of them above every other pair, and the others in `first`'s order below them."""
    floor = second[shortlisted].min() - 1.0
    return np.where(shortlisted, second, floor - (first.max() - first)).astype(np.float64)


@torch.no_grad()
def first_stage_similarity(model: RetrievalModel, data, gallery: dict, visual, regions: np.ndarray, chunk: int,
                           device) -> np.ndarray:
    """[captions, images] cosine similarities of the split's captions alone and its gallery's images alone
    (`regions`: each gallery image's region count, on the host)."""
    images = []
    for start in range(0, gallery["box_mask"].shape[0], chunk):
        part = slice(start, start + chunk)
        count = pairs_positions(np.zeros_like(regions[part]), regions[part])  # no words: [CLS] [SEP] and the image
        images.append(model.image_embeddings(gallery["boxes"][part], gallery["box_mask"][part],
                                             tuple(v[part] for v in visual), count))
    images = torch.cat(images)
    out = []
    for start in tqdm(range(0, len(data.items), chunk), desc="retrieval: first stage, captions", unit="batch"):
        ids, mask = pad_lists(data.caption_ids[start: start + chunk])  # a caption alone is short: little padding
        out.append((model.caption_embeddings(ids.to(device), mask.to(device)) @ images.T).float().cpu())
    return torch.cat(out).numpy()


@torch.no_grad()
def cross_scores(model: RetrievalModel, data, gallery: dict, visual, chosen: np.ndarray, regions: np.ndarray,
                 chunk: int, desc: str) -> np.ndarray:
    """The cross-encoder's score of each chosen (caption, image) pair of [captions, images] `chosen`, `chunk`
    pairs a forward; NaN where not chosen."""
    out = np.full(chosen.shape, np.nan, dtype=np.float32)
    captions, images = np.nonzero(chosen)  # grouped by caption
    lengths = np.array([len(ids) for ids in data.caption_ids])
    device = gallery["box_mask"].device
    for start in tqdm(range(0, len(captions), chunk), desc=desc, unit="batch"):
        c, m = captions[start: start + chunk], images[start: start + chunk]
        unique, row = np.unique(c, return_inverse=True)
        ids, mask = pad_lists([data.caption_ids[i] for i in unique])
        pairs = dict(gallery, a_ids=ids.to(device), a_mask=mask.to(device))
        out[c, m] = model.pair_scores(pairs, visual, torch.from_numpy(row).to(device), torch.from_numpy(m).to(device),
                                      pairs_positions(lengths[c], regions[m])).float().cpu().numpy()
    return out


def hardest_others(every: torch.Tensor, image: torch.Tensor, k: int):
    """From the [captions, images] scores of a batch's rows (row i: caption i, image i of image index image[i]):
    per caption the k highest-scoring images of other image indices, per image the k highest-scoring captions of
    other images (topk results, [B, k] and [k, B]); fewer than k others leave -inf values."""
    every = every.float().masked_fill(image[:, None] == image[None, :], float("-inf"))
    return every.topk(k, dim=1), every.topk(k, dim=0)


def host_count(batch: dict, captions: torch.Tensor | None, images: torch.Tensor) -> int | None:
    """`with_positions`' count of the pairs (captions[p], images[p]) where the hard negatives were picked on the
    host (CPU): counting there costs no sync, and the trained pairs skip their padding; on an accelerator it
    would cost one, so they run padded (None). Only where the loader counts positions (`real_positions`).
    captions None: the images alone (`image_embeddings`' sequences, no words)."""
    if images.device.type != "cpu" or "real_positions" not in batch:
        return None
    box_mask = batch["box_mask"][images]
    a_mask = batch["a_mask"][captions] if captions is not None else box_mask.new_zeros(len(images), 0)
    return with_positions({"a_mask": a_mask, "box_mask": box_mask})["real_positions"]


def mean_state(out) -> torch.Tensor:
    """[B, hidden]: the mean of a sequence's last hidden states over its real positions. The first stage reads
    this, not the pooled [CLS] the cross-encoder scores: sharing the pooler, one of the two losses took it and
    the other learnt nothing (docs/FINETUNE.md, session 34); and the packaged MiniLM was trained as a
    mean-pooled sentence embedding."""
    mask = out.attention_mask.unsqueeze(-1).to(out.last_hidden_state.dtype)
    return (out.last_hidden_state * mask).sum(1) / mask.sum(1)


def itc_loss(similarity: torch.Tensor, image: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """The in-batch contrastive loss of [B, B] cosine similarities (row i: caption i, column j: row j's image):
    cross-entropy of each row's softmax and each column's against the rows of the same image index, shared
    equally (two captions of one image in a batch are both right), the two directions averaged."""
    logits = similarity.float() / temperature
    same = (image[:, None] == image[None, :]).float()
    target = same / same.sum(1, keepdim=True)  # symmetric: rows of one image share their count
    text_to_image = -(logits.log_softmax(1) * target).sum(1).mean()
    image_to_text = -(logits.log_softmax(0) * target).sum(0).mean()
    return (text_to_image + image_to_text) / 2


class RetrievalModel(nn.Module):
    def __init__(self, vl_bert, dropout: float, hard_negatives: int = 1, first_stage: str = "none",
                 embed_size: int = 256, itc_weight: float = 0.1):
        super().__init__()
        self.vl_bert = vl_bert
        self.hard_negatives = hard_negatives
        self.itc_weight = itc_weight
        hidden, std = vl_bert.cfg.hidden_size, vl_bert.cfg.initializer_range
        self.scorer = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, 1))
        nn.init.normal_(self.scorer[1].weight, std=std)
        nn.init.zeros_(self.scorer[1].bias)
        self.first_stage = first_stage
        if first_stage == "itc":
            self.text_projection = nn.Linear(hidden, embed_size)
            self.image_projection = nn.Linear(hidden, embed_size)
            for layer in (self.text_projection, self.image_projection):
                nn.init.normal_(layer.weight, std=std)
                nn.init.zeros_(layer.bias)
            # ALBEF's start; one element, not 0-d: DeepSpeed broadcasts parameters as bytes
            self.temperature = nn.Parameter(torch.full((1,), 0.07))

    def itc_temperature(self) -> torch.Tensor:
        """The learnt temperature as the contrastive loss and the ranking use it: kept in ALBEF's [0.001, 0.5]."""
        return self.temperature.clamp(0.001, 0.5)

    def caption_embeddings(self, a_ids: torch.Tensor, a_mask: torch.Tensor) -> torch.Tensor:
        """[B, embed_size] unit vectors of captions alone: `[CLS] caption [SEP]`, the text-only sequence
        pretraining's text corpus trains."""
        out = encode(self.vl_bert, {"a_ids": a_ids, "a_mask": a_mask, "boxes": None, "box_mask": None})
        return F.normalize(self.text_projection(mean_state(out)).float(), dim=-1)

    def image_embeddings(self, boxes: torch.Tensor, box_mask: torch.Tensor, visual,
                         real_positions: int | None = None) -> torch.Tensor:
        """[B, embed_size] unit vectors of images alone: `[CLS] [SEP] [IMG]... [END]`, no words."""
        empty = torch.zeros(box_mask.shape[0], 0, dtype=torch.long, device=box_mask.device)
        images = {"a_ids": empty, "a_mask": empty.bool(), "boxes": boxes, "box_mask": box_mask,
                  "real_positions": real_positions}
        out = encode(self.vl_bert, images, visual_input=visual)
        return F.normalize(self.image_projection(mean_state(out)).float(), dim=-1)

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
        extra = {}
        if self.first_stage == "itc":  # the hard negatives: the contrastive first stage's most similar others
            similarity = self.caption_embeddings(batch["a_ids"], batch["a_mask"]) @ self.image_embeddings(
                batch["boxes"], batch["box_mask"], visual, host_count(batch, None, rows)).T
            temperature = self.itc_temperature()
            itc = itc_loss(similarity, image, temperature)
            hard_images, hard_captions = hardest_others(similarity.detach(), image, k)
            right = (image[similarity.detach().argmax(1)] == image).float().mean()
            extra = {"loss/itc": itc.detach(), "acc/itc_text_to_image": right,
                     "itc/temperature": temperature.detach()[0]}
        else:
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
        if extra:
            loss = loss + self.itc_weight * itc
        wins = (positive[:, 0] > other_images.amax(1)) & (positive[:, 0] > other_captions.amax(1))
        return loss, {"loss/total": loss.detach(), "loss/text_to_image": text_to_image.detach(),
                      "loss/image_to_text": image_to_text.detach(), "acc/beats_hard_negatives": wins.float().mean(),
                      **extra}


def random_recall(k: int, relevant: np.ndarray, total: int) -> float:
    """The mean recall@k of a uniformly random ranking of `total` items, each query with `relevant[q]` right
    ones: 1 - C(total - r, k) / C(total, k) (1 when k >= total: every item is in the top k)."""
    if k >= total:
        return 1.0
    return float(np.mean([1.0 - math.comb(total - int(r), k) / math.comb(total, k) for r in relevant]))


def percent(hits: np.ndarray) -> float:
    return round(100 * float(hits.mean()), 2)


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
        model = RetrievalModel(pretrained.vl_bert, cfg.classifier_dropout, cfg.hard_negatives, cfg.first_stage,
                               cfg.embed_size, cfg.itc_weight)
        return model, {"task": "retrieval", "classifier_dropout": cfg.classifier_dropout, "image": vars(cfg.image),
                       "max_caption_tokens": cfg.data.max_caption_tokens, "first_stage": cfg.first_stage,
                       "embed_size": cfg.embed_size}

    @staticmethod
    def rebuild(vl_bert, info: dict):
        # models saved before the first stage existed scored every pair with the cross-encoder
        return RetrievalModel(vl_bert, info["classifier_dropout"], first_stage=info.get("first_stage", "none"),
                              embed_size=info.get("embed_size", 256))

    @staticmethod
    def evaluate(model: RetrievalModel, data, cfg: RetrievalConfig, run_dir: Path, device) -> dict:
        if not isinstance(data, RegionFeatureCache):  # each image's regions once, not once per caption
            data = RegionFeatureCache(data, model.vl_bert.to(device), cfg.eval_batch_size, device,
                                      f"{cfg.eval_split} images")
        n_images, n_captions = len(data.image_paths), len(data.items)
        gallery = data.batch([data.first_example[m] for m in range(n_images)])
        regions = gallery["box_mask"].sum(1).numpy()  # on the host: each chunk's positions counted without a sync
        gallery = to_device(gallery, device)
        visual = (gallery["appearance"], gallery["boxes_norm"])
        caption_image = np.array([image for image, _ in data.items])
        metrics = {"split": cfg.eval_split, "images": n_images, "captions": n_captions}
        if model.first_stage == "itc" and cfg.shortlist > 0:
            first = first_stage_similarity(model, data, gallery, visual, regions, cfg.pair_batch_size, device)
            by_caption, by_image = shortlists(first, cfg.shortlist)
            cross = cross_scores(model, data, gallery, visual, by_caption | by_image, regions, cfg.pair_batch_size,
                                 f"retrieval: re-ranking {cfg.eval_split}'s shortlists")
            # a shortlisted pair's score: the cross-encoder's logit plus the first stage's (its cosine over the
            # learnt temperature), both trained in softmaxes over candidates, so their sum is the product of the two
            # experts (BLIP adds the bare cosine); the cross-encoder alone is reported beside it
            fused = cross + first / float(model.itc_temperature())
            scores = {"text_to_image": two_stage(first, fused, by_caption),
                      "image_to_text": two_stage(first, fused, by_image)}
            alone = recalls(first, caption_image)
            image_reached = np.zeros(n_images, dtype=bool)  # any of the image's captions in its shortlist
            np.logical_or.at(image_reached, caption_image, by_image[np.arange(n_captions), caption_image])
            cross_only = {"text_to_image": recalls(two_stage(first, cross, by_caption), caption_image),
                          "image_to_text": recalls(two_stage(first, cross, by_image), caption_image)}
            metrics["first_stage"] = {
                "shortlist": cfg.shortlist, "pairs_scored": int((by_caption | by_image).sum()),
                "pairs_all": n_captions * n_images,
                # how often the right item reached the re-ranking at all: the two-stage recall's ceiling
                "right_in_shortlist": {"text_to_image": percent(by_caption[np.arange(n_captions), caption_image]),
                                       "image_to_text": percent(image_reached)},
                **{direction: {f"R@{k}": percent(hit) for k, hit in by_k.items()} for direction, by_k in alone.items()},
                "cross_encoder_only": {direction: {f"R@{k}": percent(hit) for k, hit in by_k[direction].items()}
                                       for direction, by_k in cross_only.items()}}
        else:
            cross = cross_scores(model, data, gallery, visual, np.ones((n_captions, n_images), dtype=bool), regions,
                                 cfg.pair_batch_size, f"retrieval: ranking {cfg.eval_split}")
            scores = {"text_to_image": cross, "image_to_text": cross}
        hits = {direction: recalls(scores[direction], caption_image)[direction] for direction in scores}
        per_image = np.bincount(caption_image, minlength=n_images)
        chance = {"text_to_image": {k: random_recall(k, np.ones(len(caption_image), dtype=np.int64), n_images)
                                    for k in RECALL_AT},
                  "image_to_text": {k: random_recall(k, per_image, n_captions) for k in RECALL_AT}}
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
        top = np.argsort(-scores["text_to_image"], axis=1, kind="stable")[:, :10]
        top_captions = np.argsort(-scores["image_to_text"], axis=0, kind="stable")[:10].T
        rankings = {"text_to_image": [{"sentid": data.items[c][1], "image": data.image_paths[caption_image[c]],
                                       "top10": [data.image_paths[m] for m in top[c]]} for c in range(n_captions)],
                    "image_to_text": [{"image": data.image_paths[m],
                                       "top10": [data.items[c][1] for c in top_captions[m]]} for m in range(n_images)]}
        (run_dir / f"rankings_{cfg.eval_split}.json").write_text(json.dumps(rankings))
        return metrics

    @staticmethod
    def summary(metrics: dict) -> str:
        def line(direction: str) -> str:
            return ", ".join(f"{k} {v['recall']:.2f} (random {v['random']:.2f})"
                             for k, v in metrics[direction].items())
        text = (f"{metrics['images']} images, {metrics['captions']} captions; text->image {line('text_to_image')}; "
                f"image->text {line('image_to_text')}; RSUM {metrics['rsum']:.2f} "
                f"(random {metrics['rsum_random']:.2f})")
        if "first_stage" in metrics:
            first = metrics["first_stage"]
            text += (f"; the cross-encoder + ITC re-ranked each query's {first['shortlist']} best by ITC "
                     f"({first['pairs_scored']} of {first['pairs_all']} pairs; the right item among them: "
                     f"text->image {first['right_in_shortlist']['text_to_image']:.2f}%, image->text "
                     f"{first['right_in_shortlist']['image_to_text']:.2f}%; ITC alone R@1 "
                     f"{first['text_to_image']['R@1']:.2f} / {first['image_to_text']['R@1']:.2f})")
        return text


def main(argv: list[str] | None = None) -> int:
    return finetune_main(RetrievalTask, argv)


if __name__ == "__main__":
    sys.exit(entry_point(main))
