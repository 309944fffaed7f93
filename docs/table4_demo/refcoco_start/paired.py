"""RefCOCO+, VQA or VCR rows against a base row, paired by example: each expression's (or question's) accuracy averaged
over the finetuning seeds (0-2), the difference's mean and 95% interval from a bootstrap over val images
(docs/FINETUNE.md).

    python docs/table4_demo/refcoco_start/paired.py --images 15 --base none --row pretrained_mrcattr_shards \
        [--row NAME ...] [--pool] [--runs runs/nc_long/refcoco] > paired.json
    python docs/table4_demo/refcoco_start/paired.py --task vqa --images full --base none \
        --row pretrained_mrcattr_shards [--runs runs/nc_long/vqa]     # overall and "other" (colour, shape)
    python docs/table4_demo/refcoco_start/paired.py --task vcr --images full --seeds 0 --base none \
        --row pretrained_mrcattr_shards    # Q->A: <runs>/full_s<seed>/<row>/qa (SUBTASKS=qa launch/finetune_vcr.sh);
                                           # QA->R and Q->AR too where <row>/qar is there in every row

Rows are run directories under <runs>/img<N>_s<seed>/ (`--images full`: <runs>/full_s<seed>/, any other prefix
alike); every row must have all seeds. --pool adds the rows' mean (e.g. two pretraining draws of one recipe) minus
the base, paired and bootstrapped the same way. Each row's own seed-averaged accuracy comes with its interval,
and each metric with its prior or chance as the base run's metrics name it (chance_or_prior; session 50 on). Each
difference also comes seed by seed (per_seed) with a t-interval over the seeds (t95_over_seeds; session 51 on).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.statistics import clustered_bootstrap, paired_test, summarise  # noqa: E402
from finetune.table4 import refcoco_metrics, run_config, vcr_metrics, vqa_metrics  # noqa: E402

KEEP = ("n", "mean_diff", "ci95", "clusters", "p_bootstrap")
RUNS = {"refcoco": "runs/nc_long/refcoco", "vqa": "runs/nc_long/vqa", "vcr": "runs/nc_long/vcr"}


def metrics_of(task: str, run: Path) -> tuple[dict, dict[str, float]]:
    """({metric: Examples}, {metric: its prior or chance})."""
    if task == "vcr":  # launch/finetune_vcr.sh's runs under the row's folder: qa, and qar where it was run
        return vcr_metrics({sub: run / sub for sub in ("qa", "qar") if (run / sub).is_dir()})
    if task == "vqa":
        return vqa_metrics(run)
    return refcoco_metrics(run, run_config(run).get("track", "gt"))  # gt or detected, as the run was trained


def seed_accuracies(task: str, runs: Path, images_trained: str, row: str,
                    seeds=(0, 1, 2)) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, float]]:
    """{metric: ([seeds, examples] accuracies, examples sorted by key; each example's image)}, and each metric's
    prior or chance (the first seed's run's); a metric some seeds lack is left out."""
    subset = f"img{images_trained}" if images_trained.isdigit() else images_trained
    missing = [str(runs / f"{subset}_s{s}" / row) for s in seeds if not (runs / f"{subset}_s{s}" / row).is_dir()]
    if missing:  # VCR's reader would find no subtask there and the report would come out empty, not fail
        raise SystemExit(f"paired.py: row '{row}' has no run at {', '.join(missing)}")
    found = [metrics_of(task, runs / f"{subset}_s{s}" / row) for s in seeds]
    per = [examples for examples, _ in found]
    out = {}
    for name in [n for n in per[0] if all(n in m for m in per)]:  # VCR: QA->R only where every seed ran qar
        keys = sorted(per[0][name].keys)
        by_key = [dict(zip(m[name].keys, m[name].values)) for m in per]  # once per seed: 22k expressions (session 77)
        values = np.array([[seed[k] for k in keys] for seed in by_key])
        image = dict(zip(per[0][name].keys, per[0][name].images))
        out[name] = (values, np.array([image[k] for k in keys]))
    return out, found[0][1]


def compare(pairs: dict[str, tuple[np.ndarray, np.ndarray]], images: np.ndarray) -> dict:
    """{name: b - a} for each ([seeds, examples] a, b): the seed-averaged examples paired, bootstrap over images; and
    each seed's accuracy difference with a t-interval over the seeds, the one that carries the finetuning seed's
    variance (a VQA run swings by ~20 points on whether it binds colour; docs/FINETUNE.md, session 51)."""
    out = {}
    for name, (a, b) in pairs.items():
        t = paired_test(a.mean(0), b.mean(0), clusters=images)
        per_seed = b.mean(1) - a.mean(1)
        out[name] = {**{k: t[k] for k in KEEP}, "per_seed": per_seed.tolist(),
                     "t95_over_seeds": summarise(per_seed)["ci95"]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=sorted(RUNS), default="refcoco")
    ap.add_argument("--images", required=True,
                    help="training images N (the img<N>_s<seed> directories), or the folders' prefix (full, e6)")
    ap.add_argument("--base", default="none")
    ap.add_argument("--row", action="append", required=True)
    ap.add_argument("--pool", action="store_true", help="also the mean of the rows minus the base")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--runs", help="default: " + ", ".join(f"{t}: {r}" for t, r in RUNS.items()))
    args = ap.parse_args(argv)
    runs, seeds = Path(args.runs or RUNS[args.task]), [int(s) for s in args.seeds.split(",")]
    base, chance = seed_accuracies(args.task, runs, args.images, args.base, seeds)
    rows = {r: seed_accuracies(args.task, runs, args.images, r, seeds)[0] for r in args.row}
    report = {}
    for metric, (b, images) in base.items():
        if any(metric not in v for v in rows.values()):  # e.g. VCR QA->R where a row ran Q->A alone
            continue
        pairs = {f"{r} minus {args.base}": (b, v[metric][0]) for r, v in rows.items()}
        if args.pool:
            pairs[f"mean of {' and '.join(rows)} minus {args.base}"] = (
                b, np.mean([v[metric][0] for v in rows.values()], axis=0))
        own = {r: clustered_bootstrap(v.mean(0), images) for r, v in [(args.base, b), *((r, v[metric][0])
                                                                                          for r, v in rows.items())]}
        report[metric] = {"rows": {r: {"mean": s["mean"], "ci95": s["ci95"], "n": s["n"]} for r, s in own.items()},
                          **compare(pairs, images), "chance_or_prior": chance[metric]}
    # one metric (RefCOCO+, VCR Q->A alone): the report's old shape, the pairs at the top level
    print(json.dumps(next(iter(report.values())) if len(report) == 1 else report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
