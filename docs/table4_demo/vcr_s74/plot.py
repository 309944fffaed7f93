"""VCR's Table-4 column with rationales that cite the picture (docs/FINETUNE.md, session 74): Q->A, QA->R and Q->AR at
the launcher's default from session 73's quick start export and its step 0, overall and per question kind, QA->R also
from the image-ablated control's export (a reader that sees no image); each row's accuracy averaged over its finetuning
seeds (0, 1 and 2; the control's seed 0) with its 95% interval by image, chance dashed; from this folder's reports.

    python docs/table4_demo/vcr_s74/plot.py     # -> docs/table4_demo/vcr_s74/table4.png
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
ROWS = {"none": "no VL pretraining (step 0)", "pretrained": "VL pretrained (the quick start)",
        "control": "grey-image control (sees no image)"}


def main() -> int:
    paired = report_panels(HERE / "paired.json")
    qa = kind_rows(HERE / "qa_by_kind.json", "none", "pretrained")
    qar = kind_rows(HERE / "qar_by_kind.json", "none", "pretrained")
    blind = kind_rows(HERE / "qar_control_by_kind.json", "none", "control")
    control = json.loads((HERE / "control_qar_metrics_val.json").read_text())
    blind_all = json.loads((HERE / "qar_control_by_kind.json").read_text())["all"]["row"]
    qa_panels = {"Q->A\n(2 epochs, 3 seeds)": paired["VCR Q->A"],
                 "Q->A,\ncolour questions": (qa["colour"], 25.0), "Q->A,\nwhere questions": (qa["where"], 25.0)}
    rows, chance = paired["VCR QA->R"]
    seen = {"control": {"mean": blind_all[0], "ci95": blind_all[1]}}
    qar_panels = {"QA->R\n(1.5 epochs, 3 seeds)": ({**rows, **seen}, chance)}
    for kind, evidence in (("colour", "where"), ("where", "colour")):
        qar_panels[f"QA->R, {kind} questions\n(evidence: {evidence})"] = (
            {**qar[kind], "control": blind[kind]["control"]}, 25.0)
    assert abs(blind_all[0] - control["accuracy"]) < 0.01, "the control's report and its metrics disagree"
    fig, axes = plt.subplots(1, 3, figsize=(20, 5.2), gridspec_kw={"width_ratios": [3, 3.4, 1.8]})
    bars(axes[0], qa_panels, ROWS, "VCR Q->A, launcher default")
    bars(axes[1], qar_panels, ROWS, "QA->R: rationales that cite the picture")
    bars(axes[2], {"Q->AR": paired["VCR Q->AR"]}, ROWS, "Q->AR")
    save(fig, HERE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
