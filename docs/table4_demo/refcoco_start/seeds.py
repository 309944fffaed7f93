"""RefCOCO+ rows over finetuning seeds, and how fast each run leaves chance (docs/FINETUNE.md, session 38).

Per row (one run directory per seed, in seed order): each run's val accuracy, the per-expression mean over seeds with
a 95% interval from a bootstrap over images, each row minus the baseline row seed by seed (the same seed: the same
images drawn, the same batches) with a t-interval over the seeds' paired differences, and the first logged step at
which a run's training accuracy reaches 0.8; a plot of the training curves.

    python docs/table4_demo/refcoco_start/seeds.py --row none=RUN0,RUN1,RUN2 --row pretrained=... --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.statistics import summarise  # noqa: E402
from finetune.table4 import Examples, refcoco_metrics  # noqa: E402


def steps_to(run: Path, level: float) -> int | None:
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if m.get("acc/iou_0.5", 0.0) >= level:
            return int(m["step"])
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--row", action="append", required=True, help="NAME=RUN_DIR,RUN_DIR,... (one per seed)")
    ap.add_argument("--baseline", default="none")
    ap.add_argument("--track", default="gt")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows: dict[str, list[Path]] = {}
    for spec in args.row:
        name, runs = spec.split("=", 1)
        rows[name] = [Path(r) for r in runs.split(",")]
    if args.baseline not in rows:
        raise SystemExit(f"--baseline {args.baseline}: no such --row")
    per_run = {name: [next(iter(refcoco_metrics(r, args.track)[0].values())) for r in runs]
               for name, runs in rows.items()}

    def mean_over_seeds(runs: list[Examples]) -> Examples:
        keys = runs[0].keys
        for r in runs[1:]:
            if r.keys != keys:
                raise ValueError("the runs of a row scored different expressions")
        return Examples(keys, np.mean([r.values for r in runs], axis=0), runs[0].images)

    base = per_run[args.baseline]
    report, lines = {}, ["| row | val accuracy per seed | mean over seeds [images] | minus "
                         f"{args.baseline} per seed | over seeds (t) | steps to 0.8 training accuracy |",
                         "|---|---|---|---|---|---|"]
    for name, runs in per_run.items():
        mean = mean_over_seeds(runs).summary(2000)
        accs = [float(r.values.mean()) for r in runs]
        diffs = np.array([a - float(b.values.mean()) for a, b in zip(accs, base, strict=True)])
        speed = [steps_to(r, 0.8) for r in rows[name]]
        report[name] = {"runs": [str(r) for r in rows[name]], "accuracy": accs, "mean": mean,
                        "minus_baseline": diffs.tolist(),
                        "minus_baseline_t95": summarise(diffs)["ci95"],  # None for one seed: no spread
                        "steps_to_0.8": speed}
        t95 = report[name]["minus_baseline_t95"]
        lines.append(f"| {name} | {' / '.join(f'{a:.2f}' for a in accs)} | {mean['mean']:.2f} "
                     f"[{mean['ci95'][0]:.2f}, {mean['ci95'][1]:.2f}] | "
                     + ("" if name == args.baseline else " / ".join(f"{d:+.2f}" for d in diffs)) + " | "
                     + ("" if name == args.baseline or t95 is None else f"[{t95[0]:+.1f}, {t95[1]:+.1f}]") + " | "
                     + " / ".join("-" if s is None else str(s) for s in speed) + " |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "seeds.json").write_text(json.dumps(report, indent=1))
    text = "\n".join(lines) + (f"\n\nRefCOCO+ val ({args.track} boxes), accuracy at IoU >= 0.5 in percent; steps: the "
                               "first logged step (every 10) with training accuracy >= 0.8.\n")
    (out / "seeds.md").write_text(text)
    print(text)

    import matplotlib  # lazy: only for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for colour, (name, runs) in zip(plt.cm.tab10.colors, rows.items()):
        for k, run in enumerate(runs):
            log = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            ax.plot([m["step"] for m in log], [m["acc/iou_0.5"] for m in log], color=colour, alpha=0.8,
                    label=name if k == 0 else None)
    ax.set_xlabel("finetuning step")
    ax.set_ylabel("training accuracy (logged mean)")
    ax.set_title("RefCOCO+ finetuning, one line per seed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
