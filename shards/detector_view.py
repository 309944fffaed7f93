"""A detector's view of ground-truth boxes, for pretraining on a corpus whose boxes are annotations (the demo's
boxes.jsonl, COCO or Visual Genome ground truth) where finetuning reads a detector's boxes.

VL-BERT pretrains on a detector's boxes: they sit a little off their objects, miss a few and include some that hold
no object. A model pretrained only on exact boxes of real objects meets all three for the first time on RefCOCO+'s
detected track, and with the region word channel a false positive takes the words aligned to its names
(docs/FINETUNE.md, session 79). `detector_view` moves each box by a seeded draw, drops some and adds false positives
(class -1: no stored class distribution says what a detector would call them, so masked RoI classification never
chooses them; the pretraining masker skips class -1). The draw is keyed by the record's key and the data seed alone:
an image keeps one view for the whole run, as a fixed detector gives it, and a resumed or re-dealt run draws the
same boxes again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from .seeding import torch_generator

NO_CLASS = -1  # a box no stored class distribution describes (a false positive): no MRC target


@dataclass
class DetectorViewConfig:
    box_jitter: float = 0.0  # each box's centre moves by up to this fraction of its width / height (uniform)
    box_scale_jitter: float = 0.0  # and both its sides scale by one factor in [1 - this, 1 + this]
    box_miss: float = 0.0  # the chance a box is dropped (one box always stays)
    false_positives: list[int] = field(default_factory=lambda: [0, 0])  # boxes of no object: a count in [lo, hi]
    false_positive_size: list[float] = field(default_factory=lambda: [0.1, 0.3])  # side: this x the short side
    # below the boxes of real objects (scores from a box file, 1.0 for ground truth) as a detector scores them: a
    # sample that keeps its best `max_regions` or an element budget drops false positives first
    false_positive_scores: list[float] = field(default_factory=lambda: [0.3, 0.7])

    def __post_init__(self):
        for name in ("box_jitter", "box_scale_jitter", "box_miss"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"data.detector_view.{name}: {getattr(self, name)}, must be in [0, 1)")
        for name in ("false_positives", "false_positive_size", "false_positive_scores"):
            value = getattr(self, name)
            if len(value) != 2 or value[0] > value[1] or value[0] < 0:
                raise ValueError(f"data.detector_view.{name}: {value}, must be [lo, hi] with 0 <= lo <= hi")
        if self.false_positive_size[1] > 1:
            raise ValueError(f"data.detector_view.false_positive_size: {self.false_positive_size}, a fraction of "
                             "the short side (<= 1)")

    @property
    def active(self) -> bool:
        return bool(self.box_jitter or self.box_scale_jitter or self.box_miss or self.false_positives[1])


def key_index(key: str) -> int:
    """A record key as a stable non-negative integer (seeding keys are integers; Python's hash() is salted)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=7).digest(), "big")


def detector_view(sample: dict, width: int, height: int, cfg: DetectorViewConfig, seed: int) -> dict:
    """`sample`'s boxes ([N, 4] x1, y1, x2, y2 in a width x height image), scores, classes and per-box
    distributions (None or [N, K]) as a detector would give them: kept boxes jittered (clipped to the image),
    missed ones dropped, false positives appended (class NO_CLASS, zero distributions). Other fields unchanged."""
    g = torch_generator(seed, "detector view", key_index(sample["key"]))
    boxes = sample["boxes"]
    n = len(boxes)
    u = torch.rand(n, 4, generator=g)  # shift x, shift y, scale, miss: one draw per box whatever the config
    size = boxes[:, 2:] - boxes[:, :2]
    centre = (boxes[:, :2] + boxes[:, 2:]) / 2 + (u[:, :2] * 2 - 1) * cfg.box_jitter * size
    half = size / 2 * (1 + (u[:, 2:3] * 2 - 1) * cfg.box_scale_jitter)
    limit = torch.tensor([width, height], dtype=boxes.dtype)
    moved = torch.cat([(centre - half).clamp(min=0), torch.minimum(centre + half, limit)], 1)
    keep = u[:, 3] >= cfg.box_miss
    if not keep.any():
        keep[int(torch.argmax(sample["scores"]))] = True
    lo, hi = cfg.false_positives
    count = int(torch.randint(lo, hi + 1, (1,), generator=g))
    f = torch.rand(count, 4, generator=g)
    side = (cfg.false_positive_size[0] + f[:, 0] * (cfg.false_positive_size[1] - cfg.false_positive_size[0])) \
        * min(width, height)
    corner = f[:, 1:3] * (limit - side.unsqueeze(1))
    false = torch.cat([corner, corner + side.unsqueeze(1)], 1).to(boxes.dtype)
    s_lo, s_hi = cfg.false_positive_scores
    out = dict(sample)
    out["boxes"] = torch.cat([moved[keep], false])
    out["scores"] = torch.cat([sample["scores"][keep], s_lo + f[:, 3] * (s_hi - s_lo)])
    out["classes"] = torch.cat([sample["classes"][keep], torch.full((count,), NO_CLASS, dtype=torch.long)])
    for name in ("class_probs", "attribute_probs"):
        if sample.get(name) is not None:
            d = sample[name]
            out[name] = torch.cat([d[keep], d.new_zeros(count, d.shape[1])])
    return out
