"""Table 4 with little labelled data from the stride-8 quick start against its own step 0 (docs/FINETUNE.md, session
83), each row's accuracy with its 95% interval by image, the prior or chance dashed; three finetuning seeds per cell.
Left: VQA overall and "other" at 50 and 150 training images. Middle: VCR Q->A at 150 training images, all / colour /
where questions. Right: RefCOCO+ gt val at 15 training images, all / relational expressions. From this folder's
reports (run.sh's report step), or another folder's (run.sh's REPORT); a report missing there leaves its panel out.

    python docs/table4_demo/stride8_s83/plot.py [FOLDER]    # -> FOLDER/table4.png (FOLDER: this one)
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


def main(folder: Path = HERE) -> int:
    vqa = {f"{metric.removeprefix('VQA ')}\n{size} images": panel for size in (50, 150)
           if (folder / f"vqa_img{size}.json").exists()
           for metric, panel in report_panels(folder / f"vqa_img{size}.json").items()}
    vcr, refcoco = {}, {}
    if (folder / "vcr_img150_by_kind.json").exists():
        vcr = {f"Q->A {kind}\n150 images": (rows, 25.0) for kind, rows in
               kind_rows(folder / "vcr_img150_by_kind.json", "none", "pretrained",
                         ("all", "colour", "where")).items()}
    if (folder / "refcoco_img15_by_kind.json").exists():
        readers = json.loads((HERE.parent / "refcoco_s75" / "readers.json").read_text())
        refcoco = {f"{kind}\n15 images": (rows, readers[kind]["random_candidate"]) for kind, rows in
                   kind_rows(folder / "refcoco_img15_by_kind.json", "none", "pretrained",
                             ("all", "relational")).items()}
    panels = [(p, title, width) for p, title, width in
              ((vqa, "VQA val (3 seeds)", len(vqa)), (vcr, "VCR val (3 seeds)", 3),
               (refcoco, "RefCOCO+ val, gt boxes (3 seeds)", 2)) if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.75 * sum(w for *_, w in panels) / 2.25, 5.6),
                             gridspec_kw={"width_ratios": [w for *_, w in panels]}, squeeze=False)
    for ax, (p, title, _) in zip(axes[0], panels):
        bars(ax, p, ROWS, title)
    one_legend(fig, list(axes[0]))
    save(fig, folder, bottom=0.1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE))
