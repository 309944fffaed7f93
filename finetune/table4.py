"""VL-BERT's Table 4 at demo scale from finetune runs: each task's metric per pretraining variant, with 95%
intervals from a bootstrap over images (the questions or expressions of one image are not independent), the
paired difference from the model without visual-linguistic pretraining, and the prior or chance of each metric.

    python -m finetune.table4 --runs runs/table4 [--out runs/table4/report]

`--runs` holds `<task>/<init>/` finetune run directories, as `launch/table4.sh` leaves them: tasks `vqa`,
`refcoco_gt`, `refcoco_detected`, `vcr_qa`, `vcr_qar` (Q->AR is read off a variant's Q->A and QA->R runs
together), `vqg` (a BERT-gen run), inits `pretrained`, `none`, `no_mrc`, `no_text` (any present). Each run is read
from its per-example outputs (`results_<split>.json` scored again with the official VQA accuracy,
`predictions_<split>.json`; VQG's questions scored again per image), not from its summary. VQG's "prior" is one
question asked of every image (see `vqg_metrics`). Writes table4.md, table4.json and
table4.png (each metric per variant, with intervals and the prior/chance) under `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from diagnostics.report import write_report
from diagnostics.statistics import clustered_bootstrap
from model.bert_gen import BertGen
from model.config import from_dict
from shards.tokenizer import load_tokenizer

from .vqa_score import read_results, read_vqa, vqa_accuracy
from .vqg import VQGConfig, VQGSet, load_bert_gen, read_split
from .vqg_data import open_features, read_coco_captions
from .vqg_decoding import asked_of, generic_of, norm
from .vqg_eval import per_image_cider

INITS = ("pretrained", "none", "no_mrc", "no_text")
INIT_LABELS = {"pretrained": "VL pretrained", "none": "no VL pretraining (step 0)",
               "no_mrc": "pretrained without MRC", "no_text": "pretrained without the text corpus"}
TASKS = ("vqa", "refcoco_gt", "refcoco_detected", "vcr_qa", "vcr_qar", "vqg")
BASELINE = "none"


class Examples:
    """One metric of one run: per-example values (percent), their image, and a key to pair runs by."""

    def __init__(self, keys: list, values: list[float], images: list):
        self.keys, self.values, self.images = list(keys), np.asarray(values, dtype=np.float64), np.asarray(images)

    def summary(self, resamples: int) -> dict:
        s = clustered_bootstrap(self.values, self.images, resamples=resamples)
        return {"mean": s["mean"], "ci95": s["ci95"], "n": s["n"], "images": s["clusters"]}

    def minus(self, other: Examples, resamples: int) -> dict:
        theirs = dict(zip(other.keys, other.values, strict=True))
        both = [i for i, k in enumerate(self.keys) if k in theirs]
        if not both:
            raise ValueError("the two runs share no example")
        diff = np.array([self.values[i] - theirs[self.keys[i]] for i in both])
        s = clustered_bootstrap(diff, self.images[both], resamples=resamples)
        return {"mean": s["mean"], "ci95": s["ci95"], "n": s["n"]}


def run_config(run: Path) -> dict:
    try:
        return json.loads((run / "run.json").read_text())["config"]
    except FileNotFoundError:
        raise FileNotFoundError(f"{run}: no run.json (not a finetune run directory)") from None


@dataclass
class VQGRunData:
    """A finished `finetune.vqg` run read back to measure it again: its config (as run.json has it, and parsed), model,
    tokenizer, region features and captions."""
    raw: dict
    cfg: VQGConfig
    gen: BertGen
    tokenizer: object
    features: object
    captions: dict

    def eval_set(self, features=None) -> VQGSet:
        """The run's evaluation split, with `features` (e.g. `vqg_data.DerangedFeatures`) in place of its own."""
        split = self.cfg.data.val if self.cfg.eval_split == "val" else self.cfg.data.test
        return VQGSet(split, self.cfg.data, self.tokenizer, self.captions,
                      self.features if features is None else features, self.cfg.inputs)


def open_vqg_run(run: Path, device: str = "cpu") -> VQGRunData:
    raw = run_config(run)
    cfg = from_dict(VQGConfig, raw, f"{run}/run.json")
    if cfg.inputs == "caption":
        raise SystemExit(f"{run}: a caption-only run sees no image")
    return VQGRunData(raw, cfg, load_bert_gen(run / "model").to(device).eval(), load_tokenizer(str(run / "model")),
                      open_features(cfg.data.features), read_coco_captions(cfg.data.captions))


def vqa_scores(run: Path) -> tuple[list, list[float]]:
    """The questions a VQA run answered on its eval split (read as its config names them) and the official accuracy
    of each, in percent."""
    cfg = run_config(run)
    split, data = cfg["eval_split"], cfg["data"]
    root = Path(data["root"])
    questions = read_vqa(root / data["questions"].format(split=split), root / data["annotations"].format(split=split))
    results = read_results(run / f"results_{split}.json")
    answered = [q for q in questions if q.question_id in results]
    if len(answered) < len(questions) and not cfg.get("max_eval_examples"):
        raise ValueError(f"{run}: results_{split}.json answers {len(answered)} of {len(questions)} questions")
    return answered, [100.0 * vqa_accuracy(results[q.question_id], q.answers) for q in answered]


def vqa_metrics(run: Path) -> tuple[dict[str, Examples], dict[str, float]]:
    """Overall and 'other' (colour/shape) accuracy per question, and the question-type prior of each."""
    answered, scores = vqa_scores(run)
    metrics = json.loads((run / f"metrics_{run_config(run)['eval_split']}.json").read_text())
    out = {"VQA overall": Examples([q.question_id for q in answered], scores, [q.image_id for q in answered])}
    other = [i for i, q in enumerate(answered) if q.answer_type == "other"]
    out["VQA other (colour, shape)"] = Examples([answered[i].question_id for i in other], [scores[i] for i in other],
                                                [answered[i].image_id for i in other])
    prior = metrics["prior_baseline"]
    return out, {"VQA overall": prior["overall"], "VQA other (colour, shape)": prior["per_answer_type"]["other"]}


def refcoco_metrics(run: Path, track: str) -> tuple[dict[str, Examples], dict[str, float]]:
    split = run_config(run)["eval_split"]
    preds = json.loads((run / f"predictions_{split}.json").read_text())
    metrics = json.loads((run / f"metrics_{split}.json").read_text())
    name = f"RefCOCO+ {split} ({track} boxes)"
    ex = Examples([(p["ref_id"], p["sent_id"]) for p in preds], [100.0 * (p["iou"] >= 0.5) for p in preds],
                  [p["image_id"] for p in preds])
    return {name: ex}, {name: metrics["chance"]}


def vqg_metrics(run: Path) -> tuple[dict[str, Examples], dict[str, float]]:
    """Per evaluated image: CIDEr-D (x100) of its question, and whether the question is one of the image's own
    references that is not generic (asked of >= 20% of the training images, as `finetune.vqg_decoding` counts
    them): the generic ones fit almost any image and earn a high CIDEr without looking. The prior of each: one
    question for every image, the training split's most frequent one (for the second, its most frequent
    non-generic one)."""
    cfg = run_config(run)
    preds = json.loads((run / f"predictions_{cfg['eval_split']}.json").read_text())
    return vqg_examples(cfg, {p["image_id"]: p["question"] for p in preds})


def vqg_examples(cfg: dict, preds: dict[str, str],
                 with_prior: bool = True) -> tuple[dict[str, Examples], dict[str, float]]:
    """`vqg_metrics` of questions `preds` ({image: question}) generated under a VQG run's config `cfg`, and each
    metric's prior (one question for every image); `with_prior=False` skips the prior, a second CIDEr-D pass, for
    callers that already have it from the same split, and returns {} in its place."""
    data = cfg["data"]
    references = {im.image_id: im.questions for im in read_split(data[cfg["eval_split"]])}
    asked, train_images = asked_of(data["train"])
    generic = generic_of(asked, train_images)
    common = asked.most_common(1)[0][0]
    common_specific = next(q for q, _ in asked.most_common() if q not in generic)
    own = {k: {norm(q) for q in v} - generic for k, v in references.items()}
    images = sorted(preds)
    inputs = {"image": "image only", "caption": "caption only", "both": "image + caption"}[cfg["inputs"]]
    cider = per_image_cider(preds, references)
    specific = f"VQG asks an own non-generic question ({inputs})"
    cider_name = f"VQG CIDEr-D x100 ({inputs})"
    examples = {cider_name: Examples(images, [100.0 * cider[i] for i in images], images),
                specific: Examples(images, [100.0 * (norm(preds[i]) in own[i]) for i in images], images)}
    if not with_prior:
        return examples, {}
    prior = per_image_cider(dict.fromkeys(preds, common), references)
    return examples, {cider_name: 100.0 * float(np.mean(list(prior.values()))),
                      specific: 100.0 * float(np.mean([common_specific in own[i] for i in images]))}


def vcr_predictions(run: Path) -> dict:
    return json.loads((run / f"predictions_{run_config(run)['eval_split']}.json").read_text())


def vcr_examples(preds: dict, right) -> Examples:
    keys = sorted(k for k, p in preds.items() if p["label"] is not None)
    return Examples(keys, [100.0 * right(k) for k in keys], [preds[k]["image"] for k in keys])


def vcr_metrics(runs: dict[str, Path]) -> tuple[dict[str, Examples], dict[str, float]]:
    """Q->A and QA->R from whichever of {"qa": run, "qar": run} is given, and Q->AR (both right) when both are:
    an answer is right when its highest-scored choice is the label."""
    preds = {sub: vcr_predictions(run) for sub, run in runs.items()}
    right = {sub: (lambda k, p=p: int(np.argmax(p[k]["probs"])) == p[k]["label"]) for sub, p in preds.items()}
    names = {"qa": "VCR Q->A", "qar": "VCR QA->R"}
    examples = {names[sub]: vcr_examples(p, right[sub]) for sub, p in preds.items()}
    chance = {names[sub]: 25.0 for sub in preds}
    if len(preds) == 2:
        both = {k: v for k, v in preds["qa"].items() if k in preds["qar"]}
        examples["VCR Q->AR"] = vcr_examples(both, lambda k: right["qa"](k) and right["qar"](k))
        chance["VCR Q->AR"] = 6.25
    return examples, chance


def finished(run: Path) -> bool:
    """A run that evaluated (its metrics written); one still training or stopped is left out, and said so."""
    if not (run / "run.json").exists():
        return False
    if not (run / f"metrics_{run_config(run)['eval_split']}.json").exists():
        print(f"table4: {run} has not evaluated yet: left out", file=sys.stderr)
        return False
    return True


def read_runs(root: Path) -> tuple[dict[str, dict[str, Examples]], dict[str, float]]:
    """{metric: {init: Examples}} for every run found, and each metric's prior or chance."""
    table: dict[str, dict[str, Examples]] = {}
    chance: dict[str, float] = {}

    def add(init: str, found: tuple[dict[str, Examples], dict[str, float]]):
        for name, ex in found[0].items():
            table.setdefault(name, {})[init] = ex
        chance.update(found[1])

    for init in INITS:
        if finished(root / "vqa" / init):
            add(init, vqa_metrics(root / "vqa" / init))
        for track in ("gt", "detected"):
            run = root / f"refcoco_{track}" / init
            if finished(run):
                add(init, refcoco_metrics(run, track))
        vcr = {sub: root / f"vcr_{sub}" / init for sub in ("qa", "qar") if finished(root / f"vcr_{sub}" / init)}
        if vcr:
            add(init, vcr_metrics(vcr))
        if finished(root / "vqg" / init):
            add(init, vqg_metrics(root / "vqg" / init))
    if not table:
        raise FileNotFoundError(f"{root}: no finetune runs under <task>/<init>/ (tasks {', '.join(TASKS)}; inits "
                                f"{', '.join(INITS)})")
    return table, chance


def report(table: dict[str, dict[str, Examples]], chance: dict[str, float], resamples: int = 2000) -> dict:
    out = {}
    for metric, runs in table.items():
        row = {"chance_or_prior": chance.get(metric), "runs": {i: e.summary(resamples) for i, e in runs.items()}}
        if BASELINE in runs:
            row["minus_none"] = {i: e.minus(runs[BASELINE], resamples) for i, e in runs.items() if i != BASELINE}
        out[metric] = row
    return out


def fmt(s: dict | None) -> str:
    if not s or s.get("mean") is None:
        return "—"
    lo, hi = s["ci95"]
    return f"{s['mean']:.2f} [{lo:.2f}, {hi:.2f}]"


def markdown(rep: dict) -> str:
    inits = [i for i in INITS if any(i in r["runs"] for r in rep.values())]
    head = ["metric", *[INIT_LABELS[i] for i in inits], *[f"{i} - none" for i in inits if i != BASELINE],
            "prior / chance"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for metric, r in rep.items():
        cells = [fmt(r["runs"].get(i)) for i in inits]
        cells += [fmt(r.get("minus_none", {}).get(i)) for i in inits if i != BASELINE]
        c = r["chance_or_prior"]
        lines.append("| " + " | ".join([metric, *cells, "—" if c is None else f"{c:.2f}"]) + " |")
    return "\n".join(lines) + "\n\nPercent (VQG's CIDEr-D x100); 95% intervals from a bootstrap over images " \
                              "(2,000 resamples); differences paired by example.\n"


def plot(rep: dict, path: Path) -> Path:
    # lazy: matplotlib (~0.5 s to import) only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(rep)
    inits = [i for i in INITS if any(i in r["runs"] for r in rep.values())]
    fig, ax = plt.subplots(figsize=(1.6 * len(metrics) + 2, 4))
    width = 0.8 / len(inits)
    for j, init in enumerate(inits):
        xs, ys, err = [], [], [[], []]
        for k, m in enumerate(metrics):
            s = rep[m]["runs"].get(init)
            if s:
                xs.append(k + (j - (len(inits) - 1) / 2) * width)
                ys.append(s["mean"])
                err[0].append(s["mean"] - s["ci95"][0])
                err[1].append(s["ci95"][1] - s["mean"])
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=INIT_LABELS[init])
    for k, m in enumerate(metrics):
        c = rep[m]["chance_or_prior"]
        if c is not None:
            ax.hlines(c, k - 0.45, k + 0.45, colors="k", linestyles="--", label="prior / chance" if k == 0 else None)
    ax.set_xticks(range(len(metrics)), metrics, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("accuracy (%); VQG: CIDEr-D x100")
    # CIDEr-D x100 passes 100 when most words match every reference
    ax.set_ylim(0, max(100.0, 1.1 * max(s["ci95"][1] for r in rep.values() for s in r["runs"].values())))
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title("Table 4 at demo scale: finetuned from each pretraining (95% intervals by image)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="runs/table4", help="<task>/<init>/ finetune run directories")
    p.add_argument("--out", help="default: <runs>/report")
    p.add_argument("--resamples", type=int, default=2000)
    args = p.parse_args(argv)
    root = Path(args.runs)
    out = Path(args.out or root / "report")
    try:
        rep = report(*read_runs(root), resamples=args.resamples)
    except (FileNotFoundError, ValueError) as e:
        print(f"table4: {e}", file=sys.stderr)
        return 2
    md = markdown(rep)
    written = write_report(out, "table4", rep, md, lambda: plot(rep, out / "table4.png"))
    print(md + "written: " + ", ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
