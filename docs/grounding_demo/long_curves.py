"""Curves of held-out colour- and shape-word accuracy over training for runs' eval.jsonl files (docs/ABLATION.md,
session 12): with the image (solid) and with the image ablated (dashed), one colour per run.

    python docs/grounding_demo/long_curves.py OUT.png NAME=RUN_DIR_OR_EVAL_JSONL [NAME=...]

Points before the last are the periodic evaluation (grounding_periodic_images held-out images); the last of a
run is its end-of-run table (grounding.max_images), so the last segment mixes two sample sizes.
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(path: Path) -> list[dict]:
    path = path / "eval.jsonl" if path.is_dir() else path
    out = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if "grounding/colour/image" in r:
            out[r["step"]] = r  # the end-of-run table replaces the periodic point of the same step
    return [out[s] for s in sorted(out)]


def main() -> None:
    out, runs = Path(sys.argv[1]), [a.split("=", 1) for a in sys.argv[2:]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for (name, path), colour in zip(runs, ("tab:blue", "tab:red", "tab:green", "tab:purple")):
        rs = rows(Path(path))
        steps = [r["step"] for r in rs]
        for ax, cat in zip(axes, ("colour", "shape")):
            ax.plot(steps, [r[f"grounding/{cat}/image"] for r in rs], "-o", color=colour, label=f"{name}: image")
            ax.plot(steps, [r[f"grounding/{cat}/ablated"] for r in rs], "--", color=colour, alpha=0.6,
                    label=f"{name}: image ablated")
    for ax, cat, chance in zip(axes, ("colour", "shape"), (1 / 6, 1 / 8)):
        ax.axhline(chance, color="grey", lw=0.8, ls=":")
        ax.set_title(f"held-out masked {cat} words")
        ax.set_xlabel("step")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy (chance dotted)")
    axes[1].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
