"""How much of V4L's information a reader could get at all (docs/ABLATION.md, session 54): the Bayes-optimal masked
phrase predictor with perfect vision, set beside the cross-modal diagnostic's per-phrase bits.

The demo's captions come from a known generator (shards.shapes_world.caption) over a known scene (raw/scenes.jsonl).
For each held-out phrase the oracle enumerates every caption the generator could have written for that scene, with
its probability (the caption form, the objects sampled, a covered object's shape unknown to the eye: uniform over
the 8), keeps those whose word-pieces outside the masked phrase equal the sentence's (same length: the [MASK]s give
the span's piece count), and predicts each masked piece from the posterior's marginal, as an MLM head predicts each
[MASK] alone. Its bits are what no model reading this image and sentence can beat on average; the rest of the
sentence leaves the phrase's object open when the image holds several the context fits (the caption names a random
sample of the shapes in view, and a relation to the next object fits several), so the ceiling falls with the
objects in view.

    python docs/grounding_demo/long_s54/ceiling.py OUT.md --config launch/configs/heldout_demo.yaml \
        --scenes data/demo/raw/scenes.jsonl --reference DIR/per_example_control.npz LABEL=DIR/per_example_model.npz ...

The .npz files are `python -m diagnostics.ablation --out DIR`'s per-example values (pretraining's end-of-run
ablation/per_example.npz too, with --set max_examples=400). information = the reference's bits - the model's none;
the ceiling = the reference's bits - the oracle's. Writes OUT.md and OUT.png (information by the objects in view).
"""

import argparse
import itertools
import json
import re
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import shards.shapes_world as sw  # noqa: E402
from diagnostics.ablation import reference_bits  # noqa: E402
from diagnostics.config import DiagnosticConfig  # noqa: E402
from diagnostics.data import PhraseData  # noqa: E402
from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from model.config import load_config  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402

COVERED = "<covered>"  # a covered object's shape word: the image does not show it


def captions(scene: sw.Scene) -> list[tuple[float, list[str]]]:
    """Every caption shards.shapes_world.caption can write for `scene`, as (probability, words), a covered object's
    shape left as COVERED; the probabilities sum to 1 (checked)."""
    objs, n = scene.objects, len(scene.objects)
    seen = [k for k, f in enumerate(sw.visible_fractions(scene)) if f >= sw.CAPTION_MIN_VISIBLE]

    def phrase(k: int) -> list[str]:
        o = objs[k]
        return ["a", o.size, "covered", COVERED] if o.covered else ["a", o.size, o.colour, o.category]

    out = []
    p_a = 0.55 if len(seen) >= 2 else 0.0
    p_b = 0.8 - p_a
    if p_a:
        for i, j in itertools.permutations(seen, 2):
            base = [*phrase(i), *sw.relation(objs[i], objs[j]).split(), *phrase(j)]
            p = p_a / (len(seen) * (len(seen) - 1))
            rest = [x for x in seen if x not in (i, j)]
            if rest:
                out.append((p * 0.6, base))
                for k in rest:
                    out.append((p * 0.4 / len(rest), [*base, "and", *phrase(k), *sw.relation(objs[k], objs[j]).split(),
                                                      "it"]))
            else:
                out.append((p, base))
    for r in (1, 2, 3):
        m = min(len(seen), r)
        picks = list(itertools.permutations(seen, m))
        for named in picks:
            listed = [phrase(k) for k in named]
            joined = listed[0] if m == 1 else [w for x in listed[:-1] for w in [*x, ","]][:-1] + ["and", *listed[-1]]
            out.append((p_b / 3 / len(picks), [sw.NUMBER_WORDS[n], "shapes", "including", *joined]))
    for k in seen:
        where = ["on", "the", "left"] if objs[k].centre[0] < scene.width / 2 else ["on", "the", "right"]
        out.append((0.2 / len(seen), [*phrase(k), *where, "among", sw.NUMBER_WORDS[n - 1], "other", "shapes"]))
    assert abs(sum(p for p, _ in out) - 1) < 1e-9
    return out


class Pieces:
    """Word -> word-pieces, cached (the demo's vocabulary is small), and a caption's pieces with a covered shape
    drawn each way."""

    def __init__(self, tokenizer):
        self.tokenizer, self.cache = tokenizer, {}

    def word(self, w: str) -> list[int]:
        if w not in self.cache:
            self.cache[w] = self.tokenizer([w], add_special_tokens=False, is_split_into_words=True)["input_ids"]
        return self.cache[w]

    def variants(self, p: float, words: list[str]):
        slots = [i for i, w in enumerate(words) if w == COVERED]
        for shapes in itertools.product(sw.CATEGORIES, repeat=len(slots)):
            filled = list(words)
            for i, s in zip(slots, shapes):
                filled[i] = s
            yield p / len(sw.CATEGORIES) ** len(slots), [t for w in filled for t in self.word(w)]


def oracle_bits(items, scenes: dict[str, sw.Scene], pieces: Pieces) -> np.ndarray:
    """Per item: the mean over its masked pieces of -log2 of the posterior marginal of the true piece."""
    bits = np.full(len(items), np.nan)
    by_image: dict[str, list[int]] = {}
    for n, it in enumerate(items):
        by_image.setdefault(it.image_id, []).append(n)
    for image_id, rows in tqdm(by_image.items(), desc="oracle"):
        by_length: dict[int, tuple[list, list]] = {}
        for p, words in captions(scenes[image_id]):
            for q, ids in pieces.variants(p, words):
                probs, seqs = by_length.setdefault(len(ids), ([], []))
                probs.append(q)
                seqs.append(ids)
        stacked = {length: (np.array(probs), np.array(seqs)) for length, (probs, seqs) in by_length.items()}
        for n in rows:
            it = items[n]
            ids, masked = it.ids.numpy(), it.phrase.numpy()
            probs, seqs = stacked[len(ids)]
            fit = (seqs[:, ~masked] == ids[~masked]).all(1)
            if not fit.any():
                raise ValueError(f"{image_id}: no caption the generator can write fits {it.ids.tolist()}")
            post = probs[fit] / probs[fit].sum()
            right = seqs[fit][:, masked] == ids[masked]  # [captions, masked pieces]
            bits[n] = float(np.mean(-np.log2(post @ right)))
    return bits


def cell(values: np.ndarray, clusters: np.ndarray, signed: bool = True) -> str:
    s = clustered_bootstrap(values, clusters, resamples=2000, seed=0)
    lo, hi = s["ci95"]
    f = "+.3f" if signed else ".3f"
    return f"{s['mean']:{f}} [{lo:{f}}, {hi:{f}}]"


def figure(path: Path, in_view: np.ndarray, clusters: np.ndarray, ceiling: np.ndarray,
           models: list[tuple[str, np.ndarray]]) -> None:
    """Information by the objects in view: the perfect-vision ceiling and each model, 95% intervals by image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted(set(in_view.tolist()))
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, (label, v) in enumerate([("perfect-vision ceiling", ceiling), *models]):
        means, errs = [], []
        for n in counts:
            pick = in_view == n
            b = clustered_bootstrap(v[pick], clusters[pick], resamples=2000, seed=0)
            means.append(b["mean"])
            errs.append([b["mean"] - b["ci95"][0], b["ci95"][1] - b["mean"]])
        ax.errorbar(np.array(counts) + 0.08 * (k - len(models) / 2), means, yerr=np.array(errs).T, marker="o",
                    capsize=3, label=label, color="black" if k == 0 else None, ls="--" if k == 0 else "-")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("objects in the image")
    ax.set_ylabel("information: reference - bits (per word-piece)")
    ax.set_title("What the image tells the masked phrase, against a perfect-vision reader")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--config", required=True)
    p.add_argument("--scenes", required=True, help="the corpus' raw/scenes.jsonl")
    p.add_argument("--reference", required=True, help="the reader without the image: its per-example .npz")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="the diagnostic's overrides the files were made with (e.g. max_examples=400, pretraining's)")
    p.add_argument("--dump", help="write the oracle's per-phrase bits here (.npz)")
    p.add_argument("models", nargs="+", metavar="LABEL=NPZ")
    args = p.parse_args()
    cfg = load_config(DiagnosticConfig, args.config, args.set)
    tokenizer = load_tokenizer(None)
    data = PhraseData(cfg, tokenizer, 9)
    scenes = {}
    for line in open(args.scenes):
        s = json.loads(line)
        scenes[Path(s["image"]).stem] = sw.Scene(s["width"], s["height"], (0, 0, 0), [
            sw.ShapeObject(o["category"], o["colour"], o["size"], tuple(o["box"]), o["covered"]) for o in s["objects"]])
    oracle = oracle_bits(data.items, scenes, Pieces(tokenizer))
    clusters = np.array([it.image_id for it in data.items])
    if args.dump:
        np.savez_compressed(args.dump, oracle=oracle, image_id=clusters)
    reference = np.load(args.reference)
    ref = reference_bits(reference)
    models = []
    for spec in args.models:
        label, path = spec.split("=", 1)
        v = np.load(path)
        models.append((label, v["v4l/none"], v["v4l/all"]))
    for name, arr in (("reference", ref), *((label, none) for label, none, _ in models)):
        if len(arr) != len(data):
            raise ValueError(f"{name}: {len(arr)} phrases, the held-out data ({cfg.flickr_root}) has {len(data)}")
    annotations = Path(cfg.flickr_root) / "Annotations"
    objects = {i: len(re.findall(r"<object>", (annotations / f"{i}.xml").read_text())) for i in set(clusters)}
    in_view = np.array([objects[i] for i in clusters])
    lines = [f"### The perfect-vision ceiling on V4L's information ({len(data)} phrases, {len(set(clusters))} images; "
             "bits per phrase word-piece, 95% interval by image)", "",
             f"reference (a reader without the image): `{args.reference}`; oracle: the Bayes-optimal MLM with perfect "
             "vision (ceiling.py)", "",
             "| objects in view | phrases (images) | reference | oracle | ceiling: reference - oracle | "
             + " | ".join(f"{label}: none | {label}: information | {label}: share of the ceiling | {label}: all - none"
                          for label, _, _ in models) + " |",
             "|---" * (5 + 4 * len(models)) + "|"]
    for n in (*range(2, 9), None):
        pick = in_view == n if n is not None else np.ones(len(data), bool)
        if not pick.any():
            continue
        c = clusters[pick]
        row = [str(n or "**all**"), f"{int(pick.sum())} ({len(set(c))})", f"{ref[pick].mean():.3f}",
               cell(oracle[pick], c, signed=False), cell(ref[pick] - oracle[pick], c)]
        for _, none, ablated in models:
            info = ref[pick] - none[pick]
            row += [f"{none[pick].mean():.3f}", cell(info, c),
                    f"{info.mean() / (ref[pick] - oracle[pick]).mean():.2f}", cell(ablated[pick] - none[pick], c)]
        lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    figure(Path(args.out).with_suffix(".png"), in_view, clusters, ref - oracle,
           [(label, ref - none) for label, none, _ in models])
    print(text)
    print(f"oracle bits: mean {np.nanmean(oracle):.4f}, zero on {np.mean(oracle < 1e-9):.3f} of phrases, "
          f"max {np.nanmax(oracle):.3f}")


if __name__ == "__main__":
    main()
