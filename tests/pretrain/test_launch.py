import ast
import os
import subprocess
from pathlib import Path

import pytest

from model.config import load_config
from pretrain.config import build_optim_config
from pretrain.run import PretrainConfig, build_model_config
from train.engine import param_groups

ROOT = Path(__file__).resolve().parents[2]


def test_pretrain_sh_is_both_bash_and_python():
    text = (ROOT / "launch/pretrain.sh").read_text()
    ast.parse(text)  # what each rank runs under `deepspeed launch/pretrain.sh`
    out = subprocess.run(["bash", str(ROOT / "launch/pretrain.sh"), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "deepspeed launch/pretrain.sh" in out.stdout
    bad = subprocess.run(["bash", str(ROOT / "launch/pretrain.sh"), "--config", "nope.yaml"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "nope.yaml" in bad.stderr


@pytest.mark.parametrize("name", ["demo", "vlbert_base_cc", "vlbert_large_cc"])
def test_launch_configs_load(name):
    cfg = load_config(PretrainConfig, ROOT / f"launch/configs/{name}.yaml")
    if name != "demo":  # the paper's setting: 250k steps, 8000 warm-up, lr 2e-5, 1:1 batches
        assert (cfg.engine.steps, cfg.optim.warmup_steps, cfg.optim.lr) == (250000, 8000, 2e-5)
        assert cfg.data.caption_batch_size == cfg.data.text_batch_size
        cfg.bert = None  # the BERT path is the user's
        cfg.model["fast_rcnn"]["weights"] = None
    model_cfg = build_model_config(cfg)
    if name != "demo":
        assert model_cfg.fast_rcnn.weights is None  # YAML null stays None, not the string "None"
        assert model_cfg.fast_rcnn.backbone == "resnet101" and model_cfg.fast_rcnn.channels_last is True
    assert model_cfg.hidden_size == {"demo": 384, "vlbert_base_cc": 768, "vlbert_large_cc": 1024}[name]


@pytest.mark.parametrize("name", ["demo", "demo_long", "demo_features"])
def test_a_demo_config_builds_the_detector_its_warm_up_trains(name):
    """A pretraining config loads the weights its detector warm-up writes into a Fast R-CNN of its own shape. The
    shapes that change what the weights compute without failing to load them (feature_stride: the same convolutions
    at another resolution; the RoI grid) must match the warm-up's, or the run trains on a detector that names
    nothing it learnt to (checked against the warm-up config that `pretrain.prepare` runs for those weights)."""
    from pretrain.detector import DetectorConfig
    from pretrain.prepare import warmup_for

    cfg = load_config(PretrainConfig, ROOT / f"launch/configs/{name}.yaml")
    model = build_model_config(cfg).fast_rcnn
    warmup = warmup_for(model.weights, sorted((ROOT / "launch/configs").glob("detector_*.yaml")))
    assert warmup is not None, f"{name}.yaml: no warm-up config writes {model.weights}"
    trained = load_config(DetectorConfig, str(warmup), []).fast_rcnn
    for field in ("backbone", "num_classes", "roi_output_size", "feature_stride", "res5_dilation", "stride_in_1x1"):
        assert getattr(model, field) == getattr(trained, field), (name, warmup.name, field)


def test_the_image_ablated_control_reads_no_boxes():
    """masking.ablate_image greys the pixels and (unless `model` says otherwise) sets the model's region_geometry
    to whole_image, which the export's config carries to every evaluation of the control."""
    demo = ROOT / "launch/configs/demo.yaml"
    assert build_model_config(load_config(PretrainConfig, demo)).region_geometry == "boxes"
    control = load_config(PretrainConfig, demo, ["masking.ablate_image=true"])
    assert build_model_config(control).region_geometry == "whole_image"
    kept = load_config(PretrainConfig, demo, ["masking.ablate_image=true", "model.region_geometry=boxes"])
    assert build_model_config(kept).region_geometry == "boxes"
    # and it reads no image: every one it meets at evaluation is the grey it trained on (model.image_ablated)
    assert not build_model_config(load_config(PretrainConfig, demo)).image_ablated
    assert build_model_config(control).image_ablated and build_model_config(kept).image_ablated


def test_alignment_drop_needs_the_alignment():
    demo = ROOT / "launch/configs/demo.yaml"
    assert build_model_config(load_config(PretrainConfig, demo, ["masking.alignment_drop=0.5"])).region_word_alignment
    with pytest.raises(ValueError, match="set model.region_word_alignment"):
        build_model_config(load_config(PretrainConfig, demo, ["masking.alignment_drop=0.5",
                                                              "model.region_word_alignment=null"]))
    on = ["masking.neighbour_drop=0.5", "model.alignment_neighbours=1"]
    assert build_model_config(load_config(PretrainConfig, demo, on)).alignment_neighbours == 1
    with pytest.raises(ValueError, match="set model.alignment_neighbours"):
        build_model_config(load_config(PretrainConfig, demo, on[:1] + ["model.alignment_neighbours=0"]))


def test_the_image_ablated_control_freezes_its_detector():
    """The control's Fast R-CNN trains at masking.ablate_image_cnn_lr of the LR (0: frozen) whatever the config's
    multiplier for it; the other multipliers and the model's run are untouched; null keeps the config's."""
    import torch

    demo_long = ROOT / "launch/configs/demo_long.yaml"
    module = torch.nn.ModuleDict({"vl_bert": torch.nn.ModuleDict({"fast_rcnn": torch.nn.Linear(3, 3),
                                                                  "encoder": torch.nn.Linear(3, 3)})})
    detector, encoder = module["vl_bert"]["fast_rcnn"].weight, module["vl_bert"]["encoder"].weight

    def rates(overrides):
        multipliers = "optim.lr_multipliers={fast_rcnn.: 0.1, encoder.: 0.5}"
        cfg = load_config(PretrainConfig, demo_long, overrides + [multipliers])
        groups = param_groups(module, 0.01, lr=1.0, lr_multipliers=build_optim_config(cfg).lr_multipliers)
        by_id = {id(p): g.get("lr", 1.0) for g in groups for p in g["params"]}
        return by_id[id(detector)], by_id[id(encoder)]

    assert rates([]) == pytest.approx((0.1, 0.5))
    assert rates(["masking.ablate_image=true"]) == pytest.approx((0.0, 0.5))
    assert rates(["masking.ablate_image=true", "masking.ablate_image_cnn_lr=0.03"]) == pytest.approx((0.03, 0.5))
    assert rates(["masking.ablate_image=true", "masking.ablate_image_cnn_lr=null"]) == pytest.approx((0.1, 0.5))
    # a group at rate 0 does not move under AdamW (weight decay is scaled by the rate too)
    cfg = load_config(PretrainConfig, demo_long, ["masking.ablate_image=true"])
    before = detector.detach().clone(), encoder.detach().clone()
    opt = torch.optim.AdamW(param_groups(module, 0.01, lr=1e-2, lr_multipliers=build_optim_config(cfg).lr_multipliers),
                            lr=1e-2)
    module["vl_bert"]["encoder"](module["vl_bert"]["fast_rcnn"](torch.ones(2, 3))).sum().backward()
    opt.step()
    assert torch.equal(detector, before[0]) and not torch.equal(encoder, before[1])


def test_ablation_sh_passes_arguments_through(tmp_path):
    out = subprocess.run(["bash", str(ROOT / "launch/ablation.sh"), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--text-baseline" in out.stdout and "Flickr30k Entities" in out.stdout
    bad = subprocess.run(["bash", str(ROOT / "launch/ablation.sh"), "--model", f"x={tmp_path}"],
                         capture_output=True, text=True)
    # the held-out data has no default: named in one line, no traceback
    assert bad.returncode == 2 and "flickr_root, images, boxes not set" in bad.stderr
    assert "Traceback" not in bad.stderr
    bad = subprocess.run(["bash", str(ROOT / "launch/ablation.sh"), "--model", f"x={tmp_path}", "--config",
                          str(ROOT / "launch/configs/heldout_demo.yaml")], capture_output=True, text=True)
    assert bad.returncode != 0 and "config.json" in bad.stderr  # not an exported directory: named


def test_demo_config_runs_the_periodic_diagnostic():
    cfg = load_config(PretrainConfig, ROOT / "launch/configs/demo.yaml")
    assert cfg.engine.eval_every > 0 and cfg.diagnostic is not None
    assert Path(cfg.diagnostic.flickr_root).parts[:2] == ("data", "demo")


@pytest.mark.parametrize("task", ["vqa", "vcr", "refcoco"])
def test_finetune_launchers_and_configs(task):
    import importlib

    out = subprocess.run(["bash", str(ROOT / f"launch/finetune_{task}.sh"), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and f"finetune_{task}.sh" in out.stdout
    bad = subprocess.run(["bash", str(ROOT / f"launch/finetune_{task}.sh")], capture_output=True, text=True,
                         env={**os.environ, "CONFIG": "nope.yaml"})
    assert bad.returncode == 2 and "nope.yaml" in bad.stderr
    module = importlib.import_module(f"finetune.{task}")
    spec = getattr(module, {"vqa": "VQATask", "vcr": "VCRTask", "refcoco": "RefTask"}[task])
    paper = load_config(spec.config_cls, ROOT / f"launch/configs/{task}_paper.yaml")
    load_config(spec.config_cls, ROOT / f"launch/configs/{task}_demo.yaml")
    # the paper's A.2: 20 epochs of 256; VCR by SGD (lr 5e-3, x0.1 at epochs 14 and 18), the others Adam 1e-4
    assert (paper.epochs, paper.batch_size) == (20, 256)
    if task == "vcr":
        assert (paper.optim.optimizer, paper.optim.lr, paper.decay_epochs, paper.optim.warmup_steps) == \
            ("sgd", 5e-3, [14, 18], 1000)
    else:
        assert (paper.optim.optimizer, paper.optim.lr) == ("adamw", 1e-4)
        assert paper.optim.warmup_steps == {"vqa": 2000, "refcoco": 500}[task]


def test_zero_buckets_are_sized_to_the_model():
    from train.engine import EngineConfig, OptimConfig, bucket_elements, deepspeed_config

    assert bucket_elements(10_000) == 1 << 20  # floor: 1M elements
    assert bucket_elements(110_000_000) == 110_000_000 // 8 // 64 * 64  # BERT-base: 13.75M, 64-aligned
    assert bucket_elements(10**12) == 500_000_000  # DeepSpeed's default is the ceiling
    zero = deepspeed_config(EngineConfig(zero_stage=3), OptimConfig(), 8, 110_000_000)["zero_optimization"]
    assert zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == 13_749_952
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 13_749_952)
    assert deepspeed_config(EngineConfig(zero_stage=0), OptimConfig(), 8, 110_000_000)["zero_optimization"] == {
        "stage": 0}


def test_a_user_deepspeed_json_is_merged_key_by_key(tmp_path):
    """engine.deepspeed_config overrides single keys: a user's zero_optimization block adds to ours instead of
    replacing it (which dropped the stage and our bucket sizes)."""
    import json

    from train.engine import EngineConfig, OptimConfig, deepspeed_config

    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"zero_optimization": {"overlap_comm": True, "reduce_bucket_size": 1 << 22},
                                "gradient_clipping": 5.0}))
    ds = deepspeed_config(EngineConfig(zero_stage=2, deepspeed_config=str(user)), OptimConfig(), 8, 110_000_000)
    assert ds["zero_optimization"] == {"stage": 2, "reduce_bucket_size": 1 << 22, "allgather_bucket_size": 13_749_952,
                                       "overlap_comm": True}
    assert ds["gradient_clipping"] == 5.0 and ds["train_micro_batch_size_per_gpu"] == 8


@pytest.mark.parametrize("name,cls", [("vqg_demo", "finetune.vqg:VQGConfig"), ("vqg_coco", "finetune.vqg:VQGConfig"),
                                      ("retrieval_demo", "finetune.retrieval:RetrievalTask"),
                                      ("detector_demo", "pretrain.detector:DetectorTask"),
                                      ("detector_demo_long", "pretrain.detector:DetectorTask"),
                                      ("heldout_demo", "diagnostics.config:DiagnosticConfig"),
                                      ("heldout_demo", "diagnostics.config:GroundingConfig")])
def test_every_config_names_its_data(name, cls):
    """Dataset paths have no default: each shipped config loads, i.e. names every one its class requires."""
    import importlib

    module, attr = cls.split(":")
    obj = getattr(importlib.import_module(module), attr)
    load_config(getattr(obj, "config_cls", obj), ROOT / f"launch/configs/{name}.yaml")
