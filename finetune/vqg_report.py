"""The BERT-gen protocol's report: every finished step's metrics side by side (Table 1 of the paper,
under both tokenisations, with how many distinct questions each generates), and Xsim per layer for every step
plus a random-weights transformer (Figure 3), as JSON, Markdown and PNGs. Xsim as the paper defines it sits near 1
for a random-weights BERT too, so the report adds each model's per-layer gap to the random one on the same images
(95% interval, bootstrap over images) and a centred Xsim (each modality's mean [CLS] removed).

    python -m finetune.vqg_report --config launch/configs/vqg_demo.yaml --runs runs/vqg [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from diagnostics.report import write_report
from diagnostics.statistics import clustered_bootstrap
from model.bert_gen import BertGen
from model.config import load_config
from model.export import is_export_dir, load_config_dir
from shards.tokenizer import load_tokenizer

from .vqg import STEPS, VQGConfig, VQGSet, xsim
from .vqg_data import feature_size, open_features, read_coco_captions
from .vqg_eval import METRICS, plot_xsim

LABELS = {"step1": "Cap. only, Step 1", "step2": "Im. only, Step 2 (freeze)",
          "step2_unfreeze": "Im. only, Step 2 (unfreeze)", "step3": "Im. + Cap., Step 3",
          "step3_scratch": "Im. + Cap., Step 3 (from scratch)", "custom": "custom"}


def collect(runs: Path, split: str) -> dict[str, dict]:
    found = {}
    for step in STEPS:
        metrics = runs / step / f"metrics_{split}.json"
        if not metrics.exists():
            continue
        entry = {"metrics": json.loads(metrics.read_text())}
        for name, key in ((f"xsim_{split}.json", "xsim"), ("model/bert_gen.json", "origin")):
            if (runs / step / name).exists():
                entry[key] = json.loads((runs / step / name).read_text())
        found[step] = entry
    return found


def random_transformer_xsim(model_dir: Path, cfg: VQGConfig, seed: int = 0) -> dict:
    """Xsim of the same architecture with every weight at its random initialisation."""

    features = open_features(cfg.data.features)
    torch.manual_seed(seed)
    # W sized for these features: the first finished step may be step 1, whose W was sized for 2048-d ones
    gen = BertGen(replace(load_config_dir(model_dir), precomputed_feature_size=feature_size(features)))
    tokenizer = load_tokenizer(str(model_dir))
    split = cfg.data.val if cfg.eval_split == "val" else cfg.data.test
    data = VQGSet(split, cfg.data, tokenizer, read_coco_captions(cfg.data.captions), features, "both")
    return xsim(gen, data, cfg.eval_batch_size, limit=cfg.max_eval_images)


def gap_to_random(entry: dict, random: dict, key: str = "per_image") -> list[dict]:
    """Per layer: the model's Xsim minus the random-weights transformer's on the same images, with a 95% interval
    from a bootstrap over images (one caption each, so the image is the unit)."""
    ours = dict(zip(entry["image_ids"], entry[key]))
    both = [i for i in random["image_ids"] if i in ours]
    theirs = dict(zip(random["image_ids"], random[key]))
    diff = np.array([ours[i] for i in both]) - np.array([theirs[i] for i in both])  # [images, layers]
    return [clustered_bootstrap(diff[:, layer], np.arange(len(both))) for layer in range(diff.shape[1])]


def xsim_tables(found: dict[str, dict], random: dict | None) -> list[str]:
    lines = []
    for key, what in (("xsim", "the paper's Xsim: cosine of [CLS] for the image alone and the caption alone"),
                      ("xsim_centred", "centred Xsim: each modality's mean [CLS] over the split subtracted first")):
        curves = {LABELS[s]: e["xsim"][key] for s, e in found.items() if key in e.get("xsim", {})}
        if not curves:
            continue
        n = len(next(iter(curves.values())))
        lines += [f"### Per layer, {what}", "", "| model | " + " | ".join(str(i) for i in range(1, n + 1)) + " |",
                  "|---|" + "---|" * n]
        if random and key in random:
            curves = {"Random Transformer": random[key], **curves}
        lines += [f"| {name} | " + " | ".join(f"{v:.3f}" for v in c) + " |" for name, c in curves.items()]
        lines.append("")
        if not random or key not in random:
            continue
        per = "per_image" if key == "xsim" else "per_image_centred"
        lines += ["Minus the random-weights transformer on the same images (95% interval, bootstrap over images):",
                  "", "| model | " + " | ".join(str(i) for i in range(1, n + 1)) + " |", "|---|" + "---|" * n]
        for s, e in found.items():
            if per in e.get("xsim", {}):
                gaps = gap_to_random(e["xsim"], random, per)
                lines.append(f"| {LABELS[s]} | " + " | ".join(
                    f"{g['mean']:+.3f} [{g['ci95'][0]:+.3f}, {g['ci95'][1]:+.3f}]" for g in gaps) + " |")
        lines.append("")
    return lines


def markdown(found: dict[str, dict], random: dict | None) -> str:
    lines = []
    for tok, what in (("ptb", "pycocoevalcap PTB tokenizer: lowercased, punctuation (\"?\") dropped"),
                      ("nqg", "nqg-style: lowercased, punctuation kept as tokens")):
        lines += [f"### Tokenisation: {what}", "",
                  "| model | " + " | ".join(METRICS) + " | distinct questions | distinct-2 |",
                  "|---|" + "---|" * (len(METRICS) + 2)]
        for step, e in found.items():
            m = e["metrics"][tok]
            cells = " | ".join(f"{100 * m[k]:.2f}" if k in m else "-" for k in METRICS)
            d = e["metrics"]
            extra = f" {d['distinct_questions']} | {d['distinct_2']:.3f} |" if "distinct_2" in d else " - | - |"
            lines.append(f"| {LABELS[step]} | {cells} |{extra}")
        lines.append("")
    lines += xsim_tables(found, random)
    lines += ["### Where each model came from", ""]
    for step, e in found.items():
        o = e.get("origin", {})
        lines.append(f"- **{LABELS[step]}**: inputs {o.get('inputs')}; Θ from {o.get('theta_from')}; W from "
                     f"{o.get('projection_from')}; {o.get('trainable_parameters', 0):,} of "
                     f"{o.get('total_parameters', 0):,} parameters trained, {o.get('steps')} steps.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Report of the BERT-gen VQG protocol runs", epilog=__doc__)
    p.add_argument("--config", help="the VQGConfig the runs used (data paths, eval split)")
    p.add_argument("--runs", default="runs/vqg")
    p.add_argument("--out", help="default: <runs>/report")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    cfg = load_config(VQGConfig, args.config, [o for o in args.overrides if not o.startswith(
        ("engine.", "step=", "inputs=", "init", "train_only"))])
    runs = Path(args.runs)
    out = Path(args.out) if args.out else runs / "report"
    out.mkdir(parents=True, exist_ok=True)
    found = collect(runs, cfg.eval_split)
    if not found:
        raise SystemExit(f"{runs}: no finished step (no */metrics_{cfg.eval_split}.json)")
    random = None
    first = next((runs / s / "model" for s in found if is_export_dir(runs / s / "model")), None)
    if first is not None and any("xsim" in e for e in found.values()):
        random = random_transformer_xsim(first, cfg)
    report = {"split": cfg.eval_split, "steps": found, "random_transformer_xsim": random}

    def figures() -> list[Path]:
        curves = {LABELS[s]: e["xsim"]["xsim"] for s, e in found.items() if "xsim" in e}
        if not curves:
            return []
        centred = {LABELS[s]: e["xsim"]["xsim_centred"] for s, e in found.items()
                   if "xsim_centred" in e.get("xsim", {})}
        if random:
            curves = {"Random Transformer": random["xsim"], **curves}
            centred = {"Random Transformer": random["xsim_centred"], **centred}
        drawn = [plot_xsim(curves, out / "xsim.png")]
        if centred:
            drawn.append(plot_xsim(centred, out / "xsim_centred.png",
                                   "Centred Xsim (each modality's mean [CLS] removed)"))
        return drawn

    md = markdown(found, random)
    written = write_report(out, "report", report, md, figures)
    print(md)
    print("written: " + ", ".join(map(str, written)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
