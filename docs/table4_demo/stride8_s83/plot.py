"""Table 4 with little labelled data from the stride-8 quick start against its own step 0 (docs/FINETUNE.md, session
83), each row's accuracy with its 95% interval by image, the prior or chance dashed; three finetuning seeds per cell.
Left: VQA overall and "other" at 50 and 150 training images. Middle: VCR Q->A at 150 training images, all / colour /
where questions. Right: RefCOCO+ gt val at 15 training images, all / relational expressions. From this folder's
reports (run.sh's report step).

    python docs/table4_demo/stride8_s83/plot.py     # -> docs/table4_demo/stride8_s83/table4.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from docs.table4_demo.bars import bars, kind_rows, one_legend, report_panels, save  # noqa: E402

HERE = Path(__file__).resolve().parent
ROWS = {"none": "no VL pretraining (step 0, stride-8 detector)",
        "pretrained": "VL pretrained (the stride-8 quick start)"}
VQA = {"50 images": HERE / "vqa_img50.json", "150 images": HERE / "vqa_img150.json"}


def main() -> int:
    vqa = {f"{metric.removeprefix('VQA ')}\n{size}": panel for size, path in VQA.items()
           for metric, panel in report_panels(path).items()}
    vcr = {f"Q->A {kind}\n150 images": (rows, 25.0) for kind, rows in
           kind_rows(HERE / "vcr_img150_by_kind.json", "none", "pretrained", ("all", "colour", "where")).items()}
    readers = json.loads((HERE.parent / "refcoco_s75" / "readers.json").read_text())
    refcoco = {f"{kind}\n15 images": (rows, readers[kind]["random_candidate"]) for kind, rows in
               kind_rows(HERE / "refcoco_img15_by_kind.json", "none", "pretrained", ("all", "relational")).items()}
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.6), gridspec_kw={"width_ratios": [4, 3, 2]})
    bars(axes[0], vqa, ROWS, "VQA val (3 seeds)")
    bars(axes[1], vcr, ROWS, "VCR val (3 seeds)")
    bars(axes[2], refcoco, ROWS, "RefCOCO+ val, gt boxes (3 seeds)")
    one_legend(fig, axes)
    save(fig, HERE, bottom=0.1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
