"""The cross-modal diagnostic's held-out examples: Flickr30k Entities phrases with their gold boxes, the
image's regions, and which regions an Object ablation or an MRC target takes (IoT/IoU rules as batched
tensor ops)."""

from __future__ import annotations

import json
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from model.boxes import box_iot, box_iou
from shards.caption_inputs import image_regions, load_box_file
from shards.collate import collate_captions, pad_ids
from shards.decode import decode_resized
from shards.flickr30k_entities import load_phrase_examples
from shards.shapes_world import COLOURS
from shards.skips import SkipLog

from .config import DiagnosticConfig

COLOUR_WORDS = frozenset(COLOURS)


def regions_over(regions: torch.Tensor, box_mask: torch.Tensor, targets: torch.Tensor, target_mask: torch.Tensor,
                 tau: float) -> torch.Tensor:
    """[B, N] True where a region's intersection over target exceeds tau for any valid target.
    regions [B, N, 4], box_mask [B, N], targets [B, K, 4], target_mask [B, K]."""
    iot = box_iot(regions, targets)  # [B, N, K]: intersection / target area
    return ((iot > tau) & target_mask.unsqueeze(1)).any(-1) & box_mask


def choose_targets(regions: torch.Tensor, box_mask: torch.Tensor, gold: torch.Tensor, gold_mask: torch.Tensor,
                   tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The MRC target per example ([B], -1 where no region is over a gold box) and the regions masked
    with it ([B, N]: the target and every region whose IoT over the target exceeds tau)."""
    candidates = regions_over(regions, box_mask, gold, gold_mask, tau)
    iou = box_iou(regions, gold).masked_fill(~gold_mask.unsqueeze(1), -1.0).amax(-1)  # [B, N]
    best = iou.masked_fill(~candidates, -2.0).argmax(1)  # [B]
    found = candidates.any(1)
    target_box = regions.gather(1, best.view(-1, 1, 1).expand(-1, 1, 4))  # [B, 1, 4]
    masked = regions_over(regions, box_mask, target_box, found.unsqueeze(1), tau)
    return torch.where(found, best, torch.full_like(best, -1)), masked


def gold_label(words: list[str], class_index: dict[str, int]) -> int:
    """The class named by the phrase's last word that names one (plural -s/-es stripped), else -1."""
    for word in reversed(words):
        w = word.lower()
        for form in (w, w[:-1] if w.endswith("s") else None, w[:-2] if w.endswith("es") else None):
            if form and form in class_index:
                return class_index[form]
    return -1


@dataclass
class _Item:
    image_id: str
    ids: torch.Tensor  # [T] word-pieces of the sentence
    phrase: torch.Tensor  # [T] bool: the phrase's word-pieces
    gold: torch.Tensor  # [K, 4] original-image pixels
    gold_label: int
    boxes: torch.Tensor  # [N, 4] original-image pixels
    classes: torch.Tensor
    scores: torch.Tensor
    probs: torch.Tensor  # [N, C] the detector's class distributions (one-hot of its class if absent)


class PhraseData:
    """The split's phrase examples with their regions, tokenised once; batches keep image order so a
    batch decodes few images."""

    def __init__(self, cfg: DiagnosticConfig, tokenizer, num_classes: int | None, extractor=None):
        """num_classes: the model's MRC classes, checked against the box file (None: not checked, for a
        text-only model that scores no region). extractor: for a model that reads precomputed features
        (`region_input: features`), the frozen Fast R-CNN that made its training features
        (`pretrain.features.FeatureExtractor`); batches then carry region_features + image_hw."""
        self.cfg = cfg
        self.extractor = extractor
        self._features: dict[int, list[torch.Tensor]] = {}
        examples, self.left_out = load_phrase_examples(cfg.flickr_root, cfg.split)
        box_skips = SkipLog("box file lines")
        boxes = load_box_file(cfg.boxes, box_skips, num_classes)
        if box_skips.skipped:
            raise ValueError(f"{cfg.boxes}: {box_skips.summary()}")
        class_index = {}
        if cfg.class_names:
            names = json.loads(Path(cfg.class_names).read_text())
            class_index = {str(n).lower(): i for i, n in enumerate(names) if i > 0}
        if num_classes is None:  # one width for every item's class distribution, so batches collate
            num_classes = max(e.class_probs.shape[1] if e.class_probs is not None else int(e.classes.max()) + 1
                              for e in boxes.values())
        self.skipped: Counter = Counter()
        tokens: dict[tuple[str, int], tuple[list[int], list[int | None]]] = {}
        items = []
        for ex in examples:
            entry, problem = image_regions(boxes, ex.image_id, ex.width, ex.height)
            if entry is None:
                self.skipped[problem] += 1
                continue
            key = (ex.image_id, ex.sentence_index)
            if key not in tokens:
                enc = tokenizer(ex.sentence.words, add_special_tokens=False, is_split_into_words=True)
                tokens[key] = (enc["input_ids"], enc.word_ids())
            ids, word_ids = tokens[key]
            if len(ids) > cfg.max_words:
                self.skipped[f"sentence longer than max_words={cfg.max_words} word-pieces"] += 1
                continue
            phrase = [w is not None and ex.phrase.first_word <= w < ex.phrase.end for w in word_ids]
            if cfg.phrase_words == "colour":
                phrase = [p and ex.sentence.words[w].lower() in COLOUR_WORDS for p, w in zip(phrase, word_ids)]
                if not any(phrase):
                    self.skipped["phrase has no colour word (phrase_words=colour)"] += 1
                    continue
            elif cfg.phrase_words != "all":
                raise ValueError(f"phrase_words: '{cfg.phrase_words}' is not all or colour")
            label = gold_label(ex.phrase.words, class_index)
            keep = np.argsort(-entry.scores, kind="stable")[: cfg.max_regions]
            probs = (torch.from_numpy(entry.class_probs[keep].astype(np.float32)) if entry.class_probs is not None
                     else F.one_hot(torch.from_numpy(entry.classes[keep]), num_classes).float())
            items.append(_Item(ex.image_id, torch.tensor(ids), torch.tensor(phrase), ex.gold_boxes, label,
                               torch.from_numpy(entry.boxes[keep]), torch.from_numpy(entry.classes[keep]),
                               torch.from_numpy(entry.scores[keep]), probs))
        if cfg.max_examples and len(items) > cfg.max_examples:
            pick = np.random.default_rng(cfg.seed).choice(len(items), cfg.max_examples, replace=False)
            items = [items[i] for i in sorted(pick)]
        if not items:
            raise ValueError(f"{cfg.flickr_root} ({cfg.split}): no example left to score; skipped: "
                             f"{dict(self.skipped)}, left out: {dict(self.left_out)}")
        self.items = items
        self.no_gold_label = sum(it.gold_label < 0 for it in items)
        self._images: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    def __len__(self) -> int:
        return len(self.items)

    def _image(self, image_id: str):
        if image_id not in self._images:
            path = Path(self.cfg.images) / f"{image_id}.jpg"
            image, scale, _ = decode_resized(path.read_bytes(), self.cfg.short_side, self.cfg.long_side)
            self._images[image_id] = image, scale
            while len(self._images) > 4 * self.cfg.batch_size:
                self._images.popitem(last=False)
        return self._images[image_id]

    def batches(self):
        for start in range(0, len(self.items), self.cfg.batch_size):
            chunk = self.items[start: start + self.cfg.batch_size]
            samples, golds = [], []
            for it in chunk:
                image, scale = self._image(it.image_id)
                samples.append({"key": it.image_id, "image": image, "boxes": it.boxes * scale, "scores": it.scores,
                                "classes": it.classes, "class_probs": it.probs, "input_ids": it.ids,
                                "resize_scale": float(scale[:2].max())})
                golds.append(it.gold * scale)
            if self.extractor is not None:  # the same extractor as in training, once per batch
                if start not in self._features:
                    self._features[start] = self.extractor(samples)
                for sample, feats in zip(samples, self._features[start], strict=True):
                    sample["region_features"], sample["image_hw"] = feats, tuple(sample.pop("image").shape[1:])
            batch = collate_captions(samples)
            batch["phrase"], _ = pad_ids([it.phrase.long() for it in chunk])
            batch["phrase"] = batch["phrase"].bool()
            k = max(len(g) for g in golds)
            batch["gold"] = torch.zeros(len(chunk), k, 4)
            batch["gold_mask"] = torch.zeros(len(chunk), k, dtype=torch.bool)
            for i, g in enumerate(golds):
                batch["gold"][i, : len(g)], batch["gold_mask"][i, : len(g)] = g, True
            batch["gold_label"] = torch.tensor([it.gold_label for it in chunk])
            batch["class_probs"] = batch["class_probs"].float()
            yield batch
