"""RefCOCO+ rows against a base row, paired by expression: each expression's accuracy averaged over the finetuning
seeds (0-2), the difference's mean and 95% interval from a bootstrap over val images (docs/FINETUNE.md).

    python docs/table4_demo/refcoco_start/paired.py --images 15 --base none --row pretrained_mrcattr_shards \
        [--row NAME ...] [--pool] [--runs runs/nc_long/refcoco] > paired.json

Rows are run directories under <runs>/img<N>_s<seed>/; every row must have all seeds. --pool adds the rows' mean
(e.g. two pretraining draws of one recipe) minus the base, paired and bootstrapped the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.statistics import paired_test  # noqa: E402
from finetune.table4 import refcoco_metrics  # noqa: E402

KEEP = ("n", "mean_diff", "ci95", "clusters", "p_bootstrap")


def seed_mean(runs: Path, images_trained: int, row: str, seeds=(0, 1, 2)) -> tuple[np.ndarray, np.ndarray]:
    """Per expression (sorted by key): its accuracy averaged over the finetuning seeds, and its image."""
    per = [next(iter(refcoco_metrics(runs / f"img{images_trained}_s{s}" / row, "gt")[0].values())) for s in seeds]
    keys = sorted(per[0].keys)
    values = np.mean([[dict(zip(ex.keys, ex.values))[k] for k in keys] for ex in per], axis=0)
    image = dict(zip(per[0].keys, per[0].images))
    return values, np.array([image[k] for k in keys])


def compare(pairs: dict[str, tuple[np.ndarray, np.ndarray]], images: np.ndarray) -> dict:
    """{name: b - a paired over expressions, bootstrap over images} for each (a, b)."""
    out = {}
    for name, (a, b) in pairs.items():
        t = paired_test(a, b, clusters=images)
        out[name] = {k: t[k] for k in KEEP}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, required=True, help="training images (the img<N>_s<seed> directories)")
    ap.add_argument("--base", default="none")
    ap.add_argument("--row", action="append", required=True)
    ap.add_argument("--pool", action="store_true", help="also the mean of the rows minus the base")
    ap.add_argument("--runs", default="runs/nc_long/refcoco")
    args = ap.parse_args(argv)
    runs = Path(args.runs)
    base, images = seed_mean(runs, args.images, args.base)
    rows = {r: seed_mean(runs, args.images, r)[0] for r in args.row}
    pairs = {f"{r} minus {args.base}": (base, v) for r, v in rows.items()}
    if args.pool:
        pairs[f"mean of {' and '.join(rows)} minus {args.base}"] = (base, np.mean(list(rows.values()), axis=0))
    print(json.dumps(compare(pairs, images), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
