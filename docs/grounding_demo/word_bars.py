"""What the quick-start variant figures share (docs/ABLATION.md, sessions 58-59): held-out colour and shape words with
the image, one pair of bars per run, 95% intervals clustered by image, each word's chance dotted; read from each
run's grounding.json."""

from __future__ import annotations

import json
from pathlib import Path


def word_bars(ax, runs: list[tuple[str, Path]]) -> None:
    """runs: (label, a folder holding a run's grounding.json), drawn left to right."""
    width = 0.38
    for j, (category, colour) in enumerate((("colour", "tab:blue"), ("shape", "tab:orange"))):
        for i, (_, path) in enumerate(runs):
            summary = next(iter(json.loads((path / "grounding.json").read_text())["models"].values()))
            s = summary["words"][category]["image"]
            x = i + (j - 0.5) * width
            ax.bar(x, s["mean"], width, color=colour, label=category if i == 0 else None)
            ax.errorbar(x, s["mean"], yerr=[[s["mean"] - s["ci95"][0]], [s["ci95"][1] - s["mean"]]], color="black",
                        capsize=2, lw=1)
        ax.axhline(summary["words"][category]["chance"], color=colour, ls=":", lw=1)
    ax.set_xticks(range(len(runs)), [name for name, _ in runs], rotation=25, ha="right")
    ax.set_ylabel("held-out masked-word accuracy, with the image")
    ax.set_ylim(0, 1)
