"""Export directories in the transformers convention: config.json + model.safetensors (with its source in the
metadata), loaded by our loader and by transformers' `from_pretrained` to the same model; and an image with
no region at all (nothing detected) runs on its whole-image element."""

import dataclasses
import json

import torch
from transformers import AutoConfig, AutoModel

from model.config import model_config
from model.export import (
    BOX_CONVENTION,
    config_hash,
    export_metadata,
    image_preprocessing,
    load_config_dir,
    load_pretrained,
    save_pretrained,
)
from model.hf import VLBertForPreTrainingHF, VLBertHFConfig
from model.vl_bert import VLBertForPretraining

from .conftest import make_batch


def worded(cfg):
    """Region word embeddings on: their tables are buffers rebuilt from the config, not saved."""
    k, a = cfg.fast_rcnn.num_classes, cfg.fast_rcnn.num_attributes
    return dataclasses.replace(cfg, region_class_words=[[5 + i] for i in range(k)],
                               region_attribute_words=[[20 + i, 30] for i in range(a)] if a else None)


def trained_like(cfg):
    torch.manual_seed(0)
    model = VLBertForPretraining(cfg).eval()
    with torch.no_grad():  # weights no init gives: a loader that re-initialised anything would show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def hidden(model, batch):
    with torch.no_grad():
        return model(**batch).last_hidden_state


def test_export_round_trips_through_transformers(tmp_path):
    cfg = worded(model_config("tiny"))
    model, batch = trained_like(cfg), make_batch()
    image = image_preprocessing(128, 192, 32, cfg)
    save_pretrained(model.state_dict(), cfg, tmp_path / "ours", image=image,
                    source={"run_id": "abc", "step": 800}, architecture="VLBertForPreTrainingHF")
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["model_type"] == "vl_bert_scale" and config["architectures"] == ["VLBertForPreTrainingHF"]
    assert config["hidden_size"] == cfg.hidden_size and config["tie_word_embeddings"] is True
    assert config["image_preprocessing"]["short_side"] == 128
    assert config["image_preprocessing"]["pixel_mean"] == [round(m * 255, 4) for m in cfg.fast_rcnn.pixel_mean]
    assert config["image_preprocessing"]["box_convention"] == BOX_CONVENTION
    meta = export_metadata(tmp_path / "ours")
    assert meta["run_id"] == "abc" and meta["step"] == "800" and meta["config_sha256"] == config_hash(cfg)
    assert not (tmp_path / "ours" / "config.yaml").exists()

    ref = hidden(model, batch)
    ours = load_pretrained(tmp_path / "ours").eval()
    assert torch.equal(hidden(ours, batch), ref) and ours.image_preprocessing == image
    hf, info = VLBertForPreTrainingHF.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.equal(hidden(hf.eval(), batch), ref)
    assert hf.mlm_head.decoder.weight is hf.vl_bert.embeddings.word_embeddings.weight  # tied, stored once
    for (name, a), (_, b) in zip(model.named_buffers(), hf.named_buffers(), strict=True):
        assert torch.equal(a, b), name  # the config-derived buffers too (transformers builds on meta)
    assert type(AutoModel.from_pretrained(tmp_path / "ours")) is VLBertForPreTrainingHF
    assert AutoConfig.from_pretrained(tmp_path / "ours").image_preprocessing == image

    hf.save_pretrained(tmp_path / "theirs")  # and back: transformers' save, our loader
    again = load_pretrained(tmp_path / "theirs").eval()
    assert load_config_dir(tmp_path / "theirs") == load_config_dir(tmp_path / "ours")
    assert torch.equal(hidden(again, batch), ref)


def test_hf_config_keeps_every_field():
    cfg = dataclasses.replace(worded(model_config("tiny")), visual_ln_init=0.05, geometry_size=16)
    assert VLBertHFConfig.from_vl_bert(cfg).vl_bert_config() == cfg


def test_directories_written_before_config_json_still_load(tmp_path):
    import yaml

    cfg = model_config("tiny")
    model, batch = trained_like(cfg), make_batch()
    save_pretrained(model.state_dict(), cfg, tmp_path)
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
    old = load_pretrained(tmp_path).eval()
    assert torch.equal(hidden(old, batch), hidden(model, batch)) and old.image_preprocessing is None


def test_an_image_with_no_region_runs_on_its_whole_image(tiny_model):
    """N = 0 boxes gives the whole-image element and [END] only; the same image with one padded box (masked
    out of attention) is the reference: every real position must agree."""
    batch = make_batch()
    b, t = batch["input_ids"].shape
    none = dict(batch, boxes=batch["boxes"][:, :0], box_mask=batch["box_mask"][:, :0])
    padded = dict(batch, boxes=batch["boxes"][:, :1], box_mask=torch.zeros(b, 1, dtype=torch.bool))
    with torch.no_grad():
        out, ref = tiny_model(**none), tiny_model(**padded)
    assert out.num_regions == 1 and out.last_hidden_state.shape[1] == t + 2
    keep = torch.cat([torch.arange(t + 1), torch.tensor([t + 2])])  # words, whole image, [END]
    assert torch.allclose(out.last_hidden_state, ref.last_hidden_state[:, keep], atol=1e-5)
    assert torch.equal(out.attention_mask, torch.cat([batch["text_mask"], torch.ones(b, 2, dtype=torch.bool)], 1))


def test_a_zero_started_path_switched_on_over_an_export_starts_at_zero(tmp_path, capsys):
    """load_pretrained with updates that switch on geometry_layers (or a pair_geometry path) over an export trained
    without it: the projection is not in the file, starts at zero (said on stdout), and the model computes the
    export's outputs; a switched-on
    parameter the path list does not name (the learned region token, which replaces [IMG] rather than adding to it)
    is still a mismatch."""
    cfg = model_config("tiny")
    model, batch = trained_like(cfg), make_batch()
    save_pretrained(model.state_dict(), cfg, tmp_path / "export", image=image_preprocessing(128, 192, 32, cfg),
                    source={"run_id": "abc", "step": 1})
    for flag, owner, name, atol in (("geometry_layers", "embeddings", "geometry_layer_projection", 0),
                                    ("pair_geometry_bias", "embeddings", "pair_geometry_projection", 1e-6),
                                    ("pair_geometry_values", "encoder", "pair_geometry_value_projection", 1e-6)):
        loaded = load_pretrained(tmp_path / "export", updates={flag: True}).eval()
        proj = getattr(getattr(loaded.vl_bert, owner), name)
        proj = proj[1] if isinstance(proj, torch.nn.ModuleList) else proj  # one per layer
        assert not proj.weight.any() and not proj.bias.any()
        assert f"vl_bert.{owner}.{name} not in the export: starts at zero" in capsys.readouterr().out
        torch.testing.assert_close(hidden(loaded, batch), hidden(model, batch), rtol=0, atol=atol)
        with torch.no_grad():
            proj.weight.normal_()
        assert not torch.allclose(hidden(loaded, batch), hidden(model, batch))  # the path is live once it learns
    try:
        load_pretrained(tmp_path / "export", updates={"visual_tokens": "learned"})
    except ValueError as e:
        assert "does not match its config" in str(e)
    else:
        raise AssertionError("a missing parameter outside the zero-started paths loaded")
