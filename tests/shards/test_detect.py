import json

import numpy as np
import pytest
import torch

from shards import detect, write_captions
from shards.caption_inputs import load_box_file
from shards.skips import SkipLog

from .helpers import write_tsv_corpus


@pytest.mark.parametrize("scores,expected", [
    # 12 above 0.5 -> all 12 (between min 10 and max 100), best first
    ([0.9] * 12 + [0.1] * 5, list(range(12))),
    # only 3 above 0.5 -> topped up to 10 with the best below the threshold
    ([0.2, 0.95, 0.3, 0.8, 0.1, 0.7, 0.05, 0.4, 0.45, 0.01, 0.02, 0.03, 0.5], [1, 3, 5, 12, 8, 7, 2, 0, 4, 6]),
    # fewer boxes than the minimum -> all of them
    ([0.1, 0.6], [1, 0]),
])
def test_vlbert_box_rule(scores, expected):
    assert detect.select_boxes(torch.tensor(scores), 0.5, 10, 100).tolist() == expected


def test_vlbert_box_rule_caps_at_max():
    scores = torch.linspace(1.0, 0.6, 150)
    assert detect.select_boxes(scores, 0.5, 10, 100).tolist() == list(range(100))


@pytest.fixture(scope="module")
def tiny_detector():
    torch.manual_seed(0)
    cfg = detect.DetectorConfig(backbone="resnet18", num_classes=7, min_size=64, max_size=96, min_boxes=10,
                                max_boxes=20, batch_size=2)
    return detect.RegionDetector(cfg)


def test_detector_pass_outputs(tiny_detector):
    images = [torch.randint(0, 255, (3, 48, 64), dtype=torch.uint8),
              torch.randint(0, 255, (3, 80, 40), dtype=torch.uint8)]
    out = tiny_detector(images)
    for im, det in zip(images, out, strict=False):
        n = len(det["boxes"])
        assert 10 <= n <= 20  # random weights score below 0.5: the rule tops up to the minimum
        assert det["class_probs"].shape == (n, 7) and det["classes"].shape == (n,)
        np.testing.assert_allclose(det["class_probs"].astype(np.float32).sum(1), 1.0, atol=1e-2)
        h, w = im.shape[-2:]
        assert (det["boxes"][:, [0, 2]] <= w + 1e-3).all() and (det["boxes"][:, [1, 3]] <= h + 1e-3).all()
        assert (np.diff(det["scores"]) <= 0).all()  # best first


def test_detector_weights_from_local_file(tmp_path, tiny_detector):
    path = tmp_path / "det.pt"
    torch.save({"model": tiny_detector.model.state_dict()}, path)
    cfg = detect.DetectorConfig(backbone="resnet18", num_classes=7, min_size=64, max_size=96, weights=str(path))
    loaded = detect.RegionDetector(cfg)
    for (k, a), b in zip(tiny_detector.model.state_dict().items(), loaded.model.state_dict().values(), strict=False):
        assert torch.equal(a, b), k
    with pytest.raises(ValueError, match="det.pt"):
        detect.RegionDetector(detect.DetectorConfig(backbone="resnet18", num_classes=9, weights=str(path)))


def test_detect_cli_writes_a_box_file_the_writer_reads(tmp_path):
    tsv = write_tsv_corpus(tmp_path, [("a caption", "a.jpg", (50, 40), None), ("another", "b.jpg", (30, 60), None),
                                      ("gone", "c.jpg", None, None)], {})
    cfg = tmp_path / "det.yaml"
    cfg.write_text("backbone: resnet18\nnum_classes: 5\nmin_size: 64\nmax_size: 96\n")
    out = tmp_path / "boxes.jsonl"
    assert detect.main(["--tsv", str(tsv), "--image-root", str(tmp_path / "img"), "--config", str(cfg),
                        "--out", str(out), "max_boxes=12"]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["image"] for x in lines] == ["a.jpg", "b.jpg"]
    entries = load_box_file(out, SkipLog(), num_classes=5)
    assert all(10 <= len(e.boxes) <= 12 and e.class_probs.shape == (len(e.boxes), 5) for e in entries.values())
    assert write_captions.main(["--tsv", str(tsv), "--image-root", str(tmp_path / "img"), "--boxes", str(out),
                                "--out", str(tmp_path / "shards")]) == 0
    assert json.loads((tmp_path / "shards" / "manifest.json").read_text())["total"] == 2
