"""Table 4's pretraining ablations at demo scale, over finetuning seeds (docs/FINETUNE.md, session 39).

Per task and row (one finetuned run directory per seed, the seeds in the same order in every row, so run i of each
row drew the same training images and batches): each run's accuracy, the per-example mean over seeds with a 95%
interval from a bootstrap over images, and each row minus the baseline row and minus the reference row, seed by seed,
with a t-interval over the seeds' paired differences (the finetuning noise, which an image bootstrap of one run does
not cover: docs/FINETUNE.md, session 37); a plot of every run.

    python docs/table4_demo/ablation_rows/report.py --vqa none=R0,R1,R2 --vqa pretrained=... \\
        --refcoco none=R0,R1,R2 --refcoco pretrained=... --out docs/table4_demo/ablation_rows
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.statistics import clustered_bootstrap, summarise  # noqa: E402
from finetune.table4 import refcoco_metrics, vqa_scores, vqg_metrics  # noqa: E402

# the VQA question types the quick start's pretraining moved at 150 images (session 37: shape +29, colour +0.7)
VQA_TYPES = ("what shape is", "what color is the", "how many")


def vqa_run(run: Path) -> dict[str, tuple[list, np.ndarray, np.ndarray, float | None]]:
    """{metric: (question ids, per-question accuracy in percent, image ids, chance)}: overall and the types above
    (no chance: VQA's prior is per question type, in the run's metrics)."""
    answered, scores = vqa_scores(run)
    keys = [q.question_id for q in answered]
    values, images = np.array(scores), np.array([q.image_id for q in answered])
    types = np.array([q.question_type for q in answered])
    out = {"VQA overall": (keys, values, images, None)}
    for t in VQA_TYPES:
        k = types == t
        out[f'VQA "{t}"'] = ([q for q, x in zip(keys, k) if x], values[k], images[k], None)
    return out


def refcoco_run(run: Path) -> dict[str, tuple[list, np.ndarray, np.ndarray, float | None]]:
    """{metric: (expression keys, per-expression accuracy in percent, image ids, the random candidate's)}."""
    examples, chance = refcoco_metrics(run, "gt")
    (name, ex), = examples.items()
    return {name: (list(ex.keys), np.asarray(ex.values, float), np.asarray(ex.images), chance[name])}


def vqg_run(run: Path) -> dict[str, tuple[list, np.ndarray, np.ndarray, float | None]]:
    """{metric: (image ids, per-image value, image ids, one question for every image's)}: CIDEr-D x100 and the
    own non-generic question rate (`finetune.table4.vqg_metrics`); where docs/table4_demo/vqg/likelihood.py has
    measured the run, also the image's information about its own non-generic questions (bits; 0 for a model that
    ignores the image) and their log2 P, per question."""
    examples, prior = vqg_metrics(run)
    out = {name: (list(ex.keys), np.asarray(ex.values, float), np.asarray(ex.images), prior[name])
           for name, ex in examples.items()}
    measured = list(run.glob("image_information_*.json"))
    if measured:
        r = json.loads(measured[0].read_text())
        keep = ~np.asarray(r["is_generic"])
        keys = [(i, q) for i, q, k in zip(r["image_id"], r["question"], keep) if k]
        images = np.asarray(r["image_id"])[keep]
        own = np.asarray(r["log2p_own"])[keep]
        out[f"{VQG_BITS} image information, own non-generic questions"] = (
            keys, own - np.asarray(r["log2p_other"])[keep], images, 0.0)
        out[f"{VQG_BITS} log2 P, own non-generic questions"] = (keys, own, images, None)
    return out


VQG_BITS = "VQG (bits)"


def rows_of(specs: list[str]) -> dict[str, list[Path]]:
    rows = {}
    for spec in specs:
        name, _, runs = spec.partition("=")
        if not runs:
            raise SystemExit(f"{spec!r}: expected NAME=RUN_DIR[,RUN_DIR...]")
        rows[name] = [Path(r) for r in runs.split(",")]
    return rows


def task_report(rows: dict[str, list[Path]], read, baseline: str, reference: str) -> dict:
    """{metric: {"chance": ..., "rows": {row: {...}}}} for one task's rows."""
    runs = {name: [read(r) for r in dirs] for name, dirs in rows.items()}
    counts = {len(v) for v in runs.values()}
    if len(counts) != 1:
        raise SystemExit(f"rows have {sorted(counts)} runs: give one per seed in every row")
    first = next(iter(runs.values()))[0]
    out: dict = {}
    for metric, (keys, _, images, chance) in first.items():
        out[metric] = {"chance": chance, "rows": {}}
        per_row = {}
        for name, seeds in runs.items():
            for s in seeds:
                if s[metric][0] != keys:
                    raise SystemExit(f"{rows[name]}: scored other examples than {next(iter(rows.values()))[0]}")
            per_row[name] = np.stack([s[metric][1] for s in seeds])  # [seeds, examples]
        for name, acc in per_row.items():
            entry = {"runs": [str(r) for r in rows[name]], "per_seed": acc.mean(1).tolist(),
                     "mean_over_seeds": clustered_bootstrap(acc.mean(0), images)}
            # against the baseline (does the row's pretraining help?) and, for the ablations, the reference
            # (does what the ablation removes matter?)
            for other in (baseline,) if name == reference else (baseline, reference):
                if other in per_row and name != baseline:
                    diffs = acc.mean(1) - per_row[other].mean(1)
                    entry[f"minus_{other}"] = {"per_seed": diffs.tolist(), "t95": summarise(diffs)["ci95"]}
            out[metric]["rows"][name] = entry
    return out


def chance_label(metric: str) -> str:
    if metric.startswith(VQG_BITS):
        return "a model that ignores the image"
    return "one question for every image" if metric.startswith("VQG") else "a random candidate"


def interval(lo_hi: list[float] | None, signed: bool = False, digits: int = 1) -> str:
    if lo_hi is None:
        return ""
    f = f"+.{digits}f" if signed else ".2f"
    return f"[{lo_hi[0]:{f}}, {lo_hi[1]:{f}}]"


def markdown(report: dict, baseline: str, reference: str) -> str:
    lines = ["# Table 4's pretraining ablations over finetuning seeds", "",
             "Accuracy in percent (VQG (bits) rows: bits per reference question): each seed's run, then the "
             "per-example mean over seeds with its 95% interval from a "
             "bootstrap over images. Differences: seed by seed (the same seed: the same training images and "
             "batches), their mean, and a t-interval over the seeds.", ""]
    for task, metrics in report.items():
        for metric, entry in metrics.items():
            rows = entry["rows"]
            lines += [f"## {metric} ({task})", "",
                      f"| row | per seed | mean over seeds [images] | minus {baseline} | over seeds (t) "
                      f"| minus {reference} | over seeds (t) |", "|---|---|---|---|---|---|---|"]
            for name, e in rows.items():
                m = e["mean_over_seeds"]
                cells = [name, " / ".join(f"{v:.2f}" for v in e["per_seed"]),
                         f"{m['mean']:.2f} {interval(m['ci95'])}"]
                for other in (baseline, reference):
                    d = e.get(f"minus_{other}")
                    cells += ["", ""] if d is None else [
                        " / ".join(f"{v:+.2f}" for v in d["per_seed"]) + f"; {np.mean(d['per_seed']):+.2f}",
                        interval(d["t95"], signed=True, digits=2 if metric.startswith(VQG_BITS) else 1)]
                lines.append("| " + " | ".join(cells) + " |")
            if entry["chance"] is not None:
                lines.append(f"\n{chance_label(metric).capitalize()}: {entry['chance']:.2f}.")
            lines.append("")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib  # lazy: only for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(metric, m["rows"], m["chance"]) for metrics in report.values() for metric, m in metrics.items()]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.6), squeeze=False)
    for ax, (metric, rows, chance) in zip(axes[0], panels):
        for x, (name, e) in enumerate(rows.items()):
            m = e["mean_over_seeds"]
            colour = "#9ecae1" if name != "none" else "#d9d9d9"
            if m["mean"] >= 0:
                ax.bar(x, m["mean"], color=colour)
            else:  # a log-probability: a bar from 0 would show its size, not the comparison
                ax.hlines(m["mean"], x - 0.4, x + 0.4, color=colour, lw=6)
            ax.errorbar(x, m["mean"], yerr=[[m["mean"] - m["ci95"][0]], [m["ci95"][1] - m["mean"]]], color="k",
                        capsize=3)
            ax.scatter([x] * len(e["per_seed"]), e["per_seed"], color="#08519c", s=12, zorder=3)
        if chance is not None:
            ax.axhline(chance, color="k", ls="--", lw=0.8, label=chance_label(metric).removeprefix("a "))
            ax.legend(fontsize=7, loc="lower left")
        ax.set_xticks(range(len(rows)), list(rows), rotation=30, ha="right")
        ax.set_title(textwrap.fill(metric, 36), fontsize=8)
        low = min(min(e["per_seed"]) for e in rows.values())
        top = max(max(e["per_seed"]) + 5 for e in rows.values())  # CIDEr-D x100 passes 100; accuracies do not
        if metric.startswith(VQG_BITS):  # bits: the axis fits the values
            ax.set_ylabel("bits per question")
        else:
            ax.set_ylim(max(0.0, low - 10), top if metric.startswith("VQG") else min(100.0, top))
    vqg = all(metric.startswith("VQG") for metric, _, _ in panels)
    axes[0][0].set_ylabel("test: percent, CIDEr-D x100" if vqg else "val accuracy (%)")
    fig.suptitle("bars: mean over finetuning seeds (95% interval over images); dots: one run per seed", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vqa", action="append", default=[], help="NAME=RUN_DIR,RUN_DIR,... (one per seed)")
    ap.add_argument("--refcoco", action="append", default=[], help="NAME=RUN_DIR,RUN_DIR,... (gt boxes)")
    ap.add_argument("--vqg", action="append", default=[], help="NAME=RUN_DIR,RUN_DIR,... (BERT-gen runs)")
    ap.add_argument("--vqg-task", default="VQG, image only", help="the VQG rows' heading")
    ap.add_argument("--baseline", default="none")
    ap.add_argument("--reference", default="pretrained")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    report = {}
    for task, specs, read in (("VQA, 150 training images", args.vqa, vqa_run),
                              ("RefCOCO+, 150 training images", args.refcoco, refcoco_run),
                              (args.vqg_task, args.vqg, vqg_run)):
        if specs:
            report[task] = task_report(rows_of(specs), read, args.baseline, args.reference)
    if not report:
        raise SystemExit("nothing to report: give --vqa, --refcoco and/or --vqg rows")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ablation.json").write_text(json.dumps(report, indent=1))
    text = markdown(report, args.baseline, args.reference)
    (out / "ablation.md").write_text(text)
    plot(report, out / "ablation.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
