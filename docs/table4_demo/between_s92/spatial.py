"""VQA's spatial yes/no questions ("is the X above the Y?", question type "is the") in one results file: the official
accuracy and the exact match with the majority answer, overall and by the answer (yes / no) and the relation asked,
each with a 95% interval from a bootstrap clustered by image; the rest of the questions beside them. Several results
files (finetuning seeds) pool: each question's score is its mean over them.

    python docs/table4_demo/between_s92/spatial.py --raw data/demo_val4000/raw --results runs/.../results_val2014.json
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from finetune.vqa_score import normalise_answer, read_results, read_vqa, vqa_accuracy  # noqa: E402

RELATIONS = ["left of", "right of", "above", "below"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", required=True, help="the corpus' raw folder (its vqa/ holds the official files)")
    ap.add_argument("--results", required=True, nargs="+")
    ap.add_argument("--split", default="val2014")
    args = ap.parse_args()
    vqa = Path(args.raw) / "vqa"
    questions = read_vqa(vqa / f"v2_OpenEnded_mscoco_{args.split}_questions.json",
                         vqa / f"v2_mscoco_{args.split}_annotations.json")
    results = [read_results(path) for path in args.results]
    groups: dict[str, list[tuple[int, float, float]]] = {}
    for q in questions:
        predicted = [r[q.question_id] for r in results]
        row = (q.image_id, float(np.mean([vqa_accuracy(p, q.answers) for p in predicted])),
               float(np.mean([normalise_answer(p) == normalise_answer(q.multiple_choice_answer) for p in predicted])))
        if q.question_type != "is the":
            groups.setdefault("other questions", []).append(row)
            continue
        asked = next(r for r in RELATIONS if f" {r} " in q.question)
        for key in ("spatial", f"spatial, answer {q.multiple_choice_answer}", f"spatial, asked {asked}"):
            groups.setdefault(key, []).append(row)
    out = {}
    for key, rows in groups.items():
        images = np.array([r[0] for r in rows])
        out[key] = {name: clustered_bootstrap(np.array([r[i] for r in rows]) * 100, images)
                    for i, name in ((1, "accuracy"), (2, "exact"))}
    print(json.dumps({"results": args.results if len(args.results) > 1 else args.results[0], "groups": out},
                     indent=1))


if __name__ == "__main__":
    main()
