"""VCR's Table-4 column with the relation-name channel (docs/FINETUNE.md, session 70): Q->A at the launcher's default
from the four rows, overall and per question kind, QA->R and Q->AR from two, and Q->A at 150 training images over
three seeds; each row's accuracy with its 95% interval by image, chance dashed; from this folder's reports.

    python docs/table4_demo/vcr_s70/plot.py     # -> docs/table4_demo/vcr_s70/table4.png
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from docs.table4_demo.bars import bars, kind_rows, report_panels, save  # noqa: E402

HERE = Path(__file__).resolve().parent
ROWS = {"none": "no VL pretraining (step 0)", "pretrained": "VL pretrained (the quick start)",
        "no_mrc": "pretrained without MRC", "no_text": "pretrained without the text corpus"}


def main() -> int:
    default = report_panels(HERE / "default_qa_ablations_paired.json")
    panels = {"Q->A, default\n(2 epochs)": next(iter(default.values()))}
    halves = {r: kind_rows(HERE / f"default_qa{'' if r == 'pretrained' else '_' + r}_by_kind.json", "none", r)
              for r in ("pretrained", "no_mrc", "no_text")}
    for kind in ("colour", "where"):
        rows = {"none": halves["pretrained"][kind]["none"], **{r: h[kind][r] for r, h in halves.items()}}
        panels[f"Q->A default,\n{kind} half"] = (rows, 25.0)
    default = report_panels(HERE / "default_paired.json")
    panels["QA->R, default\n(1.5 epochs)"] = default["VCR QA->R"]
    panels["Q->AR, default"] = default["VCR Q->AR"]
    small = kind_rows(HERE / "img150_by_kind.json", "none", "pretrained")
    panels["Q->A, 150 images\n(3 seeds)"] = next(iter(report_panels(
        HERE.parent / "lowdata_s62" / "vcr_img150_s70.json").values()))
    for kind in ("colour", "where"):
        panels[f"Q->A 150 images,\n{kind} half"] = (small[kind], 25.0)
    fig, axes = plt.subplots(1, 2, figsize=(15, 4.8), gridspec_kw={"width_ratios": [3, 4]})
    first = dict(list(panels.items())[:3])
    rest = dict(list(panels.items())[3:])
    bars(axes[0], first, ROWS, "VCR Q->A at the launcher's default, relation names on")
    bars(axes[1], rest, ROWS, "QA->R, Q->AR (default) and Q->A with 150 training images")
    save(fig, HERE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
