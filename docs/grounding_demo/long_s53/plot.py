"""Session 53's figure (docs/ABLATION.md): the cross-modal diagnostic on all held-out phrases at demo_long's last
checkpoints on the 2 CPU ranks, the constant LR (session 52's run) against the same run with the LR cut to 0.1 at
step 1,400 (identical through step 1,399). One panel per measure, condition - none in bits with its interval by
image, and the model's own bits with the image (none).

    python docs/grounding_demo/long_s53/plot.py

Reads the control_leak.py reports beside it (and session 52's for the constant run's step 1,600 other_image).
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
# report file -> {model name in it: (schedule, step)}
CONSTANT = {"s1550": ("constant", 1550), "s1600": ("constant", 1600), "model": ("constant", 1600)}
COOLDOWN = {"cd1500": ("cooldown", 1500), "cd1550": ("cooldown", 1550), "cd1600": ("cooldown", 1600)}
REPORTS = {
    "v4l_constant.json": CONSTANT,
    "v4l_cooldown.json": COOLDOWN,
    "v4l_constant_other_image.json": CONSTANT,
    "../long_s52/v4l.json": {"model": ("constant", 1600)},
}
EVALUATION_FILL = "v4l_evaluation_fill.json"
PANELS = (("all_minus_none", "training", "all - none, the diagnostic's fill\n(pretraining average, running mean)"),
          ("all_minus_none", "evaluation", "all - none, the held-out\nregions' average (the paper's fill)"),
          ("other_image_minus_none", "training", "other_image - none\n(the next held-out image)"),
          ("none", "training", "none: bits with the image"))
COLOURS = {"constant": "tab:blue", "cooldown": "tab:red"}


def collect() -> dict:
    """{(measure, fill): {schedule: {step: (mean, lo, hi)}}}"""
    out: dict = {}

    def add(path: Path, names: dict, fill: str) -> None:
        report = json.loads(path.read_text())
        for name, (schedule, step) in names.items():
            live = report.get(name, {}).get("live", {})
            for key, s in live.items():
                if key == "none" or key.endswith("_minus_none"):
                    lo, hi = s.get("ci95") or (s["mean"], s["mean"])
                    out.setdefault((key, fill), {}).setdefault(schedule, {})[step] = (s["mean"], lo, hi)

    for file, names in REPORTS.items():
        add(HERE / file, names, "training")
    add(HERE / EVALUATION_FILL, {**CONSTANT, **COOLDOWN}, "evaluation")
    return out


def main() -> None:
    data = collect()
    fig, axes = plt.subplots(1, len(PANELS), figsize=(14, 3.6))
    for ax, (key, fill, title) in zip(axes, PANELS):
        for schedule, colour in COLOURS.items():
            points = data.get((key, fill), {}).get(schedule, {})
            steps = sorted(points)
            means = [points[s][0] for s in steps]
            errors = [[points[s][0] - points[s][1] for s in steps], [points[s][2] - points[s][0] for s in steps]]
            ax.errorbar(steps, means, yerr=errors, fmt="-o", color=colour, capsize=3, label=schedule)
        if key != "none":
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("checkpoint (step)")
        ax.set_xticks([1500, 1550, 1600])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("bits per phrase word-piece")
    axes[0].legend(fontsize=8, title="LR after step 1,400", title_fontsize=8)
    fig.suptitle("demo_long on 2 CPU ranks, all 2,363 held-out phrases (95% intervals by image; dotted: the 1-bit "
                 "target)", fontsize=10)
    fig.tight_layout()
    fig.savefig(HERE / "v4l_checkpoints.png", dpi=110)
    print(f"wrote {HERE / 'v4l_checkpoints.png'}")


if __name__ == "__main__":
    main()
