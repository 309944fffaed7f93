"""Score a VQA results file with the official accuracy, as the evaluation server would.

    python -m finetune.vqa_score --results results_val2014.json \\
        --questions v2_OpenEnded_mscoco_val2014_questions.json --annotations v2_mscoco_val2014_annotations.json
    python -m finetune.vqa score ...      # the same command

`--legacy` scores with the 2015-2020 vqaEval.py (before the March 2021 fix; the numbers papers of that time
report, VL-BERT's among them): see `finetune.vqa.vqa_accuracy`.

The results file is the format the server takes (`[{"question_id": int, "answer": str}, ...]`, what
`finetune.vqa` writes as `results_<split>.json`). Like the official `loadRes`, every annotated question
must have exactly one answer (`--allow-missing` scores only the answered ones, and says how many were
left out). Prints overall, per answer type and per question type accuracy (percent, 2 decimals), the
overall accuracy's 95% interval from a bootstrap over images (the questions of one image are not
independent), and writes them as JSON with `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from pretrain.ablation import clustered_bootstrap
from shards.skips import SkipLog

from .vqa import VQAFormatError, accuracy_table, read_json, read_vqa, vqa_accuracy


def read_results(path: str | Path) -> dict[int, str]:
    """{question_id: answer}; a malformed or repeated record is an error naming the file and the record."""
    data = read_json(path)
    if not isinstance(data, list):
        raise VQAFormatError(f"{path}: expected a list of {{question_id, answer}} records")
    out: dict[int, str] = {}
    for i, r in enumerate(data):
        try:
            qid, answer = int(r["question_id"]), r["answer"]
        except (KeyError, TypeError, ValueError) as e:
            raise VQAFormatError(f"{path}: [{i}]: missing or bad field {e}") from None
        if not isinstance(answer, str):
            raise VQAFormatError(f"{path}: [{i}]: answer is {type(answer).__name__}, not a string")
        if qid in out:
            raise VQAFormatError(f"{path}: [{i}]: question_id {qid} is answered twice")
        out[qid] = answer
    return out


def score(results: dict[int, str], questions_path: str | Path, annotations_path: str | Path,
          allow_missing: bool = False, legacy: bool = False) -> dict:
    questions = read_vqa(questions_path, annotations_path, SkipLog("questions"))
    known = {q.question_id for q in questions}
    unknown = sorted(set(results) - known)
    if unknown:
        raise VQAFormatError(f"results answer {len(unknown)} question(s) that {annotations_path} does not annotate, "
                             f"e.g. question_id {unknown[0]}")
    missing = [q.question_id for q in questions if q.question_id not in results]
    if missing and not allow_missing:
        raise VQAFormatError(f"results leave {len(missing)} of {len(questions)} questions unanswered, e.g. "
                             f"question_id {missing[0]} (the server refuses such a file; --allow-missing scores "
                             f"the answered ones)")
    answered = [q for q in questions if q.question_id in results]
    scores = [vqa_accuracy(results[q.question_id], q.answers, legacy) for q in answered]
    boot = clustered_bootstrap(np.asarray(scores, dtype=np.float64) * 100, np.asarray([q.image_id for q in answered]))
    return {**accuracy_table(answered, scores), "overall_ci95": [round(x, 2) for x in boot["ci95"] or []],
            "images": boot["clusters"], "questions": len(answered), "unanswered": len(missing),
            "vqa_eval": "2015-2020 (legacy)" if legacy else "2021"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Official VQA accuracy of a results file", epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", required=True, help="[{question_id, answer}] JSON (the server's format)")
    p.add_argument("--questions", required=True, help="v2_OpenEnded_mscoco_<split>_questions.json")
    p.add_argument("--annotations", required=True, help="v2_mscoco_<split>_annotations.json")
    p.add_argument("--allow-missing", action="store_true", help="score only the answered questions")
    p.add_argument("--legacy", action="store_true", help="the 2015-2020 vqaEval.py answer processing")
    p.add_argument("--out", help="write the accuracies here as JSON")
    args = p.parse_args(argv)
    try:
        metrics = score(read_results(args.results), args.questions, args.annotations, args.allow_missing,
                        args.legacy)
    except (VQAFormatError, FileNotFoundError) as e:
        print(f"vqa_score: {e}", file=sys.stderr)
        return 2
    ci = metrics["overall_ci95"]
    print(f"Overall Accuracy is: {metrics['overall']:.2f}  ({metrics['questions']} questions"
          + (f", {metrics['unanswered']} unanswered left out" if metrics["unanswered"] else "")
          + (f"; 95% interval over {metrics['images']} images {ci[0]:.2f}-{ci[1]:.2f}" if ci else "")
          + f"; vqaEval {metrics['vqa_eval']})")
    print("Per Answer Type Accuracy is the following:")
    for k, v in metrics["per_answer_type"].items():
        print(f"{k} : {v:.2f}")
    print("Per Question Type Accuracy is the following:")
    for k, v in metrics["per_question_type"].items():
        print(f"{k} : {v:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(metrics, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
