"""The scaling model (bench/scaling.py, docs/SCALING.md) against hand-computed values."""

import math

import pytest

from bench.scaling import Sample, main, predict, sample_flops


def args(**kw):
    import argparse

    base = dict(captions_per_gpu=8, peak_tflops=1000.0, mfu_transformer=0.5, mfu_cnn=0.25, zero_stage=2,
                gpus_per_node=8, nvlink_gbs=500.0, ib_gbps=400.0, link_efficiency=0.8, loader_images_per_core=100.0)
    return argparse.Namespace(**{**base, **kw})


def test_step_time_communication_batch_and_lr_by_hand():
    s = Sample(transformer=1e11, cnn=5e11, params=1_000_000_000)
    r = predict(s, 64, args())
    # 8 pairs per GPU: 8 x (1e11 / 5e14 + 5e11 / 2.5e14) = 8 x (0.0002 + 0.002) s
    assert r["compute_s"] == pytest.approx(8 * 0.0022)
    # ZeRO-2: 2 x 1e9 params x 2 bytes x 63/64 over 400 Gb/s x 0.8 = 40 GB/s
    assert r["comm_s"] == pytest.approx(2 * 1e9 * 2 * 63 / 64 / 40e9)
    assert r["step_overlap_s"] == pytest.approx(max(r["compute_s"], r["comm_s"]))
    assert r["step_serial_s"] == pytest.approx(r["compute_s"] + r["comm_s"])
    assert r["global_batch"] == 1024 and r["accumulation"] == 1 and r["steps"] == 250_000 * 256 // 1024
    assert r["lr"] == pytest.approx(2e-5 * 2) and r["warmup_steps"] == 2000  # sqrt(1024 / 256) = 2
    assert r["mfu_overlap"] == pytest.approx(8 * 6e11 / (r["step_overlap_s"] * 1e15))
    assert r["images_per_s_per_gpu"] == pytest.approx(8 / r["step_overlap_s"])
    # ZeRO-3 moves 3 x params; inside one node the NVLink rate applies; below the paper's batch, accumulate
    assert predict(s, 64, args(zero_stage=3))["comm_s"] == pytest.approx(1.5 * r["comm_s"])
    one_node = predict(s, 8, args())
    assert one_node["comm_s"] == pytest.approx(2 * 1e9 * 2 * 7 / 8 / 500e9)
    assert one_node["accumulation"] == 2 and one_node["global_batch"] == 256 and one_node["lr"] == 2e-5


def test_sample_flops_match_the_transformer_formula_and_count_the_cnn():
    from model.config import model_config
    from model.flops import transformer_flops

    s = sample_flops("base", regions=10, caption_tokens=13, text_tokens=64, height=200, width=300)
    cfg = model_config("base")
    want = transformer_flops(cfg, [1 + 13 + 1 + 11 + 1, 64], 2 + 10, 2)
    assert s.transformer == pytest.approx(want)
    assert s.cnn > 0 and 100e6 < s.params < 250e6  # BERT-base + ResNet-101 from res3 up
    bigger = sample_flops("base", regions=10, caption_tokens=13, text_tokens=64, height=400, width=600)
    # 4x the pixels: the backbone grows with the area, res5 per RoI does not
    assert math.isclose(bigger.transformer, s.transformer) and 2 * s.cnn < bigger.cnn < 4 * s.cnn


def test_the_command_prints_both_sizes(capsys):
    assert main(["--gpus", "8", "64", "--regions", "10", "--image", "200", "300"]) == 0
    out = capsys.readouterr().out
    assert "VL-BERT-base" in out and "VL-BERT-large" in out and out.count("\n| 64 |") == 2
