"""Table 4 without the region word channel (docs/FINETUNE.md, session 49) as one figure, from the reports the
session's commands wrote: each task's accuracy per row (step 0, the two pretraining draws of the stored-target
recipe) with its 95% interval by image, and the task's prior or chance.

    python docs/table4_demo/nochannel_s49/plot.py     # -> docs/table4_demo/nochannel_s49/table4.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from docs.table4_demo.bars import bars, save  # noqa: E402

DOCS = Path(__file__).resolve().parents[1]
ROWS = {"none": "no VL pretraining (step 0)", "pretrained_mrcattr_shards": "VL pretrained, draw 0",
        "pretrained_mrcattr_shards_p1": "VL pretrained, draw 1"}


def read(path: str) -> dict:
    return json.loads((DOCS / path).read_text())


def main() -> int:
    vqa = read("vqa_nochannel/full/paired.json")
    vcr = read("vcr_nochannel/paired_e2_s0.json")
    ref = read("refcoco_start/mrcattr_shards_seed1/detected/errors/detected_errors.json")["tracks"]
    prior = {"VQA overall": 32.64, "VQA other": 19.70}  # the question-type prior of the training questions
    panels = {  # label: ({row: {mean, ci95}}, prior or chance)
        "VQA overall\n(3 seeds)": (vqa["VQA overall"]["rows"], prior["VQA overall"]),
        "VQA other\n(colour, shape)": (vqa["VQA other (colour, shape)"]["rows"], prior["VQA other"]),
        "RefCOCO+ gt\n(15 images, 3 seeds)": ({r: v["right"] for r, v in ref["gt"].items()}, 21.59),
        "RefCOCO+ gt-trained\non detected boxes": ({r: v["right"] for r, v in ref["gt_model_on_detected"].items()},
                                                   14.33),
        "RefCOCO+ detected\ntrack": ({r: v["right"] for r, v in ref["detected"].items()}, 14.33),
        "VCR Q->A\n(seed 0)": (vcr["rows"], 25.0),
    }
    fig, ax = plt.subplots(figsize=(11, 4.8))
    bars(ax, panels, ROWS,
         "Table 4 without the region word channel, at each launcher's budget (95% intervals by image)")
    save(fig, Path(__file__).resolve().parent)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
