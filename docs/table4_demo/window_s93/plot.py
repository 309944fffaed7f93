"""VQA at full data, both Table 4 rows over three finetuning seeds, on data/demo_val10000's 10,000 val images
(docs/FINETUNE.md, session 93): `relation_between` reading its objects within 3 word-pieces (session 92's config) and
within 4 (`relation_between_window`, this session's). Left: each row's accuracy over all questions with its own 95%
interval by image. Middle: the spatial yes/no questions, likewise (seeds pooled). Right: pretrained minus step 0,
paired by image, per seed and pooled. From this folder's reports (run.sh's report step).

    python docs/table4_demo/window_s93/plot.py    # -> table4_window.png here
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
CONFIGS = {"before_val10000": "window 3\n(session 92)", "vqa_val10000": "window 4\n(session 93)"}
SPATIAL_PRIOR = 67.10  # the "is the" question type's most frequent answer, scored as the others (session 91)
ROWS = {"none": ("step 0 (no VL pretraining)", "tab:grey"), "pretrained": ("VL pretrained (quick start)", "tab:blue")}


def pooled_spatial(config: str, row: str) -> tuple[float, float, float] | None:
    """The spatial questions' accuracy, each question's mean over the seeds, with its interval by image."""
    path = HERE / f"spatial_{config}_pooled_{row}.json"
    if not path.exists():
        return None
    group = json.loads(path.read_text())["groups"]["spatial"]["accuracy"]
    return group["mean"], *group["ci95"]


def main() -> int:
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(14, 4.4), gridspec_kw={"width_ratios": [2, 2, 2]})
    for x, config in enumerate(CONFIGS):
        path = HERE / f"{config}.json"
        if not path.exists():
            continue
        report = json.loads(path.read_text())["VQA overall"]
        for i, (row, (_, colour)) in enumerate(ROWS.items()):
            cell = report["rows"][row]
            lo, hi = cell["ci95"]
            left.bar(x + 0.3 * i, cell["mean"], 0.28, color=colour)
            left.errorbar(x + 0.3 * i, cell["mean"], [[cell["mean"] - lo], [hi - cell["mean"]]], color="black",
                          capsize=3)
            got = pooled_spatial(config, row)
            if got is not None:
                mean, lo, hi = got
                middle.bar(x + 0.3 * i, mean, 0.28, color=colour)
                middle.errorbar(x + 0.3 * i, mean, [[mean - lo], [hi - mean]], color="black", capsize=3)
        diff = report["pretrained minus none"]
        seeds = diff["per_seed"]
        right.scatter([x - 0.15 + 0.1 * s for s in range(len(seeds))], seeds, color="tab:blue", s=14,
                      label="per seed" if x == 0 else None)
        lo, hi = diff["ci95"]
        right.errorbar(x + 0.2, diff["mean_diff"], [[diff["mean_diff"] - lo], [hi - diff["mean_diff"]]], fmt="o",
                       color="black", capsize=4, label="pooled, 95% by image" if x == 0 else None)
    for axis in (left, middle, right):
        axis.set_xticks([x + 0.15 for x in range(len(CONFIGS))], list(CONFIGS.values()))
    left.set_ylim(88, 93)
    left.set_ylabel("VQA accuracy, all questions")
    left.set_title("each row's own 95% interval by image")
    left.legend(handles=[Patch(color=c, label=n) for n, c in ROWS.values()], fontsize=8, loc="upper left")
    middle.set_ylim(60, 100)
    middle.axhline(SPATIAL_PRIOR, ls="--", color="black", lw=1, label="question-type prior")
    middle.legend(fontsize=8, loc="upper left")
    middle.set_ylabel("VQA accuracy, spatial yes/no questions")
    middle.set_title("spatial yes/no questions, seeds pooled")
    right.axhline(0, color="black", lw=1)
    right.set_xlim(-0.4, len(CONFIGS) - 0.5)
    right.set_ylabel("pretrained - step 0 (points)")
    right.set_title("all questions, paired by image")
    right.legend(fontsize=8)
    fig.suptitle("VQA at full data, three seeds, 10,000 val images")
    fig.tight_layout()
    fig.savefig(HERE / "table4_window.png", dpi=110)
    print(HERE / "table4_window.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
