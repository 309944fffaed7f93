"""VQG evaluation: BLEU-1..4, METEOR, ROUGE-L and CIDEr (pycocoevalcap) against every reference question
of an image, keyed by image; the cross-modal similarity Xsim; and an attention view.

Tokenisation matters and papers rarely say which they used, so both are offered and reported:
- "ptb": pycocoevalcap's PTB tokenizer (Stanford CoreNLP, needs java), as the COCO caption server;
  it lowercases and drops punctuation, including "?".
- "nqg": lowercase, punctuation split off and kept (so "?" counts), then the scorers directly, as the
  nqg question-generation evaluation scripts (Du et al. 2017) feed pre-tokenised text.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.meteor.meteor import Meteor
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

METRICS = ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr"]


def nqg_tokenize(text: str) -> str:
    return " ".join(re.findall(r"\w+|[^\w\s]", text.lower()))


def tokenized_pairs(predictions: dict[str, str], references: dict[str, list[str]], tokenization: str):
    """Each image's question and its references, tokenised as pycocoevalcap's scorers take them
    ({image: [text]}, the same image order in both)."""
    keys = sorted(predictions)
    missing = [k for k in keys if not references.get(k)]
    if missing:
        raise ValueError(f"no reference questions for images {missing[:5]}")
    if tokenization == "ptb":
        tok = PTBTokenizer()
        return (tok.tokenize({k: [{"caption": predictions[k]}] for k in keys}),
                tok.tokenize({k: [{"caption": r} for r in references[k]] for k in keys}))
    if tokenization == "nqg":
        return {k: [nqg_tokenize(predictions[k])] for k in keys}, {k: [nqg_tokenize(r) for r in references[k]]
                                                                   for k in keys}
    raise ValueError(f"tokenization: '{tokenization}' is not ptb or nqg")


def question_metrics(predictions: dict[str, str], references: dict[str, list[str]], tokenization: str = "ptb",
                     meteor: bool = True) -> dict[str, float]:
    """predictions: image -> generated question; references: image -> all its reference questions."""
    res, gts = tokenized_pairs(predictions, references, tokenization)
    out: dict[str, float] = {}
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    out.update({f"Bleu_{n + 1}": float(b) for n, b in enumerate(bleu)})
    if meteor:
        scorer = Meteor()
        try:
            out["METEOR"] = float(scorer.compute_score(gts, res)[0])
        finally:
            _close_meteor(scorer)
    out["ROUGE_L"] = float(Rouge().compute_score(gts, res)[0])
    out["CIDEr"] = float(Cider().compute_score(gts, res)[0])
    return out


def per_image_cider(predictions: dict[str, str], references: dict[str, list[str]],
                    tokenization: str = "ptb") -> dict[str, float]:
    """CIDEr-D of each image's question against its references (document frequencies from all the images given,
    as the corpus score computes them, so the corpus score is the mean of these): values a bootstrap over images
    can resample."""
    res, gts = tokenized_pairs(predictions, references, tokenization)
    return dict(zip(gts, map(float, Cider().compute_score(gts, res)[1]), strict=True))


def distinct_n(texts: list[str], n: int) -> float:
    """Distinct-n (Li et al., NAACL 2016): distinct n-grams over all n-grams of all texts (nqg tokenisation), so
    1.0 when no n-gram repeats anywhere and near 0 when every text is the same."""
    grams = [tuple(toks[i: i + n]) for t in texts for toks in [nqg_tokenize(t).split()]
             for i in range(len(toks) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def diversity(questions: list[str]) -> dict:
    """How varied a model's questions over a split are: distinct questions, distinct-1/2, and the most frequent
    question with its share (a collapsed model gives one question to most images)."""
    counts = Counter(questions)
    top, top_n = counts.most_common(1)[0] if counts else ("", 0)
    return {"distinct_questions": len(counts), "distinct_1": distinct_n(questions, 1),
            "distinct_2": distinct_n(questions, 2), "top_question": top,
            "top_share": top_n / len(questions) if questions else 0.0}


def _close_meteor(scorer) -> None:
    proc = getattr(scorer, "meteor_p", None)
    if proc is not None and proc.poll() is None:
        with scorer.lock:
            proc.stdin.close()
            proc.kill()
            proc.wait()


# --- Xsim ---------------------------------------------------------------------------------------------

def plot_xsim(curves: dict[str, list[float]], path, title: str = "Cross-modal similarity Xsim") -> Path:
    # lazy: matplotlib (~0.5 s to import) only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, values in curves.items():
        ax.plot(range(1, len(values) + 1), values, marker="o", ms=3, label=name)
    ax.set_xlabel("layer")
    ax.set_ylabel("cosine([CLS] of image alone, [CLS] of caption alone)")
    ax.set_title(title)
    ax.axhline(0, color="grey", lw=0.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --- attention view -------------------------------------------------------------------------------------

def plot_attention(image, boxes: np.ndarray, region_weights: np.ndarray, words: list[str],
                   word_weights: np.ndarray, question: str, path) -> None:
    """The image with each region shaded by the attention it gets, the caption's words highlighted by
    theirs (weights normalised to the largest of both), the generated question as the title."""
    # lazy: matplotlib (~0.5 s to import) only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    top = max(float(region_weights.max(initial=0)), float(word_weights.max(initial=0)), 1e-12)
    fig = plt.figure(figsize=(6.0, 6.6))
    ax = fig.add_axes([0.02, 0.18, 0.96, 0.74])
    ax.imshow(image)
    ax.axis("off")
    for (x1, y1, x2, y2), w in sorted(zip(boxes.tolist(), region_weights.tolist()), key=lambda z: z[1]):
        a = w / top
        ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, facecolor=(1, 0.2, 0, 0.55 * a),
                               edgecolor=(1, 0.2, 0, 0.3 + 0.7 * a), lw=1.5))
        ax.text(x1 + 2, y1 + 2, f"{w:.3f}", fontsize=7, va="top", color="black")
    ax.set_title(f"generated: {question}", fontsize=10)
    tx = fig.add_axes([0.02, 0.02, 0.96, 0.13])
    tx.axis("off")
    x, y = 0.0, 0.7
    for word, w in zip(words, word_weights.tolist()):
        t = tx.text(x, y, word, fontsize=10, transform=tx.transAxes,
                    bbox=dict(facecolor=(1, 0.2, 0, 0.8 * w / top), edgecolor="none", pad=1.5))
        fig.canvas.draw()
        width = t.get_window_extent().transformed(tx.transAxes.inverted()).width
        x += width + 0.015
        if x > 0.9:
            x, y = 0.0, y - 0.45
    fig.savefig(path, dpi=110)
    plt.close(fig)
