"""What a text-only model can know of a held-out masked colour or shape word: split by whether the sentence
names the same word elsewhere (the held-out sentences chain relations, so one object is often named twice:
"a small orange star above a green triangle and a small green hexagon below a small orange star"), where a
text-only model can copy it, and by the word's length in word-pieces: a masked word shows as one [MASK] per
piece, and "hexagon" is the only shape of 3 pieces (he ##xa ##gon; "hexagons" 4), every other colour and
shape one, so the span alone names it (the evaluator now scores such words apart, as named_by_span;
docs/grounding_demo/long_s15/text_cues.md was written before, when they counted as shape).

    python docs/grounding_demo/text_cues.py --model image=runs/demo_long/export \\
        --model control=runs/demo_long_control/export [--out docs/grounding_demo/long_s15/text_cues.md]

Per model and category: accuracy with the image and ablated, on the words named again in their sentence, on
the one-piece rest and the several-piece rest, with 95% intervals from the bootstrap over images; and the
exclusion prior of the one-piece rest (a uniform guess over the one-piece names the sentence does not use
already).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from diagnostics.categories import CATEGORIES, NAMED_BY_SPAN  # noqa: E402
from diagnostics.config import GroundingConfig  # noqa: E402
from diagnostics.grounding import GroundingEval  # noqa: E402
from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from model.config import load_config  # noqa: E402
from model.export import load_pretrained  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402

HELD_OUT = "launch/configs/heldout_demo.yaml"  # the demo's held-out images (run from the repository root)


def flags(evaluator: GroundingEval, tokenizer) -> tuple[list[bool], list[int], list[float]]:
    """Per scored word, in GroundingEval's row order: named again in its sentence, its word-pieces, and the
    exclusion prior (1 / the category's names of as many pieces not used elsewhere in the sentence)."""
    repeat, pieces, prior = [], [], []
    for item in evaluator.data.images:
        for s in item.sentences:
            last = max(x for x in s.word_ids if x is not None)
            ids = [[int(i) for i, w in zip(s.ids, s.word_ids) if w == k] for k in range(last + 1)]
            words = [tokenizer.decode(x).replace(" ", "") for x in ids]
            for word, cat in s.categories:
                n = len(ids[word])
                names = CATEGORIES.get(cat) or CATEGORIES["shape"]  # named_by_span: in the shapes world, hexagon
                vocab = {v for v in names if len(tokenizer.tokenize(v)) == n}
                others = {w for k, w in enumerate(words) if k != word and w in vocab}
                repeat.append(words[word] in others)
                pieces.append(n)
                prior.append(1 / max(1, len(vocab - (others - {words[word]}))))
    return repeat, pieces, prior
def fmt(values: np.ndarray, clusters: np.ndarray) -> str:
    s = clustered_bootstrap(values, clusters)
    return "-" if s["mean"] is None else f"{s['mean']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}] (n={s['n']})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", required=True, help="name=export directory")
    p.add_argument("--out", help="write the table here (markdown)")
    args = p.parse_args(argv)
    lines = ["| model | category | named again in the sentence: image / ablated | one piece, the rest: image / "
             "ablated | several pieces: image / ablated | one-piece rest's exclusion prior |",
             "|---|---|---|---|---|---|"]
    for spec in args.model:
        name, path = spec.split("=", 1)
        model = load_pretrained(path).eval()
        tokenizer = load_tokenizer(path)
        evaluator = GroundingEval(load_config(GroundingConfig, HELD_OUT, ["max_images=100"]), tokenizer, None)
        values = evaluator(model)["words"]
        repeat, pieces, prior = (np.asarray(x) for x in flags(evaluator, tokenizer))
        for cat in ("colour", "shape", NAMED_BY_SPAN):
            sel = values["category"] == cat
            parts = (sel & repeat, sel & ~repeat & (pieces == 1), sel & ~repeat & (pieces > 1))
            cells = [" / ".join(fmt(values[c][m], values["cluster"][m]) for c in ("image", "ablated")) for m in parts]
            one = prior[parts[1]]
            lines.append(f"| {name} | {cat} | {' | '.join(cells)} | {one.mean() if one.size else float('nan'):.3f} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        Path(args.out).write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
