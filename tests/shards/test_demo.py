import io
import json
import pickle
import random
import re
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from shards import shapes_world as sw
from shards.reader import StreamConfig, StreamLoader


def test_demo_corpus_is_complete_and_readable(demo_corpus):
    shards = demo_corpus / "shards"
    train = json.loads((shards / "captions-train" / "manifest.json").read_text())
    val = json.loads((shards / "captions-val" / "manifest.json").read_text())
    assert (train["total"], val["total"]) == (32, 8) and train["skips"]["skipped"] == {}
    assert train["class_names"] == sw.CLASS_NAMES
    text = json.loads((shards / "text" / "manifest.json").read_text())
    assert text["total"] > 50 and text["max_tokens"] == 64
    cfg = StreamConfig(caption_shards=str(shards / "captions-train" / "*.tar"),
                       text_shards=str(shards / "text" / "*.tar"), short_side=0, num_workers=0)
    batch = next(iter(StreamLoader(cfg)))
    assert batch["caption"]["class_probs"].shape[-1] == len(sw.CLASS_NAMES)
    assert batch["text"]["input_ids"].shape[1] <= 64


def test_demo_is_deterministic(demo_corpus, tmp_path):
    from shards.demo import write_raw

    write_raw(tmp_path, 40, 8, 123, 3, 12)
    for name in ("captions_train.tsv", "boxes.jsonl", "scenes.jsonl", "books/book_001.txt", "images/000007.jpg"):
        assert (tmp_path / "raw" / name).read_bytes() == (demo_corpus / "raw" / name).read_bytes(), name


def test_colour_distributions_peak_on_visible_colours_and_reach_the_batches(demo_corpus):
    """The box file's attribute_probs: a visible object's colour (in the warm-up detector's attribute order,
    COLOURS) holds the peak, a covered object's (under the cloth) does not; drawn from their own stream, so the
    class distributions are what they were before them; written into the caption shards (attrs.npy) and batched
    beside the class distributions."""
    from shards.demo import detector_like_probs
    from shards.seeding import numpy_rng

    raw = demo_corpus / "raw"
    boxes = [json.loads(line) for line in (raw / "boxes.jsonl").read_text().splitlines()]
    scenes = {s["image"]: s for s in map(json.loads, (raw / "scenes.jsonl").read_text().splitlines())}
    colours, world = list(sw.COLOURS), numpy_rng(123, "demo world", 1)
    seen = {True: 0, False: 0}
    for entry in boxes:
        for o, attrs, probs in zip(scenes[entry["image"]]["objects"], entry["attribute_probs"], entry["class_probs"],
                                   strict=True):
            true = attrs[colours.index(o["colour"])]
            assert len(attrs) == 6 and abs(sum(attrs) - 1) < 2e-3
            assert (true < 0.85) if o["covered"] else (true >= 0.85 - 1e-4 and true == max(attrs))
            seen[o["covered"]] += 1
            expected = detector_like_probs(sw.CLASS_NAMES.index(o["category"]), 9, 0.35 if o["covered"] else 0.85,
                                           world)
            assert probs == expected.astype(float).round(4).tolist()
    assert seen[True] > 5 and seen[False] > 50
    by_image = {e["image"]: e for e in boxes}
    with tarfile.open(sorted((demo_corpus / "shards" / "captions-train").glob("*.tar"))[0]) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    source = json.loads(members["000000003.json"])["source"]
    stored = np.load(io.BytesIO(members["000000003.attrs.npy"]))
    assert stored.dtype == np.float16
    np.testing.assert_allclose(stored, np.array(by_image[source]["attribute_probs"]), atol=1e-3)
    cfg = StreamConfig(caption_shards=str(demo_corpus / "shards" / "captions-train" / "*.tar"),
                       text_shards=str(demo_corpus / "shards" / "text" / "*.tar"), short_side=0, num_workers=0)
    c = next(iter(StreamLoader(cfg)))["caption"]
    assert c["attribute_probs"].shape == (*c["box_mask"].shape, 6)
    sums = c["attribute_probs"].float().sum(-1)
    assert (sums[c["box_mask"]] - 1).abs().max() < 2e-3 and (sums[~c["box_mask"]] == 0).all()


def test_scenes_follow_the_design():
    rng = random.Random(0)
    colour_words = set(sw.COLOURS)
    covered = visible = 0
    for _ in range(300):
        scene = sw.sample_scene(rng)
        assert 2 <= len(scene.objects) <= 8
        assert 128 <= scene.width <= 320 and 128 <= scene.height <= 320
        for o in scene.objects:
            x1, y1, x2, y2 = o.box
            assert 0 <= x1 < x2 <= scene.width and 0 <= y1 < y2 <= scene.height
        text, named = sw.caption(scene, rng)
        words = re.findall(r"[a-z]+", text)
        # every named visible object's colour is in the caption exactly as often as such objects are named
        for i in named:
            o = scene.objects[i]
            assert o.category in words and o.size in words
            if o.covered:
                covered += 1
                assert f"{o.size} covered {o.category}" in text
            else:
                visible += 1
                assert f"{o.size} {o.colour} {o.category}" in text
        n_colours = sum(w in colour_words for w in words)
        assert n_colours == sum(not scene.objects[i].covered for i in named)
    assert covered > 20 and visible > 300


def test_relations_match_geometry():
    a = sw.ShapeObject("circle", "red", "small", (0, 0, 10, 10))
    b = sw.ShapeObject("star", "blue", "small", (50, 5, 60, 15))
    c = sw.ShapeObject("star", "blue", "small", (2, 80, 12, 90))
    assert sw.relation(a, b) == "left of" and sw.relation(b, a) == "right of"
    assert sw.relation(a, c) == "above" and sw.relation(c, a) == "below"


def test_visible_fractions_by_hand():
    """Squares cover every pixel from x1 to x2 inclusive: 41 x 41. The second hides columns 30..50 of the
    first (21 of 41); a cloth over an object hides it like any other object."""
    scene = sw.Scene(100, 100, (230, 230, 230), [
        sw.ShapeObject("square", "red", "large", (10, 10, 50, 50)),
        sw.ShapeObject("square", "blue", "large", (30, 10, 70, 50)),
        sw.ShapeObject("circle", "red", "small", (80, 80, 95, 95)),
        sw.ShapeObject("square", "red", "small", (80, 80, 95, 95), covered=True)])
    fractions = sw.visible_fractions(scene)
    assert fractions[0] == pytest.approx(20 / 41) and fractions[1] == 1.0 and fractions[3] == 1.0
    assert fractions[2] == 0.0  # the cloth's rounded corners lie outside the circle


def test_captions_name_only_objects_at_least_half_in_view():
    """The same scenes captioned with and without the rule: with it no named object is mostly hidden, without
    it some are (so the rule is what holds), and the draws without it are those of older corpora."""
    rng = random.Random(3)
    scenes = [sw.sample_scene(rng) for _ in range(200)]
    hidden_named = {0.5: 0, 0.0: 0}
    for min_visible in hidden_named:
        rng = random.Random(4)
        for scene in scenes:
            fractions = sw.visible_fractions(scene)
            _, named = sw.caption(scene, rng, min_visible=min_visible)
            hidden_named[min_visible] += sum(fractions[k] < 0.5 for k in named)
    assert hidden_named[0.5] == 0 and hidden_named[0.0] > 10
    assert sw.CAPTION_MIN_VISIBLE == 0.5


def test_prose_is_long_and_complex():
    rng = random.Random(1)
    paragraph = sw.prose_paragraph(rng)
    sentences = re.split(r"(?<=\.)\s+", paragraph)
    assert len(sentences) >= 3 and sum(len(s.split()) for s in sentences) / len(sentences) > 15


def test_demo_vqg_data_in_vqg_coco_format_and_answerable(demo_corpus):
    from finetune.vqg_data import read_coco_captions, read_vqg_coco_csv

    raw = demo_corpus / "raw"
    scenes = {str(int(json.loads(line)["image"][7:13])): json.loads(line) for line in open(raw / "scenes.jsonl")}
    splits = {s: read_vqg_coco_csv(raw / "vqg" / f"coco_{s}_all.csv") for s in ("train", "val", "test")}
    assert len(splits["test"]) == 8  # the held-out val images
    ids = [im.image_id for s in splits.values() for im in s]
    assert len(ids) == len(set(ids))
    captions = read_coco_captions([raw / "vqg" / "captions_train2014.json", raw / "vqg" / "captions_val2014.json"])
    for images in splits.values():
        for im in images:
            scene = scenes[im.image_id]
            assert captions[im.image_id][0] == scene["caption"] and len(captions[im.image_id]) == 5
            assert 1 <= len(im.questions) <= 5 and all(q.endswith("?") for q in im.questions)
            visible = [o for o in scene["objects"] if not o["covered"]]
            for q in im.questions:
                m = re.fullmatch(r"what color is the (\w+)\?", q)
                if m:  # asked only when exactly one visible object has that shape
                    assert sum(o["category"] == m.group(1) for o in visible) == 1
                if q == "what is under the cloth?":
                    assert any(o["covered"] for o in scene["objects"])


def _where_by_centres(a: dict, b: dict) -> str:
    """a against b along the axis their centres differ most, worked from the boxes here."""
    dx = (a["box"][0] + a["box"][2] - b["box"][0] - b["box"][2]) / 2
    dy = (a["box"][1] + a["box"][3] - b["box"][1] - b["box"][3]) / 2
    if abs(dx) >= abs(dy):
        return "left of" if dx < 0 else "right of"
    return "above" if dy < 0 else "below"


def _check_rationales(record: dict, objects: list[dict]) -> None:
    """VCR's rationales cite the picture: all four agree with the right answer, differ in one fact of the image (the
    colour question's object against the other one; the where question's object's colour), true in the labelled one
    alone, so words cannot pick it."""
    answer = record["answer_choices"][record["answer_label"]]
    rationales = record["rationale_choices"]
    i = next(t for t in record["question"] if isinstance(t, list))[0]
    tags = [[t for t in c if isinstance(t, list)] for c in rationales]
    j = tags[0][-1][0]
    assert all(t == tags[0] for t in tags) and i != j
    facts = []
    for c in rationales:
        words = " ".join(t for t in c if isinstance(t, str) and t != ".")
        if record["question"][:2] == ["what", "color"]:
            assert f"the {answer[2]} shape" in words  # the right answer's colour, in every one
            facts.append(next(r for r in ("left of", "right of", "above", "below") if words.endswith(r)))
        else:
            relation = " ".join(w for w in answer if isinstance(w, str) and w != ".").split(" ", 1)[1]
            comparison = {"left of": "further left than", "right of": "further right than", "above": "higher than",
                          "below": "lower than"}[relation]
            assert words.endswith(comparison)  # the right answer's relation, in every one
            facts.append(words.split()[1])
    assert len(set(facts)) == 4  # one fact apart: the words besides it are the same in all four
    truth = objects[i]["colour"] if record["question"][:2] != ["what", "color"] else \
        _where_by_centres(objects[i], objects[j])
    assert [k for k, f in enumerate(facts) if f == truth] == [record["rationale_label"]]


def test_demo_task_data_in_official_formats_matches_the_scenes(demo_corpus):
    """VQA answers, VCR labels and RefCOCO+ referents, read by the tasks' own readers, agree with the
    scene annotations they were drawn from."""
    from finetune.refcoco import read_instances, read_refs
    from finetune.vcr import read_vcr_jsonl
    from finetune.vqa_score import read_vqa
    from shards.shapes_world import CATEGORIES

    raw = demo_corpus / "raw"
    scenes = {int(json.loads(line)["image"][7:13]): json.loads(line) for line in open(raw / "scenes.jsonl")}
    val = {int(line.split("\t")[1].strip()[7:13]) for line in open(raw / "captions_val.tsv") if line.strip()}
    for split in ("train2014", "val2014"):
        qs = read_vqa(raw / f"vqa/v2_OpenEnded_mscoco_{split}_questions.json",
                      raw / f"vqa/v2_mscoco_{split}_annotations.json")
        assert qs and all((q.image_id in val) == (split == "val2014") for q in qs)
        for q in qs:
            objs = scenes[q.image_id]["objects"]
            assert len(q.answers) == 10
            if q.question == "how many shapes are there?":
                assert q.multiple_choice_answer == str(len(objs))
            m = re.fullmatch(r"what color is the (\w+)\?", q.question)
            if m:
                assert [o["colour"] for o in objs if o["category"] == m.group(1) and not o["covered"]] == \
                    [q.multiple_choice_answer]
    labelled = read_vcr_jsonl(raw / "vcr/val.jsonl", need_labels=True)
    assert labelled and all("answer_label" not in r for r in read_vcr_jsonl(raw / "vcr/test.jsonl", False))
    for r in labelled:
        scene = scenes[int(Path(r["img_fn"]).stem)]
        meta = json.loads((raw / r["metadata_fn"]).read_text())
        assert [b[:4] for b in meta["boxes"]] == [o["box"] for o in scene["objects"]]
        answer = r["answer_choices"][r["answer_label"]]
        if r["question"][:2] == ["what", "color"]:
            assert answer[2] == scene["objects"][r["question"][3][0]]["colour"]
        _check_rationales(r, scene["objects"])
    images, anns, _ = read_instances(raw / "refcoco+/instances.json")
    refs = read_refs(raw / "refcoco+/refs(unc).p")
    assert {r["split"] for r in refs} >= {"train", "val"}
    kinds = {"names": 0, "relational": 0}
    for ref in refs:
        obj = scenes[ref["image_id"]]["objects"][ref["ann_id"] % 100]
        assert anns[ref["ann_id"]]["box"] == pytest.approx(obj["box"], abs=1e-6)
        assert CATEGORIES[ref["category_id"] - 1] == obj["category"]
        assert all(obj["category"] in s["sent"] or obj["colour"] in s["sent"] or s["sent"] == "grey cloth"
                   for s in ref["sentences"])
        scene = scenes[ref["image_id"]]
        drawn = sw.Scene(scene["width"], scene["height"], (0, 0, 0), [
            sw.ShapeObject(o["category"], o["colour"], o["size"], tuple(o["box"]), o["covered"])
            for o in scene["objects"]])
        seen = sw.visible_fractions(drawn)
        assert seen[ref["ann_id"] % 100] >= 0.5  # in view, as a caption's objects are
        for s in ref["sentences"]:  # each picks out its referent alone, among the objects as the picture shows them
            m = re.fullmatch(r"the (\w+) (left of|right of|above|below) the (\w+) (\w+)", s["sent"])
            if m:
                kinds["relational"] += 1
                assert _relational_fits(m.groups(), scene["objects"], seen) == [obj], s["sent"]
            else:
                kinds["names"] += 1
                assert [o for o in scene["objects"] if _fits(s["sent"], o)] == [obj], s["sent"]
    # look-alikes of a category are told apart by an object beside them, in every split the scenes allow
    assert kinds["relational"] > 0 and kinds["names"] > kinds["relational"], kinds


def _relational_fits(words: tuple[str, ...], objects: list[dict], seen: list[float]) -> list[dict]:
    """The objects "the <category> <relation> the <colour> <landmark>" could mean to a person who sees the picture:
    those of the category (not under the cloth) in that relation to the landmark, worked from the boxes here. The
    landmark must be one object in view, of another category, that its colour and category pick out alone."""
    category, relation, colour, landmark = words
    marks = [o for o in objects if not o["covered"] and (o["colour"], o["category"]) == (colour, landmark)]
    assert len(marks) == 1 and landmark != category and seen[objects.index(marks[0])] >= 0.5, words
    return [o for o in objects if not o["covered"] and o["category"] == category
            and _where_by_centres(o, marks[0]) == relation]


def _fits(expression: str, o: dict) -> bool:
    """Whether a person who sees the picture could take `o` for what the expression describes: under the grey
    cloth only "a cloth" shows; otherwise every colour, shape and size word the expression uses must be o's."""
    words = set(expression.split())
    if o["covered"]:
        return bool(words & {"cloth", "covered"})
    return not words & {"cloth", "covered"} and all(
        w in (o["colour"], o["category"], o["size"], "the", "one", "that", "is") for w in words)


def test_a_corpus_built_with_ambiguous_expressions_gets_its_refcoco_rewritten(demo_corpus, tmp_path):
    """A corpus from before REFCOCO_VERSION 2 (no version in instances.json) is brought up to date by the
    builder's already-built path, RefCOCO+ alone: the same files a fresh build writes, nothing else touched."""
    from shards.demo import build_demo

    old = tmp_path / "demo"
    shutil.copytree(demo_corpus, old)
    refcoco = old / "raw" / "refcoco+"
    instances = json.loads((refcoco / "instances.json").read_text())
    del instances["info"]
    (refcoco / "instances.json").write_text(json.dumps(instances))
    (refcoco / "refs(unc).p").write_bytes(pickle.dumps([], protocol=2))
    vqa = old / "raw" / "vqa" / "v2_mscoco_train2014_annotations.json"
    stamp = vqa.stat().st_mtime_ns
    build_demo(old, n_images=40, n_val=8, n_books=3, n_articles=12, seed=123, progress=False)
    for name in ("refs(unc).p", "instances.json", "dets.json"):
        assert (refcoco / name).read_bytes() == (demo_corpus / "raw" / "refcoco+" / name).read_bytes(), name
    assert vqa.stat().st_mtime_ns == stamp
