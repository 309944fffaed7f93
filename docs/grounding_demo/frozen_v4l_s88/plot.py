"""The image's information (V4L, bits per phrase word-piece against the matched control) of the quick start with its
backbone trained (session 85's recipe, draws 0 and 1) and frozen (session 86's default, draws 0-2) in pretraining, by
whether the phrase's sentence has a relation word (docs/ABLATION.md, session 88). Reads paired_by_form.json beside it
and draws it with the Table 4 figures' grouped bars.

    python docs/grounding_demo/frozen_v4l_s88/plot.py
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from docs.table4_demo.bars import bars  # noqa: E402

here = Path(__file__).resolve().parent
report = json.loads((here / "paired_by_form.json").read_text())
rows = {"s85_s0": "backbone trained, draw 0", "frz_s0": "frozen (default), draw 0",
        "unfrz_s1": "backbone trained, draw 1", "frz_s1": "frozen (default), draw 1",
        "frz_s2": "frozen (default), draw 2"}
panels = {f"{split}\n({stats['n']} phrases)": ({r: stats[f"{r} information"] for r in rows}, None)
          for split, stats in report.items()}
fig, ax = plt.subplots(figsize=(9, 4.5))
bars(ax, panels, rows, "V4L information against the matched control, 95% intervals by image")
ax.set_ylabel("information (bits / word-piece)")  # bars() draws accuracies; these are bits
ax.autoscale(axis="y")
fig.tight_layout()
fig.savefig(here / "information.png", dpi=120)
