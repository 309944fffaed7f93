"""Pretrained-model directories, in the transformers layout: `model.safetensors` (fp32, the tied MLM decoder
stored once, as the word embeddings; its metadata names the source run, step and config hash) +
`config.json` (the VLBertConfig's fields, the image preprocessing, transformers' `model_type`) + the
tokenizer's files. The trainers load one with `load_pretrained(path)`; transformers with
`model.hf.VLBertForPreTrainingHF.from_pretrained(path)`. Directories written before config.json (a
`config.yaml`) still load."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .config import VLBertConfig, deep_merge, from_dict
from .vl_bert import ZERO_STARTED, VLBertForPretraining

TIED = "mlm_head.decoder.weight"
CONFIG = "config.json"
LEGACY_CONFIG = "config.yaml"
MODEL_TYPE = "vl_bert_scale"  # transformers' AutoConfig key (model/hf.py registers it)
PRETRAINING_ARCHITECTURE = "VLBertForPreTrainingHF"
# the boxes a model takes (`VLBert.forward`): corners in pixels of the resized image
BOX_CONVENTION = "xyxy, pixels of the resized image, 0-based, x2/y2 exclusive"


def image_preprocessing(short_side: int, long_side: int, size_divisibility: int, cfg: VLBertConfig) -> dict:
    """How a model's images are prepared, as an export records it: resize (shorter side to `short_side` unless
    the longer would pass `long_side`), zero-pad the batch to a multiple of `size_divisibility`, then
    (pixels - mean) / std on 0-255 RGB inside the model."""
    return {"short_side": short_side, "long_side": long_side, "size_divisibility": size_divisibility,
            "pixel_mean": [round(m * 255, 4) for m in cfg.fast_rcnn.pixel_mean],
            "pixel_std": [round(s * 255, 4) for s in cfg.fast_rcnn.pixel_std],
            "pixel_format": "RGB, 0-255", "box_convention": BOX_CONVENTION}


def config_hash(cfg: VLBertConfig) -> str:
    return hashlib.sha256(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode()).hexdigest()[:16]


def save_pretrained(state_dict: dict[str, torch.Tensor], cfg: VLBertConfig, path: str | Path,
                    tokenizer_dir: str | Path | None = None, *, image: dict | None = None,
                    source: dict | None = None, architecture: str | None = None) -> Path:
    """image: `image_preprocessing(...)`; source: what made the weights (run directory, run id, step),
    kept in the safetensors metadata with the config's hash; architecture: the transformers class that
    loads the directory (`PRETRAINING_ARCHITECTURE` for a pretraining export)."""

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float32).contiguous().cpu() for k, v in state_dict.items() if k != TIED}
    metadata = {"format": "pt", "config_sha256": config_hash(cfg),
                **{k: str(v) for k, v in (source or {}).items()}}
    save_file(tensors, str(path / "model.safetensors"), metadata=metadata)
    config = {"model_type": MODEL_TYPE, **({"architectures": [architecture]} if architecture else {}),
              **dataclasses.asdict(cfg), "image_preprocessing": image, "tie_word_embeddings": True,
              "torch_dtype": "float32"}
    (path / CONFIG).write_text(json.dumps(config, indent=1) + "\n")
    (path / LEGACY_CONFIG).unlink(missing_ok=True)  # a directory written again: one config, the new one
    if tokenizer_dir is not None:
        for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (Path(tokenizer_dir) / name).exists():
                shutil.copy(Path(tokenizer_dir) / name, path / name)
    return path


VL_BERT_FIELDS = tuple(f.name for f in dataclasses.fields(VLBertConfig))


def exported_model_fields(data: dict) -> dict:
    """The VLBertConfig fields of an export's config mapping. A pixels model's detector weights file is dropped:
    the exported weights already hold the detector's. A features model keeps its extractor's weights file:
    evaluation on new images reruns it."""
    out = {k: v for k, v in data.items() if k in VL_BERT_FIELDS}
    if out.get("region_input", "pixels") == "pixels" and isinstance(out.get("fast_rcnn"), dict):
        out["fast_rcnn"] = {**out["fast_rcnn"], "weights": None}
    return out


def _config_json(path: Path) -> dict | None:
    """The directory's config.json if it is ours (a transformers BERT directory has one too)."""
    try:
        data = json.loads((path / CONFIG).read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path / CONFIG}: not valid JSON ({e})") from None
    return data if isinstance(data, dict) and data.get("model_type") == MODEL_TYPE else None


def is_export_dir(path: str | Path) -> bool:
    return _config_json(Path(path)) is not None or (Path(path) / LEGACY_CONFIG).exists()


def _read_config(path: Path) -> tuple[dict, str]:
    data = _config_json(path)
    if data is not None:
        return exported_model_fields(data), str(path / CONFIG)
    if (path / LEGACY_CONFIG).exists():
        return exported_model_fields(yaml.safe_load((path / LEGACY_CONFIG).read_text())), str(path / LEGACY_CONFIG)
    if (path / CONFIG).exists():
        raise ValueError(f"{path / CONFIG}: model_type is not '{MODEL_TYPE}' (a transformers BERT directory? pass "
                         "it where a BERT is expected, e.g. backbone.init)")
    raise FileNotFoundError(f"{path}: no {CONFIG} (not an exported VL-BERT directory)")


def load_config_dir(path: str | Path, updates: dict | None = None) -> VLBertConfig:
    """The directory's VLBertConfig, with `updates` merged in (a finetune config's `model` block)."""
    path = Path(path)
    data, where = _read_config(path)
    return from_dict(VLBertConfig, deep_merge(data, updates or {}), where)


def load_image_preprocessing(path: str | Path) -> dict | None:
    """The image preprocessing an export records (None for one written before it did)."""
    return (_config_json(Path(path)) or {}).get("image_preprocessing")


def load_weights(module: torch.nn.Module, path: str | Path, keep=None) -> tuple[list[str], list[str]]:
    """Load <path>/model.safetensors (the tensors whose names `keep` accepts, all by default) into `module`;
    returns its (missing, unexpected) names. The tied MLM decoder, never saved, is not missing."""
    state = load_file(str(Path(path) / "model.safetensors"))
    if keep is not None:
        state = {k: v for k, v in state.items() if keep(k)}
    missing, unexpected = module.load_state_dict(state, strict=False)
    return [k for k in missing if k != TIED], list(unexpected)


def load_pretrained(path: str | Path, with_fast_rcnn: bool = True, updates: dict | None = None):
    """VLBertForPretraining with the directory's weights; every tensor of the file must have its place and
    every place its tensor (the tied decoder aside, and a zero-started path `updates` switched on, which starts at
    zero). `image_preprocessing` rides on the model."""

    cfg = load_config_dir(path, updates)
    model = VLBertForPretraining(cfg, with_fast_rcnn=with_fast_rcnn)
    missing, unexpected = load_weights(model, path, keep=None if with_fast_rcnn else lambda k: ".fast_rcnn." not in k)
    # a zero-started path the updates switched on (say, geometry_layers for a finetune) keeps its zeros: the model
    # then computes what the export did
    added = [k for k in missing if k.startswith(("vl_bert.embeddings.", "vl_bert.encoder."))
             and k.split(".")[2] in ZERO_STARTED]
    missing = [k for k in missing if k not in added]
    if added:
        paths = sorted({".".join(k.split(".")[:3]) for k in added})  # a per-layer path once, not per layer
        print(f"{path}: {', '.join(paths)} not in the export: starts at zero")
    if missing or unexpected:
        raise ValueError(f"{path}/model.safetensors does not match its config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    model.image_preprocessing = load_image_preprocessing(path)
    return model


def export_metadata(path: str | Path) -> dict:
    """The safetensors metadata of an export (source run, step, config hash)."""

    with safe_open(str(Path(path) / "model.safetensors"), "pt") as f:
        return dict(f.metadata() or {})
