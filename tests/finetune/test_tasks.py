"""VQA, VCR and RefCOCO+: readers on hand-written files in the official formats, the official VQA
normaliser and accuracy against hand-computed cases, Q->AR accounting, IoU accuracy, the restricted
unpickler, and each task training from a pretrained export on the demo corpus' task data."""

import json
import os
import pickle
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from finetune.common import encode
from finetune.refcoco import RefFormatError, read_detections, read_instances, read_refs, safe_pickle_load
from finetune.vcr import GENDER_NEUTRAL_NAMES, VCRFormatError, instance_mask, q2ar, read_vcr_jsonl, words_of
from finetune.vqa import build_answer_vocab
from finetune.vqa_score import normalise_answer, read_vqa, soft_score, vqa_accuracy
from shards.images import ImageConfig, load_image
from shards.skips import SkipLog
from tests.toy_engine import one_process_env
from train.loaders import EpochLoader

ROOT = Path(__file__).resolve().parents[2]


# --- VQA ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, expected", [
    ("Two dogs.", "2 dogs"),  # number word, final period
    ("the Red", "red"),  # article dropped, lower case
    ("isnt", "isn't"),  # contraction restored
    ("yes!", "yes"),
    ("1,000", "1000"),  # a comma between digits: punctuation removed, not spaced
    ("left-hand", "left hand"),  # no space next to '-': replaced by a space
    ("3.5", "3.5"),  # a period between digits stays
])
def test_answer_normalisation(raw, expected):
    assert normalise_answer(raw) == expected


def test_vqa_accuracy_hand_computed():
    # 3 of 10 say "2": leaving out one of them leaves 2 matches (2/3), leaving out another leaves 3 (1)
    assert vqa_accuracy("2", ["2"] * 3 + ["3"] * 7) == pytest.approx((3 * 2 / 3 + 7 * 1) / 10)
    assert vqa_accuracy("3", ["2"] * 3 + ["3"] * 7) == pytest.approx(1.0)
    assert vqa_accuracy("4", ["2"] * 3 + ["3"] * 7) == 0.0
    # humans disagree, so the prediction is normalised: "two" -> "2"
    assert vqa_accuracy("two", ["2"] * 3 + ["3"] * 7) == pytest.approx(0.9)
    # all ten agree: the official code normalises nothing, and "two" does not match "2"
    assert vqa_accuracy("two", ["2"] * 10) == 0.0
    # one match: every subset keeps at most one -> 9/10 * 1/3
    assert vqa_accuracy("cat", ["cat"] + ["dog"] * 9) == pytest.approx(0.9 / 3)
    # humans disagree: their answers are normalised in full too ("two" -> "2"), so "2" matches all four
    assert vqa_accuracy("2", ["two"] * 4 + ["three"] * 6) == pytest.approx(1.0)
    # "a dog.", "Dog", "the dog" all become "dog": 3 matches, as the first case
    assert vqa_accuracy("a dog.", ["Dog"] * 2 + ["the dog"] + ["cat"] * 7) == pytest.approx(0.9)


def _official_vqa_eval(prediction: str, answers: list[str], legacy: bool = False) -> float:
    """vqaEval.py's loop for one question, transcribed statement by statement (answers as dicts with their
    answer_id, leave-one-out by dict inequality), on its own processPunctuation/processDigitArticle; legacy:
    the loop as it was before commit a013f00 ("Fixed processing answers bug", March 2021)."""
    import re

    contractions = {"dont": "don't", "isnt": "isn't", "thats": "that's"}
    manual_map = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                  "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
    articles = ["a", "an", "the"]
    period_strip = re.compile(r"(?!<=\d)(\.)(?!\d)")
    comma_strip = re.compile(r"(\d)(\,)(\d)")
    punct = [";", r"/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?",
             "!"]

    def process_punctuation(in_text):
        out_text = in_text
        for p in punct:
            if (p + " " in in_text or " " + p in in_text) or (re.search(comma_strip, in_text) is not None):
                out_text = out_text.replace(p, "")
            else:
                out_text = out_text.replace(p, " ")
        return period_strip.sub("", out_text, re.UNICODE)

    def process_digit_article(in_text):
        out_text = []
        for word in in_text.lower().split():
            word = manual_map.setdefault(word, word)
            if word not in articles:
                out_text.append(word)
        for word_id, word in enumerate(out_text):
            if word in contractions:
                out_text[word_id] = contractions[word]
        return " ".join(out_text)

    gts = [{"answer": a, "answer_id": i + 1} for i, a in enumerate(answers)]
    if legacy:
        res_ans = prediction.replace("\n", " ").replace("\t", " ").strip()
        res_ans = process_digit_article(process_punctuation(res_ans))
        if len({a["answer"] for a in gts}) > 1:
            for ans in gts:
                ans["answer"] = process_punctuation(ans["answer"])
        acc = []
        for gt in gts:
            others = [item for item in gts if item != gt]
            acc.append(min(1, len([item for item in others if item["answer"] == res_ans]) / 3))
        return sum(acc) / len(acc)
    for ans in gts:
        ans["answer"] = ans["answer"].replace("\n", " ").replace("\t", " ").strip()
    res_ans = prediction.replace("\n", " ").replace("\t", " ").strip()
    if len({a["answer"] for a in gts}) > 1:
        for ans in gts:
            ans["answer"] = process_digit_article(process_punctuation(ans["answer"]))
        res_ans = process_digit_article(process_punctuation(res_ans))
    acc = []
    for gt in gts:
        others = [item for item in gts if item != gt]
        acc.append(min(1, len([item for item in others if item["answer"] == res_ans]) / 3))
    return sum(acc) / len(acc)


def test_vqa_accuracy_equals_the_official_loop():
    pool = ["two", "2", "Two", "the dog", "dog", "a dog.", "dont", "don't", "yes", "no", "none", "0", "red, blue",
            "3,000", "t-shirt", "t shirt"]
    rng = random.Random(0)
    cases = [("2", ["two"] * 4 + ["three"] * 6), ("two", ["2"] * 10), ("Two", ["Two"] * 10)]
    for _ in range(400):
        answers = [rng.choice(pool[: rng.randint(1, len(pool))]) for _ in range(10)]
        cases.append((rng.choice(pool), answers))
    for prediction, answers in cases:
        assert vqa_accuracy(prediction, answers) == pytest.approx(_official_vqa_eval(prediction, answers)), \
            (prediction, answers)
        assert vqa_accuracy(prediction, answers, legacy=True) == pytest.approx(
            _official_vqa_eval(prediction, answers, legacy=True)), (prediction, answers)
    for count in range(11):
        answers = ["x"] * count + ["y"] * (10 - count)
        assert soft_score(count) == pytest.approx(vqa_accuracy("x", answers) if count < 10 else 1.0)


def test_vqa_accuracy_legacy_hand_computed():
    """The 2015-2020 rules against the 2021 ones, on cases worked by hand: the old evaluation normalised the
    prediction in full but the human answers only for punctuation, and only when they disagreed."""
    cases = [  # prediction, human answers, legacy, current
        ("2", ["two"] * 4 + ["three"] * 6, 0.0, 1.0),  # "two" stays a word for the humans in legacy
        ("two", ["2"] * 10, 1.0, 0.0),  # agreeing humans: legacy maps the prediction to "2", 2021 compares raw
        ("don't", ["dont"] * 5 + ["no"] * 5, 0.0, 1.0),  # contraction: only 2021 fixes the humans' "dont"
        ("dog", ["a dog"] * 2 + ["cat"] * 8, 0.0, (2 * 1 / 3 + 8 * 2 / 3) / 10),  # articles: only 2021 drops them
        ("yes", ["yes."] * 4 + ["no"] * 6, 1.0, 1.0),  # the period goes in both
        ("dog", ["the dog"] * 3 + ["dog"] * 7, 1.0, 1.0),
    ]
    for prediction, answers, legacy, current in cases:
        assert vqa_accuracy(prediction, answers, legacy=True) == pytest.approx(legacy), (prediction, answers)
        assert vqa_accuracy(prediction, answers) == pytest.approx(current), (prediction, answers)


def _vqa_files(tmp_path):
    q = tmp_path / "v2_OpenEnded_mscoco_train2014_questions.json"
    q.write_text(json.dumps({"questions": [
        {"image_id": 9, "question": "What color?", "question_id": 90},
        {"image_id": 9, "question": "How many?", "question_id": 91},
        {"image_id": 4, "question": "Is it?", "question_id": 40}]}))
    a = tmp_path / "v2_mscoco_train2014_annotations.json"
    ans = [{"answer": x, "answer_confidence": "yes", "answer_id": i + 1} for i, x in enumerate(["red"] * 10)]
    a.write_text(json.dumps({"annotations": [
        {"question_id": 90, "image_id": 9, "answer_type": "other", "question_type": "what color",
         "multiple_choice_answer": "Red", "answers": ans},
        {"question_id": 40, "image_id": 4, "answer_type": "yes/no", "question_type": "is it",
         "multiple_choice_answer": "the red", "answers": ans}]}))
    return q, a


def test_vqa_score_cli_scores_a_results_file(tmp_path, capsys):
    from finetune.vqa_score import main as vqa_score

    q, a = _vqa_files(tmp_path)
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"question_id": 90, "answer": "red"}, {"question_id": 40, "answer": "blue"}]))
    out = tmp_path / "metrics.json"
    assert vqa_score(["--results", str(results), "--questions", str(q), "--annotations", str(a),
                      "--out", str(out)]) == 0
    metrics = json.loads(out.read_text())
    # question 90 right (1.0), question 40 wrong (0.0): per answer type 100 / 0, overall 50
    assert metrics["overall"] == 50.0 and metrics["per_answer_type"] == {"other": 100.0, "yes/no": 0.0}
    assert "Overall Accuracy is: 50.00" in capsys.readouterr().out
    # two images, one right and one wrong question: resampling images gives 0, 50 or 100
    assert metrics["images"] == 2 and metrics["overall_ci95"] == [0.0, 100.0] and metrics["vqa_eval"] == "2021"
    from finetune.vqa import main as vqa_main  # the same command as `python -m finetune.vqa score`

    assert vqa_main(["score", "--results", str(results), "--questions", str(q), "--annotations", str(a),
                     "--legacy", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["vqa_eval"] == "2015-2020 (legacy)"
    capsys.readouterr()
    # the server's rules: every annotated question answered once, nothing else
    results.write_text(json.dumps([{"question_id": 90, "answer": "red"}]))
    assert vqa_score(["--results", str(results), "--questions", str(q), "--annotations", str(a)]) == 2
    assert "leave 1 of 2 questions unanswered, e.g. question_id 40" in capsys.readouterr().err
    assert vqa_score(["--results", str(results), "--questions", str(q), "--annotations", str(a),
                      "--allow-missing", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["overall"] == 100.0
    for bad, message in (([{"question_id": 90, "answer": "red"}] * 2, r"\[1\]: question_id 90 is answered twice"),
                         ([{"question_id": 90}], r"\[0\]: missing or bad field 'answer'"),
                         ([{"question_id": 7, "answer": "x"}], "does not annotate, e.g. question_id 7")):
        results.write_text(json.dumps(bad))
        assert vqa_score(["--results", str(results), "--questions", str(q), "--annotations", str(a)]) == 2
        assert re.search(message, capsys.readouterr().err)


def test_vqa_reader_joins_and_counts_skips(tmp_path):
    q, a = _vqa_files(tmp_path)
    skips = SkipLog()
    read = read_vqa(q, a, skips)
    assert [x.question_id for x in read] == [90, 40]
    assert read[0].answers == ["red"] * 10 and read[0].answer_type == "other" and read[1].question_type == "is it"
    assert skips.reasons == {"question without annotation": 1}
    assert skips.examples["question without annotation"] == [f"{q}: question_id 91: question without annotation"]
    assert build_answer_vocab(read, 2) == ["red"]  # "Red" and "the red" normalise to the same answer
    assert build_answer_vocab(read, 3) == []
    q.write_text(json.dumps({"questions": [{"image_id": 9, "question_id": 90}]}))
    with pytest.raises(ValueError, match=r"questions\[0\].*'question'"):
        read_vqa(q, a)


# --- VCR ------------------------------------------------------------------------------------------------

def test_vcr_references_become_words_with_regions():
    objects = ["person", "dog", "person", "chair"]
    words = words_of(["Why", "is", [0, 2], "next", "to", [1], "?"], objects)
    assert words == [("Why", -1), ("is", -1), ("Casey", 0), ("and", -1), ("Jessie", 2), ("next", -1), ("to", -1),
                     ("dog", 1), ("?", -1)]
    many = ["person"] * 17
    assert words_of([[16]], many) == [(GENDER_NEUTRAL_NAMES[1], 16)]  # cycles through the 15 names
    with pytest.raises(VCRFormatError, match="outside the 4 objects"):
        words_of([[4]], objects)


def test_vcr_reader(tmp_path):
    rec = {"question": ["What", "is", [0], "doing", "?"], "answer_choices": [["Sitting", "."]] * 4,
           "rationale_choices": [[[0], "is", "on", [1], "."]] * 4, "answer_label": 2, "rationale_label": 0,
           "objects": ["person", "chair"], "img_fn": "movie/a.jpg", "metadata_fn": "movie/a.json", "annot_id": "val-0"}
    path = tmp_path / "val.jsonl"
    path.write_text(json.dumps(rec) + "\n\n" + json.dumps({**rec, "annot_id": "val-1"}) + "\n")
    assert [r["annot_id"] for r in read_vcr_jsonl(path, need_labels=True)] == ["val-0", "val-1"]
    bad = dict(rec)
    del bad["rationale_label"]
    path.write_text(json.dumps(rec) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(VCRFormatError, match=r"val.jsonl:2: missing \['rationale_label'\]"):
        read_vcr_jsonl(path, need_labels=True)
    assert len(read_vcr_jsonl(path, need_labels=False)) == 2  # the test split has no labels


def test_vcr_instance_masks_by_hand():
    """A triangle (0,0) (3,0) (0,3) in a 4x4 frame. The even-odd rule with edges half-open in y (scikit-image
    before 0.18, the released checkpoints'): cell (r, c) is in when r < 3 and c < 3 - r, the hypotenuse and the
    bottom vertex out. Edges inside (scikit-image >= 0.18): c <= 3 - r. The box's corner and side + 1 set the
    frame: the same triangle drawn twice as large at (10, 20) gives the same cells; vertices beyond the box are
    clamped to its border; several polygons are a union; no polygon, no cell."""
    half_open = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    edges_in = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float32)
    triangle = [[[0, 0], [3, 0], [0, 3]]]
    assert torch.equal(instance_mask(triangle, [0, 0, 3, 3], 4), half_open)
    assert torch.equal(instance_mask(triangle, [0, 0, 3, 3], 4, boundary=True), edges_in)
    scaled = [[[10, 20], [16, 20], [10, 26]]]  # side + 1 = 8 pixels for 4 cells
    assert torch.equal(instance_mask(scaled, [10, 20, 17, 27, 0.9], 4), half_open)
    beyond = [[[-5, -5], [3, -5], [-5, 3]]]  # clamped to (0,0) (3,0) (0,3)
    assert torch.equal(instance_mask(beyond, [0, 0, 3, 3], 4), half_open)
    square = [[2, 2], [3, 2], [3, 3], [2, 3]]  # half-open: only its corner cell (2, 2) is in
    union = instance_mask(triangle + [square], [0, 0, 3, 3], 4)
    assert torch.equal(union, half_open + torch.tensor([[0] * 4, [0] * 4, [0, 0, 1, 0], [0] * 4]))
    assert instance_mask([], [0, 0, 3, 3], 4).sum() == 0


def test_vcr_reads_segmentations_as_region_masks(tmp_path):
    """data.segmentation_masks: each object's `segms` of the metadata becomes its [S, S] mask in `region_masks`
    (padding boxes zero), in its box's frame whatever the resize; a metadata file without segms is refused by
    name."""
    from PIL import Image

    from finetune.vcr import VCRConfig, VCRSet
    from model.config import load_config
    from shards.tokenizer import load_tokenizer

    (tmp_path / "movie").mkdir()
    Image.new("RGB", (64, 48), "white").save(tmp_path / "movie/a.jpg")
    triangle = [[[4, 4], [10, 4], [4, 10]]]  # in box (4, 4, 11, 11): the hand-computed triangle, twice as large
    meta = {"boxes": [[4, 4, 11, 11, 0.9], [20, 10, 40, 30, 0.8]], "segms": [triangle, []], "width": 64, "height": 48}
    (tmp_path / "movie/a.json").write_text(json.dumps(meta))
    rec = {"question": ["What", "is", [0], "doing", "?"], "answer_choices": [["Sitting", "."]] * 4,
           "rationale_choices": [[[0], "is", "on", [1], "."]] * 4, "answer_label": 2, "rationale_label": 0,
           "objects": ["person", "chair"], "img_fn": "movie/a.jpg", "metadata_fn": "movie/a.json", "annot_id": "val-0"}
    (tmp_path / "val.jsonl").write_text(json.dumps(rec) + "\n")
    cfg = load_config(VCRConfig, None, [f"data.root={tmp_path}", f"data.images={tmp_path}",
                                        "data.segmentation_masks=true", "data.mask_size=4", "image.short_side=96",
                                        "image.long_side=128"])
    data = VCRSet(cfg, "val", load_tokenizer(None))
    batch = data.batch([0, 0])
    assert batch["region_masks"].shape == (2, 2, 4, 4)
    assert torch.equal(batch["region_masks"][0, 0], instance_mask(triangle, meta["boxes"][0], 4))
    assert batch["region_masks"][0, 0].sum() == 6 and batch["region_masks"][0, 1].sum() == 0
    assert "region_masks" not in VCRSet(load_config(VCRConfig, None, [f"data.root={tmp_path}",
                                                                      f"data.images={tmp_path}"]),
                                        "val", load_tokenizer(None)).batch([0])
    (tmp_path / "movie/a.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "segms"}))
    with pytest.raises(VCRFormatError, match=r"val.jsonl:1: metadata .*a.json: data.segmentation_masks needs"):
        data.batch([0])


def test_q2ar_counts_a_question_right_only_when_both_are():
    qa = {"a": {"probs": [0.7, 0.1, 0.1, 0.1], "label": 0}, "b": {"probs": [0.1, 0.7, 0.1, 0.1], "label": 1},
          "c": {"probs": [0.1, 0.1, 0.7, 0.1], "label": 0}, "d": {"probs": [0.1, 0.1, 0.1, 0.7], "label": 3}}
    qar = {"a": {"probs": [0.1, 0.9, 0.0, 0.0], "label": 1}, "b": {"probs": [0.9, 0.1, 0.0, 0.0], "label": 1},
           "c": {"probs": [0.9, 0.1, 0.0, 0.0], "label": 0}, "d": {"probs": [0.0, 0.0, 0.9, 0.1], "label": 2}}
    m = q2ar(qa, qar)
    # Q->A right: a, b, d; QA->R right: a, c, d; both: a, d
    assert (m["questions"], m["q2a"], m["qa2r"], m["q2ar"]) == (4, 75.0, 75.0, 50.0)


# --- RefCOCO+ ---------------------------------------------------------------------------------------------

class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_refs_pickle_is_read_without_running_code(tmp_path):
    refs = [{"sent_ids": [7], "file_name": "COCO_train2014_000000000009_1.jpg", "ann_id": 5, "ref_id": 0,
             "image_id": 9, "split": "testA", "sentences": [{"tokens": ["red", "cup"], "raw": "Red cup",
                                                             "sent_id": 7, "sent": "red cup"}], "category_id": 47}]
    path = tmp_path / "refs(unc).p"
    path.write_bytes(pickle.dumps(refs, protocol=2))
    assert read_refs(path) == refs
    path.write_bytes(pickle.dumps([_Evil()]))
    with pytest.raises(RefFormatError, match="refused to load .*system"):
        safe_pickle_load(path)
    path.write_bytes(pickle.dumps([{"ref_id": 1}], protocol=2))
    with pytest.raises(RefFormatError, match=r"refs\[0\] lacks"):
        read_refs(path)


def test_instances_and_detections_formats(tmp_path):
    inst = tmp_path / "instances.json"
    inst.write_text(json.dumps({"images": [{"id": 9, "file_name": "a.jpg", "width": 100, "height": 80}],
                                "annotations": [{"id": 5, "image_id": 9, "bbox": [10, 20, 30, 40], "category_id": 1}]}))
    images, anns, by_image = read_instances(inst)
    assert anns[5]["box"] == [10, 20, 40, 60] and by_image == {9: [5]} and images[9]["width"] == 100
    dets = tmp_path / "dets.json"
    dets.write_text(json.dumps([{"det_id": 0, "image_id": 9, "box": [1, 2, 3, 4], "score": 0.9}]))
    assert read_detections(dets) == {9: [[1, 2, 4, 6]]}
    dets.write_text(json.dumps({"9": [{"box": [1, 2, 3, 4], "score": 0.9}]}))
    assert read_detections(dets) == {9: [[1, 2, 4, 6]]}


def test_refcoco_accuracy_at_iou_half(tmp_path):
    """Two candidate regions, IoU 0.6 and 0.4 with the referred box by hand: choosing the first scores, the
    second does not; chance is 1 of 2."""
    from PIL import Image

    from finetune.refcoco import RefConfig, RefSet, RefTask

    Image.new("RGB", (100, 100)).save(tmp_path / "a.jpg")
    # target [0, 0, 50, 60] (area 3000); region A [0, 0, 50, 36]: inter 1800, union 3000 -> 0.6;
    # region B [0, 0, 50, 24]: inter 1200, union 3000 -> 0.4
    (tmp_path / "instances.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.jpg", "width": 100, "height": 100}],
        "annotations": [{"id": 3, "image_id": 1, "bbox": [0, 0, 50, 60], "category_id": 1}]}))
    (tmp_path / "dets.json").write_text(json.dumps([{"image_id": 1, "box": [0, 0, 50, 36]},
                                                    {"image_id": 1, "box": [0, 0, 50, 24]}]))
    (tmp_path / "refs.p").write_bytes(pickle.dumps([{"ref_id": 0, "ann_id": 3, "image_id": 1, "split": "val",
                                                     "sentences": [{"sent": "it", "sent_id": 0}]}], protocol=2))
    cfg = RefConfig(track="detected", eval_split="val")
    cfg.data.refs, cfg.data.instances, cfg.data.detections = (str(tmp_path / n) for n in ("refs.p", "instances.json",
                                                                                           "dets.json"))
    cfg.image = ImageConfig(root=str(tmp_path), short_side=0)

    class Tok:
        def __call__(self, texts, **kw):
            return {"input_ids": [[5] for _ in texts]}

    data = RefSet(cfg, "val", Tok(), train=False)
    assert data.batch([0])["iou"][0].tolist() == pytest.approx([0.6, 0.4])

    class Prefers(torch.nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k

        def logits(self, batch):
            return torch.nn.functional.one_hot(torch.tensor([self.k]), 2).float()

    for k, expected in ((0, 100.0), (1, 0.0)):
        m = RefTask.evaluate(Prefers(k), data, cfg, tmp_path, "cpu")
        assert m["accuracy"] == expected and m["chance"] == 50.0


def test_box_outside_the_image_names_the_record(tmp_path):
    from PIL import Image

    Image.new("RGB", (40, 30)).save(tmp_path / "x.jpg")
    cfg = ImageConfig(root=str(tmp_path), short_side=0)
    image, boxes = load_image(tmp_path / "x.jpg", np.array([[0, 0, 41, 30]]), cfg, "q 1")  # within tolerance
    assert boxes.tolist() == [[0, 0, 40, 30]] and image.shape == (3, 30, 40)
    with pytest.raises(ValueError, match=r"question_id 7: box 1 .* outside the 40x30 image"):
        load_image(tmp_path / "x.jpg", np.array([[0, 0, 10, 10], [5, 5, 60, 20]]), cfg, "question_id 7")


# --- shared plumbing ------------------------------------------------------------------------------------------

def test_words_take_their_objects_region():
    """encode() places a_region/b_region like the words: [CLS] a0 a1 [SEP] b0 [SEP] -> -1 0 -1 -1 1 -1."""
    from model.config import model_config
    from model.vl_bert import VLBert

    seen = {}
    vl_bert = VLBert(model_config("tiny")).eval()
    original = vl_bert.forward

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return original(*args, **kwargs)

    vl_bert.forward = spy
    batch = {"a_ids": torch.tensor([[20, 21]]), "a_mask": torch.ones(1, 2, dtype=torch.bool),
             "b_ids": torch.tensor([[22, 0]]), "b_mask": torch.tensor([[True, False]]),
             "a_region": torch.tensor([[0, -1]]), "b_region": torch.tensor([[1, -1]]),
             "images": torch.zeros(1, 3, 64, 64, dtype=torch.uint8), "image_sizes": torch.tensor([[64, 64]]),
             "boxes": torch.tensor([[[0., 0, 20, 20], [10, 10, 40, 40]]]),
             "box_mask": torch.ones(1, 2, dtype=torch.bool)}
    encode(vl_bert, batch)
    assert seen["word_region_index"].tolist() == [[-1, 0, -1, -1, 1, -1]]


def test_epoch_loader_workers_give_the_same_batches():
    class Data:
        def __len__(self):
            return 10

        def batch(self, idx):
            return {"idx": torch.tensor(idx)}

    def take(loader, n):
        it = iter(loader)
        return [next(it)["idx"].tolist() for _ in range(n)]

    assert take(EpochLoader(Data(), 3, seed=1, num_workers=1), 5) == take(EpochLoader(Data(), 3, seed=1), 5)


# --- training each task from a pretrained export ---------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    """A tiny VL-BERT export (real WordPiece vocabulary, ResNet-18 detector) as pretraining leaves one."""
    from model.config import model_config
    from model.export import save_pretrained
    from model.vl_bert import VLBertForPretraining
    from shards.tokenizer import resolve_bert_dir

    cfg = model_config("tiny", updates={"vocab_size": 30522, "cls_token_id": 101, "sep_token_id": 102,
                                        "mask_token_id": 103, "img_token_id": 1, "end_token_id": 2,
                                        "visual_ln_init": 1.0, "fast_rcnn": {"roi_output_size": 4}})
    torch.manual_seed(0)
    model = VLBertForPretraining(cfg)
    out = tmp_path_factory.mktemp("export") / "export"
    save_pretrained(model.state_dict(), cfg, out, resolve_bert_dir(None))
    return out


def test_pretrained_export_loads_into_each_task(tiny_export):
    from safetensors.torch import load_file

    from finetune.common import BackboneConfig, build_pretrained

    model, tok_dir, source = build_pretrained(BackboneConfig(init=str(tiny_export)))
    saved = load_file(str(tiny_export / "model.safetensors"))
    own = model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in saved.items())
    assert tok_dir == str(tiny_export) and "VL-BERT export" in source


def run_task(module: str, run_dir: Path, *overrides: str) -> None:
    env = one_process_env()
    cmd = [sys.executable, "-m", module, "image.short_side=64", "image.long_side=96", "image.max_regions=8",
           "batch_size=4", "optim.lr=1e-3", "warmup_fraction=0", "optim.weight_decay=0", "max_eval_examples=8",
           "eval_batch_size=4", f"engine.run_dir={run_dir}", "engine.progress=false", "engine.zero_stage=0",
           "engine.precision=fp32", "engine.log_every=1", "engine.checkpoint_every=1000", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss/total"] for line in open(run_dir / "metrics.jsonl")]


def test_vqa_trains_from_an_export_and_predicts(demo_corpus, tiny_export, tmp_path):
    from finetune.infer import Predictor

    raw = demo_corpus / "raw"
    run = tmp_path / "vqa"
    run_task("finetune.vqa", run, f"backbone.init={tiny_export}", f"image.root={raw}", f"data.root={raw}/vqa",
             f"data.boxes={raw}/boxes.jsonl", "data.answer_min_count=1", "epochs=0.4", "eval_split=val2014")
    loss = losses(run)
    assert np.mean(loss[-3:]) < np.mean(loss[:3])
    # one process at ZeRO 0: the engine's guard clips and reports the norm DeepSpeed does not on this path
    assert all(json.loads(line)["grad_norm"] > 0 for line in open(run / "metrics.jsonl"))
    metrics = json.loads((run / "metrics_val2014.json").read_text())
    assert metrics["questions"] == 8 and 0 <= metrics["overall"] <= 100
    assert set(metrics["per_answer_type"]) <= {"yes/no", "number", "other"}
    results = json.loads((run / "results_val2014.json").read_text())
    assert set(results[0]) == {"question_id", "answer"}
    # one example through the saved model answers what the evaluation answered
    questions = json.loads((raw / "vqa/v2_OpenEnded_mscoco_val2014_questions.json").read_text())["questions"]
    q = next(x for x in questions if x["question_id"] == results[0]["question_id"])
    boxes = next(json.loads(line)["boxes"] for line in open(raw / "boxes.jsonl")
                 if json.loads(line)["image"] == f"images/{q['image_id']:06d}.jpg")
    pred = Predictor(run / "model", device="cpu")
    assert pred.answer(raw / f"images/{q['image_id']:06d}.jpg", q["question"], boxes)["answer"] == results[0]["answer"]


def test_refcoco_trains_from_an_export(demo_corpus, tiny_export, tmp_path):
    raw = demo_corpus / "raw"
    run = tmp_path / "ref"
    run_task("finetune.refcoco", run, f"backbone.init={tiny_export}", f"image.root={raw}/images",
             f"data.refs={raw}/refcoco+/refs(unc).p", f"data.instances={raw}/refcoco+/instances.json",
             f"data.detections={raw}/refcoco+/dets.json", "track=detected", "epochs=0.2", "eval_split=val")
    loss = losses(run)
    assert np.mean(loss[-3:]) < np.mean(loss[:3])
    metrics = json.loads((run / "metrics_val.json").read_text())
    assert metrics["track"] == "detected" and 0 < metrics["chance"] < 100


def test_vcr_trains_both_subtasks_and_combines(demo_corpus, tiny_export, tmp_path):
    raw = demo_corpus / "raw"
    for subtask in ("qa", "qar"):
        run = tmp_path / subtask
        run_task("finetune.vcr", run, f"backbone.init={tiny_export}", f"data.root={raw}/vcr", f"data.images={raw}",
                 f"subtask={subtask}", "epochs=0.3", "batch_size=2", "eval_split=val")
        # 10 steps of 2 questions move neither loss beyond its step-to-step noise (a first-3 vs last-3
        # comparison passed or failed with the dropout stream), so check the run against what is known:
        # finite losses, and a 4-way choice scored at chance, ln 4, by a head that has not learnt yet
        rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
        assert len(rows) >= 10 and all(np.isfinite(r["loss/total"]) for r in rows)
        assert abs(np.mean([r["loss/candidates"] for r in rows]) - np.log(4)) < 0.1
        assert json.loads((run / "metrics_val.json").read_text())["subtask"] == subtask
    from finetune.vcr import main

    assert main(["--combine", str(tmp_path / "qa/predictions_val.json"), str(tmp_path / "qar/predictions_val.json"),
                 "--out", str(tmp_path / "q2ar.json")]) == 0
    m = json.loads((tmp_path / "q2ar.json").read_text())
    assert m["questions"] == 8 and m["q2ar"] <= min(m["q2a"], m["qa2r"])


def test_vqa_split_files(tmp_path):
    from finetune.vqa import VQADataConfig, split_files

    q, a = _vqa_files(tmp_path)
    cfg = VQADataConfig(root=str(tmp_path))
    assert split_files(cfg, "train2014") == (q, a)
    (tmp_path / "v2_OpenEnded_mscoco_test-dev2015_questions.json").write_text(q.read_text())
    assert split_files(cfg, "test-dev2015")[1] is None  # test splits come without annotations
    with pytest.raises(FileNotFoundError, match="VQA split 'val2014': questions file .* not found"):
        split_files(cfg, "val2014")
    (tmp_path / "v2_OpenEnded_mscoco_val2014_questions.json").write_text(q.read_text())
    with pytest.raises(FileNotFoundError, match="VQA split 'val2014': annotations file"):
        split_files(cfg, "val2014")


def test_vcr_paper_schedule_sgd_with_step_decay():
    """A.2 for VCR: linear warm-up over 1,000 steps from 0, then x0.1 at each milestone."""
    from train.engine import OptimConfig, build_optimizer

    cfg = OptimConfig(optimizer="sgd", lr=5e-3, momentum=0.9, weight_decay=1e-4, warmup_steps=1000, schedule="step",
                      decay_steps=[14000, 18000], decay_factor=0.1)
    opt, factor = build_optimizer(torch.nn.Linear(2, 2), cfg, 20000)
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9
    assert [factor(s) for s in (0, 500, 1000, 13999, 14000, 17999, 18000)] == pytest.approx(
        [0.0, 0.5, 1.0, 1.0, 0.1, 0.1, 0.01])
    with pytest.raises(ValueError, match="optim.schedule"):
        build_optimizer(torch.nn.Linear(2, 2), OptimConfig(schedule="cosine"), 10)


@pytest.mark.parametrize("second_segment, answers_per_image", [(False, 1), (True, 1), (True, 4)])
def test_finetune_batches_count_their_real_positions(second_segment, answers_per_image):
    """with_positions counts, on the host, exactly the positions VLBert's attention mask keeps (VQA/RefCOCO
    rows, a second segment, VCR's 4 text rows per image), and the encoder run on those alone computes what the
    padded run computes there."""
    from finetune.common import encode, with_positions
    from model.config import model_config
    from model.vl_bert import VLBert

    torch.manual_seed(0)
    vl = VLBert(model_config("tiny"), with_fast_rcnn=False).eval()
    images, n = 3, 5
    rows = images * answers_per_image
    a_mask = torch.arange(6).expand(rows, 6) < torch.randint(1, 7, (rows, 1))
    box_mask = torch.arange(n).expand(images, n) < torch.tensor([[5], [2], [1]])
    batch = {"a_ids": torch.randint(10, 99, (rows, 6)) * a_mask, "a_mask": a_mask,
             "boxes": torch.rand(images, n, 4) * 50, "box_mask": box_mask}
    if second_segment:
        b_mask = torch.arange(4).expand(rows, 4) < torch.randint(1, 5, (rows, 1))
        batch.update(b_ids=torch.randint(10, 99, (rows, 4)) * b_mask, b_mask=b_mask)
    counted = with_positions(dict(batch))["real_positions"]
    with torch.no_grad():
        appearance, boxes_norm, _ = vl.region_features(boxes=batch["boxes"], box_mask=batch["box_mask"],
                                                       region_features=torch.randn(images, n, 24),
                                                       image_hw=torch.tensor([[60, 90]]).expand(images, 2))
        rep = {k: batch[k].repeat_interleave(answers_per_image, 0) for k in ("boxes", "box_mask")}
        k = answers_per_image
        visual = (appearance.repeat_interleave(k, 0), boxes_norm.repeat_interleave(k, 0))
        padded = encode(vl, {**batch, **rep}, visual_input=visual)
        packed = encode(vl, {**batch, **rep, "real_positions": counted}, visual_input=visual)
    keep = padded.attention_mask
    assert counted == int(keep.sum())
    torch.testing.assert_close(packed.last_hidden_state[keep], padded.last_hidden_state[keep], atol=1e-5, rtol=0)


def test_vqa_readout_classifier_scores_answers_as_the_mlm_head():
    """classifier_init=readout: a one-piece answer's logit is the MLM head's logit for that word, a two-piece
    answer's the mean of its pieces' (both linear in the same transformed state), before any training."""
    from finetune.common import copy_transform
    from finetune.vqa import VQAModel
    from model.config import model_config
    from model.vl_bert import VLBertForPretraining

    torch.manual_seed(0)
    pre = VLBertForPretraining(model_config("tiny"), with_fast_rcnn=False).eval()
    torch.nn.init.normal_(pre.mlm_head.bias)
    model = VQAModel(pre.vl_bert, 2, 0.1).eval()
    copy_transform(model.transform, pre.mlm_head.transform)
    model.init_classifier_as_readout(pre.mlm_head, [[10], [11, 12]])
    hidden = torch.randn(3, pre.cfg.hidden_size)
    with torch.no_grad():
        ours = model.classifier(model.transform(hidden))
        mlm = pre.mlm_head(hidden)
    torch.testing.assert_close(ours[:, 0], mlm[:, 10])
    torch.testing.assert_close(ours[:, 1], (mlm[:, 11] + mlm[:, 12]) / 2)


def test_frozen_detector_cache_gives_the_end_to_end_logits_and_runs_each_image_once(demo_corpus, tiny_export):
    """detector=frozen: a cached batch scores exactly as its examples through the detector one by one (each image
    on its own canvas), each distinct image of the set went through the detector once, and the detector has no
    trainable weight left."""
    from finetune.common import BackboneConfig, RegionFeatureCache, build_pretrained, freeze_detector
    from finetune.vqa import VQAConfig, VQATask
    from model.config import load_config
    from shards.tokenizer import load_tokenizer

    raw = demo_corpus / "raw"
    cfg = load_config(VQAConfig, None, [f"image.root={raw}", f"data.root={raw}/vqa", f"data.boxes={raw}/boxes.jsonl",
                                        "data.answer_min_count=1", "image.short_side=64", "image.long_side=96",
                                        "image.max_regions=8"])
    pretrained, tok_dir, _ = build_pretrained(BackboneConfig(init=str(tiny_export)))
    data = VQATask.dataset(cfg, load_tokenizer(tok_dir), None, train=True)
    data.items = data.items[:40]  # a few images, each asked several questions
    module, _ = VQATask.build_module(pretrained, cfg, data)
    freeze_detector(module.vl_bert)
    seen = []
    detector = module.vl_bert.fast_rcnn
    forward = detector.forward
    detector.forward = lambda images, *a, **k: (seen.append(images.shape[0]), forward(images, *a, **k))[1]
    cached = RegionFeatureCache(data, module.vl_bert, 16, "cpu")
    images = {rel for _, rel in data.items}
    assert sum(seen) == len(images) == len(cached.features) < len(data)
    assert not any(p.requires_grad for p in detector.parameters())
    assert any(p.requires_grad for p in module.vl_bert.parameters())
    module.eval()
    idx = [0, 7, 13, 39, 21]
    with torch.no_grad():
        direct = torch.cat([module.logits(data.batch([i])) for i in idx])
        batch = cached.batch(idx)
        assert "images" not in batch and batch["appearance"].shape[:2] == (5, 1 + batch["box_mask"].shape[1])
        # a cached batch reads image headers, not pixels, and maps the boxes as the decoded images do
        torch.testing.assert_close(batch["boxes"], data.batch(idx)["boxes"])
        torch.testing.assert_close(module.logits(batch), direct)
    assert cached.answers is data.answers  # the task set's own attributes show through


def _run_dir(path: Path, config: dict, **files) -> None:
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"config": config}))
    for name, content in files.items():
        (path / f"{name}.json").write_text(json.dumps(content))


def test_table4_report_from_per_example_outputs(tmp_path):
    """Each metric recomputed from the runs' per-example files (VQA rescored officially, RefCOCO+ at IoU 0.5,
    VCR Q->AR right only when both halves are), paired differences from `none`, by hand."""
    from finetune.table4 import main as table4_main
    from finetune.table4 import read_runs, report

    q, a = _vqa_files(tmp_path)  # questions 90 (image 9, other) and 40 (image 4, yes/no) annotated, all "red"
    vqa_cfg = {"eval_split": "train2014", "data": {"root": str(tmp_path),
                                                   "questions": "v2_OpenEnded_mscoco_{split}_questions.json",
                                                   "annotations": "v2_mscoco_{split}_annotations.json"}}
    prior = {"prior_baseline": {"overall": 12.5, "per_answer_type": {"other": 25.0}}}
    runs = tmp_path / "runs"
    _run_dir(runs / "vqa/pretrained", vqa_cfg, results_train2014=[{"question_id": 90, "answer": "red"},
                                                                   {"question_id": 40, "answer": "red"}],
             metrics_train2014=prior)
    _run_dir(runs / "vqa/none", vqa_cfg, results_train2014=[{"question_id": 90, "answer": "blue"},
                                                             {"question_id": 40, "answer": "red"}],
             metrics_train2014=prior)
    ref = [{"ref_id": 1, "sent_id": s, "image_id": s // 2, "iou": iou} for s, iou in enumerate([0.9, 0.5, 0.2, 0.7])]
    _run_dir(runs / "refcoco_gt/pretrained", {"eval_split": "val"}, predictions_val=ref, metrics_val={"chance": 20.0})
    # VCR: three questions on two images; Q->A right on a1, a2; QA->R right on a2, a3: Q->AR right on a2 alone
    qa = {"a1": {"probs": [0.7, 0.1, 0.1, 0.1], "label": 0, "image": "x.jpg"},
          "a2": {"probs": [0.1, 0.7, 0.1, 0.1], "label": 1, "image": "x.jpg"},
          "a3": {"probs": [0.1, 0.7, 0.1, 0.1], "label": 2, "image": "y.jpg"}}
    qar = {"a1": {"probs": [0.1, 0.7, 0.1, 0.1], "label": 0, "image": "x.jpg"},
           "a2": {"probs": [0.1, 0.1, 0.1, 0.7], "label": 3, "image": "x.jpg"},
           "a3": {"probs": [0.7, 0.1, 0.1, 0.1], "label": 0, "image": "y.jpg"}}
    _run_dir(runs / "vcr_qa/pretrained", {"eval_split": "val"}, predictions_val=qa)
    _run_dir(runs / "vcr_qar/pretrained", {"eval_split": "val"}, predictions_val=qar)
    for sub in ("qa", "qar"):
        (runs / f"vcr_{sub}/pretrained/metrics_val.json").write_text("{}")
    _run_dir(runs / "vcr_qa/none", {"eval_split": "val"})  # still training: no metrics, left out
    rep = report(*read_runs(runs), resamples=200)
    vqa = rep["VQA overall"]
    assert vqa["runs"]["pretrained"]["mean"] == 100.0 and vqa["runs"]["none"]["mean"] == 50.0
    assert vqa["minus_none"]["pretrained"]["mean"] == 50.0 and vqa["chance_or_prior"] == 12.5
    assert rep["VQA other (colour, shape)"]["runs"]["none"]["mean"] == 0.0
    refcoco = rep["RefCOCO+ val (gt boxes)"]
    assert refcoco["runs"]["pretrained"]["mean"] == 75.0 and refcoco["runs"]["pretrained"]["images"] == 2
    assert refcoco["chance_or_prior"] == 20.0 and "minus_none" not in refcoco
    assert rep["VCR Q->A"]["runs"]["pretrained"]["mean"] == pytest.approx(200 / 3)
    assert rep["VCR QA->R"]["runs"]["pretrained"]["mean"] == pytest.approx(200 / 3)
    assert rep["VCR Q->AR"]["runs"]["pretrained"]["mean"] == pytest.approx(100 / 3)
    assert rep["VCR Q->AR"]["chance_or_prior"] == 6.25 and set(rep["VCR Q->A"]["runs"]) == {"pretrained"}
    out = tmp_path / "report"
    assert table4_main(["--runs", str(runs), "--out", str(out), "--resamples", "100"]) == 0
    assert (out / "table4.png").stat().st_size > 0 and "| VCR Q->AR |" in (out / "table4.md").read_text()
    assert table4_main(["--runs", str(tmp_path / "nothing")]) == 2


def test_frozen_detector_cache_gives_vcr_the_end_to_end_scores(demo_corpus, tiny_export):
    """VCR reads the cached features for all 4 candidates of a question, as its detector pass gives them for the
    question alone; masked RoI classification, which hides pixels before the detector, is refused with the cache."""
    from finetune.common import BackboneConfig, RegionFeatureCache, build_pretrained, freeze_detector
    from finetune.vcr import VCRConfig, VCRTask
    from model.config import load_config
    from shards.tokenizer import load_tokenizer

    raw = demo_corpus / "raw"
    cfg = load_config(VCRConfig, None, [f"data.root={raw}/vcr", f"data.images={raw}", "image.short_side=64",
                                        "image.long_side=96", "image.max_regions=8", "mrc_weight=0"])
    pretrained, tok_dir, _ = build_pretrained(BackboneConfig(init=str(tiny_export)))
    data = VCRTask.dataset(cfg, load_tokenizer(tok_dir), None, train=True)
    data.items = data.items[:12]
    module, _ = VCRTask.build_module(pretrained, cfg, data)
    freeze_detector(module.vl_bert)
    cached = RegionFeatureCache(data, module.vl_bert, 4, "cpu")
    module.eval()
    with torch.no_grad():
        direct = torch.cat([module.run(data.batch([i]))[0] for i in (0, 5, 11)])
        scores, _ = module.run(cached.batch([0, 5, 11]))
    torch.testing.assert_close(scores, direct)
    module.settings = dict(module.settings, mrc_weight=1.0)
    with pytest.raises(ValueError, match="mrc_weight=0"):
        module.run(cached.batch([0]), torch.ones_like(cached.batch([0])["box_mask"]))


def test_train_images_keeps_every_example_of_a_nested_draw_of_images(demo_corpus, tiny_export):
    """train_images=k: the examples of k training images, all of each image's questions and no other; the k images
    of a smaller draw are among a larger draw's (one seeded order); out of range is an error naming the key."""
    from finetune.common import BackboneConfig, ImageSubset, build_pretrained
    from finetune.vqa import VQAConfig, VQATask
    from model.config import load_config
    from shards.tokenizer import load_tokenizer

    raw = demo_corpus / "raw"
    cfg = load_config(VQAConfig, None, [f"image.root={raw}", f"data.root={raw}/vqa", f"data.boxes={raw}/boxes.jsonl",
                                        "data.answer_min_count=1"])
    _, tok_dir, _ = build_pretrained(BackboneConfig(init=str(tiny_export)))
    data = VQATask.dataset(cfg, load_tokenizer(tok_dir), None, train=True)
    image_of = [rel for _, rel in data.items]
    drawn = {}
    for k in (2, 5):
        subset = ImageSubset(data, k, seed=0, batch_size=7)
        images = {image_of[i] for i in subset.indices}
        assert len(images) == k
        assert subset.indices == [i for i, rel in enumerate(image_of) if rel in images]
        assert len(subset) == len(subset.indices) and subset.answers == data.answers
        batch = subset.batch([0, len(subset) - 1], pixels=False)
        assert batch["image_keys"] == [image_of[subset.indices[0]], image_of[subset.indices[-1]]]
        drawn[k] = images
    assert drawn[2] < drawn[5]
    with pytest.raises(ValueError, match="train_images"):
        ImageSubset(data, len(set(image_of)) + 1, seed=0)


def test_relation_names_become_their_word_pieces_in_the_backbones_tokenizer():
    from shards.tokenizer import load_tokenizer, relation_word_ids

    tok = load_tokenizer(None)
    ids = relation_word_ids(["left", "right", "above", "under the"], tok, "backbone.relation_names")
    assert [tok.convert_ids_to_tokens(i) for i in ids] == [["left"], ["right"], ["above"], ["under", "the"]]
    with pytest.raises(ValueError, match="backbone.relation_names: expected 4 words, for left, right, above, below"):
        relation_word_ids(["left", "right"], tok, "backbone.relation_names")
    with pytest.raises(ValueError, match="^relation_names: expected 4 words"):  # pretraining's field by default
        relation_word_ids(["left", "right", "above", "  "], tok)
