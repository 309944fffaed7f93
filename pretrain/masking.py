"""Masking for VL-BERT's pretraining tasks, applied to collated batches inside the data workers.

- Masked language modelling: 15% of words, whole words (every word-piece of a chosen word), each
  chosen word 80% [MASK] / 10% random words / 10% unchanged (one draw per word, for all its pieces).
- Masked RoI classification: 15% of regions (the whole-image region is added inside the model and
  is never among them); 90% of those have their pixels zeroed before the Fast R-CNN (their features,
  with precomputed features), 10% stay visible; optionally regions overlapping a zeroed one (IoU
  above a threshold) are zeroed too.
- Caption samples hold at most `max_caption_elements` words + regions: the lowest-scoring regions or
  the caption tail go, whichever is longer, one at a time, as the official code does.

Randomness comes from a generator seeded by (seed, rank, batch index), so a resumed run masks its
batches exactly as the uninterrupted run did. Positions of the targets are computed here, on the
CPU, so the training step gathers them without a host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.boxes import box_iou
from model.fast_rcnn import grey_of, real_rois
from model.vl_bert import assemble_text, real_positions
from shards.images import grey_resampling_rings
from shards.seeding import torch_generator

IGNORE = -100


@dataclass
class MaskingConfig:
    mlm_probability: float = 0.15  # fraction of words chosen for masked language modelling
    # In captions, words naming a detector class or attribute (the config's `region_words`) are chosen with this
    # probability instead: the words the image decides get more of the masking, as ERNIE-ViL masks a caption's
    # scene-graph object and attribute words (Yu et al. 2021). None = every word alike (BERT, VL-BERT).
    region_word_probability: float | None = None
    # In captions, these words (e.g. spatial relations: "left", "above") are chosen with relation_word_probability
    # instead, as ERNIE-ViL masks a caption's scene-graph relationship words. A relation between two objects is
    # read off two regions' positions at once (the demo's training captions hold 0.91 relation words each against
    # 1.62 colour words), and at mlm_probability the grounded recipe reads it at the text-only level
    # (docs/ABLATION.md, session 54)
    relation_words: list[str] | None = None
    relation_word_probability: float | None = None
    mask_fraction: float = 0.8  # of chosen word-pieces: replaced by [MASK] ...
    random_fraction: float = 0.1  # ... by a random word (the rest stay unchanged)
    mrc_probability: float = 0.15  # fraction of regions chosen for masked RoI classification
    mrc_zero_fraction: float = 0.9  # of chosen regions: pixels zeroed (the rest stay visible)
    co_mask_iou: float | None = None  # zero regions overlapping a zeroed one above this IoU; None = off
    # UNITER's conditional masking (Chen et al. 2020): this fraction of a batch's caption images are masked-region
    # samples (regions chosen and zeroed, every word whole) and the rest masked-word samples (words masked, every
    # region in view), so no masked word's object is hidden. None: VL-BERT's joint masking, both in every sample.
    # Rounded per batch to at least one of each kind; a batch of one image keeps joint masking. On the quick start
    # at 0.25 colour words read 0.394 against joint masking's 0.490 (a quarter fewer masked captions, and MRC
    # there reads whole captions): not the demo's default (docs/ABLATION.md, session 58)
    conditional_mrc_fraction: float | None = None
    max_caption_elements: int = 64  # words + regions of a caption sample
    # Word views: each caption is masked this many times independently (its own words chosen each time, the
    # same regions zeroed), and the detector runs once per image for all of them. The CNN is most of an
    # end-to-end step on small models, so K views cost far less than K times the images (docs/ABLATION.md).
    word_views: int = 1
    # Control for the cross-modal ablation diagnostic: every caption image becomes a constant grey (the
    # detector's pixel mean, which normalises to 0), or with precomputed features every feature becomes
    # 0, so the model pretrains with vision always ablated. Pretraining also reads every region as the whole
    # image then (the model's `region_geometry: whole_image`, unless the config sets it): the boxes are the
    # image's layout, and a control that keeps them reads size from them (docs/ABLATION.md, session 23).
    ablate_image: bool = False
    # The control's Fast R-CNN at this multiple of the LR (None: the run's own `optim.lr_multipliers`). 0 freezes it
    # as the warm-up left it: its input carries nothing, and every step it takes fits grey images, so at the grounded
    # recipe's 0.1 its detector fell to chance (object 0.12) and the diagnostic then read real images through a CNN
    # the model never had (docs/ABLATION.md, sessions 33 and 35)
    ablate_image_cnn_lr: float | None = 0.0
    # A second control: each caption is shown another image of its length pool (any other with equal chance; the
    # image's boxes, classes and detector scores go with it; the reader pairs them, `shards.reader.MixedStream`),
    # batched by its own lengths, so its batch holds the treatment's captions, masked as theirs. Not a neighbour of
    # its batch: those share its region count and orientation (region counts correlate 0.68 on the demo), which a
    # caption's number words can read (docs/ABLATION.md, session 36). The model pretrains on real pixels that say
    # nothing of the caption: at evaluation real images are in its distribution, where the grey control meets them
    # for the first time (whose V4L then measures that, sessions 25 and 35). Boxes and the CNN's LR stay the run's.
    shuffle_images: bool = False
    # The fraction of caption rows whose words take no aligned region words (the model's `region_word_alignment`)
    # in a step; their region tokens keep their names, so the words must find their regions by attention. With
    # every row aligned a caption's colour can be read off its shape word's aligned name, and nothing asks for
    # another way to the object; on VQA a quarter of the colour questions name an object the detector names too
    # weakly to align, and whether a finetuned model answers those depends on the finetuning seed
    # (docs/FINETUNE.md, session 37: measured at 0.5, not the default)
    alignment_drop: float = 0.0
    # The fraction of caption rows whose words take nothing of their neighbours' aligned regions
    # (`model.alignment_neighbours`) in a step: with every row given them, a masked colour is read off the names
    # next to it and the path to an object named nowhere in the sentence (a whole masked phrase) is never learnt
    # (docs/ABLATION.md, session 59)
    neighbour_drop: float = 0.0


def trimmed_lengths(words: int, regions: int, limit: int) -> tuple[int, int]:
    """The official rule, in closed form: drop from the longer side one at a time (ties: words)."""
    excess = words + regions - limit
    if excess <= 0:
        return words, regions
    if abs(words - regions) >= excess:
        return (words - excess, regions) if words > regions else (words, regions - excess)
    return limit // 2, limit - limit // 2


class PretrainMasker:
    def __init__(self, cfg: MaskingConfig, tokenizer, *, cls_id: int, sep_id: int, mask_id: int, num_classes: int,
                 pad_id: int = 0, seed: int = 0, rank: int = 0,
                 pixel_mean: tuple[float, float, float] = (0.485, 0.456, 0.406),
                 region_word_ids: list[int] | None = None, mrc: bool = True, mrc_from_batch: int = 0):
        """region_word_ids: the first word-piece of each class / attribute name (masking.region_word_probability).
        mrc=False: pretraining without masked RoI classification (`losses.mrc_weight: 0`, VL-BERT's Table 4 setting
        (a)): no region is chosen and no pixel zeroed, since nothing would be asked of them. mrc_from_batch: the
        same for the rank's batches before this one (`losses.mrc_from_step`)."""
        if cfg.shuffle_images and cfg.ablate_image:  # here, not in the loader's workers at the first batch
            raise ValueError("masking: shuffle_images and ablate_image are two controls; set one")
        if not 0.0 <= cfg.alignment_drop <= 1.0:
            raise ValueError(f"masking.alignment_drop: {cfg.alignment_drop}, must be in [0, 1]")
        if not 0.0 <= cfg.neighbour_drop <= 1.0:
            raise ValueError(f"masking.neighbour_drop: {cfg.neighbour_drop}, must be in [0, 1]")
        if cfg.conditional_mrc_fraction is not None and not 0.0 < cfg.conditional_mrc_fraction < 1.0:
            raise ValueError(f"masking.conditional_mrc_fraction: {cfg.conditional_mrc_fraction}, must be in (0, 1) "
                             "(null: joint masking)")
        self.cfg = cfg
        self.mrc = mrc
        self.mrc_from_batch = mrc_from_batch
        self.grey = grey_of(pixel_mean)
        self.num_classes = num_classes
        tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        self.continuation = torch.tensor([t.startswith("##") for t in tokens])
        # random replacements are real words, not [PAD]/[unused*]/[CLS]/...
        self.first_word_id = next(i for i, t in enumerate(tokens) if not (t.startswith("[") and t.endswith("]")))
        self.vocab_size = len(tokens)
        self.cls_id, self.sep_id, self.mask_id, self.pad_id = cls_id, sep_id, mask_id, pad_id
        self.seed, self.rank = seed, rank
        if cfg.region_word_probability is not None:
            if not region_word_ids:
                raise ValueError("masking.region_word_probability needs the region words' names: set region_words "
                                 "(the detector's class/attribute vocabulary)")
        # per vocabulary entry: the probability a caption word starting with it is chosen at (NaN: mlm_probability)
        self.word_probability = None
        if cfg.region_word_probability is not None or cfg.relation_words:
            self.word_probability = torch.full((self.vocab_size,), float("nan"))
        if cfg.region_word_probability is not None:
            self.word_probability[torch.tensor(sorted(set(region_word_ids)))] = cfg.region_word_probability
        if (cfg.relation_word_probability is None) != (not cfg.relation_words):
            raise ValueError("masking.relation_words and masking.relation_word_probability: set both or neither")
        if cfg.relation_words:
            first_pieces = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in cfg.relation_words]
            if empty := [w for w, p in zip(cfg.relation_words, first_pieces) if not p]:
                raise ValueError(f"masking.relation_words: {empty} make no word-piece")
            self.word_probability[torch.tensor(sorted({p[0] for p in first_pieces}))] = cfg.relation_word_probability

    def generator(self, index: int) -> torch.Generator:
        return torch_generator(self.seed, "masking", self.rank, index)

    # -- words --------------------------------------------------------------------------------------

    def mask_words(self, ids: torch.Tensor, valid: torch.Tensor, g: torch.Generator, caption: bool = False,
                   rows: torch.Tensor | None = None):
        """Whole-word masking of [B, T] word ids -> (input ids, labels with IGNORE where not chosen). In a
        caption, words whose first piece names a region class or attribute are chosen with
        masking.region_word_probability, and words whose first piece is a relation word's with
        masking.relation_word_probability. rows [B] bool: the rows whose words may be chosen (default all)."""
        c = self.cfg
        b, t = ids.shape
        starts = valid & ~self.continuation[ids]
        word_of_token = (starts.cumsum(1) - 1).clamp(min=0)  # [B, T]
        probability = torch.full((b, t), c.mlm_probability)  # per word (column k: the row's k-th word)
        if caption and self.word_probability is not None:
            first_piece = torch.zeros(b, t + 1, dtype=ids.dtype).scatter_(
                1, torch.where(starts, word_of_token, t), ids)[:, :t]  # [B, T]: word k's first piece
            own = self.word_probability[first_piece]
            probability = torch.where(own.isnan(), probability, own)
        chosen_words = torch.rand(b, t, generator=g) < probability
        maskable = valid if rows is None else valid & rows.unsqueeze(1)
        chosen = chosen_words.gather(1, word_of_token) & maskable
        if not chosen.any() and maskable.any():  # at least one target per batch keeps the loss defined
            first = int(maskable.any(1).nonzero()[0])
            chosen[first] = valid[first] & (word_of_token[first] == 0)
        labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
        # the 80/10/10 choice is drawn once per word and shared by its pieces (BERT's whole-word masking),
        # so a chosen word is never left half [MASK] and half visible
        r = torch.rand(b, t, generator=g).gather(1, word_of_token)
        out = torch.where(chosen & (r < c.mask_fraction), torch.full_like(ids, self.mask_id), ids)
        random_words = torch.randint(self.first_word_id, self.vocab_size, (b, t), generator=g)
        use_random = chosen & (r >= c.mask_fraction) & (r < c.mask_fraction + c.random_fraction)
        return torch.where(use_random, random_words, out), labels

    def _text_inputs(self, ids, valid, g, caption: bool = False, rows: torch.Tensor | None = None) -> dict:
        masked, labels = self.mask_words(ids, valid, g, caption, rows)
        input_ids, token_types, text_mask = assemble_text(masked, valid, cls_id=self.cls_id, sep_id=self.sep_id,
                                                          pad_id=self.pad_id)
        labels, _, _ = assemble_text(labels, valid, cls_id=IGNORE, sep_id=IGNORE, pad_id=IGNORE)
        positions = (labels != IGNORE).flatten().nonzero().squeeze(1)  # into [B * T] of the text part
        return {"input_ids": input_ids, "token_type_ids": token_types, "text_mask": text_mask,
                "mlm_positions": positions, "mlm_labels": labels.flatten()[positions]}

    # -- samples ------------------------------------------------------------------------------------

    def text(self, batch: dict, g: torch.Generator) -> dict:
        out = self._text_inputs(batch["input_ids"], batch["attention_mask"], g)
        return {**out, "real_positions": real_positions(out["text_mask"])}

    def caption(self, batch: dict, g: torch.Generator, index: int = 0) -> dict:
        c = self.cfg
        mrc = self.mrc and index >= self.mrc_from_batch
        ids, valid = batch["input_ids"], batch["attention_mask"].clone()
        box_mask, scores = batch["box_mask"].clone(), batch["box_scores"]
        b, n = box_mask.shape
        # element budget: per sample (a handful of integers, not per token)
        order = torch.argsort(scores.masked_fill(~box_mask, -1e9), dim=1, descending=True, stable=True)
        rank = torch.argsort(order, dim=1)  # 0 = best-scoring region of the sample
        for i, (words, regions) in enumerate(zip(valid.sum(1).tolist(), box_mask.sum(1).tolist())):
            keep_words, keep_regions = trimmed_lengths(words, regions, c.max_caption_elements)
            valid[i, keep_words:] = False
            box_mask[i] &= rank[i] < keep_regions
        k = c.word_views
        if k < 1:
            raise ValueError(f"masking.word_views: {k}, must be >= 1")
        region_images = None  # conditional masking: the images whose regions are masked and words whole
        if c.conditional_mrc_fraction is not None and mrc and b > 1:
            count = min(max(round(c.conditional_mrc_fraction * b), 1), b - 1)
            region_images = torch.zeros(b, dtype=torch.bool)
            region_images[torch.randperm(b, generator=g)[:count]] = True
        # rows k*b + i are caption i's views: its image is image i of the batch (VLBert.region_features)
        out = self._text_inputs(torch.where(valid, ids, self.pad_id).repeat(k, 1), valid.repeat(k, 1), g, caption=True,
                                rows=None if region_images is None else ~region_images.repeat(k))
        # masked RoI classification
        # a box no stored distribution describes (a detector view's false positive, class -1) has no MRC target
        targets = box_mask & (batch["box_classes"] >= 0)
        candidates = targets if region_images is None else targets & region_images.unsqueeze(1)
        chosen = (torch.rand(b, n, generator=g) < c.mrc_probability) & candidates
        if not mrc:  # drawn all the same: the words' masks and every later draw stay the MRC run's
            chosen = torch.zeros_like(chosen)
        elif not chosen.any() and targets.any():
            # a region-masking image without boxes leaves one region of another image to be chosen (joint there)
            candidates = candidates if candidates.any() else targets
            first = int(candidates.any(1).nonzero()[0])
            chosen[first, int(candidates[first].nonzero()[0])] = True
        zeroed = chosen & (torch.rand(b, n, generator=g) < c.mrc_zero_fraction)
        if c.co_mask_iou is not None:
            overlap = box_iou(batch["boxes"], batch["boxes"]) > c.co_mask_iou  # [B, N, N]
            # neighbours of a zeroed region are hidden too; targets kept visible (the 10%) stay visible
            zeroed = zeroed | ((overlap & zeroed.unsqueeze(1)).any(-1) & box_mask & ~chosen)
        positions = chosen.flatten().nonzero().squeeze(1)  # into [B * N] of the regions (whole image excluded)
        views = (positions + torch.arange(k).unsqueeze(1) * (b * n)).flatten()  # into [K * B * N]: every view
        probs = batch.get("class_probs")
        if probs is None:  # no detector distributions stored: the detector's class as a one-hot target
            probs = torch.nn.functional.one_hot(batch["box_classes"].clamp(min=0), self.num_classes)
        if "region_features" in batch:  # precomputed features: the model zeroes the masked ones
            feats = batch["region_features"]
            visual = {"region_features": torch.zeros_like(feats) if c.ablate_image else feats,
                      "image_hw": batch["image_hw"]}
        else:
            images = batch["images"]
            if c.ablate_image:
                images = self.grey.expand_as(images).clone()
            elif zeroed.any():
                images = self.grey_resampling_rings(images, batch, zeroed)
            # res5 on the real boxes alone: a batch pads its boxes to its most (0.86-0.90 of the demo's RoIs real)
            visual = {"images": images, "image_sizes": batch["image_sizes"], "roi_index": real_rois(box_mask)}
        box_mask, zeroed = box_mask.repeat(k, 1), zeroed.repeat(k, 1)
        out.update({**visual, "boxes": batch["boxes"].repeat(k, 1, 1),
                    "box_mask": box_mask, "masked_regions": zeroed, "mrc_positions": views,
                    "mrc_probs": probs.flatten(0, 1)[positions].float().repeat(k, 1),
                    "mrc_labels": batch["box_classes"].flatten()[positions].repeat(k),
                    "real_positions": real_positions(out["text_mask"], box_mask)})
        if batch.get("attribute_probs") is not None:  # stored attribute targets (losses.mrc_attribute_targets)
            out["mrc_attribute_probs"] = batch["attribute_probs"].flatten(0, 1)[positions].float().repeat(k, 1)
        if c.alignment_drop > 0:  # drawn last and only when on, so every other draw is the default run's
            out["aligned_words"] = torch.rand(k * b, generator=g) >= c.alignment_drop
        if c.neighbour_drop > 0:  # the same: last, only when on
            out["neighbour_words"] = torch.rand(k * b, generator=g) >= c.neighbour_drop
        return out

    def grey_resampling_rings(self, images: torch.Tensor, batch: dict, zeroed: torch.Tensor) -> torch.Tensor:
        return grey_resampling_rings(images, batch["boxes"], zeroed, batch.get("resize_scales"), self.grey)

    def __call__(self, batch: dict) -> dict:
        g = self.generator(batch["index"])
        out = {k: v for k, v in batch.items() if k not in ("caption", "text")}
        if "caption" in batch:
            out["caption"] = self.caption(batch["caption"], g, batch["index"])
            out["caption"]["keys"] = batch["caption"]["keys"]
        if "text" in batch:
            out["text"] = self.text(batch["text"], g)
            out["text"]["keys"] = batch["text"]["keys"]
        return out
