"""RefCOCO+ (gt boxes) with relational expressions, demo version 3 (docs/FINETUNE.md, session 75): session 73's quick
start export against its step 0 at the launcher's default, each row's accuracy with its 95% interval by image, the
random candidate dashed. Left: the demo config (relation words read against the object after them, regions taking
the words aligned to them), three seeds, all / names / relational expressions. Middle: relational expressions at
seed 0 under each model option tried. Right: the two readers that learn nothing, on the step 0 export's detector.
From this folder's reports.

    python docs/table4_demo/refcoco_s75/plot.py     # -> docs/table4_demo/refcoco_s75/table4.png
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
KINDS = ("all", "names", "relational")
ROWS = {"none": "no VL pretraining (step 0)", "pretrained": "VL pretrained (the quick start)"}
ARMS = {"off": "neither option\n(version 2's model)", "region_words": "regions take\ntheir words",
        "landmark_first": "relation words:\nlandmark first", "both": "both\n(the demo config)"}


def main() -> int:
    readers = json.loads((HERE / "readers.json").read_text())
    chance = {k: readers[k]["random_candidate"] for k in KINDS}
    adopted = kind_rows(HERE / "by_kind_demo_config.json", "none", "pretrained", KINDS)
    left = {f"{k}\n({readers[k]['expressions']} expressions)": (adopted[k], chance[k]) for k in KINDS}
    middle = {label: (kind_rows(HERE / f"by_kind_s0_{arm}.json", "none", "pretrained", KINDS)["relational"],
                      chance["relational"]) for arm, label in ARMS.items()}
    right = {k: ({r: {"mean": readers[k][r]["accuracy"], "ci95": readers[k][r]["ci95"]}
                  for r in ("name_reader", "names_and_boxes")}, chance[k]) for k in KINDS}
    fig, axes = plt.subplots(1, 3, figsize=(19, 5.2), gridspec_kw={"width_ratios": [3, 4, 3]})
    bars(axes[0], left, ROWS, "RefCOCO+ val, gt boxes: the demo config, 3 seeds")
    bars(axes[1], middle, ROWS, "relational expressions, seed 0, by model option")
    bars(axes[2], right, {"name_reader": "names alone (no learning)", "names_and_boxes": "names + boxes (no learning)"},
         "readers that learn nothing")
    save(fig, HERE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
