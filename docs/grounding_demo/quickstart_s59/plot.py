"""Session 59's figure: the quick start with and without `model.alignment_neighbours` (330 steps, seed 0 unless
named), against its matched control. Left: held-out colour and shape words with the image at the end (first 100
held-out images, 95% intervals clustered by image, from each run's grounding.json). Right: the same words over
training, from the periodic evaluation on 16 held-out images (eval.jsonl), with the image (solid) and ablated
(dashed).

    python docs/grounding_demo/quickstart_s59/plot.py
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from docs.grounding_demo.word_bars import word_bars  # noqa: E402

here = Path(__file__).resolve().parent
demo = here.parent
RUNS = [("default (s56)", demo / "quickstart_s56/corners_330"),
        ("its control (s56)", demo / "quickstart_s56/control_330"),
        ("no MRC (s57)", demo / "quickstart_s57/no_mrc_330"),
        ("neighbours 1", here / "neighbours_1_330"),
        ("neighbours 1: control", here / "neighbours_1_330_control"),
        ("neighbours 2", here / "neighbours_2_330"),
        ("neighbours 1, seed 1", here / "neighbours_1_330_seed1"),
        ("neighbours 1 + size names", here / "neighbours_1_sizes_330"),
        ("+ size names: control", here / "neighbours_1_sizes_330_control"),
        ("+ size names, neighbour drop 0.5", here / "neighbours_1_sizes_drop_0.5_330"),
        ("the same, seed 1", here / "neighbours_1_sizes_drop_0.5_330_seed1")]
CURVES = [("default (s56)", demo / "quickstart_s56/corners_330", "tab:gray"),
          ("neighbours 1", here / "neighbours_1_330", "tab:blue"),
          ("neighbours 1 + size names", here / "neighbours_1_sizes_330", "tab:green"),
          ("neighbours 1: control", here / "neighbours_1_330_control", "tab:red")]


def periodic(path: Path) -> list[dict]:
    """The periodic evaluations (16 images), one per step: the end-of-run rows repeat the last step."""
    rows, seen = [], set()
    for line in (path / "eval.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "grounding/colour/image" in row and row["step"] not in seen:
            seen.add(row["step"])
            rows.append(row)
    return rows


def main() -> None:
    runs = [(name, path) for name, path in RUNS if (path / "grounding.json").exists()]
    fig, (ax, cx) = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [1.5, 1]})
    word_bars(ax, runs)
    ax.axhline(0.8, color="black", ls="--", lw=0.8)
    ax.set_title("The quick start at 330 steps (dotted: chance; dashed: the 0.8 target)")
    ax.legend(loc="upper left")
    for name, path, colour in CURVES:
        rows = periodic(path)
        steps = [r["step"] for r in rows]
        for category, marker in (("colour", "o"), ("shape", "s")):
            cx.plot(steps, [r[f"grounding/{category}/image"] for r in rows], color=colour, marker=marker,
                    label=f"{name}: {category}")
            cx.plot(steps, [r[f"grounding/{category}/ablated"] for r in rows], color=colour, marker=marker,
                    ls="--", alpha=0.5)
    cx.set_xlabel("step")
    cx.set_ylabel("16 held-out images (dashed: ablated)")
    cx.set_ylim(0, 1)
    cx.set_title("Over training")
    cx.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(here / "neighbours.png", dpi=120)


if __name__ == "__main__":
    main()
