"""The diagnostics' figures: the cross-modal ablation's Figure 2 and threshold sweep, and the grounding table's
per-category bars."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .categories import CHANCE, REPORTED
from .conditions import LANGUAGE_FOR_VISION, VISION_FOR_LANGUAGE


def half_widths(mean: float, s: dict) -> list[float]:
    """Error bar lengths below and above a summary's mean; none for a summary without an interval (one value)."""
    if s.get("ci95") is None:
        return [0.0, 0.0]
    return [mean - s["ci95"][0], s["ci95"][1] - mean]


def ablation_figures(report: dict, out: Path) -> list[Path]:
    """figure2.png (bits per condition, a line per model) and threshold_sweep.png under `out`."""
    # lazy: matplotlib (~0.5 s to import) only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = report["models"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, group, conditions, title in (
            (axes[0], "v4l", (*VISION_FOR_LANGUAGE, "text_only"), "Vision-for-language (MLM)"),
            (axes[1], "l4v_kl", LANGUAGE_FOR_VISION, "Language-for-vision (MRC-KL)")):
        for name, r in models.items():
            g = r.get(group, {})
            if set(g) == {"text_only"}:  # a text-only model: one value, drawn across the conditions
                ax.axhline(g["text_only"]["mean"], ls="--", color="grey", label=f"{name}")
                continue
            if not all(c in g and g[c]["mean"] is not None for c in conditions):
                continue
            means = [g[c]["mean"] for c in conditions]
            err = np.array([half_widths(m, g[c]) for m, c in zip(means, conditions)]).T
            ax.errorbar(range(len(conditions)), means, yerr=err, marker="o", capsize=3, label=name)
        ax.set_xticks(range(len(conditions)), [c.capitalize().replace("_", " ") for c in conditions])
        ax.set_xlabel("ablation")
        ax.set_ylabel("bits")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    paths = [out / "figure2.png"]
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)
    if any("sweep" in r for r in models.values()):
        fig, ax = plt.subplots(figsize=(5, 4))
        for name, r in models.items():
            if "sweep" not in r:
                continue
            taus = sorted(r["sweep"], key=float)
            ax.plot([float(t) for t in taus], [r["sweep"][t]["mean"] for t in taus], marker="o", label=name)
        ax.set_xlabel("co-ablation threshold tau (IoT with the gold box)")
        ax.set_ylabel("MLM bits, Object ablation")
        ax.set_title("Threshold sweep")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / "threshold_sweep.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    split = {name: r["against_reference"] for name, r in models.items() if "against_reference" in r}
    if split:
        paths.append(information_figure(split, report["reference"], out / "information.png"))
    return paths


def information_figure(split: dict[str, dict], reference: str, path: Path) -> Path:
    """information.png: each model's V4L all - none split in two, what the image tells it (information) and what it
    overpays on the ablated input, side by side from 0 with their 95% intervals, and their sum (all - none) marked.
    Side by side, not stacked: an overpayment is often negative, and stacked it would hide part of the information
    bar under its own."""
    # lazy: matplotlib (~0.5 s to import) only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 1.2 + 0.7 * len(split)))
    for row, r in enumerate(split.values()):
        total = 0.0
        for offset, (part, colour) in zip((-0.2, 0.2), (("information", "tab:green"), ("overpayment", "tab:grey"))):
            t = r[part]
            if t["mean_diff"] is None:
                continue
            ci = t.get("ci95")
            err = None if ci is None else [[t["mean_diff"] - ci[0]], [ci[1] - t["mean_diff"]]]
            ax.barh(row + offset, t["mean_diff"], height=0.38, color=colour, label=part if row == 0 else None)
            ax.errorbar(t["mean_diff"], row + offset, xerr=err, color="black", capsize=3)
            total += t["mean_diff"]
        ax.plot([total], [row], marker="D", color="black", linestyle="none", label="all - none" if row == 0 else None)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(split)), list(split))
    ax.invert_yaxis()
    ax.set_xlabel(f"V4L bits per word-piece (split against {reference})")
    ax.legend(fontsize=8, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def grounding_figure(summaries: dict[str, dict], path: Path) -> Path:
    """Held-out masked-word accuracy per category, with and without the image, a pair of bars per model."""
    # lazy: matplotlib (~0.5 s to import) only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = list(REPORTED)
    fig, ax = plt.subplots(figsize=(8, 4))
    series = [(name, cond) for name in summaries for cond in ("image", "ablated")]
    width = 0.8 / max(1, len(series))
    for i, (name, cond) in enumerate(series):
        s = summaries[name]["words"]
        means = [s[c][cond]["mean"] if c in s else np.nan for c in cats]
        err = np.array([half_widths(m, s[c][cond]) if c in s else [0, 0] for m, c in zip(means, cats)]).T
        ax.bar(np.arange(len(cats)) + (i - (len(series) - 1) / 2) * width, means, width, yerr=err, capsize=2,
               label=f"{name}, {cond}")
    ax.scatter(np.arange(len(cats)), [CHANCE[c] for c in cats], marker="_", s=400, color="black", label="chance",
               zorder=3)
    ax.set_xticks(range(len(cats)), cats)
    ax.set_ylabel("held-out masked-word accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
