"""The demo corpus' finetuning data, each in its task's official format, from the shapes world:

  raw/vqa/        VQA v2: v2_OpenEnded_mscoco_{train2014,val2014}_questions.json and
                  v2_mscoco_{split}_annotations.json (10 human answers each, with a little disagreement
                  and the surface variation real annotators show: "2" / "two", "Red", "a circle")
  raw/vcr/        VCR: {train,val,test}.jsonl (tokens with object references as index lists) and
                  per-image metadata JSON (boxes with scores, names, width, height); rationales that cite
                  the picture (`vcr_item`), and version.txt (`VCR_VERSION`)
  raw/refcoco+/   the refer toolkit's refs(unc).p and instances.json (COCO format, bbox x, y, w, h),
                  plus detections in MAttNet's list format (dets.json); expressions of appearance, and of
                  look-alikes by an object beside them (`_relational`)
  raw/retrieval/  dataset_flickr30k.json in Karpathy's split format (the Flickr30k/COCO retrieval file:
                  images with split, filename and 5 sentences, raw and tokenised), for image-text retrieval
  raw/detection/  instances_{train,val}.json: COCO-format boxes and categories of the visible objects,
                  with Visual-Genome-style colour attributes, for the detector's supervised warm-up
                  (`python -m pretrain.detector`), as bottom-up-attention detectors are trained

The corpus' val images are the val/test images of every task; train images come from the rest. Answers
need the picture: colours, counts and relations can only come from it.
"""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

from . import shapes_world as sw
from .seeding import python_rng

RELATIONS = ["left of", "right of", "above", "below"]
# 2: every expression picks out its referent alone, and the referent is at least half in view (before, "red one"
# could name either of two red objects and "covered star" either of two cloths: 197 of 1,124 val expressions
# fitted more than one object, the best possible accuracy 89.9%; and 8.6% named an object mostly hidden by later
# ones, on which both finetuned models scored 64-70 against 96 in full view)
# 3: an object whose category another uncovered object shares is also told by where it is against a third one ("the
# circle left of the blue star", `_relational`), as RefCOCO+'s annotators told look-alikes apart by the objects
# around them (absolute location words alone are forbidden); version 2's expressions were lists of names, which the
# detector's names answered without any learning (docs/FINETUNE.md, session 65)
REFCOCO_VERSION = "3"
# 2: each rationale cites a fact of the picture that words cannot check (vcr_item); version 1's restated its answer
VCR_VERSION = "2"
# how a rationale words the centres' comparison a relation names
RELATION_REASON = {"left of": "further left than", "right of": "further right than", "above": "higher than",
                   "below": "lower than"}


def _scenes(raw: Path):
    val_images = {line.split("\t")[1].strip() for line in open(raw / "captions_val.tsv") if line.strip()}
    with open(raw / "scenes.jsonl") as f:
        for line in f:
            scene = json.loads(line)
            world = sw.Scene(scene["width"], scene["height"], (0, 0, 0), [
                sw.ShapeObject(o["category"], o["colour"], o["size"], tuple(o["box"]), o["covered"])
                for o in scene["objects"]])
            yield int(Path(scene["image"]).stem), scene["image"], world, scene["image"] in val_images


# --- VQA v2 ---------------------------------------------------------------------------------------------

def vqa_questions(scene: sw.Scene, rng: random.Random, k: int = 5) -> list[tuple[str, str, str, str]]:
    """(question, answer, answer_type, question_type) about the picture; yes/no questions are balanced."""
    visible = [o for o in scene.objects if not o.covered]
    pool = [("how many shapes are there?", str(len(scene.objects)), "number", "how many")]
    cats = {}
    for o in visible:
        cats.setdefault(o.category, []).append(o)
    probe = rng.choice(sw.CATEGORIES)
    pool.append((f"how many {sw._plural(probe)} are there?", str(len(cats.get(probe, []))), "number", "how many"))
    for cat, group in cats.items():
        if len(group) == 1:
            pool.append((f"what color is the {cat}?", group[0].colour, "other", "what color is the"))
    colours = {}
    for o in visible:
        colours.setdefault(o.colour, []).append(o)
    for colour, group in colours.items():
        if len({o.category for o in group}) == 1:
            pool.append((f"what shape is {colour}?", group[0].category, "other", "what shape is"))
    if visible:
        o = rng.choice(visible)
        if rng.random() < 0.5:
            pool.append((f"is there a {o.colour} {o.category}?", "yes", "yes/no", "is there a"))
        else:
            absent = [(c, s) for c in sw.COLOURS for s in sw.CATEGORIES
                      if not any(v.colour == c and v.category == s for v in visible)]
            c, s = rng.choice(absent)
            pool.append((f"is there a {c} {s}?", "no", "yes/no", "is there a"))
    unique = [group[0] for group in cats.values() if len(group) == 1]
    if len(unique) >= 2:
        a, b = rng.sample(unique, 2)
        true = sw.relation(a, b)
        asked = true if rng.random() < 0.5 else rng.choice([r for r in RELATIONS if r != true])
        pool.append((f"is the {a.category} {asked} the {b.category}?", "yes" if asked == true else "no", "yes/no",
                     "is the"))
    return rng.sample(pool, min(k, len(pool)))


def _human_answers(answer: str, answer_type: str, rng: random.Random, n: int = 10) -> list[str]:
    """n annotators: most give the answer, in varying surface forms; a few give a plausible wrong one."""
    def variant(a: str) -> str:
        if answer_type == "number" and a.isdigit() and int(a) <= 10 and rng.random() < 0.3:
            return sw.NUMBER_WORDS[int(a)] if int(a) < len(sw.NUMBER_WORDS) else a
        if answer_type == "other" and rng.random() < 0.15:
            return rng.choice([a.capitalize(), f"a {a}", f"{a}."])
        return a

    out = []
    for _ in range(n):
        if rng.random() < 0.88:
            out.append(variant(answer))
        elif answer_type == "yes/no":
            out.append("no" if answer == "yes" else "yes")
        elif answer_type == "number":
            out.append(str(max(0, int(answer) + rng.choice([-1, 1]))))
        elif answer in sw.COLOURS:
            out.append(rng.choice([c for c in sw.COLOURS if c != answer]))
        else:
            out.append(rng.choice([c for c in sw.CATEGORIES if c != answer]))
    return out


def write_vqa(raw: Path, seed: int, per_image: int = 5) -> Path:
    out = raw / "vqa"
    out.mkdir(parents=True, exist_ok=True)
    data = {"train2014": ([], []), "val2014": ([], [])}
    for index, _image, world, is_val in _scenes(raw):
        split = "val2014" if is_val else "train2014"
        rng = python_rng(seed, "demo vqa", index)
        questions, annotations = data[split]
        for k, (question, answer, answer_type, question_type) in enumerate(vqa_questions(world, rng, per_image)):
            qid = index * 10 + k
            answers = _human_answers(answer, answer_type, rng)
            questions.append({"image_id": index, "question": question, "question_id": qid})
            annotations.append({
                "question_id": qid, "image_id": index, "answer_type": answer_type, "question_type": question_type,
                "multiple_choice_answer": answer,
                "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": j + 1}
                            for j, a in enumerate(answers)]})
    info = {"description": "shapes-world demo in VQA v2 format", "version": "2.0"}
    for split, (questions, annotations) in data.items():
        (out / f"v2_OpenEnded_mscoco_{split}_questions.json").write_text(json.dumps(
            {"info": info, "task_type": "Open-Ended", "data_type": "mscoco", "data_subtype": split,
             "questions": questions}))
        (out / f"v2_mscoco_{split}_annotations.json").write_text(json.dumps(
            {"info": info, "data_type": "mscoco", "data_subtype": split, "annotations": annotations}))
    return out


# --- VCR -------------------------------------------------------------------------------------------------

def vcr_item(scene: sw.Scene, rng: random.Random, evidence_rng: random.Random | None = None) -> dict | None:
    """One VCR-style question with 4 answers and 4 rationales; object references are index lists.

    Every rationale agrees with the right answer and adds one fact about the picture, true in one of them alone, as
    real VCR's rationales cite evidence in the image: for a colour question where its object is against the other
    one (the four relations), for a where question its object's colour (the true one and three others). Words alone
    cannot pick the right rationale; before version 2 each restated its own candidate answer, and a reader of the
    answer's words picked it every time (docs/FINETUNE.md, session 70). `evidence_rng` draws the other colours, so
    `rng` draws what it drew before (the questions and answers are those of version 1)."""
    visible = [i for i, o in enumerate(scene.objects) if not o.covered]
    if len(visible) < 2:
        return None
    evidence_rng = evidence_rng or rng
    i, j = rng.sample(visible, 2)
    a, b = scene.objects[i], scene.objects[j]
    true = sw.relation(a, b)
    if rng.random() < 0.5:
        question = ["what", "color", "is", [i], "?"]
        options = [a.colour] + rng.sample([c for c in sw.COLOURS if c != a.colour], 3)
        answers = [[[i], "is", c, "."] for c in options]
        relations = [true] + [r for r in RELATIONS if r != true]
        reasons = [[[i], "is", "the", a.colour, "shape", *r.split(), [j], "."] for r in relations]
    else:
        question = ["where", "is", [i], "compared", "to", [j], "?"]
        options = [true] + [r for r in RELATIONS if r != true]
        answers = [[[i], "is", *r.split(), [j], "."] for r in options]
        colours = [a.colour] + evidence_rng.sample([c for c in sw.COLOURS if c != a.colour], 3)
        reasons = [["the", c, "shape", [i], "is", *RELATION_REASON[true].split(), [j], "."]
                   for c in colours]
    order_a, order_r = rng.sample(range(4), 4), rng.sample(range(4), 4)
    return {"question": question, "answer_choices": [answers[k] for k in order_a],
            "rationale_choices": [reasons[k] for k in order_r], "answer_label": order_a.index(0),
            "rationale_label": order_r.index(0)}


def write_vcr(raw: Path, seed: int) -> Path:
    out = raw / "vcr"
    (out / "metadata").mkdir(parents=True, exist_ok=True)
    files = {s: open(out / f"{s}.jsonl", "w") for s in ("train", "val", "test")}
    try:
        for index, image, world, is_val in _scenes(raw):
            rng = python_rng(seed, "demo vcr", index)
            evidence_rng = python_rng(seed, "demo vcr evidence", index)
            split = ("val" if index % 2 == 0 else "test") if is_val else "train"
            meta = f"vcr/metadata/{index:06d}.json"
            (raw / meta).write_text(json.dumps({
                "boxes": [[*o.box, 1.0] for o in world.objects], "segms": [[] for _ in world.objects],
                "names": [o.category for o in world.objects], "width": world.width, "height": world.height}))
            for k in range(2):
                item = vcr_item(world, rng, evidence_rng)
                if item is None:
                    continue
                record = {"movie": "shapes_world", "objects": [o.category for o in world.objects],
                          "interesting_scores": [0], "img_fn": image, "metadata_fn": meta,
                          "question_orig": " ".join(t if isinstance(t, str) else "it" for t in item["question"]),
                          "annot_id": f"{split}-{index * 10 + k}", "img_id": f"{split}-{index}",
                          "question_number": k, **item}
                if split == "test":  # distributed without labels
                    record.pop("answer_label")
                    record.pop("rationale_label")
                files[split].write(json.dumps(record) + "\n")
    finally:
        for f in files.values():
            f.close()
    # VCR's format has no version field: a corpus built before VCR_VERSION is told by this file (shards.demo), written
    # last so that a build stopped half way is rebuilt
    (out / "version.txt").write_text(VCR_VERSION + "\n")
    return out


# --- RefCOCO+ --------------------------------------------------------------------------------------------

def _referable(world: sw.Scene, k: int, seen: list[float]) -> bool:
    """Whether object k is in view as a caption's objects are (`seen`: `visible_fractions`, at least
    `CAPTION_MIN_VISIBLE` of it) and has a description no other object shares, as a person looking at the
    picture sees them: a visible object by its colour and category; one under the cloth only as the one cloth
    (what it hides cannot be seen, so a second cloth makes "the star under the cloth" a guess)."""
    o = world.objects[k]
    if seen[k] < sw.CAPTION_MIN_VISIBLE:
        return False
    if o.covered:
        return sum(p.covered for p in world.objects) == 1
    return sum(not p.covered and (p.colour, p.category) == (o.colour, o.category) for p in world.objects) == 1


def _expressions(world: sw.Scene, k: int, rng: random.Random) -> list[str]:
    """Appearance-only descriptions (RefCOCO+ forbids location words) of a referable object, each of which
    picks it out alone, as the ReferIt game's listener had to find it: "red one" only when no other visible
    object is red."""
    o = world.objects[k]
    if o.covered:
        return [f"covered {o.category}", f"the {o.category} under the cloth", "grey cloth"][: rng.randint(2, 3)]
    forms = [f"{o.colour} {o.category}", f"the {o.size} {o.colour} {o.category}", f"{o.colour} one",
             f"{o.category} that is {o.colour}"]
    if sum(not p.covered and p.colour == o.colour for p in world.objects) > 1:
        forms.remove(f"{o.colour} one")
    return rng.sample(forms, rng.randint(2, 3))


def _relational(world: sw.Scene, k: int, seen: list[float], rng: random.Random) -> list[str]:
    """Expressions that tell object k from the other objects of its category by its relation to a third one
    ("the circle left of the blue star"): k in view and uncovered, another uncovered object of its category
    anywhere in the picture (however hidden), a landmark of another category in view that its colour and category
    pick out alone, and no other object of k's category in that relation to it (`shapes_world.relation`, as the
    captions word it). Relative to an object, not absolute ("left dog"), which RefCOCO+ forbids; at most two, with
    different landmarks. Empty when k's category is its own: its names already pick it out."""
    o = world.objects[k]
    if o.covered or seen[k] < sw.CAPTION_MIN_VISIBLE:
        return []
    uncovered = [p for p in world.objects if not p.covered]
    others = [p for i, p in enumerate(world.objects) if i != k and not p.covered and p.category == o.category]
    if not others:
        return []
    forms = []
    for j, m in enumerate(world.objects):
        if m.covered or m.category == o.category or seen[j] < sw.CAPTION_MIN_VISIBLE:
            continue
        if sum((p.colour, p.category) == (m.colour, m.category) for p in uncovered) > 1:
            continue
        rel = sw.relation(o, m)
        if all(sw.relation(p, m) != rel for p in others):
            forms.append(f"the {o.category} {rel} the {m.colour} {m.category}")
    return rng.sample(forms, min(2, len(forms)))


def write_refcoco(raw: Path, seed: int, n_train_images: int = 1000) -> Path:
    out = raw / "refcoco+"
    out.mkdir(parents=True, exist_ok=True)
    categories = [{"id": k, "name": c, "supercategory": "shape"} for k, c in enumerate(sw.CATEGORIES, 1)]
    images, annotations, refs, dets = [], [], [], []
    n_train = 0
    for index, image, world, is_val in _scenes(raw):
        if not is_val:
            if n_train >= n_train_images:
                continue
            n_train += 1
        rng = python_rng(seed, "demo refcoco", index)
        # its own stream, so that the names and boxes are version 2's draws
        relation_rng = python_rng(seed, "demo refcoco relation", index)
        images.append({"id": index, "file_name": Path(image).name, "width": world.width, "height": world.height})
        ann_ids = []
        for k, o in enumerate(world.objects):
            x1, y1, x2, y2 = o.box
            ann_id = index * 100 + k
            ann_ids.append(ann_id)
            annotations.append({"id": ann_id, "image_id": index, "category_id": o.class_id, "iscrowd": 0,
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1)})
            # a detector's view: jittered boxes, scores, and now and then a miss
            if rng.random() < 0.95:
                s = x2 - x1
                jx, jy = rng.uniform(-0.12, 0.12) * s, rng.uniform(-0.12, 0.12) * s
                w = s * rng.uniform(0.85, 1.15)
                bx, by = max(0.0, x1 + jx), max(0.0, y1 + jy)
                dets.append({"det_id": len(dets), "image_id": index, "category_id": o.class_id,
                             "box": [round(bx, 1), round(by, 1), round(min(w, world.width - bx), 1),
                                     round(min(w, world.height - by), 1)], "score": round(rng.uniform(0.6, 1), 3)})
        for _ in range(rng.randint(1, 3)):  # false positives
            w = rng.uniform(0.1, 0.3) * min(world.width, world.height)
            bx, by = rng.uniform(0, world.width - w), rng.uniform(0, world.height - w)
            dets.append({"det_id": len(dets), "image_id": index, "category_id": rng.randint(1, 8),
                         "box": [round(bx, 1), round(by, 1), round(w, 1), round(w, 1)],
                         "score": round(rng.uniform(0.3, 0.7), 3)})
        seen = sw.visible_fractions(world)
        for k, o in enumerate(world.objects):
            texts = (_expressions(world, k, rng) if _referable(world, k, seen) else []) + \
                _relational(world, k, seen, relation_rng)
            if not texts:
                continue
            if is_val:
                if index % 2 == 0:
                    split = "val"
                else:  # like testA's "several people": the referent has look-alikes of its category
                    split = "testA" if sum(p.category == o.category for p in world.objects) > 1 else "testB"
            else:
                split = "train"
            sentences = []
            for text in texts:
                sent_id = index * 1000 + k * 10 + len(sentences)
                sentences.append({"tokens": text.split(), "raw": text, "sent_id": sent_id, "sent": text})
            refs.append({"sent_ids": [s["sent_id"] for s in sentences], "file_name": f"COCO_{index:06d}_{k}.jpg",
                         "ann_id": ann_ids[k], "ref_id": len(refs), "image_id": index, "split": split,
                         "sentences": sentences, "category_id": o.class_id})
    with open(out / "refs(unc).p", "wb") as f:
        pickle.dump(refs, f, protocol=2)  # the refer toolkit's pickles are protocol 2
    info = {"description": "shapes-world demo in RefCOCO+ format", "version": REFCOCO_VERSION}
    (out / "instances.json").write_text(json.dumps({"info": info, "images": images, "annotations": annotations,
                                                    "categories": categories}))
    (out / "dets.json").write_text(json.dumps(dets))
    return out


# --- detector warm-up -------------------------------------------------------------------------------------

def write_detection(raw: Path) -> Path:
    """COCO instances with colour attributes and sizes for the corpus' train and val images. An object under
    the grey cloth is left out: its category cannot be seen, and a detector taught to name it would
    hallucinate."""
    out = raw / "detection"
    out.mkdir(parents=True, exist_ok=True)
    categories = [{"id": k, "name": c, "supercategory": "shape"} for k, c in enumerate(sw.CATEGORIES, 1)]
    attributes = [{"id": k, "name": c} for k, c in enumerate(sw.COLOURS, 1)]
    colour_id = {a["name"]: a["id"] for a in attributes}
    sizes = [{"id": k, "name": c} for k, c in enumerate(sw.SIZES, 1)]
    size_id = {a["name"]: a["id"] for a in sizes}
    splits = {"train": ([], []), "val": ([], [])}
    for index, image, world, is_val in _scenes(raw):
        images, annotations = splits["val" if is_val else "train"]
        images.append({"id": index, "file_name": image, "width": world.width, "height": world.height})
        for k, o in enumerate(world.objects):
            if o.covered:
                continue
            x1, y1, x2, y2 = o.box
            annotations.append({"id": index * 100 + k, "image_id": index, "category_id": o.class_id,
                                "attribute_ids": [colour_id[o.colour]], "size_id": size_id[o.size], "iscrowd": 0,
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1)})
    for split, (images, annotations) in splits.items():
        (out / f"instances_{split}.json").write_text(json.dumps({
            "images": images, "annotations": annotations, "categories": categories, "attributes": attributes,
            "sizes": sizes}))
    return out


def write_retrieval(raw: Path, seed: int, per_image: int = 5) -> Path:
    """Image-text retrieval data in Karpathy's `dataset_flickr30k.json` format: every image with its split
    (the corpus' train images "train"; its held-out images "val" for the first half, "test" for the rest),
    filename and `per_image` sentences (the corpus caption first, then new draws; each `raw` with its
    lower-cased `tokens`), sentence ids counting over the file."""
    out = raw / "retrieval"
    out.mkdir(parents=True, exist_ok=True)
    images, sentid = [], 0
    scenes = list(_scenes(raw))
    held_out = [image for _, image, _, is_val in scenes if is_val]
    val = set(held_out[: len(held_out) // 2])
    captions = {obj["image"]: obj["caption"] for obj in map(json.loads, open(raw / "scenes.jsonl"))}
    for image_id, image, scene, is_val in scenes:
        rng = python_rng(seed, "demo retrieval", image_id)
        texts = [captions[image]] + [sw.caption(scene, rng)[0] for _ in range(per_image - 1)]
        sentences = [{"tokens": text.replace(",", " ,").split(), "raw": text, "imgid": len(images),
                      "sentid": sentid + k} for k, text in enumerate(texts)]
        images.append({"sentids": [s["sentid"] for s in sentences], "imgid": len(images), "sentences": sentences,
                       "split": ("val" if image in val else "test") if is_val else "train",
                       "filename": Path(image).name})
        sentid += len(sentences)
    (out / "dataset_flickr30k.json").write_text(json.dumps({"images": images, "dataset": "flickr30k"}))
    return out


def write_all(raw: Path, seed: int) -> None:
    write_detection(raw)
    write_retrieval(raw, seed)
    write_vqa(raw, seed)
    write_vcr(raw, seed)
    write_refcoco(raw, seed)
