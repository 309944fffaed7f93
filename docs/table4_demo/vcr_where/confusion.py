"""Whether a VCR Q->A finetune fits its where questions at all: accuracy per question kind on any split (train too:
`finetune_vcr.sh ... eval_split=train --eval-only` writes predictions_train.json), and the where half's confusion
between the true relation and the relation of the candidate it picked.

A run that answers the where half at chance on val may still have learnt it on train (overfitting, a data question)
or not at all (an optimisation or architecture question); the confusion says what it does instead (e.g. one relation
for every question: a bias on the relation word, no reading of the boxes).

    python docs/table4_demo/vcr_where/confusion.py --predictions RUN/qa/predictions_train.json \
        --records data/demo/raw/vcr/train.jsonl [--out OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from docs.table4_demo.lowdata_s62.vcr_reader import interval, kind_of  # noqa: E402
from docs.table4_demo.vcr_where.position_probe import relation_of  # noqa: E402
from finetune.vcr import read_vcr_jsonl  # noqa: E402
from shards.demo_tasks import RELATIONS  # noqa: E402


def fit(predictions: dict, records: dict) -> dict:
    out: dict = {}
    for kind in ("colour", "where"):
        keys = [k for k in predictions if kind_of(records[k]) == kind]
        right = [float(int(np.argmax(predictions[k]["probs"])) == predictions[k]["label"]) for k in keys]
        out[kind] = interval(right, [predictions[k]["image"] for k in keys])
    confusion = np.zeros((len(RELATIONS), len(RELATIONS)), dtype=int)
    for k, p in predictions.items():
        r = records[k]
        if kind_of(r) == "where":
            picked = r["answer_choices"][int(np.argmax(p["probs"]))]
            confusion[relation_of(r["answer_choices"][r["answer_label"]]), relation_of(picked)] += 1
    out["where confusion (rows: true, columns: picked)"] = {
        true: dict(zip(RELATIONS, row.tolist())) for true, row in zip(RELATIONS, confusion)}
    out["where picks"] = dict(zip(RELATIONS, confusion.sum(0).tolist()))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--predictions", required=True, help="a Q->A run's predictions_<split>.json")
    ap.add_argument("--records", required=True, help="the split's VCR jsonl (the questions and answer choices)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    records = {r["annot_id"]: r for r in read_vcr_jsonl(args.records, need_labels=True)}
    result = {"predictions": args.predictions, **fit(json.loads(Path(args.predictions).read_text()), records)}
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
