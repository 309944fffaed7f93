"""The one box-overlap function set: IoU and intersection-over-target, used by RoI co-masking,
RefCOCO+ labels and accuracy, and the cross-modal ablation diagnostic.

Boxes are (x1, y1, x2, y2) in continuous pixel coordinates (x2 exclusive). Flickr30k Entities'
1-based inclusive corners convert with `from_one_based_inclusive`.
"""

from __future__ import annotations

import torch


def _intersection(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    lt = torch.maximum(a[..., :, None, :2], b[..., None, :, :2])
    rb = torch.minimum(a[..., :, None, 2:], b[..., None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    return wh[..., 0] * wh[..., 1]


def area(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[..., 2] - boxes[..., 0]).clamp(min=0) * (boxes[..., 3] - boxes[..., 1]).clamp(min=0)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[..., N, 4] x [..., M, 4] -> [..., N, M] intersection over union (0 where both are empty)."""
    inter = _intersection(a, b)
    union = area(a)[..., :, None] + area(b)[..., None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-12), torch.zeros_like(inter))


def box_iot(regions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Intersection over *target* area: [..., N, 4] regions x [..., M, 4] targets -> [..., N, M]."""
    inter = _intersection(regions, targets)
    target_area = area(targets)[..., None, :]
    return torch.where(target_area > 0, inter / target_area.clamp(min=1e-12), torch.zeros_like(inter))


def with_whole_image(boxes: torch.Tensor, image_hw: torch.Tensor, inclusive: bool = False) -> torch.Tensor:
    """[B, N, 4] pixel boxes, [B, 2] (h, w) -> [B, 1+N, 4] with the whole-image box (0, 0, w, h) first
    ((0, 0, w-1, h-1) when corners are inclusive pixel indices, detectron's legacy convention)."""
    wh = image_hw.flip(-1).to(boxes.dtype) - (1 if inclusive else 0)
    return torch.cat([torch.cat([torch.zeros_like(wh), wh], -1).unsqueeze(1), boxes], 1)


def normalise(boxes: torch.Tensor, image_hw: torch.Tensor) -> torch.Tensor:
    """[B, N, 4] pixel boxes / (w, h, w, h) of each image ([B, 2] (h, w))."""
    return boxes / image_hw.flip(-1).to(boxes.dtype).repeat(1, 2).unsqueeze(1)


def scale_features(boxes_normalised: torch.Tensor) -> torch.Tensor:
    """[..., 4] boxes normalised by the image's width and height -> [..., 4] (w, h, log w, log h): what a
    size classifier reads. An object's side over the image's shorter side is the larger of w and h for a
    square box; the logs spread the small sizes apart."""
    wh = (boxes_normalised[..., 2:] - boxes_normalised[..., :2]).float().clamp(min=1e-4)
    return torch.cat([wh, wh.log()], -1)


def from_one_based_inclusive(boxes: torch.Tensor) -> torch.Tensor:
    """PASCAL VOC / Flickr30k corners (1-based, inclusive) -> 0-based continuous (x2, y2 exclusive)."""
    return boxes.to(torch.float32) - torch.tensor([1.0, 1.0, 0.0, 0.0], device=boxes.device)
