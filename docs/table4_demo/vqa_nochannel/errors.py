"""Where VQA runs on the demo go wrong, by question type (docs/FINETUNE.md, session 49).

"what color is the <shape>?" names its object by shape and asks its colour; "what shape is <colour>?" the other way
round. A wrong answer that is the colour (or shape) of another object in the image means the question's word found
the wrong region; one that no object in the image has means the region's attribute was misread. Read against the
scenes the corpus was drawn from; every share is averaged over the finetuning seeds per question, with a 95%
interval from a bootstrap over images.

    python docs/table4_demo/vqa_nochannel/errors.py --runs runs/nc_long/vqa --images full \\
        --row none --row pretrained_mrcattr_shards --row pretrained_mrcattr_shards_p1 --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from finetune.vqa_score import read_results, read_vqa, vqa_accuracy  # noqa: E402

# question prefix -> (the scene field the question names its object by, the field it asks)
KINDS = {"what color is the": ("category", "colour"), "what shape is": ("colour", "category")}
OUTCOMES = ("right", "another object's", "no object's")


def outcome(answer: str, truth: str, objects: list[dict], kind: str) -> int:
    """Index into OUTCOMES of one answer to a question of `kind`."""
    _, asked = KINDS[kind]
    if answer == truth:
        return 0
    return 1 if answer in {o[asked] for o in objects} else 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default="runs/nc_long/vqa")
    ap.add_argument("--images", default="full", help="the <images>_s<seed> directories: full or img<N>")
    ap.add_argument("--row", action="append", required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--data", default="data/demo/raw/vqa")
    ap.add_argument("--scenes", default="data/demo/raw/scenes.jsonl")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    questions = read_vqa(Path(args.data) / "v2_OpenEnded_mscoco_val2014_questions.json",
                         Path(args.data) / "v2_mscoco_val2014_annotations.json")
    scenes = [json.loads(line)["objects"] for line in open(args.scenes)]
    report, lines = {}, []
    for kind in KINDS:
        asked = [q for q in questions if q.question.startswith(kind)]
        images = np.array([q.image_id for q in asked])
        report[kind] = {"questions": len(asked), "rows": {}}
        lines += [f'**"{kind} ..."** ({len(asked)} questions; percent of them)', "",
                  "| row | accuracy (official) |" + "".join(f" {o} answer |" for o in OUTCOMES),
                  "|---|---|" + "---|" * len(OUTCOMES)]
        for row in args.row:
            share, accuracy = np.zeros((len(asked), len(OUTCOMES))), np.zeros(len(asked))
            for s in seeds:
                results = read_results(Path(args.runs) / f"{args.images}_s{s}" / row / "results_val2014.json")
                for i, q in enumerate(asked):
                    share[i, outcome(results[q.question_id], q.multiple_choice_answer,
                                     scenes[q.image_id], kind)] += 1
                    accuracy[i] += 100.0 * vqa_accuracy(results[q.question_id], q.answers)
            share, accuracy = 100 * share / len(seeds), accuracy / len(seeds)
            entry = {"accuracy": clustered_bootstrap(accuracy, images),
                     **{o: clustered_bootstrap(share[:, k], images) for k, o in enumerate(OUTCOMES)}}
            report[kind]["rows"][row] = entry
            lines.append(f"| {row} |" + "".join(f" {e['mean']:.2f} [{e['ci95'][0]:.2f}, {e['ci95'][1]:.2f}] |"
                                                for e in entry.values()))
        lines.append("")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "errors.json").write_text(json.dumps(report, indent=1))
    text = (f"VQA val2014 of the demo, seeds {args.seeds} averaged per question; 95% intervals from a bootstrap over "
            "images. \"right\" is the answer equal to the annotators' most common one.\n\n" + "\n".join(lines))
    (out / "errors.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
