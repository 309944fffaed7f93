"""VQA's official formats and accuracy (GT-Vision-Lab/VQA's vqaEval.py), and a results file scored with them
as the evaluation server would.

    python -m finetune.vqa_score --results results_val2014.json \\
        --questions v2_OpenEnded_mscoco_val2014_questions.json --annotations v2_mscoco_val2014_annotations.json
    python -m finetune.vqa score ...      # the same command

`--legacy` scores with the 2015-2020 vqaEval.py (before the March 2021 fix; the numbers papers of that time
report, VL-BERT's among them): see `vqa_accuracy` below.

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
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from diagnostics.statistics import clustered_bootstrap
from shards.skips import SkipLog

# --- the official answer normalisation and accuracy (VQA evaluation code, vqaEval.py) -------------------

_CONTRACTIONS = dict(pair.split("=") for pair in (
    "aint=ain't arent=aren't cant=can't couldve=could've couldnt=couldn't couldn'tve=couldn't've "
    "couldnt've=couldn't've didnt=didn't doesnt=doesn't dont=don't hadnt=hadn't hadnt've=hadn't've "
    "hadn'tve=hadn't've hasnt=hasn't havent=haven't hed=he'd hed've=he'd've he'dve=he'd've hes=he's howd=how'd "
    "howll=how'll hows=how's Id've=I'd've I'dve=I'd've Im=I'm Ive=I've isnt=isn't itd=it'd itd've=it'd've "
    "it'dve=it'd've itll=it'll let's=let's maam=ma'am mightnt=mightn't mightnt've=mightn't've "
    "mightn'tve=mightn't've mightve=might've mustnt=mustn't mustve=must've neednt=needn't notve=not've "
    "oclock=o'clock oughtnt=oughtn't ow's'at='ow's'at 'ows'at='ow's'at 'ow'sat='ow's'at shant=shan't "
    "shed've=she'd've she'dve=she'd've she's=she's shouldve=should've shouldnt=shouldn't "
    "shouldnt've=shouldn't've shouldn'tve=shouldn't've somebody'd=somebodyd somebodyd've=somebody'd've "
    "somebody'dve=somebody'd've somebodyll=somebody'll somebodys=somebody's someoned=someone'd "
    "someoned've=someone'd've someone'dve=someone'd've someonell=someone'll someones=someone's "
    "somethingd=something'd somethingd've=something'd've something'dve=something'd've somethingll=something'll "
    "thats=that's thered=there'd thered've=there'd've there'dve=there'd've therere=there're theres=there's "
    "theyd=they'd theyd've=they'd've they'dve=they'd've theyll=they'll theyre=they're theyve=they've "
    "twas='twas wasnt=wasn't wed've=we'd've we'dve=we'd've weve=we've werent=weren't whatll=what'll "
    "whatre=what're whats=what's whatve=what've whens=when's whered=where'd wheres=where's whereve=where've "
    "whod=who'd whod've=who'd've who'dve=who'd've wholl=who'll whos=who's whove=who've whyll=why'll "
    "whyre=why're whys=why's wont=won't wouldve=would've wouldnt=wouldn't wouldnt've=wouldn't've "
    "wouldn'tve=wouldn't've yall=y'all yall'll=y'all'll y'allll=y'all'll yall'd've=y'all'd've "
    "y'alld've=y'all'd've y'all'dve=y'all'd've youd=you'd youd've=you'd've you'dve=you'd've youll=you'll "
    "youre=you're youve=you've").split())
_NUMBERS = {w: str(i) for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}
_NUMBERS["none"] = "0"
_ARTICLES = {"a", "an", "the"}
_PUNCT = [";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!"]
# The official pattern reads `(?!<=\d)`, a look-ahead (not the look-behind it looks like): it is kept,
# because the metric is defined by what that code computes.
_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")
_COMMA_NUMBER = re.compile(r"(\d)(,)(\d)")


def process_punctuation(text: str) -> str:
    out = text
    for p in _PUNCT:
        if (p + " " in text or " " + p in text) or _COMMA_NUMBER.search(text):
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD.sub("", out)


def process_digit_article(text: str) -> str:
    words = [_NUMBERS.get(w, w) for w in text.lower().split()]
    return " ".join(_CONTRACTIONS.get(w, w) for w in words if w not in _ARTICLES)


def normalise_answer(text: str) -> str:
    """Punctuation, number words, articles and contractions, as the evaluation treats a prediction."""
    return process_digit_article(process_punctuation(text.replace("\n", " ").replace("\t", " ").strip()))


def vqa_accuracy(prediction: str, answers: list[str], legacy: bool = False) -> float:
    """The official accuracy of one prediction against the 10 human answers: the mean over the 10
    leave-one-out subsets of min(1, matches / 3). As in vqaEval.py (GT-Vision-Lab/VQA, the version the
    evaluation server runs, "Fixed processing answers bug", March 2021): when the humans disagree, the answers
    and the prediction are both normalised in full (punctuation, then digits/articles/contractions); when they
    all agree, nothing is normalised beyond newlines, tabs and outer spaces.

    legacy: the 2015-2020 vqaEval.py (the numbers of papers of that time, VL-BERT's included): the prediction
    is always normalised in full; the human answers, only when they disagree and only for punctuation (and
    their newlines and tabs are kept)."""
    if legacy:
        pred = normalise_answer(prediction)
        gts = list(answers)
        if len(set(gts)) > 1:
            gts = [process_punctuation(a) for a in gts]
    else:
        gts = [a.replace("\n", " ").replace("\t", " ").strip() for a in answers]
        pred = prediction.replace("\n", " ").replace("\t", " ").strip()
        if len(set(gts)) > 1:
            gts = [process_digit_article(process_punctuation(a)) for a in gts]
            pred = process_digit_article(process_punctuation(pred))
    matches = [a == pred for a in gts]
    total = sum(matches)
    return sum(min(1.0, (total - m) / 3) for m in matches) / len(gts)


def soft_score(count: int, n_answers: int = 10) -> float:
    """The accuracy of an answer that `count` of the n human answers gave, in closed form: leaving out
    one of its own leaves count - 1 matches, leaving out another leaves count."""
    return (count * min(1.0, (count - 1) / 3) + (n_answers - count) * min(1.0, count / 3)) / n_answers


# --- the official files -----------------------------------------------------------------------------------

class VQAFormatError(ValueError):
    pass


@dataclass
class VQAQuestion:
    question_id: int
    image_id: int
    question: str
    answers: list[str] = field(default_factory=list)  # the 10 human answers (empty without annotations)
    answer_type: str = ""
    question_type: str = ""
    multiple_choice_answer: str = ""


def read_json(path: str | Path):
    """A JSON file's content; a missing file or bad JSON is an error naming the file."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: not found") from None
    except json.JSONDecodeError as e:
        raise VQAFormatError(f"{path}: not JSON ({e})") from None


def _load_json(path: Path, key: str) -> list:
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise VQAFormatError(f"{path}: expected an object with a '{key}' list")
    return data[key]


def read_vqa(questions_path: str | Path, annotations_path: str | Path | None, skips: SkipLog | None = None
             ) -> list[VQAQuestion]:
    """Questions joined with their annotations by question_id. A question without an annotation is a
    counted skip naming it; a malformed record is an error naming the file and the record."""
    out = []
    for i, q in enumerate(_load_json(Path(questions_path), "questions")):
        try:
            out.append(VQAQuestion(int(q["question_id"]), int(q["image_id"]), str(q["question"])))
        except (KeyError, TypeError, ValueError) as e:
            raise VQAFormatError(f"{questions_path}: questions[{i}]: missing or bad field {e}") from None
    if annotations_path is None:
        return out
    anns = {}
    for i, a in enumerate(_load_json(Path(annotations_path), "annotations")):
        try:
            answers = [str(x["answer"]) for x in a["answers"]]
            anns[int(a["question_id"])] = (a, answers)
        except (KeyError, TypeError, ValueError) as e:
            raise VQAFormatError(f"{annotations_path}: annotations[{i}]: missing or bad field {e}") from None
    kept = []
    for q in out:
        if q.question_id not in anns:
            if skips is not None:
                skips.skip("question without annotation", f"{questions_path}: question_id {q.question_id}")
            continue
        a, answers = anns[q.question_id]
        q.answers, q.answer_type = answers, str(a.get("answer_type", ""))
        q.question_type, q.multiple_choice_answer = str(a.get("question_type", "")), str(a.get(
            "multiple_choice_answer", ""))
        kept.append(q)
    return kept


def accuracy_table(questions: list[VQAQuestion], scores: list[float]) -> dict:
    """Overall, per answer type and per question type, in percent (as the official evaluation reports)."""
    def mean(xs):
        return round(100.0 * sum(xs) / max(1, len(xs)), 2)

    by_answer, by_question = defaultdict(list), defaultdict(list)
    for q, s in zip(questions, scores, strict=True):
        by_answer[q.answer_type].append(s)
        by_question[q.question_type].append(s)
    return {"overall": mean(scores), "per_answer_type": {k: mean(v) for k, v in sorted(by_answer.items())},
            "per_question_type": {k: mean(v) for k, v in sorted(by_question.items())}}


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
