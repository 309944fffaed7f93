"""Import a transformers BERT checkpoint from a local directory into VL-BERT.

Reads `config.json` plus `model.safetensors` (or `pytorch_model.bin`, loaded with weights_only).
Mapped by name: word/position embeddings, the embedding LayerNorm, every encoder layer, the pooler,
and the MLM head (`cls.predictions.*`) where the checkpoint has one. Token types: BERT's two become
segments A and B; segment C keeps its N(0, 0.02) init, like every parameter BERT does not have.
Keys may carry BertForPreTraining's `bert.` prefix or none (BertModel); old `gamma`/`beta` names work.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from .config import VLBertConfig, model_config
from .vl_bert import VLBertForPretraining


def read_hf_config(path: str | Path) -> dict:
    path = Path(path)
    try:
        return json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no config.json (expected a transformers BERT directory)") from None


def config_from_hf(path: str | Path, preset: str = "base", overrides=(), updates: dict | None = None
                   ) -> VLBertConfig:
    """A VLBertConfig whose transformer sizes are the checkpoint's (vision settings from the preset)."""
    hf = read_hf_config(path)
    sizes = [f"{k}={hf[k]}" for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                         "intermediate_size", "max_position_embeddings", "layer_norm_eps")
             if k in hf]
    return model_config(preset, None, [*sizes, *overrides], updates)


def load_hf_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if (path / "model.safetensors").exists():

        state = load_file(str(path / "model.safetensors"))
    elif (path / "pytorch_model.bin").exists():
        state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{path}: neither model.safetensors nor pytorch_model.bin")
    out = {}
    for key, value in state.items():
        key = key.removeprefix("bert.").replace("LayerNorm.gamma", "LayerNorm.weight").replace(
            "LayerNorm.beta", "LayerNorm.bias")
        out[key] = value
    return out


def load_hf_bert(model, path: str | Path) -> dict[str, list[str]]:
    """Copy a BERT checkpoint into a VLBert or VLBertForPretraining in place. Returns what was loaded
    and which of our parameters kept their initialisation."""

    vl_bert = model.vl_bert if isinstance(model, VLBertForPretraining) else model
    cfg = vl_bert.cfg
    hf = read_hf_config(path)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        if key in hf and hf[key] != getattr(cfg, key):
            raise ValueError(f"{path}/config.json: {key}={hf[key]} but the model has {getattr(cfg, key)} "
                             f"(build the config with model.hf_import.config_from_hf)")
    if hf.get("hidden_act", "gelu") not in ("gelu", "gelu_python"):
        raise ValueError(f"{path}/config.json: hidden_act={hf['hidden_act']}, VL-BERT's layers use exact GELU")
    state = load_hf_state_dict(path)
    own = vl_bert.state_dict()
    loaded = []
    with torch.no_grad():
        for key, value in state.items():
            if key == "embeddings.token_type_embeddings.weight":
                own[key][: value.shape[0]].copy_(value)  # A, B <- BERT's types 0, 1; C keeps its init
                loaded.append(key)
            elif key.startswith(("embeddings.word_embeddings", "embeddings.position_embeddings",
                                 "embeddings.LayerNorm", "encoder.layer.", "pooler.")) and key in own:
                if own[key].shape != value.shape:
                    raise ValueError(f"{path}: '{key}' is {list(value.shape)}, model has {list(own[key].shape)}")
                own[key].copy_(value)
                loaded.append(key)
        if isinstance(model, VLBertForPretraining):
            head = model.mlm_head.state_dict()
            for key, value in state.items():
                if key.startswith("cls.predictions.") and not key.endswith("decoder.weight"):
                    name = key.removeprefix("cls.predictions.").replace("decoder.bias", "bias")
                    if name in head:
                        head[name].copy_(value)
                        loaded.append(key)
    kept = [k for k in own if k not in loaded and not k.startswith("fast_rcnn.")]
    return {"loaded": loaded, "kept_init": kept}
