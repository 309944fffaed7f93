"""Table 4 from the quick start's default with little labelled data (docs/FINETUNE.md, session 62): each row's
seed-averaged accuracy with its 95% interval by image, per task and training-set size, the prior or chance dashed;
from the paired.py reports in this folder (report.sh writes them).

    python docs/table4_demo/lowdata_s62/plot.py     # -> docs/table4_demo/lowdata_s62/table4.png
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
ROWS = {"none": "no VL pretraining (step 0)", "pretrained": "VL pretrained (the quick start's default)"}


def main() -> int:
    panels = {}
    for n in (15, 50, 150):
        path = HERE / f"vqa_img{n}.json"
        if path.exists():
            got = report_panels(path)
            panels[f"VQA overall\n{n} images"] = got["VQA overall"]
            panels[f"VQA other\n{n} images"] = got["VQA other (colour, shape)"]
    for name, label in (("refcoco_img15", "RefCOCO+ gt\n15 images"),
                        ("refcoco_detected_img15", "RefCOCO+ detected\n15 images"),
                        ("vcr_img150", "VCR Q->A\n150 images"),
                        ("vcr_img150_s70", "VCR Q->A, 150 images,\nrelation names (s70)")):
        if (HERE / f"{name}.json").exists():
            panels[label] = next(iter(report_panels(HERE / f"{name}.json").values()))
    fig, ax = plt.subplots(figsize=(14, 4.6))
    bars(ax, panels, ROWS, "Finetuned with little labelled data, 3 finetuning seeds each "
                           "(seed-averaged, 95% interval by image)")
    save(fig, HERE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
