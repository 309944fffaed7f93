"""FLOPs of one VL-BERT pretraining step, counted per part so utilisation is stated honestly.

- Transformer (as nanoGPT / torchtitan): 6 x non-embedding parameters per token (forward + backward)
  plus attention, 12 x layers x hidden x sequence length per token; the MLM head only at masked
  positions, the MRC head only at masked regions.
- CNN: the backbone on every (padded) image and res5 per region, counted by torch's FlopCounterMode
  on a forward pass of the actual modules at the actual shapes, times 3 for forward + backward.
"""

from __future__ import annotations

import time

import torch
from torch.utils.flop_counter import FlopCounterMode


def transformer_layer_params(hidden: int, intermediate: int) -> int:
    return 4 * hidden * hidden + 4 * hidden + 2 * hidden * intermediate + intermediate + hidden + 4 * hidden


def transformer_flops(cfg, seq_lens: list[int], masked_words: int, masked_regions: int) -> float:
    """Training FLOPs of the encoder over sequences of the given real lengths, plus the heads."""
    n = cfg.num_hidden_layers * transformer_layer_params(cfg.hidden_size, cfg.intermediate_size)
    tokens = sum(seq_lens)
    attention = sum(12 * cfg.num_hidden_layers * cfg.hidden_size * t * t for t in seq_lens)
    mlm_head = 6 * masked_words * (cfg.hidden_size * cfg.hidden_size + cfg.hidden_size * cfg.vocab_size)
    mrc_head = 6 * masked_regions * (cfg.hidden_size * cfg.hidden_size + cfg.hidden_size * cfg.fast_rcnn.num_classes)
    return 6.0 * n * tokens + attention + mlm_head + mrc_head


def cnn_flops(fast_rcnn, images: torch.Tensor, image_sizes: torch.Tensor, boxes: torch.Tensor,
              box_mask: torch.Tensor) -> float:
    """Training FLOPs of the Fast R-CNN (backbone + res5 per region) at these shapes."""
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        fast_rcnn(images, image_sizes, boxes, box_mask)
    return 3.0 * counter.get_total_flops()


def measured_matmul_peak(n: int = 2048, repeats: int = 5, device: str = "cpu", dtype=torch.float32) -> float:
    """FLOP/s of a large square GEMM: the machine's practical matmul ceiling, measured in the same run."""

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        if device != "cpu":
            torch.cuda.synchronize()
        t = time.perf_counter()
        a @ b
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2.0 * n ** 3 / best
