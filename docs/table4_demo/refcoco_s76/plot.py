"""Table 4 with little labelled data from session 73's quick start export against its step 0 (docs/FINETUNE.md,
session 76), each row's accuracy with its 95% interval by image, the prior or random candidate dashed. Left:
RefCOCO+ gt val by kind at 15 and 150 training images and at full data (session 75), three finetuning seeds each.
Middle: VQA overall and "other" at 50 and 150 training images (three seeds) and at full data (seed 0). Right: VCR
Q->A at 150 training images, all / colour / where questions (three seeds). From this folder's reports.

    python docs/table4_demo/refcoco_s76/plot.py     # -> docs/table4_demo/refcoco_s76/table4.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from docs.table4_demo.bars import bars, kind_rows, report_panels, save  # noqa: E402

HERE = Path(__file__).resolve().parent
ROWS = {"none": "no VL pretraining (step 0)", "pretrained": "VL pretrained (the quick start)"}
KINDS = ("all", "relational")
REFCOCO = {"15 images": HERE / "by_kind_img15.json", "150 images": HERE / "by_kind_img150.json",
           "full data": HERE.parent / "refcoco_s75" / "by_kind_demo_config.json"}
VQA = {"50 images": HERE / "vqa_img50.json", "150 images": HERE / "vqa_img150.json",
       "full data": HERE / "vqa_full.json"}


def main() -> int:
    readers = json.loads((HERE.parent / "refcoco_s75" / "readers.json").read_text())
    left = {f"{kind}\n{size}": (kind_rows(path, "none", "pretrained", KINDS)[kind],
                                readers[kind]["random_candidate"])
            for kind in KINDS for size, path in REFCOCO.items()}
    right = {f"{metric.removeprefix('VQA ')}\n{size}": panel for size, path in VQA.items()
             for metric, panel in report_panels(path).items()}
    vcr = {f"Q->A {kind}\n150 images": (rows, 25.0) for kind, rows in
           kind_rows(HERE / "vcr_img150_by_kind.json", "none", "pretrained", ("all", "colour", "where")).items()}
    fig, axes = plt.subplots(1, 3, figsize=(21, 5.2), gridspec_kw={"width_ratios": [6, 6, 3]})
    bars(axes[0], left, ROWS, "RefCOCO+ val, gt boxes (3 seeds): all / relational expressions")
    bars(axes[1], right, ROWS, "VQA val (3 seeds; full data: seed 0)")
    bars(axes[2], vcr, ROWS, "VCR val (3 seeds)")
    save(fig, HERE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
