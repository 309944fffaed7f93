"""The shapes world's word categories the grounding tables score (colour, shape, covered shape, size, relation,
place, number), each one's chance, and the masked-region classification splits."""

from __future__ import annotations

from shards.shapes_world import CATEGORIES as SHAPES
from shards.shapes_world import COLOURS, NUMBER_WORDS, SIZES

CATEGORIES: dict[str, tuple[str, ...]] = {
    "colour": tuple(COLOURS),
    "shape": tuple(SHAPES),
    # a shape word right after "covered" names an object drawn under the grey cloth: its shape is not in the
    # image (shards.shapes_world), so no model can read it there. Scored apart, it keeps "shape" a test of
    # vision (in the shapes world 16% of shape words are these; with them, a model that reads every visible
    # shape right would score ~0.88)
    "covered_shape": tuple(SHAPES),
    "size": tuple(SIZES),
    # a relation of two objects ("a star left of a circle", "a star above a circle"): read by comparing two boxes
    "relation": ("left", "right", "above", "below"),
    # a place in the picture ("a star on the left among two other shapes"): one box against the image's middle.
    # Scored apart: counted together, a model that compares boxes and one that places a box read alike
    "place": ("left", "right"),
    "number": tuple(NUMBER_WORDS),
}


# A word is masked as one [MASK] per word-piece, so a name whose piece count no other name of its category has
# is given away by its span: "hexagon" (he ##xa ##gon) is the only shape of three pieces, and a text-only model
# names every masked hexagon (the matched control: 77 of 77 held-out ones, docs/ABLATION.md). Such words are
# scored apart, as `named_by_span`, so that each category measures what the span does not tell.
NAMED_BY_SPAN = "named_by_span"

REPORTED = (*CATEGORIES, NAMED_BY_SPAN)

CHANCE = {name: 1.0 / len(words) for name, words in CATEGORIES.items()} | {NAMED_BY_SPAN: 1.0}


def span_naming_lengths(tokenizer) -> dict[str, set[int]]:
    """Per category, the word-piece counts that exactly one of its names has."""
    out = {}
    for name, words in CATEGORIES.items():
        lengths = [len(tokenizer.tokenize(w)) for w in words]
        out[name] = {n for n in lengths if lengths.count(n) == 1}
    return out


# Masked RoI classification splits. `visible`: chosen, pixels kept; of those `visible_in_view`, the objects the image
# shows, and `visible_covered`, those under the grey cloth, whose class the pixels do not hold (the shapes world
# makes them a test of language; the detector warm-up neither trains nor scores them, and names 0.12 of them, chance
# 0.125, where it names 0.91 of the others: session 84). `zeroed_named` / `zeroed_unnamed`: pixels zeroed, the caption
# names the object or not
MRC_SPLITS = ("visible", "visible_in_view", "visible_covered", "zeroed_named", "zeroed_unnamed")


def word_category(words: list[str], index: int) -> str | None:
    """The category of words[index] in its sentence (None: not scored)."""
    w = words[index].lower()
    for name, vocab in CATEGORIES.items():
        if name not in ("covered_shape", "place") and w in vocab:
            if name == "shape" and index > 0 and words[index - 1].lower() == "covered":
                return "covered_shape"
            if name == "relation" and index > 0 and words[index - 1].lower() == "the":  # "on the left"
                return "place" if w in CATEGORIES["place"] else None
            return name
    return None


def names_covered(phrase: list[str]) -> bool:
    """Whether a phrase names an object under the cloth ("a small covered star"), as `word_category` reads it."""
    return any(word_category(phrase, i) == "covered_shape" for i in range(len(phrase)))
