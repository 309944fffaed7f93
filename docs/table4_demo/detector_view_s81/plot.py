"""RefCOCO+ at 15 training images on the large val, pretrained on the demo's exact boxes against a detector's view of
them (docs/FINETUNE.md, session 81): step 0, the quick start's recipe (draws 0 and 1) and the same recipe with
`data.detector_view` (draws 0 and 1), on the detected track and on the gt boxes, all and relational expressions
(seeds 0-2; 95% intervals by image; dashed: a random candidate); beside them, on the detected track, how often each
row picks a false positive ("stray") or another object's box. Each panel and row is drawn where run.sh has
reported it (session 81 reported the detected track's draw 0).

    python docs/table4_demo/detector_view_s81/plot.py    # -> docs/table4_demo/detector_view_s81/table4.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from docs.table4_demo.bars import bars, kind_rows, one_legend, save  # noqa: E402

HERE = Path(__file__).resolve().parent
ROWS = {"none": "no VL pretraining (step 0)", "pretrained": "the quick start's recipe, draw 0",
        "pretrained_draw1": "the quick start's recipe, draw 1", "detector_view": "with data.detector_view, draw 0",
        "detector_view_draw1": "with data.detector_view, draw 1"}
TRACKS = {"detected": "detected track", "gt": "gt boxes"}
# a random candidate on the relational expressions' gt boxes (docs/FINETUNE.md's Table 4, session 78's row)
RELATIONAL_CHANCE = 15.8


def main() -> int:
    panels, errors = {}, {}
    for track, label in TRACKS.items():
        folder = HERE / track
        if not (folder / "vs_none.json").exists():
            continue
        chance = json.loads((folder / "vs_none.json").read_text())["chance_or_prior"]
        got: dict[str, dict] = {"all": {}, "relational": {}}
        for row in ROWS:
            path = folder / f"by_kind_{row}_vs_none.json"
            if path.exists():
                for kind, rows in kind_rows(path, "none", row, tuple(got)).items():
                    got[kind].update(rows)
        for kind, rows in got.items():
            panels[f"{kind}\n{label}"] = (rows, chance if kind == "all" else RELATIONAL_CHANCE)
        for row in ROWS:
            path = folder / f"errors_{row}_vs_none.json"
            if not path.exists():
                continue
            rep = json.loads(path.read_text())
            for side, name in (("base", "none"), ("row", row)):
                for outcome, title in (("stray", "a false\npositive's box"), ("other_object", "another\nobject's box")):
                    mean, ci = rep[side]["share_all"][outcome]
                    errors.setdefault(f"picks {title}", ({}, None))[0][name] = {"mean": mean,
                                                                                                   "ci95": ci}
    widths = [len(panels), max(len(errors), 1)]
    fig, axes = plt.subplots(1, 2, figsize=(3 + 1.7 * sum(widths), 5.8), gridspec_kw={"width_ratios": widths})
    bars(axes[0], panels, ROWS, "RefCOCO+, 15 training images, 1,976 val images,\n3 finetuning seeds: "
         "pretrained on exact boxes\nor on a detector's view of them")
    if errors:
        bars(axes[1], errors, ROWS, "The detected track's errors")
        axes[1].set_ylim(0, max(s["ci95"][1] for got, _ in errors.values() for s in got.values()) * 1.2)
        axes[1].set_ylabel("% of expressions")
    else:
        axes[1].axis("off")
    one_legend(fig, axes, ncol=2)
    save(fig, HERE, bottom=0.1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
