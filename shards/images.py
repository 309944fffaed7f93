"""Images and their boxes into model batches, outside the streaming reader: one image file resized by
VL-BERT's rule with its boxes mapped onto it, and a batch of them padded as the reader pads. The finetune
tasks, the detector warm-up and `finetune.infer` read their datasets this way. And the resampling rings round a
masked region hidden with the grey (`grey_resampling_rings`; the grey itself is `model.fast_rcnn.grey_of`, which the
image-ablated model reads too), shared by pretraining's masker and the diagnostics."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from model.fast_rcnn import pixel_mask

from .collate import pad_images
from .decode import _box_scale, decode_resized, resized_size


@dataclass
class ImageConfig:
    root: str = ""  # image paths of the dataset are relative to this (empty: to the working directory)
    short_side: int = 600  # VL-BERT resizes to 600 / 1000
    long_side: int = 1000
    max_regions: int = 100
    box_tolerance: float = 2.0  # pixels a box may stick out of its image (then clipped); beyond: an error


def load_image(path: Path, boxes: np.ndarray, cfg: ImageConfig, where: str, pixels: bool = True
               ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The image resized by VL-BERT's rule and its [N, 4] pixel boxes (x1, y1, x2, y2, original image)
    mapped onto it. A box outside the image by more than cfg.box_tolerance is an error naming `where`.
    pixels=False reads the header alone and gives None for the image (its features are cached elsewhere)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{where}: image {path} not found (image root: {cfg.root})") from None
    if pixels:
        image, scale, (w, h) = decode_resized(data, cfg.short_side, cfg.long_side)
    else:

        image = None
        w, h = Image.open(io.BytesIO(data)).size  # the header only
        nw, nh = resized_size(w, h, cfg.short_side, cfg.long_side)
        scale = _box_scale(w, h, nw, nh)
    b = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    tol = cfg.box_tolerance
    bad = (b[:, 0] < -tol) | (b[:, 1] < -tol) | (b[:, 2] > w + tol) | (b[:, 3] > h + tol) | \
          (b[:, 2] <= b[:, 0]) | (b[:, 3] <= b[:, 1])
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{where}: box {k} {b[k].tolist()} lies outside the {w}x{h} image {path} or is empty")
    b = np.clip(b, 0, [w, h, w, h])
    return image, torch.from_numpy(b) * scale


SIZE_DIVISIBILITY = 32  # batch images are zero-padded to a multiple of it, as pretraining's reader does


def collate_visual(items: list[tuple[torch.Tensor | None, torch.Tensor]]) -> dict:
    """(image, boxes) pairs -> images [B, 3, H, W] uint8, image_sizes [B, 2], boxes [B, N, 4], box_mask; images
    loaded without pixels (None) give boxes and box_mask alone."""
    n = max(1, max(len(b) for _, b in items))
    boxes = torch.zeros(len(items), n, 4)
    mask = torch.zeros(len(items), n, dtype=torch.bool)
    for i, (_, b) in enumerate(items):
        boxes[i, : len(b)], mask[i, : len(b)] = b, True
    if any(im is None for im, _ in items):
        return {"boxes": boxes, "box_mask": mask}
    images, sizes = pad_images([im for im, _ in items], SIZE_DIVISIBILITY)
    return {"images": images, "image_sizes": sizes, "boxes": boxes, "box_mask": mask}


def grey_resampling_rings(images: torch.Tensor, boxes: torch.Tensor, zeroed: torch.Tensor,
                          resize_scales: torch.Tensor | None, grey: torch.Tensor) -> torch.Tensor:
    """The reader resized each image before any box was chosen, so a zeroed box's pixels were blended into
    a ring around it: as wide as the resampling filter's reach, 1 pixel of the resized image when shrinking
    (the antialiased filter spans one source pixel per output pixel) and `scale` pixels when enlarging
    (bilinear reaches one source pixel). The model zeroes the box itself; the ring is set to `grey` (the
    pixel mean) here, so nothing of a hidden object remains. Pretraining's masker and the evaluators'
    hidden-region conditions both use it.

    images uint8 [B, 3, H, W]; boxes [B, N, 4] pixels of the resized image; zeroed [B, N] bool; resize_scales
    [B] (the reader's `resize_scales`; None = 1)."""
    reach = torch.ones(images.shape[0]) if resize_scales is None else resize_scales.float().cpu().clamp(min=1.0)
    widen = (reach.view(-1, 1, 1) * torch.tensor([-1.0, -1.0, 1.0, 1.0])).to(boxes.device)  # [B, 1, 4]
    h, w = images.shape[-2:]
    sizes = torch.tensor([[h, w]], device=boxes.device).expand(len(images), 2)
    ring = pixel_mask(boxes + widen, zeroed.to(boxes.device), sizes, h, w).to(images.device)
    return torch.where(ring.unsqueeze(1), grey.to(images.device), images)
