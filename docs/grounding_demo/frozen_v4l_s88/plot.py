"""The image's information (V4L, bits per phrase word-piece against the matched control) of the quick start with its
backbone trained (session 85's recipe) and frozen (session 86's default) in pretraining, two draws each, by whether
the phrase's sentence has a relation word (docs/ABLATION.md, session 88). Reads paired_by_form.json beside it.

    python docs/grounding_demo/frozen_v4l_s88/plot.py
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

here = Path(__file__).resolve().parent
report = json.loads((here / "paired_by_form.json").read_text())
models = [("s85_s0", "backbone trained, draw 0"), ("frz_s0", "frozen (default), draw 0"),
          ("unfrz_s1", "backbone trained, draw 1"), ("frz_s1", "frozen (default), draw 1")]
splits = list(report)
fig, ax = plt.subplots(figsize=(8, 4))
width = 0.8 / len(models)
for i, (key, label) in enumerate(models):
    stats = [report[s][f"{key} information"] for s in splits]
    means = [st["mean"] for st in stats]
    err = [[m - st["ci95"][0] for m, st in zip(means, stats)], [st["ci95"][1] - m for m, st in zip(means, stats)]]
    ax.bar([j + (i - 1.5) * width for j in range(len(splits))], means, width, yerr=err, capsize=3, label=label,
           color=["#1f77b4", "#ff7f0e", "#aec7e8", "#ffbb78"][i])
ax.set_xticks(range(len(splits)))
ax.set_xticklabels([f"{s}\n({report[s]['n']} phrases)" for s in splits])
ax.set_ylabel("information (bits / word-piece)")
ax.set_title("V4L information against the matched control, 95% intervals by image")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(here / "information.png", dpi=120)
