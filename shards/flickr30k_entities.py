"""Flickr30k Entities as distributed (Plummer et al. 2015): the cross-modal ablation diagnostic's data.

    <root>/Sentences/<image_id>.txt    one caption per line; phrases marked `[/EN#<chain>/<type>... words]`,
                                       chain 0 = not visual
    <root>/Annotations/<image_id>.xml  PASCAL-VOC-like: `<size>`, then `<object>`s, each with one or more
                                       `<name>` chain ids and a `<bndbox>` (1-based inclusive pixel corners),
                                       or `<nobndbox>`/`<scene>` flags instead of a box
    <root>/<split>.txt                 image ids of a split (train / val / test), one per line

`load_phrase_examples` yields one example per (sentence, phrase) whose chain has at least one box,
with the gold boxes in continuous 0-based pixels (x2/y2 exclusive; `model.boxes.from_one_based_inclusive`).
Malformed files raise `Flickr30kFormatError` naming the file and line (or object); phrases that are
not visual, or whose chain has no box, are counted, not silently dropped.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from model.boxes import from_one_based_inclusive

_TAG = re.compile(r"^\[/EN#(\d+)((?:/[^/\s]+)+)$")


class Flickr30kFormatError(ValueError):
    """A Sentences or Annotations file that does not follow the distributed format."""


@dataclass
class Phrase:
    first_word: int  # index of the phrase's first word in the sentence's words
    words: list[str]
    chain: str  # coreference chain id; "0" = not visual
    types: list[str]  # coarse types: people, clothing, bodyparts, animals, vehicles, instruments, scene, other

    @property
    def end(self) -> int:  # one past the last word
        return self.first_word + len(self.words)


@dataclass
class Sentence:
    words: list[str]
    phrases: list[Phrase]

    @property
    def text(self) -> str:
        return " ".join(self.words)


@dataclass
class ImageAnnotation:
    width: int
    height: int
    boxes: dict[str, torch.Tensor] = field(default_factory=dict)  # chain -> [k, 4] 0-based continuous pixels
    scene: list[str] = field(default_factory=list)  # chains annotated as the whole scene
    nobox: list[str] = field(default_factory=list)  # chains not visible in the image


@dataclass
class PhraseExample:
    image_id: str
    sentence_index: int  # line of the Sentences file, 0-based among non-empty lines
    sentence: Sentence
    phrase: Phrase
    gold_boxes: torch.Tensor  # [k, 4] every box of the phrase's chain
    width: int
    height: int


def parse_sentence(line: str, where: str) -> Sentence:
    words: list[str] = []
    phrases: list[Phrase] = []
    open_phrase: Phrase | None = None
    for token in line.split():
        if open_phrase is None and token.startswith("[/EN#"):
            m = _TAG.match(token)
            if not m:
                raise Flickr30kFormatError(f"{where}: bad entity tag '{token}' (expected [/EN#<chain>/<type>)")
            open_phrase = Phrase(len(words), [], m.group(1), m.group(2).strip("/").split("/"))
            continue
        if open_phrase is not None and token.startswith("[/EN#"):
            raise Flickr30kFormatError(f"{where}: entity tag '{token}' inside an open phrase")
        closes = open_phrase is not None and "]" in token
        # the distributed files space-separate punctuation; "word]," is read as "word]" ","
        word, trailing = token.split("]", 1) if closes else (token, "")
        if word:
            words.append(word)
            if open_phrase is not None:
                open_phrase.words.append(word)
        if closes:
            if not open_phrase.words:
                raise Flickr30kFormatError(f"{where}: empty phrase for chain {open_phrase.chain}")
            phrases.append(open_phrase)
            open_phrase = None
            if trailing:
                words.append(trailing)
    if open_phrase is not None:
        raise Flickr30kFormatError(f"{where}: phrase for chain {open_phrase.chain} is never closed with ']'")
    return Sentence(words, phrases)


def parse_sentences(path: str | Path) -> list[Sentence]:
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                out.append(parse_sentence(line.strip(), f"{path}:{lineno}"))
    return out


def _int(node: ET.Element, tag: str, where: str) -> int:
    child = node.find(tag)
    if child is None or child.text is None:
        raise Flickr30kFormatError(f"{where}: missing <{tag}>")
    try:
        return int(float(child.text.strip()))
    except ValueError:
        raise Flickr30kFormatError(f"{where}: <{tag}> is '{child.text.strip()}', not a number") from None


def parse_annotation(path: str | Path) -> ImageAnnotation:
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        raise Flickr30kFormatError(f"{path}: not well-formed XML ({e})") from None
    size = root.find("size")
    if size is None:
        raise Flickr30kFormatError(f"{path}: missing <size>")
    ann = ImageAnnotation(_int(size, "width", f"{path} <size>"), _int(size, "height", f"{path} <size>"))
    boxes: dict[str, list[list[int]]] = {}
    for k, obj in enumerate(root.findall("object")):
        where = f"{path} <object> #{k + 1}"
        names = [n.text.strip() for n in obj.findall("name") if n.text and n.text.strip()]
        if not names:
            raise Flickr30kFormatError(f"{where}: no <name> (chain id)")
        box = obj.find("bndbox")
        if box is not None:
            corners = [_int(box, t, where) for t in ("xmin", "ymin", "xmax", "ymax")]
            if corners[2] < corners[0] or corners[3] < corners[1]:
                raise Flickr30kFormatError(f"{where}: box {corners} has xmax < xmin or ymax < ymin")
            for name in names:
                boxes.setdefault(name, []).append(corners)
            continue
        for flag, target in (("nobndbox", ann.nobox), ("scene", ann.scene)):
            node = obj.find(flag)
            if node is not None and node.text and int(node.text.strip() or 0) > 0:
                target.extend(names)
    ann.boxes = {chain: from_one_based_inclusive(torch.tensor(b)) for chain, b in boxes.items()}
    return ann


def read_split(root: str | Path, split: str) -> list[str]:
    path = Path(root) / f"{split}.txt"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no split list (one image id per line) for split '{split}'")
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def load_phrase_examples(root: str | Path, split: str, limit_images: int | None = None
                         ) -> tuple[list[PhraseExample], Counter]:
    """Every (sentence, phrase) of the split whose chain has at least one box, and a count of the
    phrases left out by reason."""
    root = Path(root)
    examples: list[PhraseExample] = []
    left_out: Counter = Counter()
    ids = read_split(root, split)
    for image_id in ids[:limit_images] if limit_images else ids:
        ann = parse_annotation(root / "Annotations" / f"{image_id}.xml")
        for s_index, sentence in enumerate(parse_sentences(root / "Sentences" / f"{image_id}.txt")):
            for phrase in sentence.phrases:
                if phrase.chain == "0":
                    left_out["not visual (chain 0)"] += 1
                elif phrase.chain not in ann.boxes:
                    left_out["chain has no box"] += 1
                else:
                    examples.append(PhraseExample(image_id, s_index, sentence, phrase, ann.boxes[phrase.chain],
                                                  ann.width, ann.height))
    return examples, left_out
