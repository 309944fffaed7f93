"""The BERT-gen protocol's report: every finished step's metrics side by side (Table 1 of the paper,
under both tokenisations), and Xsim per layer for every step plus a random-weights transformer
(Figure 3), as JSON, Markdown and a PNG.

    python -m finetune.vqg_report --config launch/configs/vqg_demo.yaml --runs runs/vqg [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from model.bert_gen import BertGen
from model.config import load_config
from model.export import is_export_dir, load_config_dir
from shards.tokenizer import load_tokenizer

from .vqg import STEPS, VQGConfig, VQGSet, xsim
from .vqg_data import open_features, read_coco_captions
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


def random_transformer_xsim(model_dir: Path, cfg: VQGConfig, seed: int = 0) -> list[float]:
    """Xsim of the same architecture with every weight at its random initialisation."""

    torch.manual_seed(seed)
    gen = BertGen(load_config_dir(model_dir))  # the architecture only: no weights read
    tokenizer = load_tokenizer(str(model_dir))
    split = cfg.data.val if cfg.eval_split == "val" else cfg.data.test
    data = VQGSet(split, cfg.data, tokenizer, read_coco_captions(cfg.data.captions), open_features(cfg.data.features),
                  "both")
    return xsim(gen, data, cfg.eval_batch_size, limit=cfg.max_eval_images)


def markdown(found: dict[str, dict], random_curve: list[float] | None) -> str:
    lines = []
    for tok, what in (("ptb", "pycocoevalcap PTB tokenizer: lowercased, punctuation (\"?\") dropped"),
                      ("nqg", "nqg-style: lowercased, punctuation kept as tokens")):
        lines += [f"### Tokenisation: {what}", "", "| model | " + " | ".join(METRICS) + " |",
                  "|---|" + "---|" * len(METRICS)]
        for step, e in found.items():
            m = e["metrics"][tok]
            cells = " | ".join(f"{100 * m[k]:.2f}" if k in m else "-" for k in METRICS)
            lines.append(f"| {LABELS[step]} | {cells} |")
        lines.append("")
    curves = {LABELS[s]: e["xsim"]["xsim"] for s, e in found.items() if "xsim" in e}
    if curves:
        n = len(next(iter(curves.values())))
        lines += ["### Xsim per layer (cosine of [CLS] for the image alone and the caption alone)", "",
                  "| model | " + " | ".join(str(i) for i in range(1, n + 1)) + " |", "|---|" + "---|" * n]
        if random_curve:
            curves = {"Random Transformer": random_curve, **curves}
        for name, c in curves.items():
            lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in c) + " |")
        lines.append("")
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
    random_curve = None
    first = next((runs / s / "model" for s in found if is_export_dir(runs / s / "model")), None)
    if first is not None and any("xsim" in e for e in found.values()):
        random_curve = random_transformer_xsim(first, cfg)
    report = {"split": cfg.eval_split, "steps": found, "random_transformer_xsim": random_curve}
    (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "report.md").write_text(markdown(found, random_curve))
    curves = {LABELS[s]: e["xsim"]["xsim"] for s, e in found.items() if "xsim" in e}
    if random_curve:
        curves = {"Random Transformer": random_curve, **curves}
    if curves:
        plot_xsim(curves, out / "xsim.png")
    print((out / "report.md").read_text())
    print(f"report: {out}/report.md, report.json" + (", xsim.png" if curves else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
