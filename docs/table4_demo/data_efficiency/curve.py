"""Table 4's pretrained-vs-none pair as a data-efficiency curve (docs/FINETUNE.md, session 36): each
`<runs>/img<N>/` is a `launch/table4.sh` output (VQA from both inits on the questions of N training images);
this reads every one with `finetune.table4` (the official accuracy per question, a bootstrap over images, the
difference paired by question) and writes curve.md, curve.json and curve.png.

    python docs/table4_demo/data_efficiency/curve.py --runs runs/data_efficiency --out docs/table4_demo/data_efficiency
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from finetune.table4 import INIT_LABELS, fmt, read_runs, report  # noqa: E402

METRICS = ("VQA overall", "VQA other (colour, shape)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="runs/data_efficiency")
    p.add_argument("--out", default="docs/table4_demo/data_efficiency")
    p.add_argument("--resamples", type=int, default=2000)
    args = p.parse_args(argv)
    sizes = sorted((int(m.group(1)), d) for d in Path(args.runs).iterdir() if (m := re.fullmatch(r"img(\d+)", d.name)))
    rows, curve = [], {}
    for n, root in sizes:
        rep = report(*read_runs(root), resamples=args.resamples)
        record = json.loads((root / "vqa" / "pretrained" / "run.json").read_text())["finetune"]
        curve[n] = {"train_questions": record["train_examples"], "steps": record["steps"], "metrics": rep}
        for metric in METRICS:
            r = rep[metric]
            rows.append(f"| {n} | {record['train_examples']} | {record['steps']} | {metric} | "
                        f"{fmt(r['runs'].get('pretrained'))} | {fmt(r['runs'].get('none'))} | "
                        f"{fmt(r.get('minus_none', {}).get('pretrained'))} | {r['chance_or_prior']:.2f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    head = (f"| training images | questions | steps | metric | {INIT_LABELS['pretrained']} | {INIT_LABELS['none']} "
            "| pretrained - none | prior |\n|---|---|---|---|---|---|---|---|\n")
    md = head + "\n".join(rows) + ("\n\nPercent; 95% intervals from a bootstrap over the 200 held-out images (2,000 "
                                   "resamples); differences paired by question.\n")
    (out / "curve.md").write_text(md)
    (out / "curve.json").write_text(json.dumps(curve, indent=1))
    plot(curve, out / "curve.png")
    print(md)
    return 0


def plot(curve: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(5 * len(METRICS), 3.8))
    sizes = sorted(curve)
    for ax, metric in zip(axes, METRICS, strict=True):
        for init, style in (("pretrained", "o-"), ("none", "s--")):
            s = [curve[n]["metrics"][metric]["runs"][init] for n in sizes]
            mean = [x["mean"] for x in s]
            err = [[x["mean"] - x["ci95"][0] for x in s], [x["ci95"][1] - x["mean"] for x in s]]
            ax.errorbar(sizes, mean, yerr=err, fmt=style, capsize=3, label=INIT_LABELS[init])
        prior = [curve[n]["metrics"][metric]["chance_or_prior"] for n in sizes]  # of each run's training questions
        ax.plot(sizes, prior, "k:", label="question-type prior")
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_xlabel("training images (their questions)")
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(0, 100)
        ax.set_title(metric, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("VQA from the quick start's export vs its step 0, ~300 finetuning steps, by labelled data "
                 "(95% intervals by image)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
