"""Session 90: held-out colour and shape words and MRC in view per pretraining draw, the quick start at the full LR
to its last step against the same runs with the LR cut to 0.1 for their last 40 steps (identical through step 289),
and the full-LR runs' step 300; 95% intervals by image. Reads the grounding.json files beside this script.
    python docs/grounding_demo/intel_s90/plot.py"""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
ROWS = [("full LR to the end (step 330)", "s{d}.grounding.json", "export", "tab:grey"),
        ("full LR, step 300", "step300.grounding.json", "s{d}_300", "tab:blue"),
        ("LR x0.1 for the last 40 steps (the default since)", "cut_s{d}.grounding.json", "export", "tab:orange")]
METRICS = [("colour words", "words", "colour", "image"), ("shape words", "words", "shape", "image"),
           ("MRC, regions in view", "mrc", "visible_in_view", None)]


def value(path: Path, model: str, group: str, key: str, cond):
    if not path.exists():
        return None
    models = json.loads(path.read_text())["models"]
    if model not in models:
        return None
    r = models[model][group][key]
    return r[cond] if cond else r


fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), sharey=True)
for ax, (title, group, key, cond) in zip(axes, METRICS):
    for i, (label, pattern, model, colour) in enumerate(ROWS):
        for d in range(3):
            r = value(HERE / pattern.format(d=d), model.format(d=d), group, key, cond)
            if r is None:
                continue
            x = d + (i - 1) * 0.22
            lo, hi = r["ci95"]
            ax.errorbar(x, r["mean"], yerr=[[r["mean"] - lo], [hi - r["mean"]]], fmt="o", color=colour, capsize=3,
                        label=label if d == 0 or (i == 1 and d == 2) else None)
    ax.axhline(0.8, color="k", lw=0.8, ls="--")
    ax.set_title(title)
    ax.set_xticks(range(3), [f"draw {d}" for d in range(3)])
axes[0].set_ylabel("held-out accuracy (first 100 images)")
handles, labels = axes[0].get_legend_handles_labels()
seen = dict(zip(labels, handles))
fig.legend(seen.values(), seen.keys(), loc="lower center", ncol=3, frameon=False)
fig.tight_layout(rect=(0, 0.1, 1, 1))
fig.savefig(HERE / "draws.png", dpi=110)
print(f"wrote {HERE / 'draws.png'}")
