import torch
from torch.utils.flop_counter import FlopCounterMode

from model.config import model_config
from model.flops import transformer_flops
from model.vl_bert import VLBert


def test_transformer_formula_matches_counted_flops():
    """6N per token + 12*L*d*T^2 per sequence == 3 x the encoder's forward FLOPs as torch counts them."""
    cfg = model_config("tiny", overrides=["hidden_size=64", "intermediate_size=128", "num_attention_heads=4"])
    model = VLBert(cfg, with_fast_rcnn=False).eval()
    seq, batch = 24, 2
    x = torch.randn(batch, seq, 64)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        # the explicit-matmul attention path: torch's counter does not see CPU SDPA kernels
        model.encoder(x, torch.ones(batch, seq, dtype=torch.bool), output_attentions=True)
    counted = 3 * counter.get_total_flops()
    formula = transformer_flops(cfg, [seq] * batch, masked_words=0, masked_regions=0)
    # the formula also counts biases and LayerNorm parameters as 6 FLOPs each per token: within 5%
    assert abs(formula - counted) / counted < 0.05, (formula, counted)
