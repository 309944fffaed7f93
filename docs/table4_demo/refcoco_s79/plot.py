"""RefCOCO+ at 15 training images on the large val (docs/FINETUNE.md, session 79): step 0 against the quick start's
export, all and relational expressions, on the gt boxes, on box sets between them and the detections, and on the
detections, for models trained on the gt track and on the detected one (seeds 0-2; 95% intervals by image; dashed:
a random candidate on each box set). From this folder's reports.

    python docs/table4_demo/refcoco_s79/plot.py [FOLDER]    # -> FOLDER/table4.png (default this folder)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from docs.table4_demo.bars import bars, kind_rows, save  # noqa: E402

HERE = Path(__file__).resolve().parent
ROWS = {"none": "no VL pretraining (step 0)", "pretrained": "VL pretrained (the quick start)"}
GT_CHANCE = 20.72  # a random candidate on the large val's gt boxes (its runs' metrics_val.json)
SETS = {"gt_and_false": "gt boxes\n+ false pos.", "objects_only": "detections\n- false pos.", "dets": "detections"}


def main() -> int:
    here = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    panels = {}
    for kind in ("all", "relational"):
        gt = kind_rows(here / "by_kind_gt_trained_on_gt.json", "none", "pretrained", (kind,))[kind]
        panels[f"{kind}\ngt boxes\n(gt-trained)"] = (gt, GT_CHANCE)
        for model in ("gt", "detected"):
            for name, label in SETS.items():
                path = here / f"errors_{model}_trained_on_{name}.json"
                if not path.exists():
                    continue
                rep = json.loads(path.read_text())
                got = {row: {"mean": rep[side][f"share_{kind}"]["hit"][0], "ci95": rep[side][f"share_{kind}"]["hit"][1]}
                       for row, side in (("none", "base"), ("pretrained", "row"))}
                panels[f"{kind}\n{label}\n({model}-trained)"] = (got, rep["chance"])
    fig, ax = plt.subplots(figsize=(2 + 1.3 * len(panels), 5.4))
    bars(ax, panels, ROWS, "RefCOCO+ val, 15 training images, 1,976 val images (3 seeds): hits at IoU 0.5")
    save(fig, here)
    return 0


if __name__ == "__main__":
    sys.exit(main())
