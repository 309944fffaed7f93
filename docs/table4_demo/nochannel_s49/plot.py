"""Table 4 without the region word channel (docs/FINETUNE.md, session 49) as one figure, from the reports the
session's commands wrote: each task's accuracy per row (step 0, the two pretraining draws of the stored-target
recipe) with its 95% interval by image, and the task's prior or chance.

    python docs/table4_demo/nochannel_s49/plot.py     # -> docs/table4_demo/nochannel_s49/table4.png
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DOCS = Path(__file__).resolve().parents[1]
ROWS = {"none": "no VL pretraining (step 0)", "pretrained_mrcattr_shards": "VL pretrained, draw 0",
        "pretrained_mrcattr_shards_p1": "VL pretrained, draw 1"}


def read(path: str) -> dict:
    return json.loads((DOCS / path).read_text())


def main() -> int:
    vqa = read("vqa_nochannel/full/paired.json")
    vcr = read("vcr_nochannel/paired_e2_s0.json")
    ref = read("refcoco_start/mrcattr_shards_seed1/detected/errors/detected_errors.json")["tracks"]
    prior = {"VQA overall": 32.64, "VQA other": 19.70}  # the question-type prior of the training questions
    panels = {  # label: ({row: {mean, ci95}}, prior or chance)
        "VQA overall\n(3 seeds)": (vqa["VQA overall"]["rows"], prior["VQA overall"]),
        "VQA other\n(colour, shape)": (vqa["VQA other (colour, shape)"]["rows"], prior["VQA other"]),
        "RefCOCO+ gt\n(15 images, 3 seeds)": ({r: v["right"] for r, v in ref["gt"].items()}, 21.59),
        "RefCOCO+ gt-trained\non detected boxes": ({r: v["right"] for r, v in ref["gt_model_on_detected"].items()},
                                                   14.33),
        "RefCOCO+ detected\ntrack": ({r: v["right"] for r, v in ref["detected"].items()}, 14.33),
        "VCR Q->A\n(seed 0)": (vcr["rows"], 25.0),
    }
    fig, ax = plt.subplots(figsize=(11, 4.2))
    width = 0.8 / len(ROWS)
    for j, (row, label) in enumerate(ROWS.items()):
        xs, ys, err = [], [], [[], []]
        for k, (rows, _) in enumerate(panels.values()):
            s = rows[row]
            xs.append(k + (j - (len(ROWS) - 1) / 2) * width)
            ys.append(s["mean"])
            err[0].append(s["mean"] - s["ci95"][0])
            err[1].append(s["ci95"][1] - s["mean"])
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=label)
    for k, (_, chance) in enumerate(panels.values()):
        ax.hlines(chance, k - 0.45, k + 0.45, colors="k", linestyles="--", label="prior / chance" if k == 0 else None)
    ax.set_xticks(range(len(panels)), list(panels), fontsize=8)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    ax.set_title("Table 4 without the region word channel, at each launcher's budget (95% intervals by image)",
                 fontsize=9)
    fig.tight_layout()
    out = Path(__file__).with_name("table4.png")
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
