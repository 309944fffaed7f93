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

Outputs under --out: results.json (per model: mean, 95% interval, n per condition; paired t-tests
between conditions; skip counts), results.md, figure2.png (bits per condition, one line per model) and
threshold_sweep.png (Object ablation's MLM bits against tau). `PeriodicDiagnostic` runs the same
measurement inside pretraining (`engine.eval_every`), to TensorBoard.
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
    lines += ["", "## Skipped and left out", ""]
    for name, r in report["models"].items():
        lines.append(f"- {name}: {r['examples']} examples; skipped {r['skipped'] or 'none'}; phrases left out "
                     f"{r['left_out_phrases'] or 'none'}; without a gold label (no XE) {r['no_gold_label']}"
                     + (f"; ablated elements take the {r['ablation_fill']} average" if "ablation_fill" in r else ""))
    return "\n".join(lines) + "\n"


class PeriodicDiagnostic:
    """The diagnostic on a small held-out set as an engine evaluator: model -> scalars for TensorBoard.
    Every rank evaluates the same examples, so every rank makes the same forward calls (ZeRO-3 gathers
    parameters collectively); the values agree and rank 0 logs them."""

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
           desc: str = "ablation") -> tuple[dict[str, np.ndarray], dict]:
    """One model through the diagnostic: its per-example values and its report entry (`model_report`, with the
    average its ablated elements took when it has an image)."""
    data = PhraseData(cfg, tokenizer, model.cfg.fast_rcnn.num_classes if with_image else None,
                      feature_extractor(model, device))
    ablator = Ablator(model, device, cfg.ablation_fill)
    values = evaluate(ablator, data, image=with_image, tau=cfg.tau, sweep=cfg.sweep if with_image else None,
                      desc=desc)
    entry = model_report(values, data)
    if with_image:
        entry["ablation_fill"] = ablator.fill
    return values, entry


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
    args = p.parse_args(argv)
    models = model_specs(p, args.model)
    if not args.model and not args.text_baseline:
        p.error("give at least one --model NAME=DIR or --text-baseline")
    cfg, out = command_config(p, DiagnosticConfig, args)
    report: dict = {"config": cfg.__dict__, "models": {}}
    runs = []
    for name, path in models:
        runs.append((name, lambda path=path: (load_pretrained(path), path), True))
    if args.text_baseline:
        runs.append(("text-only BERT", lambda: _text_baseline(args.text_baseline), False))
    for name, load, with_image in runs:
        model, tokenizer_dir = load()
        model = model.to(args.device).eval()
        values, entry = ablate(model, load_tokenizer(str(tokenizer_dir)), cfg, args.device, with_image=with_image,
                               desc=name)
        np.savez_compressed(out / f"per_example_{''.join(c if c.isalnum() else '_' for c in name)}.npz", **values)
        report["models"][name] = entry
        if with_image and entry["ablation_fill"] != cfg.ablation_fill:
            print(f"{name}: no appearance standardisers to read a training average from: ablated elements "
                  f"take the evaluation images' average", flush=True)
        print(f"{name}: {v4l_line(entry)}", flush=True)
        if "l4v_kl" in report["models"][name]:
            print(f"{name}: language-for-vision MRC-KL bits " + ", ".join(
                f"{c} {format_interval(s)}" for c, s in report["models"][name]["l4v_kl"].items()), flush=True)
    written = write_report(out, "results", report, markdown(report), lambda: ablation_figures(report, out))
    print("written: " + ", ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
