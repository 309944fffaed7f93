"""Table 4's pretraining ablations without the region word channel, and VCR's three metrics (docs/FINETUNE.md,
session 50), from the reports paired.py wrote: each row's accuracy with its 95% interval by image, and each metric's
prior or chance as the reports carry it (chance_or_prior).

    python docs/table4_demo/nochannel_s50/plot.py     # -> docs/table4_demo/nochannel_s50/table4.png
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
ABLATION_ROWS = {"none": "no VL pretraining (step 0)", "pretrained_mrcattr_shards": "VL pretrained (draw 0)",
                 "no_text": "without the text corpus", "no_mrc": "without MRC"}
VCR_ROWS = {"none": "no VL pretraining (step 0)", "pretrained_mrcattr_shards": "VL pretrained, draw 0",
            "pretrained_mrcattr_shards_p1": "VL pretrained, draw 1"}  # those the VCR report has


def metrics(name: str) -> dict:
    """{metric: {"rows": ..., "chance_or_prior": ...}}; a one-metric report keeps its pairs at the top level."""
    rep = json.loads((HERE / name).read_text())
    return {name.split(".")[0]: rep} if "rows" in rep else rep


def bars(ax, panels: dict, rows: dict, title: str) -> None:
    rows = {r: label for r, label in rows.items() if all(r in rep["rows"] for rep in panels.values())}
    width = 0.8 / len(rows)
    for j, (row, label) in enumerate(rows.items()):
        xs, ys, err = [], [], [[], []]
        for k, rep in enumerate(panels.values()):
            s = rep["rows"][row]
            xs.append(k + (j - (len(rows) - 1) / 2) * width)
            ys.append(s["mean"])
            err[0].append(s["mean"] - s["ci95"][0])
            err[1].append(s["ci95"][1] - s["mean"])
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=label)
    for k, rep in enumerate(panels.values()):
        ax.hlines(rep["chance_or_prior"], k - 0.45, k + 0.45, colors="k", linestyles="--",
                  label="prior / chance" if k == 0 else None)
    ax.set_xticks(range(len(panels)), list(panels), fontsize=8)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    ax.set_title(title, fontsize=9)


def main() -> int:
    vqa, ref, vcr = metrics("vqa_s0.json"), metrics("refcoco_img15.json"), metrics("vcr_e2_s0.json")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2.2]})
    bars(left, {"VQA overall\n(seed 0)": vqa["VQA overall"], "VQA other\n(colour, shape; seed 0)":
                vqa["VQA other (colour, shape)"], "RefCOCO+ gt\n(15 images, 3 seeds)": ref["refcoco_img15"]},
         ABLATION_ROWS, "Pretraining ablations without the channel, at each launcher's budget")
    bars(right, {"Q->A": vcr["VCR Q->A"], "QA->R": vcr["VCR QA->R"], "Q->AR": vcr["VCR Q->AR"]}, VCR_ROWS,
         "VCR, 2 epochs per subtask (the launcher's default), seed 0")
    fig.tight_layout()
    out = HERE / "table4.png"
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
