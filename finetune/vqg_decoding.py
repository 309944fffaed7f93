"""Why a BERT-gen model's questions collapse, measured: one trained model decoded several ways on the evaluation
split, each with its metrics beside how varied its questions are, and whether the search or the model chose them.

    python -m finetune.vqg_decoding --config launch/configs/vqg_demo.yaml --run runs/vqg/step3 [--out DIR]

For every decoding (greedy; the config's beam; beam without n-gram blocking, with length penalty 0 and 2, with 12
beams; diverse beam search; nucleus sampling) it reports BLEU-4 and CIDEr (PTB tokenisation, no METEOR: java per
variant is slow), distinct questions, distinct-1/2, the most frequent question's share, the share of *generic*
questions (asked of at least `--generic-share` of the training images, e.g. "how many shapes are there?") and of
questions that are among the image's own references.

Then the cause. Every reference question of every image is scored by the model (log P, teacher-forced) and ranked
by the criterion the beam ranks by (log P / length ** length_penalty):
- *search error*: a reference outranks the question the search returned, so the search missed a sequence the
  model prefers (a wider or different search would help);
- *model prefers generic*: the image's best-ranked reference is a generic question, so the model's own ranking
  puts the question every image shares first, and any search that finds the model's preferred question collapses.
Writes decoding.md, decoding.json and decoding.png (CIDEr against distinct questions per decoding) under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from model.config import load_config
from shards.tokenizer import load_tokenizer
from train.engine import to_device

from .generate import DecodeConfig, check
from .vqg import VQGConfig, VQGSet, generate_questions, load_bert_gen, model_inputs, read_split
from .vqg_data import open_features, read_coco_captions
from .vqg_eval import diversity, question_metrics

VARIANTS = {  # name: (label, changes to the config's `decode`)
    "greedy": ("greedy", {"method": "greedy", "num_return": 1}),
    "beam": ("beam (the config's)", {}),
    "beam_no_block": ("beam, no n-gram blocking", {"no_repeat_ngram_size": 0}),
    "beam_lp0": ("beam, length penalty 0", {"length_penalty": 0.0}),
    "beam_lp2": ("beam, length penalty 2", {"length_penalty": 2.0}),
    "beam12": ("beam of 12", {"beam_size": 12}),
    "diverse": ("diverse beam: 3 groups of 2, penalty 1",
                {"beam_size": 6, "beam_groups": 3, "diversity_penalty": 1.0, "num_return": 3}),
    "sample": ("sample, top-p 0.9", {"method": "sample", "top_p": 0.9, "num_return": 1}),
}


GENERIC_SHARE = 0.2  # a question asked of at least this share of the training images is generic


def asked_of(train_path: str) -> tuple[Counter, int]:
    """How many training images each question is asked of (case and spacing ignored), and how many images."""
    images = read_split(train_path)
    return Counter(q for im in images for q in {norm(q) for q in im.questions}), len(images)


def generic_questions(train_path: str, share: float = GENERIC_SHARE) -> set[str]:
    """Questions asked of at least `share` of the training images (case and spacing ignored)."""
    return generic_of(*asked_of(train_path), share)


def generic_of(counts: Counter, images: int, share: float = GENERIC_SHARE) -> set[str]:
    """`generic_questions` from `asked_of`'s counts."""
    return {q for q, n in counts.items() if n >= share * images}


def norm(text: str) -> str:
    return " ".join(text.lower().split())


@torch.no_grad()
def reference_scores(gen, data: VQGSet, batch_size: int, device) -> tuple[np.ndarray, np.ndarray]:
    """log P and length (end token included) of every (image, reference question) pair of `data`, teacher-forced."""
    logp, length = [], []
    for start in tqdm(range(0, len(data.pairs), batch_size), desc="score references", unit="batch"):
        b = to_device(data.batch(list(range(start, min(len(data.pairs), start + batch_size)))), device)
        inp = gen.embed_input(**model_inputs(b))
        logp.append(gen.sequence_log_probs(inp, b["target_ids"], b["target_mask"]).float().cpu())
        length.append(b["target_mask"].sum(1).cpu())
    return torch.cat(logp).numpy(), torch.cat(length).numpy()


def diagnose(preds: list[dict], data: VQGSet, ref_logp: np.ndarray, ref_len: np.ndarray, alpha: float,
             generic: set[str]) -> dict:
    """Per image: did a reference outrank the returned question (search error), and is the best-ranked reference
    generic (the model prefers it)? Shares over the images."""
    by_image: dict[int, list[int]] = {}
    for p, (i, _) in enumerate(data.pairs):
        by_image.setdefault(i, []).append(p)
    index = {im.image_id: i for i, im in enumerate(data.images)}
    errors = prefers_generic = 0
    for pred in preds:
        pairs = by_image[index[pred["image_id"]]]
        ranks = ref_logp[pairs] / ref_len[pairs].astype(np.float64) ** alpha
        best = pairs[int(np.argmax(ranks))]
        ours = pred["score"] / max(pred["length"], 1) ** alpha
        errors += bool(ranks.max() > ours + 1e-4 and norm(data.pairs[best][1]) != norm(pred["question"]))
        prefers_generic += norm(data.pairs[best][1]) in generic
    n = max(len(preds), 1)
    return {"search_error": errors / n, "model_prefers_generic": prefers_generic / n}


def evaluate_variant(name: str, decode: DecodeConfig, gen, data: VQGSet, cfg: VQGConfig, device, generic: set[str],
                     ref_logp: np.ndarray, ref_len: np.ndarray) -> dict:
    preds = generate_questions(gen, data, decode, cfg.eval_batch_size, device, cfg.max_eval_images, progress=False)
    refs = data.references()
    hyp = {p["image_id"]: p["question"] for p in preds}
    own = {k: {norm(q) for q in v} for k, v in refs.items()}
    questions = [p["question"] for p in preds]
    out = {"name": name, "decode": asdict(decode), "images": len(preds), **diversity(questions),
           "generic_share": float(np.mean([norm(q) in generic for q in questions])),
           "own_reference_share": float(np.mean([norm(p["question"]) in own[p["image_id"]] for p in preds])),
           "mean_log_p_per_token": float(np.mean([p["score"] / max(p["length"], 1) for p in preds])),
           "metrics": question_metrics(hyp, {k: refs[k] for k in hyp}, "ptb", meteor=False)}
    if decode.method != "sample":
        out.update(diagnose(preds, data, ref_logp, ref_len, decode.length_penalty, generic))
    if decode.num_return > 1:
        sets = [[p["question"]] + [a["question"] for a in p["alternatives"]] for p in preds]
        out["per_image"] = {"questions": decode.num_return,
                            "distinct": float(np.mean([len({norm(q) for q in s}) for s in sets])),
                            "own_reference": float(np.mean([np.mean([norm(q) in own[p["image_id"]] for q in s])
                                                            for p, s in zip(preds, sets)])),
                            "distinct_over_split": len({norm(q) for s in sets for q in s})}
    out["examples"] = preds[:5]
    return out


def markdown(rows: list[dict], images: int, generic: set[str], generic_share: float) -> str:
    lines = [f"One model decoded {len(rows)} ways over {images} evaluation images (PTB tokenisation, METEOR off). "
             f"Generic: asked of >= {100 * generic_share:.0f}% of training images ({len(generic)}: "
             + ", ".join(f'"{q}"' for q in sorted(generic)) + ").", "",
             "| decoding | BLEU-4 | CIDEr | distinct questions | distinct-1 | distinct-2 | most frequent (share) | "
             "generic | own reference | search error | model prefers generic |", "|---|" + "---|" * 10]
    for r in rows:
        m = r["metrics"]
        se = f"{100 * r['search_error']:.1f}%" if "search_error" in r else "-"
        mg = f"{100 * r['model_prefers_generic']:.1f}%" if "model_prefers_generic" in r else "-"
        lines.append(f"| {r['name']} | {100 * m['Bleu_4']:.2f} | {100 * m['CIDEr']:.2f} | {r['distinct_questions']} | "
                     f"{r['distinct_1']:.3f} | {r['distinct_2']:.3f} | \"{r['top_question']}\" "
                     f"({100 * r['top_share']:.0f}%) | {100 * r['generic_share']:.1f}% | "
                     f"{100 * r['own_reference_share']:.1f}% | {se} | {mg} |")
    for r in rows:
        if "per_image" in r:
            p = r["per_image"]
            lines += ["", f"{r['name']}: {p['questions']} questions per image, {p['distinct']:.2f} distinct on "
                      f"average, {100 * p['own_reference']:.1f}% of them among the image's references, "
                      f"{p['distinct_over_split']} distinct over the split."]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    # lazy: matplotlib (~0.5 s to import) only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    points: dict[tuple, list[str]] = {}  # decodings that return the same questions share one point and label
    for r in rows:
        points.setdefault((r["distinct_questions"], round(100 * r["metrics"]["CIDEr"], 2)), []).append(r["name"])
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for (x, y), names in points.items():
        ax.scatter([x], [y])
        stack = len(names) > 1  # a stack of names hangs left of its point, clear of its neighbours' labels
        ax.annotate("\n".join(names), (x, y), fontsize=7, xytext=(-5, 2) if stack else (4, 2),
                    textcoords="offset points", ha="right" if stack else "left", va="top" if stack else "bottom")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(ScalarFormatter())
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_xlabel("distinct questions over the split (log)")
    ax.set_ylabel("CIDEr (PTB)")
    ax.set_title("VQG decodings: accuracy against variety")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="VQG decoding diagnosis of one trained model", epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="the VQGConfig the run used (data paths, eval split, decode)")
    p.add_argument("--run", required=True, help="a finetune.vqg run directory (its model/ is decoded)")
    p.add_argument("--out", help="default: <run>/decoding")
    p.add_argument("--generic-share", type=float, default=GENERIC_SHARE,
                   help="a question asked of at least this share of training images is generic")
    p.add_argument("--variants", help="comma-separated names of VARIANTS (default: all)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    cfg = load_config(VQGConfig, args.config, args.overrides)
    run, names = Path(args.run), list(VARIANTS) if not args.variants else args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {list(VARIANTS)}")
    decodes = {n: DecodeConfig(**{**asdict(cfg.decode), **VARIANTS[n][1]}) for n in names}
    for d in decodes.values():
        check(d)
    origin = json.loads((run / "model" / "bert_gen.json").read_text())
    gen = load_bert_gen(run / "model").eval()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = gen.to(device)
    tokenizer = load_tokenizer(str(run / "model"))
    features = open_features(cfg.data.features) if origin["inputs"] != "caption" else None
    split = cfg.data.val if cfg.eval_split == "val" else cfg.data.test
    data = VQGSet(split, cfg.data, tokenizer, read_coco_captions(cfg.data.captions), features, origin["inputs"])
    generic = generic_questions(cfg.data.train, args.generic_share)
    ref_logp, ref_len = reference_scores(gen, data, cfg.eval_batch_size, device)
    rows = [evaluate_variant(VARIANTS[n][0], decodes[n], gen, data, cfg, device, generic, ref_logp, ref_len)
            for n in tqdm(names, desc="decodings", unit="decoding")]
    out = Path(args.out) if args.out else run / "decoding"
    out.mkdir(parents=True, exist_ok=True)
    images = rows[0]["images"]
    (out / "decoding.json").write_text(json.dumps({"run": str(run), "split": cfg.eval_split, "images": images,
                                                   "generic": sorted(generic), "variants": rows}, indent=1))
    (out / "decoding.md").write_text(markdown(rows, images, generic, args.generic_share))
    plot(rows, out / "decoding.png")
    print((out / "decoding.md").read_text())
    print(f"decoding diagnosis: {out}/decoding.md, decoding.json, decoding.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
