"""The exports' held-out grounding side by side (docs/FINETUNE.md, session 81): each pretraining run's own final
evaluation (`<run>/grounding/grounding.json`, 100 held-out images, gt boxes, 95% intervals by image), as a markdown
table: masked colour, shape and size words with the image and with it ablated, and masked RoI classification of
visible regions and of zeroed ones a caption names.

    python docs/table4_demo/detector_view_s81/grounding.py RUN [RUN ...] > grounding.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def cell(stat: dict) -> str:
    lo, hi = stat["ci95"]
    return f"{stat['mean']:.3f} [{lo:.3f}, {hi:.3f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()
    words = ("colour", "shape", "size")
    print("| export | " + " | ".join(f"{w}: image / ablated" for w in words) + " | visible MRC | zeroed named MRC |")
    print("|---" * (len(words) + 3) + "|")
    for run in args.runs:
        rep = json.loads((Path(run) / "grounding" / "grounding.json").read_text())
        (model,) = rep["models"].values()
        w, m = model["words"], model["mrc"]
        cells = [f"{cell(w[k]['image'])} / {w[k]['ablated']['mean']:.3f}" for k in words]
        print(f"| {run} (step {rep['step']}) | " + " | ".join(cells) +
              f" | {cell(m['visible'])} | {cell(m['zeroed_named'])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
