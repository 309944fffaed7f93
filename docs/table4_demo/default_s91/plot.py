"""Table 4 from the quick start's default since session 90 against its own step 0 (docs/FINETUNE.md, session 91): each
row's accuracy with its 95% interval by image, the prior or chance dashed. Left: VQA overall at 50 and 150 training
images (three finetuning seeds) and at full data (seed 0) on data/demo's 200 val images and on data/demo_val4000's
4,000. Middle: VCR at the launcher's default (seed 0): Q->A, QA->R, Q->AR. Right: RefCOCO+ gt at 15 training images
(three seeds) on data/demo's 98 val images and on the 1,976 of data/demo_val4000, all expressions and the relational
ones (chance: a random candidate). From this folder's reports (run.sh's
report step); a report missing leaves its bars out.

    python docs/table4_demo/default_s91/plot.py [FOLDER]    # -> FOLDER/table4.png (FOLDER: this one)
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
ROWS = {"none": "no VL pretraining (step 0: packaged MiniLM, same warmed-up detector)",
        "pretrained": "VL pretrained (the quick start since session 90)"}


def panel(folder: Path, files: list[tuple[str, str, str]]) -> dict:
    """[(report file, metric in it, bar label)] -> bars' panels, the files that exist."""
    out = {}
    for name, metric, label in files:
        if (folder / name).exists():
            out[label] = report_panels(folder / name)[metric]
    return out


def main(folder: Path = HERE) -> int:
    vqa = panel(folder, [("vqa_img50.json", "VQA overall", "50 images"),
                         ("vqa_img150.json", "VQA overall", "150 images"),
                         ("vqa_full.json", "VQA overall", "full data\n200 val images"),
                         ("vqa_full_val4000.json", "VQA overall", "full data\n4,000 val images")])
    vcr = panel(folder, [("vcr_full.json", f"VCR {m}", m) for m in ("Q->A", "QA->R", "Q->AR")])
    refcoco = panel(folder, [("refcoco_img15.json", "refcoco_img15", "all\n98 val images"),
                             ("refcoco_img15_val1976.json", "refcoco_img15_val1976", "all\n1,976 val images")])
    chance = json.loads((HERE.parent / "refcoco_s75" / "readers.json").read_text())["relational"]["random_candidate"]
    for name, label in (("refcoco_img15_by_kind.json", "relational\n98 val images"),
                        ("refcoco_img15_val1976_by_kind.json", "relational\n1,976 val images")):
        if (folder / name).exists():
            refcoco[label] = (kind_rows(folder / name, "none", "pretrained", ("relational",))["relational"], chance)
    panels = [(p, title) for p, title in ((vqa, "VQA val"), (vcr, "VCR val, launcher default (seed 0)"),
                                          (refcoco, "RefCOCO+ gt, 15 training images (3 seeds)")) if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 + 1.3 * sum(len(p) for p, _ in panels), 5.4),
                             gridspec_kw={"width_ratios": [len(p) for p, _ in panels]}, squeeze=False)
    for ax, (p, title) in zip(axes[0], panels):
        bars(ax, p, ROWS, title)
    one_legend(fig, list(axes[0]), ncol=1)
    save(fig, folder, bottom=0.12)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE))
