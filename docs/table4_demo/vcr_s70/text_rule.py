"""How much of the demo's VCR QA->R a reader of words alone answers: given the question and its right answer, pick
the rationale that restates the answer's colour word, or its relation as a comparison of the two centres ("above" ->
"higher", "left of" -> "further left"), reading no image and no box. A reader that needs no image bounds what
pretraining's grounding can add to the subtask (docs/FINETUNE.md, session 70). With --predictions, each finetuned
run's QA->R accuracy per question kind beside it. Since session 74 (`shards.demo_tasks.VCR_VERSION` 2) every rationale
agrees with the right answer and the reader finds all four consistent (`unique` 0).

    python docs/table4_demo/vcr_s70/text_rule.py --records data/demo/raw/vcr/val.jsonl data/demo/raw/vcr/train.jsonl \
        [--predictions ROW=RUN/qar/predictions_val.json ...] [--out OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from docs.table4_demo.lowdata_s62.vcr_reader import interval, kind_of  # noqa: E402
from shards.shapes_world import COLOURS  # noqa: E402

# the answer's relation, as the rationale's comparison of centres words it
COMPARISON = {"above": "higher", "below": "lower", "left": "left", "right": "right"}


def words(tokens: list) -> list[str]:
    return [t for t in tokens if isinstance(t, str)]  # object tags ([k]) are the same in every candidate


def rule(record: dict) -> list[int]:
    """The rationales consistent with the right answer's words (a unique one is the reader's pick)."""
    answer = words(record["answer_choices"][record["answer_label"]])
    if kind_of(record) == "colour":
        needed = [w for w in answer if w in COLOURS]
    else:
        needed = [COMPARISON[w] for w in answer if w in COMPARISON]
    return [i for i, c in enumerate(record["rationale_choices"]) if all(w in words(c) for w in needed)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", nargs="+", required=True)
    ap.add_argument("--predictions", action="append", default=[], help="ROW=predictions_val.json of a QA->R run")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    report: dict = {}
    for path in args.records:
        records = [json.loads(line) for line in open(path)]
        picks = [rule(r) for r in records]
        report[path] = {"questions": len(records), "unique": sum(len(p) == 1 for p in picks),
                        "right": sum(p == [r["rationale_label"]] for p, r in zip(picks, records, strict=True))}
    val = {r["annot_id"]: r for r in (json.loads(line) for line in open(args.records[0]))}
    for spec in args.predictions:
        row, path = spec.split("=", 1)
        predictions = json.loads(Path(path).read_text())
        out = {}
        for kind in ("colour", "where"):
            keys = [k for k in predictions if kind_of(val[k]) == kind]
            right = [float(int(np.argmax(predictions[k]["probs"])) == predictions[k]["label"]) for k in keys]
            out[kind] = interval(right, [predictions[k]["image"] for k in keys])
        report[row] = out
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
