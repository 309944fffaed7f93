"""The CPU dropout (32-bit integer sampling) against dropout's definition, and the attention path that
uses it against SDPA."""

import math

import torch
import torch.nn.functional as F

from model.config import model_config
from model.dropout import dropout, dropout_add
from model.encoder import BertSelfAttention, attention_bias


def test_drop_rate_and_scale_follow_the_definition():
    """Each element is dropped with probability p (within 6 binomial sigmas over 4M draws); kept ones
    are x / (1 - p), so the expectation is x; the gradient is the same multiplier."""
    torch.manual_seed(0)
    n = 1 << 22
    for p in (0.1, 0.5, 0.9):
        x = torch.full((n,), 3.0, requires_grad=True)
        y = dropout(x, p)
        dropped = (y == 0).double().mean().item()
        assert abs(dropped - p) < 6 * math.sqrt(p * (1 - p) / n), (p, dropped)
        kept = y[y != 0]
        torch.testing.assert_close(kept, torch.full_like(kept, 3.0 / (1 - p)))
        y.sum().backward()
        torch.testing.assert_close(x.grad, (y / 3.0).detach())


def test_masks_are_independent_across_elements_and_calls():
    """No structure in the mask: neighbouring elements (the two halves of one 64-bit draw) and two
    calls agree at the rate independence gives, p^2 + (1-p)^2."""
    torch.manual_seed(1)
    n, p = 1 << 20, 0.3
    a = dropout(torch.ones(n), p) == 0
    b = dropout(torch.ones(n), p) == 0
    expected = p * p + (1 - p) ** 2
    sigma = math.sqrt(expected * (1 - expected) / (n // 2))
    assert abs((a[0::2] == a[1::2]).double().mean().item() - expected) < 6 * sigma
    assert abs((a == b).double().mean().item() - expected) < 6 * sigma


def test_eval_mode_and_p_zero_are_the_identity():
    x = torch.randn(4, 5)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0) is x
    r = torch.randn(4, 5)
    torch.testing.assert_close(dropout_add(x, r, 0.3, training=False), x + r)


def test_dropout_add_is_residual_plus_dropout():
    x, r = torch.randn(64, 32), torch.randn(64, 32)
    torch.manual_seed(5)
    fused = dropout_add(x, r, 0.2)
    torch.manual_seed(5)
    torch.testing.assert_close(fused, r + dropout(x, 0.2))


def test_training_attention_path_computes_sdpa():
    """With dropout on, CPU training attention runs its own softmax(QK^T / sqrt(d) + mask) V; at a
    dropout rate too small to drop anything it must equal SDPA without dropout, padding mask included."""
    cfg = model_config("tiny", updates={"attention_probs_dropout_prob": 1e-12})
    torch.manual_seed(2)
    attn = BertSelfAttention(cfg).train()
    x = torch.randn(3, 7, cfg.hidden_size)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 5:], mask[2, 2:] = False, False
    out, _, _ = attn(x, attention_bias(mask, 7))
    split = attn._split
    ref = F.scaled_dot_product_attention(split(attn.query(x)), split(attn.key(x)), split(attn.value(x)),
                                         attn_mask=attention_bias(mask, 7))
    torch.testing.assert_close(out, ref.transpose(1, 2).reshape(3, 7, -1), atol=1e-6, rtol=1e-5)
