"""Table 4's pretraining ablations without the region word channel, and VCR's three metrics (docs/FINETUNE.md,
session 50), from the reports paired.py wrote: each row's accuracy with its 95% interval by image, and each metric's
prior or chance as the reports carry it (chance_or_prior).

    python docs/table4_demo/nochannel_s50/plot.py     # -> docs/table4_demo/nochannel_s50/table4.png
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from docs.table4_demo.bars import bars, report_panels, save  # noqa: E402

HERE = Path(__file__).resolve().parent
ABLATION_ROWS = {"none": "no VL pretraining (step 0)", "pretrained_mrcattr_shards": "VL pretrained (draw 0)",
                 "no_text": "without the text corpus", "no_mrc": "without MRC"}
VCR_ROWS = {"none": "no VL pretraining (step 0)", "pretrained_mrcattr_shards": "VL pretrained, draw 0",
            "pretrained_mrcattr_shards_p1": "VL pretrained, draw 1"}  # those the VCR report has


def main() -> int:
    vqa, ref, vcr = (report_panels(HERE / name) for name in ("vqa_s0.json", "refcoco_img15.json", "vcr_e2_s0.json"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2.2]})
    bars(left, {"VQA overall\n(seed 0)": vqa["VQA overall"], "VQA other\n(colour, shape; seed 0)":
                vqa["VQA other (colour, shape)"], "RefCOCO+ gt\n(15 images, 3 seeds)": ref["refcoco_img15"]},
         ABLATION_ROWS, "Pretraining ablations without the channel, at each launcher's budget")
    bars(right, {"Q->A": vcr["VCR Q->A"], "QA->R": vcr["VCR QA->R"], "Q->AR": vcr["VCR Q->AR"]}, VCR_ROWS,
         "VCR, 2 epochs per subtask (the launcher's default), seed 0")
    save(fig, HERE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
