"""Decoding and sample building: a tar record -> a sample. Images are decoded and resized by VL-BERT's rule
(short side, capped long side) with their boxes mapped onto the resized image; a caption sample keeps its
highest-scoring regions and tokenises its caption; a text sample is its stored word-pieces. Plain functions of
one record, so the reader applies them after its (record-level) shuffle and resume never decodes anything twice."""

from __future__ import annotations

import functools
import io
import json
import warnings

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.v2 import functional as TF

from .caption_inputs import BOX_DISTRIBUTIONS
from .detector_view import detector_view
from .stream_config import StreamConfig
from .tokenizer import load_tokenizer


def resize_scale(height: int, width: int, short_side: int, long_side: int) -> float:
    """Detectron/VL-BERT rule: shorter side to `short_side`, unless the longer one exceeds `long_side`."""
    scale = short_side / min(height, width)
    if max(height, width) * scale > long_side:
        scale = long_side / max(height, width)
    return scale


def resized_size(width: int, height: int, short_side: int, long_side: int) -> tuple[int, int]:
    """(new width, new height) by `resize_scale` (short_side 0 = keep the size)."""
    scale = resize_scale(height, width, short_side, long_side) if short_side > 0 else 1.0
    return max(1, round(width * scale)), max(1, round(height * scale))


def _box_scale(w: int, h: int, nw: int, nh: int) -> torch.Tensor:
    return torch.tensor([nw / w, nh / h, nw / w, nh / h])


def load_resized(pil, short_side: int, long_side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A PIL image -> uint8 [3, H, W] resized by `resize_scale` (0 = keep), and the [4] factor that maps
    its pixel boxes (x1, y1, x2, y2) onto the resized image. From a file or bytes, `decode_resized` is
    faster for JPEGs."""

    w, h = pil.size
    nw, nh = resized_size(w, h, short_side, long_side)
    if nw < w / 2:
        pil.draft("RGB", (nw, nh))  # JPEG: decode at a reduced DCT scale, far cheaper than full size
    pil = pil.convert("RGB")
    if pil.size != (nw, nh):
        pil = pil.resize((nw, nh), Image.BILINEAR, reducing_gap=None)
    image = torch.from_numpy(np.array(pil)).permute(2, 0, 1)  # [3, H, W] uint8
    return image, _box_scale(w, h, nw, nh)


@functools.cache
def _torchvision_jpeg():
    """torchvision's JPEG decoder, or None where a torchvision release no longer has it (0.29 deprecates
    its image codecs in favour of TorchCodec): then PIL decodes."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
    except ImportError:
        return None
    return decode_jpeg


def decode_resized(data: bytes, short_side: int, long_side: int) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """Encoded image bytes -> (uint8 [3, H, W] resized as `load_resized` does, the box scale [4], the original
    (width, height)). JPEGs go through torchvision's libjpeg-turbo decoder and its uint8 antialiased
    resize, about 9x faster than PIL's decode + convert + resize on the demo images with the same pixels up
    to rounding; strong downscales (< 1/2) keep PIL's reduced-size DCT decode, other formats PIL."""

    pil = Image.open(io.BytesIO(data))  # reads the header only
    w, h = pil.size
    nw, nh = resized_size(w, h, short_side, long_side)
    fast = pil.format == "JPEG" and pil.mode in ("RGB", "L") and nw >= w / 2
    decode_jpeg = _torchvision_jpeg() if fast else None
    if decode_jpeg is None:
        image, box_scale = load_resized(pil, short_side, long_side)
        return image, box_scale, (w, h)

    with warnings.catch_warnings():  # the deprecation notice comes with every call
        warnings.simplefilter("ignore", DeprecationWarning)
        image = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    if (nw, nh) != (w, h):
        image = TF.resize(image, [nh, nw], interpolation=TF.InterpolationMode.BILINEAR, antialias=True)
    return image, _box_scale(w, h, nw, nh), (w, h)


def kept_regions(scores: torch.Tensor, max_regions: int) -> torch.Tensor:
    """Indices of the regions a caption sample keeps: the highest scores first, ties in stored order."""
    return torch.argsort(scores, descending=True, stable=True)[:max_regions]


class CaptionDecoder:
    def __init__(self, cfg: StreamConfig):
        self.cfg = cfg

    def prepare(self) -> None:
        """Loads the tokenizer and the JPEG decoder (importing torchvision) now. Called in the training
        process before DataLoader workers fork, so they inherit both instead of each importing them at
        its first sample: 2-3 s per worker and per pass on 2 cores, longer than a pass of the demo loader."""
        _torchvision_jpeg()
        load_tokenizer(self.cfg.tokenizer)

    def __call__(self, record: dict) -> dict:
        """A caption sample: the resized image (uint8 [3, h, w]) with boxes in its pixels, or, for a
        features shard (`pretrain.features`), region_features [N, F] with boxes in the original image's
        pixels and image_hw (h, w) of that image."""
        cfg = self.cfg
        features = "feats.npy" in record
        for member in ("json",) if features else ("json", "jpg"):
            if member not in record:
                raise KeyError(f"missing member '{member}'")
        meta = json.loads(record["json"])
        visual: dict = {}
        if features:
            feats = torch.from_numpy(np.load(io.BytesIO(record["feats.npy"]), allow_pickle=False))
            if feats.ndim != 2 or len(feats) != len(meta["boxes"]):
                raise ValueError(f"feats.npy has shape {list(feats.shape)}, the JSON has {len(meta['boxes'])} boxes")
            visual = {"region_features": feats.float(), "image_hw": (meta["height"], meta["width"])}
            box_scale = torch.ones(4)
        else:
            image, box_scale, (w, h) = decode_resized(record["jpg"], cfg.short_side, cfg.long_side)
            if (meta["width"], meta["height"]) != (w, h):
                raise ValueError(f"JSON says {meta['width']}x{meta['height']}, image is {w}x{h}")
            # the resize factor: resampling spreads a box's pixels over a ring this wide around it (the masker)
            visual = {"image": image, "resize_scale": float(box_scale[:2].max())}
        boxes = torch.tensor(meta["boxes"], dtype=torch.float32).reshape(-1, 4) * box_scale
        scores = torch.tensor(meta["scores"], dtype=torch.float32)
        classes = torch.tensor(meta["classes"], dtype=torch.long)
        dists = {}  # class_probs (and attribute_probs): None when the shard has none
        for field, member in BOX_DISTRIBUTIONS.items():
            dists[field] = None
            if member in record:
                dists[field] = torch.from_numpy(np.load(io.BytesIO(record[member])).astype(np.float16))
                if len(dists[field]) != len(boxes):
                    raise ValueError(f"{member} has {len(dists[field])} rows, the JSON has {len(boxes)} boxes")
        if cfg.detector_view.active:
            if features:
                raise ValueError("data.detector_view moves boxes, but a features shard's region features were computed "
                                 "on its stored boxes: turn it off, or extract the features from the images")
            view = detector_view({"key": record["__key__"], "boxes": boxes, "scores": scores, "classes": classes,
                                  **dists}, image.shape[2], image.shape[1], cfg.detector_view, cfg.seed)
            boxes, scores, classes = view["boxes"], view["scores"], view["classes"]
            dists = {k: view[k] for k in dists}
        if len(boxes) > cfg.max_regions:
            keep = kept_regions(scores, cfg.max_regions)
            boxes, scores, classes = boxes[keep], scores[keep], classes[keep]
            dists = {k: v[keep] if v is not None else None for k, v in dists.items()}
            if features:
                visual["region_features"] = visual["region_features"][keep]
        ids = load_tokenizer(cfg.tokenizer)(meta["caption"], add_special_tokens=False)["input_ids"]
        return {"key": record["__key__"], **visual, "boxes": boxes, "scores": scores,
                "classes": classes, **dists, "input_ids": torch.tensor(ids, dtype=torch.long)}


def decode_text(record: dict) -> dict:
    meta = json.loads(record["json"])
    return {"key": record["__key__"], "input_ids": torch.tensor(meta["input_ids"], dtype=torch.long)}


def caption_length(sample: dict) -> tuple[int, int, int]:
    """Sort key: orientation first (portrait 1, landscape or precomputed features 0), as Detectron's
    aspect-ratio grouping, so a batch does not pad landscape images to portrait height (half of a mixed
    batch's pixels, which the detector's backbone would run on); then regions, then words."""
    image = sample.get("image")
    portrait = int(image.shape[1] > image.shape[2]) if image is not None else 0
    return portrait, len(sample["boxes"]), len(sample["input_ids"])


def text_length(sample: dict) -> int:
    return len(sample["input_ids"])
