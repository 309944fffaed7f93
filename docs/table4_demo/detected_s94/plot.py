"""RefCOCO+'s detected track at 15 training images on data/demo_val4000's 1,976 val images, both Table 4 rows over three
finetuning seeds (docs/FINETUNE.md, session 94), for each arm run (on: the demo config; whole: with
`model.align_whole_names`). Left: each row's accuracy over all expressions with its own 95% interval by image.
Middle: the relational expressions by landmark (a hexagon, "he ##xa ##gon", or another category). Right: pretrained
minus step 0, paired by image, per seed and pooled. From this folder's reports (run.sh).

    python docs/table4_demo/detected_s94/plot.py    # -> table4_detected.png here
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

HERE = Path(__file__).resolve().parent
ARMS = {"on": "demo config", "whole": "align_whole_names"}
ROWS = {"base": ("step 0 (no VL pretraining)", "tab:grey"), "row": ("VL pretrained (quick start)", "tab:blue")}
GROUPS = ("landmark hexagon", "landmark other")


def bar(ax, x: float, cell: list, colour: str) -> None:
    mean, (lo, hi) = cell
    ax.bar(x, mean, 0.18, color=colour)
    ax.errorbar(x, mean, [[mean - lo], [hi - mean]], color="black", capsize=2)


def main() -> int:
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.4), gridspec_kw={"width_ratios": [2, 3, 2]})
    arms = [a for a in ARMS if (HERE / a / "by_kind_img15_val1976.json").exists()]
    if not arms:
        raise SystemExit("plot: no arm's reports here (run.sh first)")
    for x, arm in enumerate(arms):
        kinds = json.loads((HERE / arm / "by_kind_img15_val1976.json").read_text())
        landmarks = json.loads((HERE / arm / "landmarks_val1976.json").read_text())
        for i, (row, (_, colour)) in enumerate(ROWS.items()):
            bar(left, x + 0.2 * i, kinds["all"][row], colour)
            for g, group in enumerate(GROUPS):
                bar(middle, g * (len(arms) + 0.5) + x + 0.2 * i, landmarks[group][row], colour)
        paired = json.loads((HERE / arm / "paired_img15_val1976.json").read_text())["pretrained minus none"]
        seeds = paired["per_seed"]
        right.scatter([x - 0.15 + 0.1 * s for s in range(len(seeds))], seeds, color="tab:blue", s=14,
                      label="per seed" if x == 0 else None)
        lo, hi = paired["ci95"]
        mean = paired["mean_diff"]
        right.errorbar(x + 0.2, mean, [[mean - lo], [hi - mean]], fmt="o", color="black", capsize=3,
                       label="seeds pooled, 95% by image" if x == 0 else None)
    left.set_xticks([x + 0.1 for x in range(len(arms))], [ARMS[a] for a in arms])
    left.set_ylim(60, 85)
    left.set_ylabel("accuracy (IoU >= 0.5), %")
    left.set_title("all 22,082 val expressions")
    ticks = [g * (len(arms) + 0.5) + x + 0.1 for g in range(len(GROUPS)) for x in range(len(arms))]
    middle.set_xticks(ticks, [f"{group.split()[1]}\n{ARMS[a]}" for group in GROUPS for a in arms], fontsize=8)
    middle.set_ylim(20, 70)
    middle.set_title("relational expressions by landmark")
    middle.legend(handles=[Patch(color=c, label=label) for label, c in ROWS.values()], loc="upper left", fontsize=8)
    right.axhline(0, color="grey", lw=0.8)
    right.set_xticks(range(len(arms)), [ARMS[a] for a in arms])
    right.set_ylabel("pretrained - step 0, points")
    right.set_title("the gain, paired by image")
    right.legend(fontsize=8)
    fig.suptitle("RefCOCO+ detected track, 15 training images, 1,976 val images, three seeds")
    fig.tight_layout()
    out = HERE / "table4_detected.png"
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
