"""The quick start's held-out words and visible MRC per pretraining draw, its detector at feature stride 16 (the
default before session 82) against 8 (docs/ABLATION.md, session 82): each run's own final grounding table (first 100
held-out images, 95% intervals by image), the targets' 0.80 dashed.

    python docs/grounding_demo/quickstart_s82/plot.py --base runs/demo runs/demo_draw1 runs/demo_draw2 \\
        --row runs/demo_s8 runs/demo_s8_draw1 runs/demo_s8_draw2      # -> draws.json and draws.png here
    python docs/grounding_demo/quickstart_s82/plot.py                 # re-plot draws.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
PANELS = {"colour words": ("words", "colour", "image"), "shape words": ("words", "shape", "image"),
          "visible MRC": ("mrc", "visible", None)}
LABELS = {"base": "feature stride 16 (before)", "row": "feature stride 8 (session 82)"}


def read(run: str) -> dict:
    (model,) = json.loads((Path(run) / "grounding" / "grounding.json").read_text())["models"].values()
    out = {}
    for panel, (part, key, cond) in PANELS.items():
        stat = model[part][key][cond] if cond else model[part][key]
        out[panel] = {"mean": stat["mean"], "ci95": stat["ci95"]}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", nargs="*", default=[])
    parser.add_argument("--row", nargs="*", default=[])
    args = parser.parse_args()
    store = HERE / "draws.json"
    if args.base:
        data = {side: {run: read(run) for run in runs} for side, runs in (("base", args.base), ("row", args.row))}
        store.write_text(json.dumps(data, indent=1))
    data = json.loads(store.read_text())
    fig, axes = plt.subplots(1, len(PANELS), figsize=(12, 4), sharey=True)
    for ax, panel in zip(axes, PANELS):
        for k, (side, runs) in enumerate(data.items()):
            for draw, stats in enumerate(runs.values()):
                s = stats[panel]
                x = draw + (k - 0.5) * 0.35
                # points, not bars: the axis starts at 0.5, where a bar's length would mislead
                ax.errorbar(x, s["mean"], yerr=[[s["mean"] - s["ci95"][0]], [s["ci95"][1] - s["mean"]]], fmt="o",
                            color=f"C{k}", capsize=3, label=LABELS[side] if draw == 0 else None)
        ax.axhline(0.8, ls="--", color="k", lw=1, label="target 0.80")
        ax.set_xticks(range(len(next(iter(data.values())))), [f"draw {d}" for d in range(3)])
        ax.set_ylim(0.5, 1.0)
        ax.set_title(panel)
    axes[0].set_ylabel("accuracy, first 100 held-out images")
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle("The quick start (330 steps, seeds 0-2): its detector at feature stride 16 against 8", fontsize=10)
    fig.tight_layout()
    fig.savefig(HERE / "draws.png", dpi=110)
    print(HERE / "draws.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
