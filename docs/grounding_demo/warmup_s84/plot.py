"""The quick start against its detector warm-up's length (docs/ABLATION.md, session 84): held-out colour and shape
words, MRC on the regions in view, and the warm-up's held-out object accuracy, per warm-up (epochs) and pretraining
draw, with 95% intervals by image. Reads the runs' grounding.json and detector_drift.json copied beside this file
(`e<epochs x 10>_seed<D>.grounding.json`, `e<..>_seed<D>.drift.json`; run.sh copies the shortened warm-ups'; the
2-epoch ones are session 82's exports under this session's evaluator: seed 0 the clean clone's own table, seeds 1-2
`python -m diagnostics.grounding ... max_images=100`); writes warmup.png and warmup.md.

    python docs/grounding_demo/warmup_s84/plot.py
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from docs.table4_demo.bars import one_legend  # noqa: E402

here = Path(__file__).parent
PANELS = [("colour words", ("words", "colour", "image")), ("shape words", ("words", "shape", "image")),
          ("MRC, regions in view", ("mrc", "visible_in_view", None))]


def cell(summary: dict, where: tuple) -> dict:
    part, key, cond = where
    r = summary[part][key]
    return r[cond] if cond else r


runs = {}
for path in sorted(here.glob("e*_seed*.grounding.json")):
    warmup, seed = path.name.split(".")[0].split("_")
    drift = json.loads(path.with_name(path.name.replace("grounding", "drift")).read_text())
    runs[(int(warmup[1:]) / 10, int(seed[4:]))] = (json.loads(path.read_text())["models"]["export"], drift)
epochs = sorted({e for e, _ in runs})
seeds = sorted({s for _, s in runs})

def fmt(r: dict) -> str:
    return f"{r['mean']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"


lines = ["| warm-up epochs | draw | detector object / colour (held out) | colour | shape | MRC in view | MRC visible |",
         "|---|---|---|---|---|---|---|"]
for (e, s), (g, d) in sorted(runs.items()):
    lines.append(f"| {e:g} | {s} | {d['warm_up']['object_accuracy']:.3f} / {d['warm_up']['attribute_accuracy']:.3f} | "
                 f"{fmt(g['words']['colour']['image'])} | {fmt(g['words']['shape']['image'])} | "
                 f"{fmt(g['mrc']['visible_in_view'])} | {fmt(g['mrc']['visible'])} |")
(here / "warmup.md").write_text("\n".join(lines) + "\n")

fig, axes = plt.subplots(1, len(PANELS) + 1, figsize=(13, 3.6))
width = 0.8 / max(1, len(seeds))
for ax, (title, where) in zip(axes, PANELS):
    for j, s in enumerate(seeds):
        xs, ys, lo, hi = [], [], [], []
        for i, e in enumerate(epochs):
            if (e, s) in runs:
                r = cell(runs[(e, s)][0], where)
                xs.append(i + (j - (len(seeds) - 1) / 2) * width)
                ys.append(r["mean"])
                lo.append(r["mean"] - r["ci95"][0])
                hi.append(r["ci95"][1] - r["mean"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=f"pretraining draw {s}", color=f"C{j}")
    ax.axhline(0.8, ls=":", color="grey")
    ax.set_ylim(0.6, 1.0)
    ax.set_xticks(range(len(epochs)), [f"{e:g}" for e in epochs])
    ax.set_xlabel("detector warm-up epochs")
    ax.set_title(title, fontsize=10)
ax = axes[-1]
ax.plot(epochs, [runs[(e, seeds[0])][1]["warm_up"]["object_accuracy"] for e in epochs], "o-", label="object")
ax.plot(epochs, [runs[(e, seeds[0])][1]["warm_up"]["attribute_accuracy"] for e in epochs], "s-", label="colour")
ax.set_xticks(epochs)
ax.set_xlabel("detector warm-up epochs")
ax.set_title("warm-up, held-out accuracy", fontsize=10)
ax.set_ylim(0.6, 1.0)
ax.legend(fontsize=8)
axes[0].set_ylabel("first 100 held-out images")
one_legend(fig, axes[:1], ncol=len(seeds))
fig.tight_layout(rect=(0, 0.08, 1, 1))
fig.savefig(here / "warmup.png", dpi=110)
print((here / "warmup.md").read_text())
