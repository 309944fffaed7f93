"""The quick start at the CNN's two LR multipliers over three pretraining draws: a table and a plot from the runs'
grounding.json and detector_drift.json (docs/ABLATION.md, session 29).

    python docs/grounding_demo/quickstart_s29/seeds.py   # writes seeds.md and seeds.png beside this file
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
S28 = HERE.parent / "quickstart_s28"
# (multiplier, seed) -> run directory; seed 0 at 0.01 is this session's clean-clone quick start (byte-identical to
# session 28's m001), seed 0 at 0.1 session 28's clean-clone quick start
RUNS = {(0.1, 0): S28 / "model", (0.1, 1): S28 / "seed1", (0.1, 2): HERE / "seed2_m01",
        (0.01, 0): HERE / "model", (0.01, 1): S28 / "seed1_m001", (0.01, 2): HERE / "seed2_m001"}
COLUMNS = [("colour", "image"), ("colour", "image_minus_ablated"), ("shape", "image"),
           ("shape", "image_minus_ablated"), ("mrc", "visible")]


def figures(run: Path) -> dict:
    model = next(iter(json.loads((run / "grounding.json").read_text())["models"].values()))
    out = {(w, c): model["words"][w][c] for w in ("colour", "shape") for c in ("image", "image_minus_ablated")}
    out[("mrc", "visible")] = model["mrc"]["visible"]
    drift = json.loads((run / "detector_drift.json").read_text())["after"]
    out["drift"] = (drift["object_accuracy"], drift["attribute_accuracy"])
    return out


def main() -> None:
    runs = {key: figures(path) for key, path in RUNS.items() if (path / "grounding.json").exists()}
    head = "| LR multiplier | seed | colour, image | colour, image - ablated | shape, image | shape, image - ablated " \
           "| MRC visible | detector object / colour (warm-up 0.803 / 0.923) |"
    rows = [head, "|" + "---|" * 8]
    for (mult, seed), f in sorted(runs.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        cells = [f"{f[c]['mean']:.3f} [{f[c]['ci95'][0]:.3f}, {f[c]['ci95'][1]:.3f}]" for c in COLUMNS]
        rows.append(f"| {mult} | {seed} | " + " | ".join(cells) + f" | {f['drift'][0]:.3f} / {f['drift'][1]:.3f} |")
    for mult in (0.1, 0.01):
        mine = [f for (m, _), f in runs.items() if m == mult]
        means = [sum(f[c]["mean"] for f in mine) / len(mine) for c in COLUMNS]
        rows.append(f"| {mult} | mean of {len(mine)} | " + " | ".join(f"{m:.3f}" for m in means) + " | |")
    (HERE / "seeds.md").write_text("\n".join(rows) + "\n")

    fig, axes = plt.subplots(1, len(COLUMNS), figsize=(3.0 * len(COLUMNS), 3.2), sharey=False)
    for ax, col in zip(axes, COLUMNS):
        for x, mult in enumerate((0.1, 0.01)):
            for (m, seed), f in runs.items():
                if m != mult:
                    continue
                lo, hi = f[col]["ci95"]
                xs = x + (seed - 1) * 0.12
                ax.errorbar(xs, f[col]["mean"], yerr=[[f[col]["mean"] - lo], [hi - f[col]["mean"]]], fmt="o",
                            color=f"C{seed}", label=f"seed {seed}" if x == 0 else None, capsize=2)
        ax.set_xticks([0, 1], ["0.1", "0.01"])
        ax.set_xlabel("fast_rcnn LR multiplier")
        ax.set_title(" ".join(col).replace("image_minus_ablated", "image - ablated").replace("mrc", "MRC"),
                     fontsize=9)
        ax.axhline(0, color="grey", lw=0.5)
    axes[0].legend(fontsize=7)
    fig.suptitle("quick start (220 steps), first 100 held-out images, 95% intervals by image", fontsize=9)
    fig.tight_layout()
    fig.savefig(HERE / "seeds.png", dpi=110)


if __name__ == "__main__":
    main()
