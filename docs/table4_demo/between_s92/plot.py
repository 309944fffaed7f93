"""VQA at full data with `model.relation_between` (docs/FINETUNE.md, session 92), on data/demo_val4000's 4,000 val
images. Left: the spatial yes/no questions ("is the square left of the cross?"), official accuracy with its 95%
interval by image, per row: without the option (session 91, seed 0) and with it (each finetuning seed), the
question-type prior dashed. Right: the quick start's export minus step 0 over all 19,921 questions, paired by image,
per seed and pooled. From this folder's reports (run.sh's report step).

    python docs/table4_demo/between_s92/plot.py    # -> table4_spatial.png here
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

HERE = Path(__file__).resolve().parent
ROWS = {"none": ("step 0 (no VL pretraining)", "tab:grey"), "pretrained": ("VL pretrained (quick start)", "tab:blue"),
        "pretrained_between": ("pretrained with the option on in pretraining too", "tab:orange")}
SPATIAL_PRIOR = 67.10  # the "is the" question type's most frequent answer, scored as the other answers (session 91)


def spatial(path: Path) -> tuple[float, list[float]]:
    group = json.loads(path.read_text())["groups"]["spatial"]["accuracy"]
    return group["mean"], group["ci95"]


def main() -> int:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4), gridspec_kw={"width_ratios": [3, 2]})
    ticks, labels, x = [], [], 0.0
    seeds = sorted({p.stem.split("_")[2] for p in HERE.glob("spatial_val4000_s*_*.json")})
    conditions = [("without", "without\n(session 91)")] + [(s, f"with, seed {s[1:]}") for s in seeds]
    for key, label in conditions:
        for i, (row, (name, colour)) in enumerate(ROWS.items()):
            path = HERE / f"spatial_val4000_{key}_{row}.json"
            if not path.exists():
                continue
            mean, (lo, hi) = spatial(path)
            left.bar(x + 0.27 * i, mean, 0.25, color=colour, label=name)
            left.errorbar(x + 0.27 * i, mean, [[mean - lo], [hi - mean]], color="black", capsize=3)
        ticks.append(x + 0.27)
        labels.append(label)
        x += 1.0
    left.axhline(SPATIAL_PRIOR, ls="--", color="black", lw=1)
    left.set_xticks(ticks, labels)
    left.set_ylim(50, 105)
    left.set_ylabel("VQA accuracy, spatial yes/no questions (1,734)")
    handles = [Patch(color=colour, label=name) for name, colour in ROWS.values()]
    handles.append(Line2D([], [], ls="--", color="black", lw=1, label="question-type prior"))
    left.legend(handles=handles, fontsize=8, loc="upper left")
    left.set_title("spatial questions, 4,000 val images")
    report = HERE / "vqa_val4000_pretrained.json"
    if report.exists():
        diff = json.loads(report.read_text())["VQA overall"]["pretrained minus none"]
        seeds = diff["per_seed"]
        right.scatter(range(len(seeds)), seeds, color="tab:blue", label="per seed")
        lo, hi = diff["ci95"]
        right.errorbar(len(seeds) + 0.5, diff["mean_diff"], [[diff["mean_diff"] - lo], [hi - diff["mean_diff"]]],
                       fmt="o", color="black", capsize=4, label="pooled, 95% by image")
        right.set_xticks([*range(len(seeds)), len(seeds) + 0.5], [*(f"seed {s}" for s in range(len(seeds))), "pooled"])
    right.axhline(0, color="black", lw=1)
    right.set_ylabel("pretrained - step 0, VQA overall (points)")
    right.set_title("all 19,921 questions, paired by image")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "table4_spatial.png", dpi=110)
    print(HERE / "table4_spatial.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
