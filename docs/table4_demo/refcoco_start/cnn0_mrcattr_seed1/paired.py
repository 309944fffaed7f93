"""Both pretraining draws of the CNN-frozen + colour-MRC recipe against step 0 on RefCOCO+ (docs/FINETUNE.md,
session 46): paired by expression (each expression's accuracy averaged over the three finetuning seeds), with a
bootstrap over val images; the two draws pooled, and draw 1 minus draw 0.

    python docs/table4_demo/refcoco_start/cnn0_mrcattr_seed1/paired.py 15 > DIR/paired_img15.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from diagnostics.statistics import paired_test  # noqa: E402
from finetune.table4 import refcoco_metrics  # noqa: E402

RUNS = Path("runs/nc_long/refcoco")
KEEP = ("n", "mean_diff", "ci95", "clusters", "p_bootstrap")


def seed_mean(images_trained: int, row: str) -> tuple[np.ndarray, np.ndarray]:
    """Per expression (sorted by key): its accuracy averaged over finetuning seeds 0-2, and its image."""
    per = [next(iter(refcoco_metrics(RUNS / f"img{images_trained}_s{s}" / row, "gt")[0].values())) for s in range(3)]
    keys = sorted(per[0].keys)
    values = np.mean([[dict(zip(ex.keys, ex.values))[k] for k in keys] for ex in per], axis=0)
    image = dict(zip(per[0].keys, per[0].images))
    return values, np.array([image[k] for k in keys])


def main() -> int:
    n = int(sys.argv[1])
    base, images = seed_mean(n, "none")
    draw0, _ = seed_mean(n, "pretrained_cnn0_mrcattr")
    draw1, _ = seed_mean(n, "pretrained_cnn0_mrcattr_p1")
    pairs = {"draw 0 minus step 0": (base, draw0), "draw 1 minus step 0": (base, draw1),
             "both draws minus step 0": (base, (draw0 + draw1) / 2), "draw 1 minus draw 0": (draw0, draw1)}
    out = {}
    for name, (a, b) in pairs.items():
        t = paired_test(a, b, clusters=images)
        out[name] = {k: t[k] for k in KEEP}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
