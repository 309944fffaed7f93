"""Cross-modal input ablation (Frank, Bugliarello & Elliott, EMNLP 2021): does a model use the image to
predict words (vision-for-language), and the words to predict regions (language-for-vision)?

    python -m pretrain.ablation --model vl=runs/demo/export --model no-image=runs/demo-noimg/export \\
        --text-baseline packaged --out runs/ablation [--config F] [key=value ...]

Data: Flickr30k Entities as distributed (`shards.flickr30k_entities`), the images, and a box file of
the images' detector regions keyed `<id>.jpg` (`python -m shards.detect` writes one), whose class
distributions are the MRC-KL targets. One example per (sentence, phrase) whose chain has a box.

Vision-for-language: every word-piece of the phrase is [MASK]ed (no 80/10/10) and the MLM head scores
them; the metric is the phrase's cross-entropy in bits (mean over its word-pieces, then over phrases).
Visual input: `none`; `object`, every region whose intersection over target (the gold box) with one of
the phrase's gold boxes exceeds tau is ablated; `all`, every region and the whole image are ablated.
An ablated region keeps its box and [IMG] token and takes an average region feature, so the input stays
in distribution: the average of the model's own pretraining features (`ablation_fill: training`, the
default), or the paper's average over the evaluation images (`evaluation`; the only one a model without
appearance standardisers has). The paper's choice is out of distribution for a model that never saw images
like the evaluation's, such as the image-ablated control (docs/ABLATION.md, session 19). Its pixels are
zeroed before the Fast R-CNN (end to end) or it is left out of the whole-image mean (precomputed
features), so the whole-image element, recomputed from what remains, carries nothing of it.

Language-for-vision: the target is, among regions whose IoT with a gold box exceeds tau, the one with
the highest IoU; it and every region whose IoT over it exceeds tau are masked as in pretraining
(pixels or features zeroed, RoI-[MASK] token) and the MRC head classifies the target. Text: `none`;
`phrase`, the phrase's word-pieces -> [MASK]; `all`, every word-piece -> [MASK]. Metrics in bits:
MRC-KL against the detector's class distribution of the target, and cross-entropy against the gold
label (the phrase's last word naming a detector class, as the paper's LabelMatch subset). An example
with no region over its gold box is skipped and counted, never scored.

Outputs under --out: results.json (per model: mean, 95% interval, n per condition; paired t-tests
between conditions; skip counts), results.md, figure2.png (bits per condition, one line per model) and
threshold_sweep.png (Object ablation's MLM bits against tau). `PeriodicDiagnostic` runs the same
measurement inside pretraining (`engine.eval_every`), to TensorBoard.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from model.boxes import box_iot, box_iou, normalise, with_whole_image
from model.config import load_config
from model.export import load_pretrained
from model.hf_import import config_from_hf, load_hf_bert
from model.vl_bert import VLBertForPretraining, assemble_text
from pretrain.features import FeatureExtractor
from shards.caption_inputs import image_regions, load_box_file
from shards.flickr30k_entities import load_phrase_examples
from shards.reader import collate_captions, decode_resized, pad_ids
from shards.shapes_world import COLOURS
from shards.skips import SkipLog
from shards.tokenizer import bert_source_dir, load_tokenizer

from .config import DiagnosticConfig
from .masking import grey_of, grey_resampling_rings

LN2 = math.log(2.0)
COLOUR_WORDS = frozenset(COLOURS)
VISION_FOR_LANGUAGE = ("none", "object", "object_masked", "all")
LANGUAGE_FOR_VISION = ("none", "phrase", "all")


# --- overlap rules (batched tensor ops) --------------------------------------------------------------

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


# --- data ---------------------------------------------------------------------------------------------

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


# --- the model side -----------------------------------------------------------------------------------

def _to(batch: dict, device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


ABLATION_FILLS = ("training", "evaluation")


def training_means(vb) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(whole image [F], region [F]): the average appearance of the model's own pretraining data, as its
    standardisers' running means keep it (an ablated element then standardises to exactly 0); None for a
    model without standardisers (e.g. an official checkpoint)."""
    emb = vb.embeddings
    whole, region = (getattr(emb, n, None) for n in ("whole_image_standardiser", "appearance_standardiser"))
    if whole is None or region is None or not bool(whole.initialised) or not bool(region.initialised):
        return None
    return whole.running_mean.float().clone(), region.running_mean.float().clone()


def resolve_fill(vb, fill: str) -> str:
    """The fill the ablation will use: `fill`, or "evaluation" where "training" has no statistics to read."""
    if fill not in ABLATION_FILLS:
        raise ValueError(f"ablation_fill: '{fill}' is not one of {', '.join(ABLATION_FILLS)}")
    return "training" if fill == "training" and training_means(vb) is not None else "evaluation"


class Ablator:
    """Runs one VLBertForPretraining on ablated inputs. `fit_means` first: the average region and
    whole-image features that ablated elements take (`fill`: see `HeldOutConfig.ablation_fill`)."""

    def __init__(self, model: VLBertForPretraining, device: torch.device | str = "cpu", fill: str = "training"):
        self.model, self.vb, self.cfg = model, model.vl_bert, model.cfg
        self.device = torch.device(device)
        self.fill = resolve_fill(self.vb, fill)
        self.region_mean: torch.Tensor | None = None
        self.whole_mean: torch.Tensor | None = None
        self.box_mean: torch.Tensor | None = None  # `fit_box_mean`: for the all_boxes condition

    def _visual_kwargs(self, b: dict) -> dict:
        if "region_features" in b:
            return {"region_features": b["region_features"], "image_hw": b["image_hw"]}
        return {"images": b["images"], "image_sizes": b["image_sizes"]}

    @torch.no_grad()
    def fit_means(self, batches) -> None:
        """The fill's averages: read off the model (`training`: `batches` is not consumed) or one pass
        over `batches` (`evaluation`)."""
        if self.fill == "training":
            self.whole_mean, self.region_mean = (m.to(self.device) for m in training_means(self.vb))
            return
        region_sum = whole_sum = 0.0
        regions = images = 0
        for b in batches:
            b = _to(b, self.device)
            appearance, _, _ = self.vb.region_features(boxes=b["boxes"], box_mask=b["box_mask"],
                                                       **self._visual_kwargs(b))
            appearance = appearance.float()
            region_sum = region_sum + (appearance[:, 1:] * b["box_mask"].unsqueeze(-1)).sum((0, 1))
            whole_sum = whole_sum + appearance[:, 0].sum(0)
            regions = regions + b["box_mask"].sum()
            images += appearance.shape[0]
        self.region_mean = region_sum / regions
        self.whole_mean = whole_sum / images

    @torch.no_grad()
    def fit_box_mean(self, batches) -> None:
        """The average normalised region box of `batches` (one pass, no CNN): what every region's box becomes in
        the all_boxes condition, where the geometry (and what a model reads off it, e.g. size names) is ablated
        with the appearance."""
        total, count = 0.0, 0
        for b in batches:
            b = _to(b, self.device)
            hw = b["image_hw"] if "image_hw" in b else b["image_sizes"]
            boxes = normalise(b["boxes"], hw).float()
            total = total + (boxes * b["box_mask"].unsqueeze(-1)).sum((0, 1))
            count = count + b["box_mask"].sum()
        self.box_mean = total / count

    def text(self, b: dict, ablate: str):
        """`[CLS] words [SEP]` with nothing, the phrase, or every word-piece as [MASK]."""
        ids, valid = b["input_ids"], b["attention_mask"]
        if ablate == "phrase":
            ids = ids.masked_fill(b["phrase"], self.cfg.mask_token_id)
        elif ablate == "all":
            ids = ids.masked_fill(valid, self.cfg.mask_token_id)
        elif ablate != "none":
            raise ValueError(f"text ablation '{ablate}' is not none, phrase or all")
        return assemble_text(ids, valid, cls_id=self.cfg.cls_token_id, sep_id=self.cfg.sep_token_id,
                             pad_id=self.cfg.pad_token_id)

    def visual(self, b: dict, ablated: torch.Tensor, whole: bool):
        """Appearance [B, 1+N, F] and normalised boxes with `ablated` regions (and the whole image if
        `whole`) set to the fill's averages; the rest computed without the ablated regions' pixels."""
        if self.region_mean is None:
            raise RuntimeError("Ablator.fit_means must run before ablating")
        bsz, n = ablated.shape
        mean = torch.cat([self.whole_mean.unsqueeze(0), self.region_mean.expand(n, -1)], 0)  # [1+N, F]
        if whole and bool((ablated == b["box_mask"]).all()):  # nothing of the image is left: no CNN to run
            hw = b["image_hw"] if "image_hw" in b else b["image_sizes"]
            inclusive = self.vb.cfg.fast_rcnn.box_convention == "inclusive"
            return mean.expand(bsz, -1, -1), normalise(with_whole_image(b["boxes"], hw, inclusive=inclusive), hw)
        appearance, boxes_norm, _ = self.vb.region_features(boxes=b["boxes"], box_mask=b["box_mask"],
                                                            masked_regions=ablated, **self._visual_kwargs(b))
        fill = torch.cat([torch.full_like(ablated[:, :1], whole), ablated], 1)  # [B, 1+N]
        return torch.where(fill.unsqueeze(-1), mean.to(appearance.dtype), appearance), boxes_norm

    def _phrase_bits(self, out, b: dict) -> torch.Tensor:
        positions = F.pad(b["phrase"], (1, 1))[:, : out.text_length]  # shifted by [CLS]
        labels = F.pad(b["input_ids"], (1, 1))[:, : out.text_length][positions]
        log_p = self.model.mlm_head(out.text_hidden[positions]).float().log_softmax(-1)
        bits = -log_p.gather(1, labels.unsqueeze(1)).squeeze(1) / LN2  # [M]
        rows = positions.nonzero()[:, 0]
        sums = torch.zeros(positions.shape[0], device=bits.device).index_add_(0, rows, bits)
        counts = positions.sum(1)
        return torch.where(counts > 0, sums / counts.clamp(min=1), torch.full_like(sums, float("nan")))

    @torch.no_grad()
    def vision_for_language(self, b: dict, condition: str, tau: float = 0.5) -> torch.Tensor:
        """Per example: the masked phrase's MLM cross-entropy in bits per word-piece [B]."""
        ids, types, mask = self.text(b, "phrase")
        if condition == "text_only":  # no visual input at all (a text-only BERT)
            return self._phrase_bits(self.vb(ids, mask, types), b)
        if condition == "none":
            ablated, whole = torch.zeros_like(b["box_mask"]), False
        elif condition == "object":
            ablated, whole = regions_over(b["boxes"], b["box_mask"], b["gold"], b["gold_mask"], tau), False
        elif condition == "object_masked":  # as masked RoIs in training: pixels zeroed, RoI-[MASK] token
            ablated = regions_over(b["boxes"], b["box_mask"], b["gold"], b["gold_mask"], tau)
            visual = self._visual_kwargs(b)
            if "images" in visual:  # and, as pretraining's masker does, the resampling ring around them greyed
                visual["images"] = grey_resampling_rings(visual["images"], b["boxes"], ablated, b.get("resize_scales"),
                                                         grey_of(self.vb.cfg.fast_rcnn.pixel_mean))
            out = self.vb(ids, mask, types, boxes=b["boxes"], box_mask=b["box_mask"], masked_regions=ablated,
                          **visual)
            return self._phrase_bits(out, b)
        elif condition == "all":
            ablated, whole = b["box_mask"], True
        elif condition == "all_boxes":  # all, and every region's box the average box (`fit_box_mean`)
            if self.box_mean is None:
                raise RuntimeError("the all_boxes condition needs Ablator.fit_box_mean first")
            appearance, boxes_norm = self.visual(b, b["box_mask"], True)
            boxes_norm = torch.cat([boxes_norm[:, :1], self.box_mean.to(boxes_norm).expand_as(boxes_norm[:, 1:])], 1)
            out = self.vb(ids, mask, types, boxes=b["boxes"], box_mask=b["box_mask"],
                          visual_input=(appearance, boxes_norm))
            return self._phrase_bits(out, b)
        elif condition == "grey":  # every pixel the pixel mean, boxes kept, no RoI-[MASK] token
            visual = self._visual_kwargs(b)
            if "images" not in visual:
                raise ValueError("visual ablation 'grey' needs images (the model reads precomputed features)")
            visual["images"] = grey_of(self.vb.cfg.fast_rcnn.pixel_mean).to(visual["images"]).expand_as(
                visual["images"]).clone()
            out = self.vb(ids, mask, types, boxes=b["boxes"], box_mask=b["box_mask"], **visual)
            return self._phrase_bits(out, b)
        else:
            raise ValueError(f"visual ablation '{condition}' is not none, object, object_masked, all, all_boxes, "
                             "grey or text_only")
        out = self.vb(ids, mask, types, boxes=b["boxes"], box_mask=b["box_mask"],
                      visual_input=self.visual(b, ablated, whole))
        return self._phrase_bits(out, b)

    @torch.no_grad()
    def language_for_vision(self, b: dict, conditions=LANGUAGE_FOR_VISION, tau: float = 0.5) -> dict:
        """Per text condition: MRC-KL and MRC cross-entropy (gold label) in bits per example, NaN where
        not scored ([B] each). The masked visual input is computed once and shared by the conditions."""
        target, masked = choose_targets(b["boxes"], b["box_mask"], b["gold"], b["gold_mask"], tau)
        appearance, boxes_norm, _ = self.vb.region_features(boxes=b["boxes"], box_mask=b["box_mask"],
                                                            masked_regions=masked, **self._visual_kwargs(b))
        rows = torch.arange(len(target), device=target.device)
        index = target.clamp(min=0)
        p = b["class_probs"][rows, index].float()
        p = p / p.sum(-1, keepdim=True).clamp(min=1e-12)  # stored as float16: renormalise
        found = target >= 0
        out = {}
        for condition in conditions:
            ids, types, mask = self.text(b, condition)
            enc = self.vb(ids, mask, types, boxes=b["boxes"], box_mask=b["box_mask"], masked_regions=masked,
                          visual_input=(appearance, boxes_norm))
            log_q = self.model.masked_roi_classification(enc.region_hidden[:, 1:][rows, index]).float().log_softmax(-1)
            kl = (p * (p.clamp(min=1e-12).log() - log_q)).sum(-1) / LN2
            xe = -log_q.gather(1, b["gold_label"].clamp(min=0).unsqueeze(1)).squeeze(1) / LN2
            nan = torch.full_like(kl, float("nan"))
            out[condition] = (torch.where(found, kl, nan), torch.where(found & (b["gold_label"] >= 0), xe, nan))
        return out


def evaluate(ablator: Ablator, data: PhraseData, *, image: bool = True, sweep: list | None = None,
             tau: float = 0.5, progress: bool = True, desc: str = "ablation") -> dict[str, np.ndarray]:
    """Per-example values for every condition, aligned with `data.items` (NaN = not scored)."""

    if image:
        ablator.fit_means(data.batches() if ablator.fill == "training" else
                          tqdm(data.batches(), total=math.ceil(len(data) / data.cfg.batch_size),
                               desc=f"{desc}: average features", disable=not progress, leave=False))
    out: dict[str, list] = {}
    bar = tqdm(data.batches(), total=math.ceil(len(data) / data.cfg.batch_size), desc=desc, disable=not progress)
    for b in bar:
        b = _to(b, ablator.device)
        values = {}
        # no visual input at all: a text-only model's only condition, and for a VL model (pretrained
        # on text-only samples too, so in distribution) the floor below `all`
        values["v4l/text_only"] = ablator.vision_for_language(b, "text_only")
        if image:
            for c in VISION_FOR_LANGUAGE:
                values[f"v4l/{c}"] = ablator.vision_for_language(b, c, tau)
            for c, (kl, xe) in ablator.language_for_vision(b, LANGUAGE_FOR_VISION, tau).items():
                values[f"l4v_kl/{c}"], values[f"l4v_xe/{c}"] = kl, xe
            for t in sweep or []:
                values[f"sweep/{t:g}"] = (values["v4l/object"] if t == tau else
                                          ablator.vision_for_language(b, "object", t))
        for k, v in values.items():  # evaluation, not the training hot loop: one transfer per batch
            out.setdefault(k, []).append(v.float().cpu().numpy())
    return {k: np.concatenate(v) for k, v in out.items()}


# --- statistics and reports ---------------------------------------------------------------------------

def clustered_bootstrap(values: np.ndarray, clusters: np.ndarray, *, resamples: int = 2000, seed: int = 0,
                        level: float = 0.95, return_draws: bool = False) -> dict:
    """Mean of `values` (NaN = not scored) and its percentile interval from resampling whole clusters
    with replacement: each resample draws as many clusters as there are, and its mean weights every
    example of a drawn cluster equally (the ratio estimator, as the mean over all examples is)."""
    ok = np.isfinite(values)
    v, c = values[ok].astype(np.float64), clusters[ok]
    if v.size == 0:
        return {"n": 0, "clusters": 0, "mean": None, "ci95": None}
    ids, inverse = np.unique(c, return_inverse=True)
    sums = np.bincount(inverse, weights=v, minlength=len(ids))
    counts = np.bincount(inverse, minlength=len(ids)).astype(np.float64)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(ids), size=(resamples, len(ids)))
    means = sums[draws].sum(1) / counts[draws].sum(1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    out = {"n": int(v.size), "clusters": int(len(ids)), "mean": float(v.mean()), "ci95": [float(lo), float(hi)]}
    if return_draws:
        out["draws"] = means
    return out


def summarise(values: np.ndarray, clusters: np.ndarray | None = None, resamples: int = 2000, seed: int = 0) -> dict:
    """Mean and 95% interval over the scored (finite) examples: from a bootstrap that resamples whole
    clusters (images: the phrases of one image are not independent) when `clusters` is given, else the
    t-interval over examples."""
    # lazy: scipy.stats (~0.9 s to import) only for the statistics
    from scipy import stats

    if clusters is not None and resamples:
        return clustered_bootstrap(values, clusters, resamples=resamples, seed=seed)
    v = values[np.isfinite(values)]
    n = int(v.size)
    if n == 0:
        return {"n": 0, "mean": None, "ci95": None}
    mean = float(v.mean())
    if n < 2 or float(v.std()) == 0.0:
        return {"n": n, "mean": mean, "ci95": [mean, mean]}
    lo, hi = stats.t.interval(0.95, n - 1, loc=mean, scale=stats.sem(v))
    return {"n": n, "mean": mean, "ci95": [float(lo), float(hi)]}


def paired_test(a: np.ndarray, b: np.ndarray, clusters: np.ndarray | None = None, resamples: int = 2000,
                seed: int = 0) -> dict:
    """b - a over examples scored in both: the paired t-test (examples as independent), and with
    `clusters` the difference's 95% interval from the clustered bootstrap and its two-sided bootstrap p
    (twice the share of resampled mean differences on the far side of 0)."""
    # lazy: scipy.stats (~0.9 s to import) only for the statistics
    from scipy import stats

    ok = np.isfinite(a) & np.isfinite(b)
    n = int(ok.sum())
    if n < 2:
        return {"n": n, "mean_diff": None, "t": None, "p": None}
    diff = b[ok] - a[ok]
    out: dict = {"n": n, "mean_diff": float(diff.mean()), "t": None, "p": None}
    if float(diff.std()) != 0.0:
        res = stats.ttest_rel(b[ok], a[ok])
        out.update(t=float(res.statistic), p=float(res.pvalue))
    if clusters is not None and resamples:
        boot = clustered_bootstrap(diff, clusters[ok], resamples=resamples, seed=seed, return_draws=True)
        draws = boot.pop("draws")
        side = np.mean(draws <= 0) if boot["mean"] > 0 else np.mean(draws >= 0)
        out.update(ci95=boot["ci95"], clusters=boot["clusters"], p_bootstrap=float(min(1.0, 2 * side)))
    return out


def model_report(values: dict[str, np.ndarray], data: PhraseData) -> dict:
    clusters = np.array([it.image_id for it in data.items])
    boot = {"clusters": clusters, "resamples": data.cfg.bootstrap, "seed": data.cfg.seed}
    groups: dict[str, dict] = {}
    for key, v in values.items():
        group, cond = key.split("/", 1)
        groups.setdefault(group, {})[cond] = summarise(v, **boot)
    tests = []
    for group, conditions in (("v4l", VISION_FOR_LANGUAGE), ("l4v_kl", LANGUAGE_FOR_VISION),
                              ("l4v_xe", LANGUAGE_FOR_VISION)):
        for i, a in enumerate(conditions):
            for b in conditions[i + 1:]:
                if f"{group}/{a}" in values and f"{group}/{b}" in values:
                    tests.append({"metric": group, "a": a, "b": b,
                                  **paired_test(values[f"{group}/{a}"], values[f"{group}/{b}"], **boot)})
    skipped = dict(data.skipped)
    if "l4v_kl/none" in values:
        unscored = len(data) - int(np.isfinite(values["l4v_kl/none"]).sum())
        if unscored:
            skipped["language-for-vision: no region over the gold box"] = unscored
    return {"examples": len(data), **groups, "paired_tests": tests, "skipped": skipped,
            "left_out_phrases": dict(data.left_out), "no_gold_label": int(data.no_gold_label)}


_NAMES = {"v4l": "Vision-for-language: MLM bits (phrase)", "l4v_kl": "Language-for-vision: MRC-KL bits",
          "l4v_xe": "Language-for-vision: MRC cross-entropy bits (gold label)"}


def format_interval(s: dict | None) -> str:
    """'mean [low, high]' of a summary, or '-' when nothing was scored."""
    if not s or s["mean"] is None:
        return "-"
    return f"{s['mean']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]"


def markdown(report: dict) -> str:
    lines = ["# Cross-modal input ablation", ""]
    for group, conditions in (("v4l", VISION_FOR_LANGUAGE), ("l4v_kl", LANGUAGE_FOR_VISION),
                              ("l4v_xe", LANGUAGE_FOR_VISION)):
        cols = list(conditions) + (["text_only"] if group == "v4l" else [])
        lines += [f"## {_NAMES[group]}", "", "mean [95% interval from a bootstrap over images], lower is better", "",
                  "| model | " + " | ".join(cols) + " | n |", "|---" * (len(cols) + 2) + "|"]
        for name, r in report["models"].items():
            g = r.get(group, {})
            if not g:
                continue
            n = max(s["n"] for s in g.values())
            lines.append(f"| {name} | " + " | ".join(format_interval(g.get(c)) for c in cols) + f" | {n} |")
        lines.append("")
    lines += ["## Paired differences (b - a): clustered bootstrap interval and p, and the t-test", "",
              "| model | metric | a | b | mean diff | 95% interval (images) | p (bootstrap) | t | p (t) | n |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    def fmt(x, spec):
        return "-" if x is None else format(x, spec)

    for name, r in report["models"].items():
        for t in r["paired_tests"]:
            ci = t.get("ci95")
            lines.append(f"| {name} | {t['metric']} | {t['a']} | {t['b']} | {fmt(t['mean_diff'], '.4f')} | "
                         + (f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "-") + f" | {fmt(t.get('p_bootstrap'), '.2g')} | "
                         f"{fmt(t['t'], '.2f')} | {fmt(t['p'], '.2g')} | {t['n']} |")
    lines += ["", "## Skipped and left out", ""]
    for name, r in report["models"].items():
        lines.append(f"- {name}: {r['examples']} examples; skipped {r['skipped'] or 'none'}; phrases left out "
                     f"{r['left_out_phrases'] or 'none'}; without a gold label (no XE) {r['no_gold_label']}"
                     + (f"; ablated elements take the {r['ablation_fill']} average" if "ablation_fill" in r else ""))
    return "\n".join(lines) + "\n"


def plot(report: dict, out: Path) -> list[Path]:
    # lazy: matplotlib (~0.5 s to import) only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = report["models"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, group, conditions, title in (
            (axes[0], "v4l", (*VISION_FOR_LANGUAGE, "text_only"), "Vision-for-language (MLM)"),
            (axes[1], "l4v_kl", LANGUAGE_FOR_VISION, "Language-for-vision (MRC-KL)")):
        for name, r in models.items():
            g = r.get(group, {})
            if set(g) == {"text_only"}:  # a text-only model: one value, drawn across the conditions
                ax.axhline(g["text_only"]["mean"], ls="--", color="grey", label=f"{name}")
                continue
            if not all(c in g and g[c]["mean"] is not None for c in conditions):
                continue
            means = [g[c]["mean"] for c in conditions]
            err = np.array([[m - g[c]["ci95"][0], g[c]["ci95"][1] - m] for m, c in zip(means, conditions)]).T
            ax.errorbar(range(len(conditions)), means, yerr=err, marker="o", capsize=3, label=name)
        ax.set_xticks(range(len(conditions)), [c.capitalize().replace("_", " ") for c in conditions])
        ax.set_xlabel("ablation")
        ax.set_ylabel("bits")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    paths = [out / "figure2.png"]
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)
    if any("sweep" in r for r in models.values()):
        fig, ax = plt.subplots(figsize=(5, 4))
        for name, r in models.items():
            if "sweep" not in r:
                continue
            taus = sorted(r["sweep"], key=float)
            ax.plot([float(t) for t in taus], [r["sweep"][t]["mean"] for t in taus], marker="o", label=name)
        ax.set_xlabel("co-ablation threshold tau (IoT with the gold box)")
        ax.set_ylabel("MLM bits, Object ablation")
        ax.set_title("Threshold sweep")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / "threshold_sweep.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


# --- inside pretraining -------------------------------------------------------------------------------

class PeriodicDiagnostic:
    """The diagnostic on a small held-out set as an engine evaluator: model -> scalars for TensorBoard.
    Every rank evaluates the same examples, so every rank makes the same forward calls (ZeRO-3 gathers
    parameters collectively); the values agree and rank 0 logs them."""

    def __init__(self, cfg: DiagnosticConfig, tokenizer, num_classes: int, extractor=None):
        self.cfg = cfg
        self.data = PhraseData(cfg, tokenizer, num_classes, extractor)

    def __call__(self, model: VLBertForPretraining, device) -> dict[str, float]:
        values = evaluate(Ablator(model, device, self.cfg.ablation_fill), self.data, tau=self.cfg.tau,
                          progress=False)
        scalars = {f"xmodal/{k}": float(np.nanmean(v)) for k, v in values.items()}
        scalars["xmodal/v4l_object_minus_none"] = scalars["xmodal/v4l/object"] - scalars["xmodal/v4l/none"]
        scalars["xmodal/v4l_all_minus_none"] = scalars["xmodal/v4l/all"] - scalars["xmodal/v4l/none"]
        scalars["xmodal/l4v_kl_all_minus_none"] = scalars["xmodal/l4v_kl/all"] - scalars["xmodal/l4v_kl/none"]
        return scalars


# --- command line -------------------------------------------------------------------------------------

def feature_extractor(model: VLBertForPretraining, device="cpu"):
    """The frozen Fast R-CNN a features model (`region_input: features`) was trained on, else None."""
    if model.cfg.region_input != "features" or model.cfg.visual_embedding != "vlbert":
        return None

    return FeatureExtractor(model.cfg.fast_rcnn, device)


def _text_baseline(path: str) -> tuple[VLBertForPretraining, Path]:
    bert_dir = bert_source_dir(path)
    model = VLBertForPretraining(config_from_hf(bert_dir, "base"), with_fast_rcnn=False)
    report = load_hf_bert(model, bert_dir)
    if not any(k.startswith("cls.predictions.") for k in report["loaded"]):
        raise ValueError(f"{bert_dir}: the checkpoint has no MLM head (cls.predictions.*), so its word "
                         "predictions would be random; a text-only baseline needs a BertForMaskedLM / "
                         "BertForPreTraining checkpoint (e.g. bert-base-uncased), or compare against a model "
                         "pretrained here with masking.ablate_image=true")
    return model, bert_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Cross-modal input ablation diagnostic (Frank et al. 2021)",
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=[], metavar="NAME=DIR",
                   help="an exported VL-BERT directory (repeat for several models side by side)")
    p.add_argument("--text-baseline", metavar="DIR",
                   help="a text-only HF BERT directory with its MLM head (BertForMaskedLM / BertForPreTraining)")
    p.add_argument("--config", help="DiagnosticConfig YAML")
    p.add_argument("--out", default="runs/ablation")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("overrides", nargs="*", help="DiagnosticConfig fields as key=value, e.g. max_examples=500")
    args = p.parse_args(argv)
    if not args.model and not args.text_baseline:
        p.error("give at least one --model NAME=DIR or --text-baseline")
    cfg = load_config(DiagnosticConfig, args.config, args.overrides)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"config": cfg.__dict__, "models": {}}
    runs = []
    for spec in args.model:
        name, sep, path = spec.partition("=")
        if not sep:
            p.error(f"--model '{spec}': expected NAME=DIR")
        runs.append((name, lambda path=path: (load_pretrained(path), path), True))
    if args.text_baseline:
        runs.append(("text-only BERT", lambda: _text_baseline(args.text_baseline), False))
    for name, load, with_image in runs:
        model, tokenizer_dir = load()
        model = model.to(args.device).eval()
        data = PhraseData(cfg, load_tokenizer(str(tokenizer_dir)), model.cfg.fast_rcnn.num_classes if with_image
                          else None, feature_extractor(model, args.device))
        ablator = Ablator(model, args.device, cfg.ablation_fill)
        values = evaluate(ablator, data, image=with_image, tau=cfg.tau, sweep=cfg.sweep if with_image else None,
                          desc=name)
        np.savez_compressed(out / f"per_example_{''.join(c if c.isalnum() else '_' for c in name)}.npz", **values)
        report["models"][name] = model_report(values, data)
        if with_image:
            report["models"][name]["ablation_fill"] = ablator.fill
            if ablator.fill != cfg.ablation_fill:
                print(f"{name}: no appearance standardisers to read a training average from: ablated elements "
                      f"take the evaluation images' average", flush=True)
        g = report["models"][name]["v4l"]
        print(f"{name}: vision-for-language bits "
              + ", ".join(f"{c} {format_interval(s)}" for c, s in g.items()), flush=True)
        if "l4v_kl" in report["models"][name]:
            print(f"{name}: language-for-vision MRC-KL bits " + ", ".join(
                f"{c} {format_interval(s)}" for c, s in report["models"][name]["l4v_kl"].items()), flush=True)
    (out / "results.json").write_text(json.dumps(report, indent=1))
    (out / "results.md").write_text(markdown(report))
    figures = plot(report, out)
    print(f"results: {out / 'results.json'}, {out / 'results.md'}; figures: " + ", ".join(map(str, figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
