"""Both pretraining draws of the CNN-frozen + colour-MRC recipe against step 0 on RefCOCO+ (docs/FINETUNE.md,
session 46): paired by expression (each expression's accuracy averaged over the three finetuning seeds), with a
bootstrap over val images; the two draws pooled, and draw 1 minus draw 0.

    python docs/table4_demo/refcoco_start/cnn0_mrcattr_seed1/paired.py 15 > DIR/paired_img15.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from docs.table4_demo.refcoco_start.paired import compare, seed_mean  # noqa: E402

RUNS = Path("runs/nc_long/refcoco")


def main() -> int:
    n = int(sys.argv[1])
    base, images = seed_mean(RUNS, n, "none")
    draw0, _ = seed_mean(RUNS, n, "pretrained_cnn0_mrcattr")
    draw1, _ = seed_mean(RUNS, n, "pretrained_cnn0_mrcattr_p1")
    out = compare({"draw 0 minus step 0": (base, draw0), "draw 1 minus step 0": (base, draw1),
                   "both draws minus step 0": (base, (draw0 + draw1) / 2), "draw 1 minus draw 0": (draw0, draw1)},
                  images)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
