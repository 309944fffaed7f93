"""What the streaming reader reads and how: shards, batch sizes, image resizing, shuffling, length
buckets, workers, epochs (`StreamConfig`, the `data` block of a pretraining config)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .detector_view import DetectorViewConfig


@dataclass
class StreamConfig:
    caption_shards: str = ""  # caption shard paths: globs or brace patterns, comma-separated
    text_shards: str = ""  # text-only shard paths; empty = caption batches only
    caption_batch_size: int = 4  # caption samples per batch (VL-BERT: 128 of 256)
    text_batch_size: int = 4  # text samples per batch; the ratio of the two is the mixing ratio
    shuffle_buffer: int = 256  # records held for shuffling, per role and source
    short_side: int = 600  # resize shorter image side to this (0 = keep the stored size) ...
    long_side: int = 1000  # ... unless the longer side would exceed this (VL-BERT: 600 / 1000)
    size_divisibility: int = 32  # pad batch images to a multiple of this
    max_regions: int = 100  # keep at most this many boxes per image (highest scores)
    tokenizer: str | None = None  # local BERT tokenizer dir; None = packaged all-MiniLM-L6-v2
    seed: int = 0
    num_workers: int = 2
    epochs: int | None = None  # None = stream forever (pretraining); 1 = one pass (evaluation)
    length_buckets: int = 1  # > 1: batch similar lengths together within pools of this many batches
    max_bad_fraction: float = 0.5  # stop with an error when more records than this are bad ...
    min_seen: int = 50  # ... once at least this many were read by one role
    # caption images' boxes as a detector's (jittered, some missed, false positives added; shards/detector_view.py):
    # for ground-truth boxes where finetuning reads a detector's. Off by default (the boxes as stored)
    detector_view: DetectorViewConfig = field(default_factory=DetectorViewConfig)
