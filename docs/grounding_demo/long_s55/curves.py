"""Session 55's training curves (docs/ABLATION.md): the periodic grounding evaluation (16 held-out images every 150
steps, `grounding/<category>/<condition>` in each run's eval.jsonl, copied to eval/) of the three runs, colour, shape
and relation words with the image (solid) and ablated (dashed). Its intervals are wide (~70 relation words an
evaluation); the end-of-run tables on 100 images are the figures to quote.

    python docs/grounding_demo/long_s55/curves.py
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
RUNS = {"relation": "relation words at 0.9", "geometry": "+ geometry_layers", "aligned": "+ aligned_geometry"}
CATEGORIES = ("colour", "shape", "relation")


def curve(run: str, key: str) -> tuple[list[int], list[float]]:
    """step -> value of one scalar, the last record of each step (a resumed run repeats its final step)."""
    points = {}
    for line in (HERE / "eval" / f"{run}.jsonl").read_text().splitlines():
        record = json.loads(line)
        if key in record:
            points[record["step"]] = record[key]
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def main() -> None:
    fig, axes = plt.subplots(1, len(CATEGORIES), figsize=(4.2 * len(CATEGORIES), 3.6), sharey=True)
    for ax, category in zip(axes, CATEGORIES):
        for k, (run, label) in enumerate(RUNS.items()):
            colour = f"C{k}"
            ax.plot(*curve(run, f"grounding/{category}/image"), "-o", ms=3, color=colour, label=f"{label}: image")
            ax.plot(*curve(run, f"grounding/{category}/ablated"), "--", color=colour, alpha=0.6,
                    label=f"{label}: ablated")
        ax.set_title(f"{category} words (16 held-out images)")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("masked-word accuracy")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    out = HERE / "curves.png"
    fig.savefig(out, dpi=110)
    print(f"written: {out}")


if __name__ == "__main__":
    main()
