"""Pretrained-model directories: `model.safetensors` (fp32, the tied MLM decoder stored once, as the
word embeddings) + `config.yaml` (the VLBertConfig) + the tokenizer's files. The model and every
finetune task load one with `load_pretrained(path)`."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch
import yaml

from .config import VLBertConfig, from_dict

TIED = "mlm_head.decoder.weight"


def save_pretrained(state_dict: dict[str, torch.Tensor], cfg: VLBertConfig, path: str | Path,
                    tokenizer_dir: str | Path | None = None) -> Path:
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float32).contiguous().cpu() for k, v in state_dict.items() if k != TIED}
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
    if tokenizer_dir is not None:
        for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (Path(tokenizer_dir) / name).exists():
                shutil.copy(Path(tokenizer_dir) / name, path / name)
    return path


def load_config_dir(path: str | Path) -> VLBertConfig:
    path = Path(path)
    try:
        data = yaml.safe_load((path / "config.yaml").read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no config.yaml (not an exported VL-BERT directory)") from None
    if data.get("region_input", "pixels") == "pixels":
        data["fast_rcnn"]["weights"] = None  # the exported weights already hold the detector's
    # a features model keeps its extractor's weights file: evaluation on new images reruns it
    return from_dict(VLBertConfig, data, str(path / "config.yaml"))


def load_pretrained(path: str | Path, with_fast_rcnn: bool = True):
    from safetensors.torch import load_file

    from .vl_bert import VLBertForPretraining

    cfg = load_config_dir(path)
    model = VLBertForPretraining(cfg, with_fast_rcnn=with_fast_rcnn)
    state = load_file(str(Path(path) / "model.safetensors"))
    if not with_fast_rcnn:
        state = {k: v for k, v in state.items() if ".fast_rcnn." not in k}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != TIED]
    if missing or unexpected:
        raise ValueError(f"{path}/model.safetensors does not match its config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    return model
