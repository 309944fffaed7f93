import json

import pytest
import torch

from model.boxes import box_iou
from shards.decode import CaptionDecoder
from shards.detector_view import NO_CLASS, DetectorViewConfig, detector_view
from shards.stream_config import StreamConfig
from tests.shards.helpers import jpeg_bytes

W, H = 200, 120


def sample(key="000001", n=6):
    g = torch.Generator().manual_seed(len(key))
    xy = torch.rand(n, 2, generator=g) * torch.tensor([W - 60, H - 50])
    boxes = torch.cat([xy, xy + torch.tensor([30.0, 40.0])], 1)
    return {"key": key, "boxes": boxes, "scores": torch.ones(n), "classes": torch.arange(1, n + 1),
            "class_probs": torch.softmax(torch.randn(n, 9, generator=g), -1).half(), "attribute_probs": None,
            "input_ids": torch.tensor([5, 6])}


def test_off_leaves_the_sample_alone_and_is_inactive():
    cfg = DetectorViewConfig()
    assert not cfg.active
    s = sample()
    out = detector_view(s, W, H, cfg, seed=0)
    torch.testing.assert_close(out["boxes"], s["boxes"])  # to float rounding (the decoder does not call it when off)
    assert torch.equal(out["classes"], s["classes"])


def test_jitter_stays_within_its_bounds():
    cfg = DetectorViewConfig(box_jitter=0.12, box_scale_jitter=0.15)
    for k in range(50):
        s = sample(f"{k:06d}")
        out = detector_view(s, W, H, cfg, seed=3)
        b, m = s["boxes"], out["boxes"]
        assert len(m) == len(b)  # nothing missed, nothing added
        size = b[:, 2:] - b[:, :2]
        shift = ((m[:, :2] + m[:, 2:]) / 2 - (b[:, :2] + b[:, 2:]) / 2).abs()
        inside = (m[:, :2] > 0).all(1) & (m[:, 2] < W) & (m[:, 3] < H)  # unclipped boxes: the bounds are exact
        assert (shift[inside] <= 0.12 * size[inside] + 1e-4).all()
        scale = (m[:, 2:] - m[:, :2])[inside] / size[inside]
        assert ((scale >= 0.85 - 1e-4) & (scale <= 1.15 + 1e-4)).all()
        assert torch.allclose(scale[:, 0], scale[:, 1], atol=1e-4)  # one factor for both sides
        assert (m[:, :2] >= 0).all() and (m[:, 2] <= W).all() and (m[:, 3] <= H).all()
        # the bounds' worst case, shifted 0.12 of each side and scaled by 0.85: overlap 0.805 x 0.805 of the box,
        # IoU 0.648 / (1 + 0.7225 - 0.648) = 0.603; clipping only cuts what lies outside the stored box
        assert (box_iou(m, b).diagonal() > 0.6).all()
        assert torch.equal(out["classes"], s["classes"])


def test_misses_and_false_positives_at_their_rates():
    cfg = DetectorViewConfig(box_miss=0.25, false_positives=[1, 3], false_positive_size=[0.1, 0.3],
                             false_positive_scores=[0.3, 0.7])
    real = kept = 0
    counts = []
    for k in range(400):
        s = sample(f"img{k}")
        out = detector_view(s, W, H, cfg, seed=0)
        fp = out["classes"] == NO_CLASS
        real += len(s["boxes"])
        kept += int((~fp).sum())
        counts.append(int(fp.sum()))
        f = out["boxes"][fp]
        side = f[:, 2] - f[:, 0]
        assert torch.allclose(side, f[:, 3] - f[:, 1])  # square, as the demo's detections' false positives
        assert ((side >= 0.1 * H - 1e-4) & (side <= 0.3 * H + 1e-4)).all()
        assert (f[:, :2] >= 0).all() and (f[:, 2] <= W + 1e-4).all() and (f[:, 3] <= H + 1e-4).all()
        assert ((out["scores"][fp] >= 0.3) & (out["scores"][fp] <= 0.7)).all()
        assert (out["class_probs"][fp] == 0).all() and out["attribute_probs"] is None
        # the boxes kept are the stored ones in order, with their own scores and distributions
        assert torch.equal(out["class_probs"][~fp], s["class_probs"][torch.isin(s["classes"], out["classes"])])
    # 2,400 boxes at 0.25: sd 0.0088
    assert abs(1 - kept / real - 0.25) < 0.035
    assert set(counts) == {1, 2, 3} and abs(sum(counts) / len(counts) - 2) < 0.15


def test_the_view_is_the_images_all_run_and_the_seeds():
    cfg = DetectorViewConfig(box_jitter=0.1, box_miss=0.2, false_positives=[0, 2])
    a, b = detector_view(sample(), W, H, cfg, seed=0), detector_view(sample(), W, H, cfg, seed=0)
    assert torch.equal(a["boxes"], b["boxes"])
    assert not torch.equal(detector_view(sample(), W, H, cfg, seed=1)["boxes"].flatten()[:4], a["boxes"].flatten()[:4])
    assert not torch.equal(detector_view(sample("000002"), W, H, cfg, seed=0)["boxes"][:1], a["boxes"][:1])


def test_one_box_always_stays():
    out = detector_view(sample(n=3), W, H, DetectorViewConfig(box_miss=0.999), seed=0)
    assert (out["classes"] != NO_CLASS).sum() == 1


@pytest.mark.parametrize("bad", [{"box_jitter": -0.1}, {"box_miss": 1.0}, {"false_positives": [3, 1]},
                                 {"false_positive_size": [0.1, 1.5]}, {"false_positives": [1]}])
def test_bad_settings_name_their_field(bad):
    with pytest.raises(ValueError, match="data.detector_view." + next(iter(bad))):
        DetectorViewConfig(**bad)


def test_decoder_applies_it_in_the_resized_pixels():
    meta = {"caption": "a red square", "width": 400, "height": 240, "boxes": [[10, 20, 110, 120], [200, 40, 300, 140]],
            "classes": [1, 2], "scores": [1.0, 1.0]}
    record = {"__key__": "k1", "json": json.dumps(meta).encode(), "jpg": jpeg_bytes(400, 240)}
    plain = CaptionDecoder(StreamConfig(short_side=120, long_side=200))(record)
    view = DetectorViewConfig(box_jitter=0.1, false_positives=[2, 2])
    noisy = CaptionDecoder(StreamConfig(short_side=120, long_side=200, seed=4, detector_view=view))(record)
    expected = detector_view({k: plain[k] for k in ("key", "boxes", "scores", "classes")} |
                             {"class_probs": None, "attribute_probs": None}, 200, 120, view, seed=4)
    assert noisy["image"].shape == plain["image"].shape == (3, 120, 200)
    assert torch.equal(noisy["boxes"], expected["boxes"]) and noisy["classes"].tolist() == [1, 2, -1, -1]
