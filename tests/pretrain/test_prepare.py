"""pretrain.prepare: the steps launch/pretrain.sh runs before the ranks start, read from the config as the run
reads it (overrides included), where the launcher once grepped the file's text."""

import os

import pytest

from model.config import ConfigError
from pretrain.prepare import main


def steps(capsys, *argv) -> list[str]:
    assert main(list(argv)) == 0
    return capsys.readouterr().out.splitlines()


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A checkout's layout in tmp_path: a detector warm-up config, a pretraining config on the demo's shards
    whose detector weights that warm-up writes, and one on other shards whose comment names the demo's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "launch/configs").mkdir(parents=True)
    (tmp_path / "launch/configs/detector_x.yaml").write_text(
        "train: a.json\nval: b.json\nimage_root: .\nengine:\n  run_dir: runs/det-x\n")
    (tmp_path / "demo.yaml").write_text(
        "data:\n  caption_shards: data/demo/shards/captions-train/*.tar\n"
        "model:\n  fast_rcnn:\n    weights: runs/det-x/fast_rcnn.pt\n")
    (tmp_path / "other.yaml").write_text(
        "# unlike data/demo/shards/captions-train, these are a user's own shards\n"
        "data:\n  caption_shards: /corpus/cc-{000..009}.tar\n")
    return tmp_path


def test_demo_corpus_and_warmup_from_the_config_not_its_text(tree, capsys):
    assert steps(capsys, "--config", "demo.yaml") == ["demo", "warmup launch/configs/detector_x.yaml"]
    assert steps(capsys, "--config", "other.yaml") == []  # the comment's demo path is no data the run reads
    # overrides count as the run counts them; the launcher's own flags are accepted
    assert steps(capsys, "--config", "other.yaml", "--resume", "--skip-batches", "3,4",
                 "data.text_shards=data/demo/shards/text/*.tar") == ["demo"]
    assert steps(capsys, "--config", "demo.yaml", "data.caption_shards=/corpus/x.tar") == [
        "warmup launch/configs/detector_x.yaml"]
    (tree / "runs/det-x").mkdir(parents=True)
    (tree / "runs/det-x/fast_rcnn.pt").write_bytes(b"")
    assert steps(capsys, "--config", "demo.yaml") == ["demo"]  # warmed up already


def test_weights_nothing_writes_are_an_error_before_the_run(tree):
    with pytest.raises(ConfigError, match="model.fast_rcnn.weights: runs/nope.pt not found"):
        main(["--config", "demo.yaml", "model.fast_rcnn.weights=runs/nope.pt"])


def test_features_when_missing_or_older_than_their_captions(tree, capsys):
    argv = ["--config", "other.yaml", "data.caption_shards=data/demo/shards/features-train/*.tar"]
    features_step = "features data/demo/shards/captions-train/*.tar data/demo/shards/features-train"
    assert steps(capsys, *argv) == ["demo", features_step]
    captions, features = tree / "data/demo/shards/captions-train", tree / "data/demo/shards/features-train"
    captions.mkdir(parents=True)
    features.mkdir(parents=True)
    (captions / "manifest.json").write_text("{}")
    (features / "manifest.json").write_text("{}")
    os.utime(captions / "manifest.json", (1_000, 1_000))
    os.utime(features / "manifest.json", (2_000, 2_000))
    assert steps(capsys, *argv) == ["demo"]
    os.utime(captions / "manifest.json", (3_000, 3_000))  # the corpus was rebuilt after the features
    assert steps(capsys, *argv) == ["demo", features_step]
