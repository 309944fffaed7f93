"""Table 4's MRC row without the channel with the CNN frozen, beside session 50's ablation rows (docs/FINETUNE.md,
session 51), from the reports in this folder and session 50's pretraining reports: left, what each pretraining
names on held-out captions (colour and shape words with the image, 95% interval by image, chance dashed); right,
each row's VQA (3 finetuning seeds) and RefCOCO+ gt (15 training images, 3 seeds) with their intervals.

    python docs/table4_demo/nochannel_s51/plot.py     # -> docs/table4_demo/nochannel_s51/table4.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from docs.table4_demo.bars import bars, report_panels, save  # noqa: E402

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent
ROWS = {"none": "no VL pretraining (step 0)", "pretrained_mrcattr_shards": "VL pretrained (draw 0)",
        "no_text": "without the text corpus", "no_mrc": "without MRC (CNN at 0.1)",
        "no_mrc_frozen": "without MRC, CNN frozen"}
PRETRAINING = {"pretrained_mrcattr_shards": "refcoco_start/mrcattr_shards/pretraining",
               "no_text": "nochannel_s50/pretraining_notext", "no_mrc": "nochannel_s50/pretraining_nomrc",
               "no_mrc_frozen": "nochannel_s51/pretraining_nomrc_frozen"}


def words(category: str) -> tuple[dict, float]:
    """({row: its held-out accuracy with the image, in %}, chance in %) for one word category."""
    got, chance = {}, None
    for row, folder in PRETRAINING.items():
        report = json.loads((DOCS / folder / "grounding.json").read_text())
        w = report["models"]["export"]["words"][category]
        got[row] = {"mean": 100 * w["image"]["mean"], "ci95": [100 * c for c in w["image"]["ci95"]]}
        chance = 100 * w["chance"]
    return got, chance


def main() -> int:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.8), gridspec_kw={"width_ratios": [2, 3]})
    bars(left, {"colour words": words("colour"), "shape words": words("shape")}, ROWS,
         "Pretraining: held-out masked words with the image")
    vqa, ref = report_panels(HERE / "vqa.json"), report_panels(HERE / "refcoco_img15.json")
    bars(right, {"VQA overall\n(3 seeds)": vqa["VQA overall"], "VQA other\n(colour, shape; 3 seeds)":
                 vqa["VQA other (colour, shape)"], "RefCOCO+ gt\n(15 images, 3 seeds)": ref["refcoco_img15"]},
         ROWS, "Finetuned at each launcher's budget")
    save(fig, HERE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
