"""VCR Q->A (or RefCOCO+) from two rows, overall and per question kind (the demo's colour and where halves; RefCOCO+'s
expressions of names and relational ones): each row's accuracy averaged over its finetuning seeds with a 95% interval
from a bootstrap over val images, and the row minus the base paired by question (the same bootstrap), with each seed's
own accuracy (docs/FINETUNE.md, sessions 70 and 75).

    python docs/table4_demo/vcr_s70/kind_pair.py --base 'runs/lowdata_s70/vcr/img150_s*/none/qa/predictions_val.json' \
        --row 'runs/lowdata_s70/vcr/img150_s*/pretrained/qa/predictions_val.json' [--out OUT.json]
    python docs/table4_demo/vcr_s70/kind_pair.py --task refcoco --base 'runs/refcoco_s75/table_gt/full_s*/none/...' \
        --row '.../pretrained/predictions_val.json'     # hit: the chosen box at IoU >= 0.5 with the referent
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
from docs.table4_demo.lowdata_s62.name_reader import kind_of as expression_kind  # noqa: E402
from docs.table4_demo.lowdata_s62.vcr_reader import kind_of  # noqa: E402
from finetune.refcoco import read_refs  # noqa: E402

KINDS = {"vcr": ("all", "colour", "where"), "refcoco": ("all", "names", "relational")}


def load(pattern: str, task: str = "vcr") -> tuple[list[str], list, np.ndarray, np.ndarray]:
    """(files, question keys, [seeds, questions] right or not, each question's image)."""
    files = sorted(glob.glob(pattern))
    if not files:
        raise SystemExit(f"kind_pair: no predictions match {pattern}")
    runs = [json.loads(Path(f).read_text()) for f in files]
    if task == "refcoco":  # a list of {ref_id, sent_id, image_id, iou}, keyed here by (ref_id, sent_id)
        runs = [{(p["ref_id"], p["sent_id"]): {"right": float(p["iou"] >= 0.5), "image": p["image_id"]}
                 for p in preds} for preds in runs]
    else:
        runs = [{k: {"right": float(int(np.argmax(v["probs"])) == v["label"]), "image": v["image"]}
                 for k, v in preds.items()} for preds in runs]
    keys = sorted(runs[0])
    right = np.array([[p[k]["right"] for k in keys] for p in runs])
    return files, keys, right, np.array([runs[0][k]["image"] for k in keys])


def percent(summary: dict) -> list:
    return [round(100 * summary["mean"], 2), [round(100 * v, 2) for v in summary["ci95"]]]


def paired_cell(base: np.ndarray, row: np.ndarray, images: np.ndarray, pick: np.ndarray) -> dict:
    """The questions `pick` selects: each row's accuracy averaged over its seeds (base, row: [seeds, questions]) with
    its 95% interval by image, the row minus the base paired by question, and each seed's own accuracy."""
    a, b, clusters = base[:, pick].mean(0), row[:, pick].mean(0), images[pick]
    t = paired_test(a, b, clusters=clusters)
    return {"n": int(pick.sum()), "base": percent(clustered_bootstrap(a, clusters)),
            "row": percent(clustered_bootstrap(b, clusters)),
            "row_minus_base": round(100 * t["mean_diff"], 2),
            "ci95": [round(100 * v, 2) for v in t["ci95"]], "p_bootstrap": t["p_bootstrap"],
            "base_per_seed": [round(100 * v, 2) for v in base[:, pick].mean(1)],
            "row_per_seed": [round(100 * v, 2) for v in row[:, pick].mean(1)]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="a glob of the base row's qa/predictions_val.json, one per seed")
    ap.add_argument("--row", required=True, help="the same for the row compared with it")
    ap.add_argument("--task", choices=sorted(KINDS), default="vcr")
    ap.add_argument("--records", help="VCR's val.jsonl (default data/demo/raw/vcr/val.jsonl); for RefCOCO+ the "
                    "refer toolkit's refs (default data/demo/raw/refcoco+/refs(unc).p)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.task == "vcr":
        records = {r["annot_id"]: r for r in (json.loads(line) for line in open(
            args.records or "data/demo/raw/vcr/val.jsonl"))}
        kind = {k: kind_of(r) for k, r in records.items()}
    else:
        kind = {(ref["ref_id"], s["sent_id"]): expression_kind(s["sent"])
                for ref in read_refs(args.records or "data/demo/raw/refcoco+/refs(unc).p") for s in ref["sentences"]}
    base_files, keys, base, images = load(args.base, args.task)
    row_files, row_keys, row, _ = load(args.row, args.task)
    if keys != row_keys:
        raise SystemExit("kind_pair: the two rows scored different questions")
    report: dict = {"base": base_files, "row": row_files}
    for kind_name in KINDS[args.task]:
        pick = np.array([kind_name == "all" or kind[k] == kind_name for k in keys])
        report[kind_name] = paired_cell(base, row, images, pick)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
