"""Dropout that is cheap on CPU.

`F.dropout` on CPU draws one Bernoulli sample per element (`bernoulli_`), which costs as much as a
768-wide matmul row on a 2-core machine: 12 ms for a [32, 76, 768] activation, where 32 random bits
per element, two from every 64-bit `random_` draw, cost 3 ms. Elsewhere (CUDA) `F.dropout` is a fused
Philox kernel and is used as is. Same distribution: an element is dropped with probability p (to
2^-32), and kept ones are scaled by 1 / (1 - p).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _cheap(x: torch.Tensor, p: float, training: bool) -> bool:
    return training and 0.0 < p < 1.0 and x.device.type == "cpu"


def keep_scale(x: torch.Tensor, p: float) -> torch.Tensor:
    """The dropout multiplier for `x`: 1 / (1 - p) where kept, 0 where dropped."""
    n = x.numel()
    # random_(min, None) draws the full 64-bit range without a modulo: two uniform int32s per draw
    bits = torch.empty((n + 1) // 2, dtype=torch.int64, device=x.device).random_(-2 ** 63, None)
    keep = bits.view(torch.int32)[:n].view(x.shape) >= round(p * 2 ** 32) - 2 ** 31
    return keep.to(x.dtype).mul_(1.0 / (1.0 - p))


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    if _cheap(x, p, training):
        return x * keep_scale(x, p)
    return F.dropout(x, p, training) if training and p > 0.0 else x


def dropout_add(x: torch.Tensor, residual: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """residual + dropout(x); on CPU one fused pass (addcmul), with one activation less to allocate."""
    if _cheap(x, p, training):
        return torch.addcmul(residual, x, keep_scale(x, p))
    return residual + dropout(x, p, training)


class Dropout(nn.Dropout):
    """`nn.Dropout` with the cheap CPU sampling of `dropout`; no parameters, so checkpoints are unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
