"""The diagnostics' configuration: the held-out images they read and how, for the cross-modal ablation
(`DiagnosticConfig`) and the grounding tables (`GroundingConfig`). Pretraining's config holds one of each for
its periodic evaluation."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import torch

from model.config import ConfigError, load_config, required


@dataclass
class HeldOutConfig:
    """Held-out images with sentences in Flickr30k Entities' format, as the diagnostics read them."""
    flickr_root: str = required()  # Sentences/, Annotations/, <split>.txt
    split: str = "val"
    images: str = required()  # <image_id>.jpg
    boxes: str = required()  # regions, keyed <image_id>.jpg
    # the detector's class names (JSON list), the cross-modal ablation's gold labels for MRC; None: none. The
    # grounding table reads regions' names from the model's own vocabulary instead
    class_names: str | None = None
    short_side: int = 128  # image resizing as the model was trained (the paper's setting: 600 / 1000)
    long_side: int = 192
    max_regions: int = 100  # highest-scoring regions kept per image
    seed: int = 0
    bootstrap: int = 2000  # resamples of images for the clustered intervals (0 = t-intervals over examples)
    # what an ablated region or whole image becomes: "training", the average of the model's own pretraining
    # features (its appearance standardisers keep it; a model without them falls back to the next, and says
    # so), or "evaluation", the average over these held-out images (the cross-modal ablation paper's choice).
    # Both keep the input in distribution for a model pretrained on images like these; only "training" does
    # for the image-ablated control (docs/ABLATION.md, session 19)
    ablation_fill: str = "training"


@dataclass
class DiagnosticConfig(HeldOutConfig):
    tau: float = 0.5  # IoT threshold of Object ablation and of co-masking around the MRC target
    sweep: list = field(default_factory=lambda: [0.1, 0.3, 0.5, 0.7, 0.9])  # taus of the Figure 3 sweep
    max_words: int = 100  # word-pieces per sentence; longer sentences are skipped and counted
    batch_size: int = 16
    max_examples: int | None = None  # a seeded random subset of the examples (None = all)
    # which of the phrase's words are masked and scored: "all" (the paper), or "colour" (only its colour
    # words; phrases without one are left out and counted): in the shapes world those come only from the image
    phrase_words: str = "all"


@dataclass
class GroundingConfig(HeldOutConfig):
    max_images: int | None = None  # the first N images of the split (None = all)


def command_line(description: str, doc: str, *, config_name: str, out: str, models_required: bool,
                 model_help: str, overrides_example: str) -> argparse.ArgumentParser:
    """The diagnostics' shared command line: --model NAME=DIR (repeated), --config, --out, --device, overrides."""
    p = argparse.ArgumentParser(description=description, epilog=doc.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=[], metavar="NAME=DIR", required=models_required,
                   help=model_help)
    p.add_argument("--config", help=f"{config_name} YAML naming the held-out data (the demo's: "
                                    "launch/configs/heldout_demo.yaml), or give its fields as overrides")
    p.add_argument("--out", default=out)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("overrides", nargs="*", help=f"{config_name} fields as key=value, e.g. {overrides_example}")
    return p


def model_specs(parser: argparse.ArgumentParser, specs: list[str]) -> list[tuple[str, str]]:
    """(name, directory) of each --model NAME=DIR, refused with the spec named before any model loads."""
    out = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name:
            parser.error(f"--model '{spec}': expected NAME=DIR")
        if not Path(path).is_dir():
            parser.error(f"--model '{spec}': {path} is not a directory")
        if name in dict(out):
            parser.error(f"--model '{spec}': the name '{name}' is given twice")
        out.append((name, path))
    return out


def command_config(parser: argparse.ArgumentParser, cls: type, args: argparse.Namespace):
    """The command's config (--config, then the overrides; a bad field is a usage error naming it) and its --out
    directory, created."""
    try:
        cfg = load_config(cls, args.config, args.overrides)
    except ConfigError as e:
        parser.error(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return cfg, out
