"""What the Table 4 figures share (docs/FINETUNE.md, sessions 49-51): the grouped bar chart (each row's accuracy per
panel with its 95% interval, each panel's prior or chance as a dashed line), the reading of a paired.py report into
its panels, and where a figure is written."""

from __future__ import annotations

import json
from pathlib import Path


def report_panels(path: Path) -> dict[str, tuple[dict, float]]:
    """{metric: (its rows, its prior or chance)} from a docs/table4_demo/refcoco_start/paired.py report; a one-metric
    report (its pairs at the top level) is keyed by the file's stem."""
    rep = json.loads(path.read_text())
    rep = {path.stem: rep} if "rows" in rep else rep
    return {m: (r["rows"], r["chance_or_prior"]) for m, r in rep.items()}


def kind_rows(path: Path, base: str, row: str, kinds=("colour", "where")) -> dict[str, dict]:
    """{kind: {base: {mean, ci95}, row: ...}} from a docs/table4_demo/vcr_s70/kind_pair.py report (VCR's colour and
    where questions; RefCOCO+'s kinds "all", "names", "relational")."""
    rep = json.loads(path.read_text())
    return {k: {base: {"mean": rep[k]["base"][0], "ci95": rep[k]["base"][1]},
                row: {"mean": rep[k]["row"][0], "ci95": rep[k]["row"][1]}} for k in kinds}


def save(fig, folder: Path, bottom: float = 0.0) -> None:
    """<folder>/table4.png, the name the docs link; `bottom`: the figure's share kept free below the panels (for a
    legend of the whole figure)."""
    fig.tight_layout(rect=(0, bottom, 1, 1))
    out = folder / "table4.png"
    fig.savefig(out, dpi=110)
    print(out)


def one_legend(fig, axes, ncol: int = 3) -> None:
    """One legend for the whole figure, below it, in place of each panel's (the rows keep their colours across
    panels, so the first panel's entries name them all); pair with save(fig, folder, bottom=0.1)."""
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8)


def bars(ax, panels: dict[str, tuple[dict, float]], rows: dict[str, str], title: str) -> None:
    """panels: {label: ({row: {"mean", "ci95"}}, prior or chance, or None)}; rows: {row: legend label}, drawn where
    every panel has the row; a row keeps its colour (its place in `rows`) when another is left out, so panels side by
    side match."""
    colour = {r: f"C{i}" for i, r in enumerate(rows)}
    rows = {r: label for r, label in rows.items() if all(r in got for got, _ in panels.values())}
    width = 0.8 / len(rows)
    for j, (row, label) in enumerate(rows.items()):
        xs, ys, err = [], [], [[], []]
        for k, (got, _) in enumerate(panels.values()):
            s = got[row]
            xs.append(k + (j - (len(rows) - 1) / 2) * width)
            ys.append(s["mean"])
            err[0].append(s["mean"] - s["ci95"][0])
            err[1].append(s["ci95"][1] - s["mean"])
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=label, color=colour[row])
    for k, (_, chance) in enumerate(panels.values()):
        if chance is None:  # a share that has no chance level (an error kind's)
            continue
        ax.hlines(chance, k - 0.45, k + 0.45, colors="k", linestyles="--", label="prior / chance" if k == 0 else None)
    ax.set_xticks(range(len(panels)), list(panels), fontsize=8)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    ax.set_title(title, fontsize=9)
