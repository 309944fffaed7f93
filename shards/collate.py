"""Collation: samples -> padded batch tensors (word-pieces with their attention mask, images padded to a
multiple of the backbone's stride with their real sizes, boxes with their mask)."""

from __future__ import annotations

import math

import torch

from .caption_inputs import BOX_DISTRIBUTIONS


def pad_ids(seqs: list[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    length = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = True
    return ids, mask


def batch_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor for a padded batch. In a DataLoader worker the batch goes to the trainer through
    shared memory: allocating it there (zero-filled by the OS), as `default_collate` does, saves copying it
    into a segment at send time (~2 MB per 600 x 1000 image)."""
    if torch.utils.data.get_worker_info() is None:
        return torch.zeros(shape, dtype=dtype)
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


def pad_images(images: list[torch.Tensor], size_divisibility: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [3, h, w] images -> [B, 3, H, W] (top-left aligned, zero padded to a multiple of the
    divisibility) and their sizes [B, 2] (h, w).

    The batch is channels-last in memory (`torch.channels_last`), the layout the decoders produce and
    the backbone runs in: each image row is one contiguous copy (30% less collation time than
    scattering into planes), and the detector has no layout conversion to make."""
    div = max(1, size_divisibility)
    hmax = math.ceil(max(im.shape[1] for im in images) / div) * div
    wmax = math.ceil(max(im.shape[2] for im in images) / div) * div
    out = batch_zeros((len(images), hmax, wmax, 3), torch.uint8)
    for i, im in enumerate(images):
        out[i, : im.shape[1], : im.shape[2]] = im.permute(1, 2, 0)
    return out.permute(0, 3, 1, 2), torch.tensor([list(im.shape[1:]) for im in images])


def collate_captions(samples: list[dict], size_divisibility: int = 32) -> dict:
    """Pads images (uint8, top-left aligned) or region features, boxes and words into batch tensors
    with masks."""
    b = len(samples)
    n = max(len(s["boxes"]) for s in samples)
    features = "region_features" in samples[0]
    if features != all("region_features" in s for s in samples):
        raise ValueError("a batch mixes samples with images and samples with precomputed features")
    if features:
        region_features = batch_zeros((b, n, samples[0]["region_features"].shape[1]), torch.float32)
        for i, s in enumerate(samples):
            region_features[i, : len(s["region_features"])] = s["region_features"]
        visual = {"region_features": region_features,  # [B, N, F]
                  "image_hw": torch.tensor([list(s["image_hw"]) for s in samples])}  # [B, 2] (h, w)
    else:
        images, image_sizes = pad_images([s["image"] for s in samples], size_divisibility)
        visual = {"images": images, "image_sizes": image_sizes,  # image_sizes [B, 2] (h, w)
                  "resize_scales": torch.tensor([s.get("resize_scale", 1.0) for s in samples])}  # [B]
    boxes = torch.zeros((b, n, 4))  # [B, N, 4] pixels of the resized image (of the original: features)
    box_mask = torch.zeros((b, n), dtype=torch.bool)
    classes = torch.full((b, n), -1, dtype=torch.long)
    scores = torch.zeros((b, n))
    # class_probs, attribute_probs [B, N, K]: None unless every sample has them
    dists = {f: torch.zeros((b, n, samples[0][f].shape[1]), dtype=torch.float16)
             if all(s.get(f) is not None for s in samples) else None for f in BOX_DISTRIBUTIONS}
    for i, s in enumerate(samples):
        k = len(s["boxes"])
        boxes[i, :k], box_mask[i, :k], classes[i, :k], scores[i, :k] = s["boxes"], True, s["classes"], s["scores"]
        for f, d in dists.items():
            if d is not None:
                d[i, :k] = s[f]
    ids, mask = pad_ids([s["input_ids"] for s in samples])
    return {"keys": [s["key"] for s in samples], **visual,
            "boxes": boxes, "box_mask": box_mask, "box_classes": classes, "box_scores": scores,
            **dists, "input_ids": ids, "attention_mask": mask}


def collate_text(samples: list[dict]) -> dict:
    ids, mask = pad_ids([s["input_ids"] for s in samples])
    return {"keys": [s["key"] for s in samples], "input_ids": ids, "attention_mask": mask}
