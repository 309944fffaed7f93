"""Table 4's four rows on RefCOCO+ at 15 training images on the large val (docs/FINETUNE.md, session 80): step 0, the
quick start's export and its two ablations (without MRC, without the text corpus), all and relational expressions,
per arm and track (seeds 0-2; 95% intervals by image; dashed: a random candidate). From this folder's reports, and
VCR Q->A at 150 images from session 79's folder when its report is there.

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
from docs.table4_demo.bars import bars, report_panels, save  # noqa: E402

HERE = Path(__file__).resolve().parent
ROWS = {"none": "no VL pretraining (step 0)", "pretrained": "VL pretrained (the quick start)",
        "no_mrc": "pretrained without MRC", "no_text": "pretrained without the text corpus"}
ARMS = {"on": "gt, demo config", "off": "gt, options off", "off/detected": "detected, options off"}
# a random candidate on the relational expressions' gt boxes (docs/FINETUNE.md's Table 4, session 78's row); the
# reports carry the chance of all expressions only
RELATIONAL_CHANCE = 15.8
VCR = HERE.parent / "ablation_s79" / "vcr_img150_vs_none.json"


def main() -> int:
    panels = {}
    for arm, label in ARMS.items():
        folder = HERE / arm
        if not (folder / "by_kind_none_vs_pretrained.json").exists():
            continue
        chance = json.loads((folder / "vs_none.json").read_text())["chance_or_prior"]
        for kind in ("all", "relational"):
            got = {}
            for row in ("none", "no_mrc", "no_text"):
                rep = json.loads((folder / f"by_kind_{row}_vs_pretrained.json").read_text())[kind]
                got[row] = {"mean": rep["row"][0], "ci95": rep["row"][1]}
                got["pretrained"] = {"mean": rep["base"][0], "ci95": rep["base"][1]}
            panels[f"RefCOCO+ {kind}\n{label}"] = (got, chance if kind == "all" else RELATIONAL_CHANCE)
    if VCR.exists():
        seeds = len(json.loads(VCR.read_text())["pretrained minus none"]["per_seed"])
        for got, chance in report_panels(VCR).values():
            panels[f"VCR Q->A\n150 images\n({seeds} seed{'s' if seeds > 1 else ''})"] = (got, chance)
    fig, ax = plt.subplots(figsize=(2 + 1.6 * len(panels), 5.4))
    bars(ax, panels, ROWS,
         "Table 4's rows at low data: RefCOCO+ at 15 training images on 1,976 val images (3 seeds), VCR at 150")
    save(fig, HERE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
