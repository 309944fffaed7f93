"""VCR Q->A from two rows, overall and per question kind (the demo's colour and where halves): each row's accuracy
averaged over its finetuning seeds with a 95% interval from a bootstrap over val images, and the row minus the base
paired by question (the same bootstrap), with each seed's own accuracy (docs/FINETUNE.md, session 70).

    python docs/table4_demo/vcr_s70/kind_pair.py --base 'runs/lowdata_s70/vcr/img150_s*/none/qa/predictions_val.json' \
        --row 'runs/lowdata_s70/vcr/img150_s*/pretrained/qa/predictions_val.json' [--out OUT.json]
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.statistics import clustered_bootstrap, paired_test  # noqa: E402
from docs.table4_demo.lowdata_s62.vcr_reader import kind_of  # noqa: E402


def load(pattern: str) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    """(files, question keys, [seeds, questions] right or not, each question's image)."""
    files = sorted(glob.glob(pattern))
    if not files:
        raise SystemExit(f"kind_pair: no predictions match {pattern}")
    runs = [json.loads(Path(f).read_text()) for f in files]
    keys = sorted(runs[0])
    right = np.array([[float(int(np.argmax(p[k]["probs"])) == p[k]["label"]) for k in keys] for p in runs])
    return files, keys, right, np.array([runs[0][k]["image"] for k in keys])


def percent(summary: dict) -> list:
    return [round(100 * summary["mean"], 2), [round(100 * v, 2) for v in summary["ci95"]]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="a glob of the base row's qa/predictions_val.json, one per seed")
    ap.add_argument("--row", required=True, help="the same for the row compared with it")
    ap.add_argument("--records", default="data/demo/raw/vcr/val.jsonl")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    records = {r["annot_id"]: r for r in (json.loads(line) for line in open(args.records))}
    base_files, keys, base, images = load(args.base)
    row_files, row_keys, row, _ = load(args.row)
    if keys != row_keys:
        raise SystemExit("kind_pair: the two rows scored different questions")
    report: dict = {"base": base_files, "row": row_files}
    for kind in ("all", "colour", "where"):
        pick = np.array([kind == "all" or kind_of(records[k]) == kind for k in keys])
        a, b, clusters = base[:, pick].mean(0), row[:, pick].mean(0), images[pick]
        t = paired_test(a, b, clusters=clusters)
        report[kind] = {"n": int(pick.sum()), "base": percent(clustered_bootstrap(a, clusters)),
                        "row": percent(clustered_bootstrap(b, clusters)),
                        "row_minus_base": round(100 * t["mean_diff"], 2),
                        "ci95": [round(100 * v, 2) for v in t["ci95"]], "p_bootstrap": t["p_bootstrap"],
                        "base_per_seed": [round(100 * v, 2) for v in base[:, pick].mean(1)],
                        "row_per_seed": [round(100 * v, 2) for v in row[:, pick].mean(1)]}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
