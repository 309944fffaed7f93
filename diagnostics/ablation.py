"""Cross-modal input ablation (Frank, Bugliarello & Elliott, EMNLP 2021): does a model use the image to
predict words (vision-for-language), and the words to predict regions (language-for-vision)?

    python -m diagnostics.ablation --model vl=runs/demo/export --model no-image=runs/demo-noimg/export \\
        --text-baseline packaged --config launch/configs/heldout_demo.yaml --out runs/ablation [key=value ...]

Data: Flickr30k Entities as distributed (`shards.flickr30k_entities`), the images, and a box file of
the images' detector regions keyed `<id>.jpg` (`python -m shards.detect` writes one), whose class
distributions are the MRC-KL targets. One example per (sentence, phrase) whose chain has a box.

Vision-for-language: every word-piece of the phrase is [MASK]ed (no 80/10/10) and the MLM head scores
them; the metric is the phrase's cross-entropy in bits (mean over its word-pieces, then over phrases).
Visual input: `none`; `object`, every region whose intersection over target (the gold box) with one of
the phrase's gold boxes exceeds tau is ablated; `all`, every region and the whole image are ablated.
An ablated region keeps its box and [IMG] token and takes an average region feature, so the input stays
in distribution: the average of the model's own pretraining features (`ablation_fill: training`, the
default), or the paper's average over the evaluation images (`evaluation`; the only one a model without
appearance standardisers has). The paper's choice is out of distribution for a model that never saw images
like the evaluation's, such as the image-ablated control (docs/ABLATION.md, session 19). Its pixels are
zeroed before the Fast R-CNN (end to end) or it is left out of the whole-image mean (precomputed
features), so the whole-image element, recomputed from what remains, carries nothing of it.

Language-for-vision: the target is, among regions whose IoT with a gold box exceeds tau, the one with
the highest IoU; it and every region whose IoT over it exceeds tau are masked as in pretraining
(pixels or features zeroed, RoI-[MASK] token) and the MRC head classifies the target. Text: `none`;
`phrase`, the phrase's word-pieces -> [MASK]; `all`, every word-piece -> [MASK]. Metrics in bits:
MRC-KL against the detector's class distribution of the target, and cross-entropy against the gold
label (the phrase's last word naming a detector class, as the paper's LabelMatch subset). An example
with no region over its gold box is skipped and counted, never scored.

Against a reader without the image (`--reference NAME`: the matched control, or the text-only BERT), V4L's
all - none splits, phrase by phrase, into what the image tells the model (`information`: the reference's bits
minus the model's `none`) and what it overpays on the ablated input (`overpayment`: its `all` minus the
reference's bits). The average region the `all` condition gives is an input no training step shows, so
all - none can exceed what the image is worth (docs/ABLATION.md, session 53); the information term never reads
that input. It takes the reference to read text as well as the model would without the image, as a matched
control (same seed, schedule, batches and steps) is built to.

Outputs under --out: results.json (per model: mean, 95% interval, n per condition; paired t-tests
between conditions; the split against the reference; skip counts), results.md, figure2.png (bits per
condition, one line per model) and threshold_sweep.png (Object ablation's MLM bits against tau).
`PeriodicDiagnostic` runs the same measurement inside pretraining (`engine.eval_every`), to TensorBoard.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from model.export import load_pretrained
from model.hf_import import config_from_hf, load_hf_bert
from model.vl_bert import VLBertForPretraining
from shards.region_features import FeatureExtractor
from shards.tokenizer import bert_source_dir, load_tokenizer

from .conditions import LANGUAGE_FOR_VISION, VISION_FOR_LANGUAGE, Ablator, evaluate
from .config import DiagnosticConfig, command_config, command_line, model_specs
from .data import PhraseData
from .plots import ablation_figures
from .report import write_report
from .statistics import format_interval, paired_test, summarise


def model_report(values: dict[str, np.ndarray], data: PhraseData) -> dict:
    clusters = np.array([it.image_id for it in data.items])
    boot = {"clusters": clusters, "resamples": data.cfg.bootstrap, "seed": data.cfg.seed}
    groups: dict[str, dict] = {}
    for key, v in values.items():
        group, cond = key.split("/", 1)
        groups.setdefault(group, {})[cond] = summarise(v, **boot)
    tests = []
    for group, conditions in (("v4l", VISION_FOR_LANGUAGE), ("l4v_kl", LANGUAGE_FOR_VISION),
                              ("l4v_xe", LANGUAGE_FOR_VISION)):
        for i, a in enumerate(conditions):
            for b in conditions[i + 1:]:
                if f"{group}/{a}" in values and f"{group}/{b}" in values:
                    tests.append({"metric": group, "a": a, "b": b,
                                  **paired_test(values[f"{group}/{a}"], values[f"{group}/{b}"], **boot)})
    skipped = dict(data.skipped)
    if "l4v_kl/none" in values:
        unscored = len(data) - int(np.isfinite(values["l4v_kl/none"]).sum())
        if unscored:
            skipped["language-for-vision: no region over the gold box"] = unscored
    return {"examples": len(data), **groups, "paired_tests": tests, "skipped": skipped,
            "left_out_phrases": dict(data.left_out), "no_gold_label": int(data.no_gold_label)}


def reference_bits(values: dict[str, np.ndarray]) -> np.ndarray:
    """A reference reader's bits per phrase: its `none` when it has an image input (a control's is grey or
    unrelated to its captions), else its text-only reading."""
    return values["v4l/none"] if "v4l/none" in values else values["v4l/text_only"]


def against_reference(values: dict[str, np.ndarray], reference: np.ndarray, clusters: np.ndarray, *,
                      resamples: int = 2000, seed: int = 0) -> dict:
    """V4L all - none = information + overpayment, per phrase against a reader without the image (`reference`,
    aligned with `values`): information = reference - none, overpayment = all - reference, each paired by
    phrase with its interval from the bootstrap clustered by image."""
    boot = {"clusters": clusters, "resamples": resamples, "seed": seed}
    return {"reference_none": summarise(reference, **boot),
            "information": paired_test(values["v4l/none"], reference, **boot),
            "overpayment": paired_test(reference, values["v4l/all"], **boot)}


_NAMES = {"v4l": "Vision-for-language: MLM bits (phrase)", "l4v_kl": "Language-for-vision: MRC-KL bits",
          "l4v_xe": "Language-for-vision: MRC cross-entropy bits (gold label)"}


def markdown(report: dict) -> str:
    lines = ["# Cross-modal input ablation", ""]
    for group, conditions in (("v4l", VISION_FOR_LANGUAGE), ("l4v_kl", LANGUAGE_FOR_VISION),
                              ("l4v_xe", LANGUAGE_FOR_VISION)):
        cols = list(conditions) + (["text_only"] if group == "v4l" else [])
        lines += [f"## {_NAMES[group]}", "", "mean [95% interval from a bootstrap over images], lower is better", "",
                  "| model | " + " | ".join(cols) + " | n |", "|---" * (len(cols) + 2) + "|"]
        for name, r in report["models"].items():
            g = r.get(group, {})
            if not g:
                continue
            n = max(s["n"] for s in g.values())
            lines.append(f"| {name} | " + " | ".join(format_interval(g.get(c)) for c in cols) + f" | {n} |")
        lines.append("")
    lines += ["## Paired differences (b - a): clustered bootstrap interval and p, and the t-test", "",
              "| model | metric | a | b | mean diff | 95% interval (images) | p (bootstrap) | t | p (t) | n |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    def fmt(x, spec):
        return "-" if x is None else format(x, spec)

    for name, r in report["models"].items():
        for t in r["paired_tests"]:
            ci = t.get("ci95")
            lines.append(f"| {name} | {t['metric']} | {t['a']} | {t['b']} | {fmt(t['mean_diff'], '.4f')} | "
                         + (f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "-") + f" | {fmt(t.get('p_bootstrap'), '.2g')} | "
                         f"{fmt(t['t'], '.2f')} | {fmt(t['p'], '.2g')} | {t['n']} |")
    split = {name: r["against_reference"] for name, r in report["models"].items() if "against_reference" in r}
    if split:
        lines += ["", f"## Vision-for-language against a reader without the image ({report['reference']})", "",
                  "all - none = information (the reference's bits - none: what the image tells the model) + "
                  "overpayment (all - the reference's bits: what the ablated input costs beyond losing the image); "
                  "bits per phrase word-piece, paired by phrase, 95% interval by image", "",
                  "| model | reference's bits | information | overpayment | n |", "|---|---|---|---|---|"]
        def diff(t):
            ci = t.get("ci95")
            return "-" if t["mean_diff"] is None else f"{t['mean_diff']:+.3f}" + (
                f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")

        for name, r in split.items():
            lines.append(f"| {name} | {format_interval(r['reference_none'])} | {diff(r['information'])} | "
                         f"{diff(r['overpayment'])} | {r['information']['n']} |")
    lines += ["", "## Skipped and left out", ""]
    for name, r in report["models"].items():
        lines.append(f"- {name}: {r['examples']} examples; skipped {r['skipped'] or 'none'}; phrases left out "
                     f"{r['left_out_phrases'] or 'none'}; without a gold label (no XE) {r['no_gold_label']}"
                     + (f"; ablated elements take the {r['ablation_fill']} average" if "ablation_fill" in r else ""))
    return "\n".join(lines) + "\n"


class PeriodicDiagnostic:
    """The diagnostic on a small held-out set as an engine evaluator: model -> scalars for TensorBoard.
    Every rank that evaluates takes the same examples, so at ZeRO-3 (where every rank joins, as its forwards gather
    parameters collectively) every rank makes the same forward calls; the values agree and rank 0 logs them."""

    def __init__(self, cfg: DiagnosticConfig, tokenizer, num_classes: int, extractor=None):
        self.cfg = cfg
        self.data = PhraseData(cfg, tokenizer, num_classes, extractor)

    def __call__(self, model: VLBertForPretraining, device) -> dict[str, float]:
        values = evaluate(Ablator(model, device, self.cfg.ablation_fill), self.data, tau=self.cfg.tau,
                          progress=False)
        scalars = {f"xmodal/{k}": float(np.nanmean(v)) for k, v in values.items()}
        scalars["xmodal/v4l_object_minus_none"] = scalars["xmodal/v4l/object"] - scalars["xmodal/v4l/none"]
        scalars["xmodal/v4l_all_minus_none"] = scalars["xmodal/v4l/all"] - scalars["xmodal/v4l/none"]
        scalars["xmodal/l4v_kl_all_minus_none"] = scalars["xmodal/l4v_kl/all"] - scalars["xmodal/l4v_kl/none"]
        return scalars


def feature_extractor(model: VLBertForPretraining, device="cpu"):
    """The frozen Fast R-CNN a features model (`region_input: features`) was trained on, else None."""
    if model.cfg.region_input != "features" or model.cfg.visual_embedding != "vlbert":
        return None

    return FeatureExtractor(model.cfg.fast_rcnn, device)


def ablate(model: VLBertForPretraining, tokenizer, cfg: DiagnosticConfig, device, *, with_image: bool = True,
           desc: str = "ablation") -> tuple[dict[str, np.ndarray], dict, PhraseData]:
    """One model through the diagnostic: its per-example values, its report entry (`model_report`, with the
    average its ablated elements took when it has an image) and the phrases they are aligned with."""
    data = PhraseData(cfg, tokenizer, model.cfg.fast_rcnn.num_classes if with_image else None,
                      feature_extractor(model, device))
    ablator = Ablator(model, device, cfg.ablation_fill)
    values = evaluate(ablator, data, image=with_image, tau=cfg.tau, sweep=cfg.sweep if with_image else None,
                      desc=desc)
    entry = model_report(values, data)
    if with_image:
        entry["ablation_fill"] = ablator.fill
    return values, entry, data


def v4l_line(entry: dict) -> str:
    """'vision-for-language bits none m [lo, hi], ...' of a report entry."""
    return "vision-for-language bits " + ", ".join(f"{c} {format_interval(s)}" for c, s in entry["v4l"].items())


def _text_baseline(path: str) -> tuple[VLBertForPretraining, Path]:
    bert_dir = bert_source_dir(path)
    model = VLBertForPretraining(config_from_hf(bert_dir, "base"), with_fast_rcnn=False)
    report = load_hf_bert(model, bert_dir)
    if not any(k.startswith("cls.predictions.") for k in report["loaded"]):
        raise ValueError(f"{bert_dir}: the checkpoint has no MLM head (cls.predictions.*), so its word "
                         "predictions would be random; a text-only baseline needs a BertForMaskedLM / "
                         "BertForPreTraining checkpoint (e.g. bert-base-uncased), or compare against a model "
                         "pretrained here with masking.ablate_image=true")
    return model, bert_dir


def main(argv: list[str] | None = None) -> int:
    p = command_line("Cross-modal input ablation diagnostic (Frank et al. 2021)", __doc__,
                     config_name="DiagnosticConfig", out="runs/ablation", models_required=False,
                     model_help="an exported VL-BERT directory (repeat for several models side by side)",
                     overrides_example="max_examples=500")
    p.add_argument("--text-baseline", metavar="DIR",
                   help="a text-only HF BERT directory with its MLM head (BertForMaskedLM / BertForPreTraining)")
    p.add_argument("--reference", metavar="NAME",
                   help="a reader without the image (a --model NAME such as the matched control, or 'text-only "
                        "BERT'): every other model's all - none is split against it into information + overpayment")
    args = p.parse_args(argv)
    models = model_specs(p, args.model)
    if not args.model and not args.text_baseline:
        p.error("give at least one --model NAME=DIR or --text-baseline")
    names = [name for name, _ in models] + (["text-only BERT"] if args.text_baseline else [])
    if args.reference is not None and args.reference not in names:
        p.error(f"--reference {args.reference!r} is none of the models: {', '.join(names)}")
    cfg, out = command_config(p, DiagnosticConfig, args)
    report: dict = {"config": cfg.__dict__, "models": {}}
    if args.reference is not None:
        report["reference"] = args.reference
    per_model: dict[str, tuple[dict, list, np.ndarray]] = {}
    runs = []
    for name, path in models:
        runs.append((name, lambda path=path: (load_pretrained(path), path), True))
    if args.text_baseline:
        runs.append(("text-only BERT", lambda: _text_baseline(args.text_baseline), False))
    for name, load, with_image in runs:
        model, tokenizer_dir = load()
        model = model.to(args.device).eval()
        values, entry, data = ablate(model, load_tokenizer(str(tokenizer_dir)), cfg, args.device,
                                     with_image=with_image, desc=name)
        per_model[name] = (values, [(it.image_id, tuple(it.ids.tolist()), tuple(it.phrase.tolist()))
                                    for it in data.items], np.array([it.image_id for it in data.items]))
        np.savez_compressed(out / f"per_example_{''.join(c if c.isalnum() else '_' for c in name)}.npz", **values)
        report["models"][name] = entry
        if with_image and entry["ablation_fill"] != cfg.ablation_fill:
            print(f"{name}: no appearance standardisers to read a training average from: ablated elements "
                  f"take the evaluation images' average", flush=True)
        print(f"{name}: {v4l_line(entry)}", flush=True)
        if "l4v_kl" in report["models"][name]:
            print(f"{name}: language-for-vision MRC-KL bits " + ", ".join(
                f"{c} {format_interval(s)}" for c, s in report["models"][name]["l4v_kl"].items()), flush=True)
    if args.reference is not None:
        ref_values, ref_phrases, _ = per_model[args.reference]
        for name, (values, phrases, clusters) in per_model.items():
            if name == args.reference or "v4l/all" not in values:
                continue
            if phrases != ref_phrases:  # the rest of the report stands: say so, and write it
                print(f"{name}: not split against {args.reference}: they read different phrases (another tokenizer "
                      "or detector classes), so their bits per word-piece do not compare", file=sys.stderr)
                report.setdefault("not_split", []).append(name)
                continue
            report["models"][name]["against_reference"] = against_reference(
                values, reference_bits(ref_values), clusters, resamples=cfg.bootstrap, seed=cfg.seed)
            split = report["models"][name]["against_reference"]
            print(f"{name}: against {args.reference}: information {split['information']['mean_diff']:+.3f}, "
                  f"overpayment {split['overpayment']['mean_diff']:+.3f} bits", flush=True)
    written = write_report(out, "results", report, markdown(report), lambda: ablation_figures(report, out))
    print("written: " + ", ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
