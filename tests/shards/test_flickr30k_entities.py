import json

import pytest
import torch

from shards.flickr30k_entities import (
    Flickr30kFormatError,
    load_phrase_examples,
    parse_annotation,
    parse_sentence,
    parse_sentences,
)

# Written by hand in the distributed format (from the dataset's README conventions).
LINE = ("[/EN#18/people A child] in [/EN#19/clothing/other a pink dress] is climbing up "
        "[/EN#0/notvisual a set] of stairs in [/EN#21/scene an entry way] .")

XML = """<annotation>
  <filename>1000.jpg</filename>
  <size><width>500</width><height>333</height><depth>3</depth></size>
  <object><name>18</name><bndbox><xmin>1</xmin><ymin>11</ymin><xmax>100</xmax><ymax>200</ymax></bndbox></object>
  <object><name>19</name><name>18</name><bndbox><xmin>51</xmin><ymin>61</ymin><xmax>80</xmax><ymax>90</ymax></bndbox>
  </object>
  <object><name>21</name><nobndbox>0</nobndbox><scene>1</scene></object>
  <object><name>22</name><nobndbox>1</nobndbox><scene>0</scene></object>
</annotation>
"""


def test_sentence_phrases_words_chains_and_types():
    s = parse_sentence(LINE, "x:1")
    assert s.text == "A child in a pink dress is climbing up a set of stairs in an entry way ."
    assert [(p.first_word, p.words, p.chain, p.types) for p in s.phrases] == [
        (0, ["A", "child"], "18", ["people"]),
        (3, ["a", "pink", "dress"], "19", ["clothing", "other"]),
        (9, ["a", "set"], "0", ["notvisual"]),
        (14, ["an", "entry", "way"], "21", ["scene"]),
    ]
    assert s.words[s.phrases[1].first_word: s.phrases[1].end] == ["a", "pink", "dress"]


def test_punctuation_glued_to_a_closing_bracket_becomes_a_word():
    s = parse_sentence("[/EN#1/other a star], [/EN#2/other a moon]", "x:1")
    assert s.words == ["a", "star", ",", "a", "moon"]
    assert [p.first_word for p in s.phrases] == [0, 3]


@pytest.mark.parametrize("line, message", [
    ("[/EN#4/people a man walks", "never closed"),
    ("[/EN#x/people a] man", "bad entity tag"),
    ("[/EN#4/people a [/EN#5/people b] c]", "inside an open phrase"),
])
def test_malformed_sentences_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "1.txt"
    path.write_text(LINE + "\n\n" + line + "\n")
    with pytest.raises(Flickr30kFormatError, match=rf"1.txt:3: .*{message}"):
        parse_sentences(path)


def test_annotation_boxes_one_based_inclusive_to_continuous(tmp_path):
    path = tmp_path / "1000.xml"
    path.write_text(XML)
    ann = parse_annotation(path)
    assert (ann.width, ann.height) == (500, 333)
    # xmin=1..xmax=100 covers pixels 1..100 (1-based): [0, 100) 0-based, width 100
    assert ann.boxes["18"].tolist() == [[0, 10, 100, 200], [50, 60, 80, 90]]  # two objects name chain 18
    assert ann.boxes["19"].tolist() == [[50, 60, 80, 90]]
    assert ann.scene == ["21"] and ann.nobox == ["22"]


def test_bad_annotation_names_the_object(tmp_path):
    path = tmp_path / "1.xml"
    path.write_text(XML.replace("<xmax>80</xmax>", "<xmax>eighty</xmax>"))
    with pytest.raises(Flickr30kFormatError, match=r"1.xml <object> #2: <xmax> is 'eighty'"):
        parse_annotation(path)


def test_examples_one_per_phrase_whose_chain_has_a_box(tmp_path):
    (tmp_path / "Sentences").mkdir()
    (tmp_path / "Annotations").mkdir()
    (tmp_path / "Sentences" / "1000.txt").write_text(LINE + "\n[/EN#19/clothing The dress] is [/EN#22/other pink] .\n")
    (tmp_path / "Annotations" / "1000.xml").write_text(XML)
    (tmp_path / "val.txt").write_text("1000\n")
    examples, left_out = load_phrase_examples(tmp_path, "val")
    assert [(e.sentence_index, e.phrase.chain) for e in examples] == [(0, "18"), (0, "19"), (1, "19")]
    assert examples[0].gold_boxes.shape == (2, 4)
    # chain 0 is not visual; the scene chain 21 and the nobox chain 22 have no box
    assert left_out == {"not visual (chain 0)": 1, "chain has no box": 2}
    with pytest.raises(FileNotFoundError, match="test.txt"):
        load_phrase_examples(tmp_path, "test")


def test_demo_corpus_in_the_official_format(demo_corpus):
    root = demo_corpus / "raw" / "flickr30k_entities"
    scenes = {json.loads(line)["image"].split("/")[-1][:-4]: json.loads(line)
              for line in (demo_corpus / "raw" / "scenes.jsonl").read_text().splitlines()}
    ids = (root / "val.txt").read_text().split()
    assert len(ids) == 8  # the demo's val images
    examples, left_out = load_phrase_examples(root, "val")
    assert examples and all(len(parse_sentences(root / "Sentences" / f"{i}.txt")) == 5 for i in ids)
    for ex in examples:
        objects = scenes[ex.image_id]["objects"]
        if ex.phrase.words[-1] in ("it", "shapes"):
            continue
        # the phrase names an object: its single gold box is that object's box, to the pixel
        (box,) = ex.gold_boxes.tolist()
        match = [o for o in objects if all(abs(a - b) <= 1.0 for a, b in zip(o["box"], box))]
        assert match and ex.phrase.words[-1] == match[0]["category"], (ex.phrase, box)
    group = [ex for ex in examples if ex.phrase.words[-1] == "shapes"]
    assert all(len(ex.gold_boxes) == len(scenes[ex.image_id]["objects"]) for ex in group)
    boxes = [json.loads(line) for line in (root / "boxes_val.jsonl").read_text().splitlines()]
    assert sorted(b["image"] for b in boxes) == sorted(f"{i}.jpg" for i in ids)
    assert set(left_out) <= {"not visual (chain 0)"}
    assert torch.is_tensor(examples[0].gold_boxes)
