"""Table 4's four rows on RefCOCO+ at 15 training images on the large val (docs/FINETUNE.md, session 80): step 0, the
quick start's export and its two ablations (without MRC, without the text corpus), all and relational expressions,
per arm and track (seeds 0-2; 95% intervals by image; dashed: a random candidate), with VCR Q->A at 150 images from
session 79's folder when its report is there; beside them, per arm that has them, the second pretraining draws of
the quick start's recipe and of its no_text twin (draw.sh) against the first.

    python docs/table4_demo/ablation_s80/plot.py    # -> docs/table4_demo/ablation_s80/table4.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from docs.table4_demo.bars import bars, kind_rows, report_panels, save  # noqa: E402

HERE = Path(__file__).resolve().parent
ROWS = {"none": "no VL pretraining (step 0)", "pretrained": "VL pretrained (the quick start)",
        "no_mrc": "pretrained without MRC", "no_text": "pretrained without the text corpus"}
ARMS = {"on": "gt, demo config", "off": "gt, options off", "off/detected": "detected, options off"}
# no_mrc holds its place (not drawn there) so that every row keeps its colour across the two panels
DRAWS = {"none": ROWS["none"], "pretrained": "the quick start's recipe, draw 0", "no_mrc": ROWS["no_mrc"],
         "no_text": "without the text corpus, draw 0",
         "pretrained_draw1": "the quick start's recipe, draw 1", "no_text_draw1": "without the text corpus, draw 1"}
# a random candidate on the relational expressions' gt boxes (docs/FINETUNE.md's Table 4, session 78's row); the
# reports carry the chance of all expressions only
RELATIONAL_CHANCE = 15.8
VCR = HERE.parent / "ablation_s79" / "vcr_img150_vs_none.json"


def kinds(folder: Path, rows) -> dict[str, dict]:
    """{kind: {row: {mean, ci95}}} for "all" and "relational", each row from the folder's
    by_kind_<row>_vs_pretrained.json (the full recipe, their common base, from any of them)."""
    out = {"all": {}, "relational": {}}
    for row in rows:
        for kind, got in kind_rows(folder / f"by_kind_{row}_vs_pretrained.json", "pretrained", row, tuple(out)).items():
            out[kind].update(got)
    return out


def main() -> int:
    panels, draws = {}, {}
    for arm, label in ARMS.items():
        folder = HERE / arm
        if not (folder / "by_kind_none_vs_pretrained.json").exists():
            continue
        chance = json.loads((folder / "vs_none.json").read_text())["chance_or_prior"]
        for kind, got in kinds(folder, ("none", "no_mrc", "no_text")).items():
            panels[f"RefCOCO+ {kind}\n{label}"] = (got, chance if kind == "all" else RELATIONAL_CHANCE)
        if (folder / "by_kind_no_text_draw1_vs_pretrained.json").exists():
            for kind, got in kinds(folder, ("none", "no_text", "pretrained_draw1", "no_text_draw1")).items():
                draws[f"RefCOCO+ {kind}\n{label}"] = (got, chance if kind == "all" else RELATIONAL_CHANCE)
    if VCR.exists():
        seeds = len(json.loads(VCR.read_text())["pretrained minus none"]["per_seed"])
        for got, chance in report_panels(VCR).values():
            panels[f"VCR Q->A\n150 images\n({seeds} seed{'s' if seeds > 1 else ''})"] = (got, chance)
    widths = [len(panels), max(len(draws), 1)]
    fig, axes = plt.subplots(1, 2, figsize=(3 + 1.6 * sum(widths), 5.8), gridspec_kw={"width_ratios": widths})
    bars(axes[0], panels, ROWS,
         "Table 4's rows at low data (one pretraining draw each): RefCOCO+ at 15 training images\n"
         "on 1,976 val images (3 finetuning seeds), VCR at 150")
    if draws:
        bars(axes[1], draws, DRAWS, "A second pretraining draw (seed 1)\nof the recipe and of its no_text twin")
    else:
        axes[1].axis("off")
    save(fig, HERE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
