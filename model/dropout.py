"""Dropout that is cheap on CPU.

`F.dropout` on CPU draws one Bernoulli sample per element (`bernoulli_`), which costs as much as a
768-wide matmul row on a 2-core machine: 12 ms for a [32, 76, 768] activation, where 32 random bits
per element from one 64-bit `randint` every two elements cost 2 ms. Elsewhere (CUDA) `F.dropout` is a
fused Philox kernel and is used as is. Same distribution: an element is dropped with probability p
(to 2^-32), and kept ones are scaled by 1 / (1 - p).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> torch.Tensor:
    """Boolean mask, True with probability 1 - p, from 32 uniform bits per element."""
    n = shape.numel()
    # random_(min, None) draws the full 64-bit range without a modulo: two uniform int32s per draw
    bits = torch.empty((n + 1) // 2, dtype=torch.int64, device=device).random_(-2 ** 63, None)
    bits = bits.view(torch.int32)[:n].view(shape)
    return bits >= round(p * 2 ** 32) - 2 ** 31


def keep_scale(shape: torch.Size, p: float, like: torch.Tensor) -> torch.Tensor:
    """The dropout multiplier: 1 / (1 - p) where kept, 0 where dropped."""
    return keep_mask(shape, p, like.device).to(like.dtype).mul_(1.0 / (1.0 - p))


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, True)
    return x * keep_scale(x.shape, p, x)


def dropout_add(x: torch.Tensor, residual: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """residual + dropout(x); on CPU one fused pass (addcmul), with one activation less to allocate."""
    if not training or p == 0.0:
        return residual + x
    if x.device.type != "cpu" or p >= 1.0:
        return residual + F.dropout(x, p, True)
    return torch.addcmul(residual, x, keep_scale(x.shape, p, x))


class Dropout(nn.Dropout):
    """`nn.Dropout` with the cheap CPU sampling of `dropout`; no parameters, so checkpoints are unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
