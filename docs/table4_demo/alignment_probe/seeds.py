"""VQA rows over finetuning seeds (docs/FINETUNE.md, session 37).

A bootstrap over images gives the spread of a score over the val images a run happens to meet, not over the
finetuning run itself: two seeds of one recipe can differ by more than that interval. This scores each row's runs
(`results_<split>.json` with the official accuracy), and reports, per question type:
- each run's accuracy (their spread is the finetuning noise), and the row's mean over seeds;
- each row minus the first row, seed by seed (run i against the first row's run i: the same seed, so the same
  batches) and on the per-question mean over seeds (paired by question), with a 95% interval from a bootstrap over
  images (which the seed-by-seed spread shows it does not cover).

    python docs/table4_demo/alignment_probe/seeds.py --row step0=runs/a/vqa/none,runs/b/vqa/step0 \\
        --row pretrained=runs/a/vqa/pretrained,runs/b/vqa/pretrained --out docs/table4_demo/alignment_probe/s37
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.statistics import clustered_bootstrap, paired_test  # noqa: E402
from finetune.table4 import vqa_scores  # noqa: E402


def fmt(mean: float, ci: list[float] | None) -> str:
    return f"{mean:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else f"{mean:+.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--row", action="append", required=True, help="NAME=RUN_DIR,RUN_DIR,... (one per seed)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows: dict[str, list[tuple[str, np.ndarray]]] = {}
    questions = None
    for spec in args.row:
        name, _, dirs = spec.partition("=")
        if not dirs:
            raise SystemExit(f"--row {spec!r}: expected NAME=DIR[,DIR...]")
        rows[name] = []
        for d in dirs.split(","):
            answered, scores = vqa_scores(Path(d))
            if questions is None:
                questions = answered
            elif [q.question_id for q in answered] != [q.question_id for q in questions]:
                raise SystemExit(f"{d}: answers other questions than {args.row[0]}")
            rows[name].append((d, np.array(scores)))
    images = np.array([q.image_id for q in questions])
    types = np.array([q.question_type for q in questions])
    groups = {"all": np.ones(len(types), bool), **{t: types == t for t in sorted(set(types))}}
    out: dict = {"rows": {n: [d for d, _ in runs] for n, runs in rows.items()}, "per_run": {}, "mean_over_seeds": {},
                 "vs_first": {}, "vs_first_per_seed": {}}
    first = next(iter(rows))
    base_runs = [s for _, s in rows[first]]
    base = np.mean(base_runs, 0)
    for name, runs in rows.items():
        out["per_run"][name] = {g: [float(s[k].mean()) for _, s in runs] for g, k in groups.items()}
        mean = np.mean([s for _, s in runs], 0)
        out["mean_over_seeds"][name] = {g: clustered_bootstrap(mean[k], images[k]) for g, k in groups.items()}
        if name != first:
            if len(runs) != len(base_runs):
                raise SystemExit(f"--row {name}: {len(runs)} runs, {first} has {len(base_runs)}: give one per seed")
            out["vs_first"][name] = {g: paired_test(base[k], mean[k], images[k]) for g, k in groups.items()}
            out["vs_first_per_seed"][name] = {g: [float((s[k] - b[k]).mean()) for (_, s), b in zip(runs, base_runs)]
                                              for g, k in groups.items()}
    lines = ["# VQA over finetuning seeds", "",
             "Accuracy of each run (seeds in the order given), the row's mean over seeds with its 95% interval over "
             "images:", "", "| question type | " + " | ".join(rows) + " |", "|---|" + "---|" * len(rows)]
    for g in groups:
        cells = []
        for name in rows:
            m = out["mean_over_seeds"][name][g]
            per = " / ".join(f"{v:.2f}" for v in out["per_run"][name][g])
            cells.append(f"{per}; mean {m['mean']:.2f} [{m['ci95'][0]:.2f}, {m['ci95'][1]:.2f}]")
        lines.append(f"| {g} | " + " | ".join(cells) + " |")
    lines += ["", f"Each row minus {first}: seed by seed, then on the mean over seeds with its 95% interval over "
              "images (paired by question):", "", "| question type | " + " | ".join(f"{n} - {first}"
                                                                                   for n in out["vs_first"]) + " |",
              "|---|" + "---|" * len(out["vs_first"])]
    for g in groups:
        cells = []
        for n, table in out["vs_first"].items():
            per = " / ".join(f"{v:+.2f}" for v in out["vs_first_per_seed"][n][g])
            cells.append(f"{per}; mean {fmt(table[g]['mean_diff'], table[g].get('ci95'))}")
        lines.append(f"| {g} | " + " | ".join(cells) + " |")
    report = "\n".join(lines) + "\n"
    dest = Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "seeds.json").write_text(json.dumps(out, indent=1))
    (dest / "seeds.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
