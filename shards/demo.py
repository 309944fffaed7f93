"""Build the embedded demo corpus: the seeded shapes world, written in the users' input formats and
then turned into shards by the same writers users run.

Raw layout under `<out>/raw/`:
  images/NNNNNN.jpg                     the rendered scenes
  captions_{train,val}.tsv              Conceptual-Captions-style `caption<TAB>image`
  boxes.jsonl                           box file: ground-truth boxes, class ids and a detector-like
                                        class distribution per box (peaked; flatter for covered objects),
                                        and a colour distribution likewise (`attribute_probs`; none
                                        peaked for a covered object, whose colour is under the cloth)
  scenes.jsonl                          full scene annotations (colour, size, covered) for task data
  class_names.json                      ["__background__", "circle", ...]
  books/book_NNN.txt                    BooksCorpus-style, one book per file
  wiki/wiki_000.txt                     Wikipedia-style dump, articles separated by blank lines
  flickr30k_entities/                   the val images as Flickr30k Entities (Sentences/, Annotations/,
                                        val.txt) plus their region box file keyed `<id>.jpg`, for the
                                        cross-modal ablation diagnostic (`python -m diagnostics.ablation`)
  vqg/                                  visual question generation data in VQG_COCO's format (csv per
                                        split + COCO captions JSON), for `launch/finetune_vqg.sh`
  vqa/, vcr/, refcoco+/, retrieval/     finetuning data in VQA v2's, VCR's, the refer toolkit's and Karpathy's
                                        retrieval split formats
  detection/                            COCO instances + colour attributes for the detector warm-up
                                        (see shards/demo_tasks.py), for `launch/finetune_<task>.sh`
Shards under `<out>/shards/{captions-train,captions-val,text}/` with a manifest each.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from . import demo_tasks
from . import shapes_world as sw
from .caption_inputs import iter_tsv, load_box_file
from .seeding import numpy_rng, python_rng
from .skips import SkipLog
from .tokenizer import load_tokenizer
from .write_captions import write_caption_shards
from .write_text import iter_books, iter_wiki, write_text_shards


def detector_like_probs(true: int, n: int, peak: float, rng: np.random.Generator) -> np.ndarray:
    """A class (or attribute) distribution over n shaped like a detector's: `peak` of the mass on the true one,
    the rest spread unevenly."""
    noise = rng.dirichlet(np.full(n, 0.5))
    probs = (1 - peak) * noise
    probs[true] += peak
    return probs.astype(np.float16)


def write_raw(out: Path, n_images: int, n_val: int, seed: int, n_books: int, n_articles: int) -> None:
    raw = out / "raw"
    (raw / "images").mkdir(parents=True, exist_ok=True)
    (raw / "books").mkdir(exist_ok=True)
    (raw / "wiki").mkdir(exist_ok=True)
    rng = python_rng(seed, "demo world", 0)
    nprng = numpy_rng(seed, "demo world", 1)
    # the colour distributions draw from their own stream: every other draw of the corpus stays what it was
    colour_rng = numpy_rng(seed, "demo world", 2)
    colours = list(sw.COLOURS)  # the warm-up detector's attribute order (shards.demo_tasks)
    (raw / "class_names.json").write_text(json.dumps(sw.CLASS_NAMES))
    with open(raw / "captions_train.tsv", "w") as train, open(raw / "captions_val.tsv", "w") as val, \
            open(raw / "boxes.jsonl", "w") as boxes, open(raw / "scenes.jsonl", "w") as scenes:
        for i in tqdm(range(n_images), desc="shapes world", unit="img"):
            scene = sw.sample_scene(rng)
            image = sw.render(scene, rng)
            name = f"images/{i:06d}.jpg"
            image.save(raw / name, quality=92)
            text, named = sw.caption(scene, rng)
            (val if i >= n_images - n_val else train).write(f"{text}\t{name}\n")
            # a covered object is hard to see: its class distribution is flatter, and its colour is under the cloth
            # (no peak: the colour distribution a detector gives a grey cloth carries nothing of the object's)
            probs = np.stack([detector_like_probs(o.class_id, len(sw.CLASS_NAMES), 0.35 if o.covered else 0.85, nprng)
                              for o in scene.objects])
            attributes = np.stack([detector_like_probs(colours.index(o.colour), len(colours),
                                                       0.0 if o.covered else 0.85, colour_rng) for o in scene.objects])
            boxes.write(json.dumps({
                "image": name, "boxes": [list(o.box) for o in scene.objects],
                "classes": [o.class_id for o in scene.objects], "scores": [1.0] * len(scene.objects),
                "class_probs": probs.astype(float).round(4).tolist(),
                "attribute_probs": attributes.astype(float).round(4).tolist()}) + "\n")
            scenes.write(json.dumps({
                "image": name, "width": scene.width, "height": scene.height, "caption": text, "named": named,
                "objects": [{"category": o.category, "colour": o.colour, "size": o.size, "box": list(o.box),
                             "covered": o.covered} for o in scene.objects]}) + "\n")
    for b in range(n_books):
        paragraphs = [sw.prose_paragraph(rng) for _ in range(rng.randint(8, 20))]
        (raw / "books" / f"book_{b:03d}.txt").write_text("\n\n".join(paragraphs) + "\n")
    with open(raw / "wiki" / "wiki_000.txt", "w") as wiki:
        for _ in range(n_articles):
            wiki.write("\n".join(sw.prose_paragraph(rng, 2, 5) for _ in range(rng.randint(1, 3))) + "\n\n")


def _entities_xml(image_id: str, scene: dict, chains: list[list[int]]) -> str:
    lines = ["<annotation>", f"  <filename>{image_id}.jpg</filename>",
             f"  <size><width>{scene['width']}</width><height>{scene['height']}</height><depth>3</depth></size>"]
    for obj, names in zip(scene["objects"], chains):
        x1, y1, x2, y2 = obj["box"]
        # continuous pixels -> the 1-based inclusive corners of the pixels the box touches
        corners = (math.floor(x1) + 1, math.floor(y1) + 1, min(math.ceil(x2), scene["width"]),
                   min(math.ceil(y2), scene["height"]))
        lines.append("  <object>" + "".join(f"<name>{c}</name>" for c in names) + "<bndbox>" + "".join(
            f"<{t}>{v}</{t}>" for t, v in zip(("xmin", "ymin", "xmax", "ymax"), corners)) + "</bndbox></object>")
    lines.append("</annotation>")
    return "\n".join(lines) + "\n"


def write_flickr30k_entities(raw: Path, seed: int, sentences_per_image: int = 5) -> Path:
    """The val images in Flickr30k Entities' distributed format: 5 captions per image with every
    mention marked (object chains; "N shapes" is a chain over every box; "other shapes" is chain 0,
    not visual), the boxes as 1-based inclusive corners, a split list, and the images' box file."""
    out = raw / "flickr30k_entities"
    (out / "Sentences").mkdir(parents=True, exist_ok=True)
    (out / "Annotations").mkdir(exist_ok=True)
    val_images = {line.split("\t")[1].strip() for line in open(raw / "captions_val.tsv") if line.strip()}
    boxes = {json.loads(line)["image"]: line for line in open(raw / "boxes.jsonl") if line.strip()}
    ids = []
    with open(raw / "scenes.jsonl") as scenes, open(out / "boxes_val.jsonl", "w") as box_file:
        for line in scenes:
            scene = json.loads(line)
            if scene["image"] not in val_images:
                continue
            image_id = Path(scene["image"]).stem
            index = int(image_id)
            chain = [str(index * 10 + k + 1) for k in range(len(scene["objects"]))]
            group = str(index * 10 + 9)
            world = sw.Scene(scene["width"], scene["height"], (0, 0, 0), [
                sw.ShapeObject(o["category"], o["colour"], o["size"], tuple(o["box"]), o["covered"])
                for o in scene["objects"]])

            def mark(target, text, chain=chain, group=group):
                tag = "0/notvisual" if target is None else f"{group if target == 'all' else chain[target]}/other"
                return f"[/EN#{tag} {text}]"

            rng = python_rng(seed, "demo entities", index)
            # tokenised as the distributed captions are: punctuation stands apart
            sentences = [sw.caption(world, rng, mark)[0].replace("],", "] ,") for _ in range(sentences_per_image)]
            (out / "Sentences" / f"{image_id}.txt").write_text("\n".join(sentences) + "\n")
            (out / "Annotations" / f"{image_id}.xml").write_text(
                _entities_xml(image_id, scene, [[c, group] for c in chain]))
            entry = json.loads(boxes[scene["image"]])
            entry["image"] = f"{image_id}.jpg"
            box_file.write(json.dumps(entry) + "\n")
            ids.append(image_id)
    (out / "val.txt").write_text("\n".join(ids) + "\n")
    return out


def write_vqg(raw: Path, seed: int, n_train: int = 1600, n_val: int = 200) -> Path:
    """Visual question generation data in VQG_COCO's distributed format: `coco_{train,val,test}_all.csv`
    (`image_id,image_url,questions,ratings`, questions joined by `---`) and COCO-format captions
    (`captions_train2014.json` for train images, `captions_val2014.json` for val and test, as VQG_COCO's
    val/test images come from COCO val), 5 captions per image (the first is the corpus caption). The
    test split is the corpus' held-out val images."""

    out = raw / "vqg"
    out.mkdir(parents=True, exist_ok=True)
    val_images = {line.split("\t")[1].strip() for line in open(raw / "captions_val.tsv") if line.strip()}
    splits: dict[str, list] = {"train": [], "val": [], "test": []}
    captions = {"train": {"images": [], "annotations": []}, "val": {"images": [], "annotations": []}}
    seen_train = 0
    with open(raw / "scenes.jsonl") as scenes:
        for line in scenes:
            scene = json.loads(line)
            index = int(Path(scene["image"]).stem)
            if scene["image"] in val_images:
                split = "test"
            elif seen_train < n_train:
                split, seen_train = "train", seen_train + 1
            elif seen_train < n_train + n_val:
                split, seen_train = "val", seen_train + 1
            else:
                continue
            world = sw.Scene(scene["width"], scene["height"], (0, 0, 0), [
                sw.ShapeObject(o["category"], o["colour"], o["size"], tuple(o["box"]), o["covered"])
                for o in scene["objects"]])
            rng = python_rng(seed, "demo questions", index)
            qs = sw.questions(world, rng, 5)
            splits[split].append([index, scene["image"], "---".join(qs), "---".join("3" for _ in qs)])
            coco = captions["train" if split == "train" else "val"]
            coco["images"].append({"id": index, "file_name": scene["image"], "width": scene["width"],
                                   "height": scene["height"]})
            texts = [scene["caption"]] + [sw.caption(world, rng)[0] for _ in range(4)]
            for j, text in enumerate(texts):
                coco["annotations"].append({"image_id": index, "id": index * 10 + j, "caption": text})
    for split, rows in splits.items():
        with open(out / f"coco_{split}_all.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["image_id", "image_url", "questions", "ratings"])
            writer.writerows(rows)
    for split, data in captions.items():
        (out / f"captions_{split}2014.json").write_text(json.dumps(data))
    return out


def _write_vqg_split(raw: Path, seed: int, n_images: int, n_val: int) -> Path:
    pool = n_images - n_val  # the held-out val images are VQG's test split; train/val share the rest 4:1
    return write_vqg(raw, seed, n_train=min(1600, pool * 4 // 5), n_val=min(200, pool // 5))


def build_demo(out: str | Path = "data/demo", *, n_images: int = 2000, n_val: int = 200, seed: int = 0,
               n_books: int = 24, n_articles: int = 200, tokenizer: str | None = None,
               force: bool = False, progress: bool = True) -> Path:
    out = Path(out)
    shards = out / "shards"
    done = [shards / d / "manifest.json" for d in ("captions-train", "captions-val", "text")]
    raw = out / "raw"
    if all(p.exists() for p in done) and not force:
        if not (raw / "flickr30k_entities" / "val.txt").exists():  # corpora built before it existed
            write_flickr30k_entities(raw, seed)
        if not (raw / "vqg" / "coco_test_all.csv").exists():
            _write_vqg_split(raw, seed, n_images, n_val)
        refcoco = raw / "refcoco+" / "instances.json"
        if not refcoco.exists():
            demo_tasks.write_all(raw, seed)
        elif json.loads(refcoco.read_text()).get("info", {}).get("version") != demo_tasks.REFCOCO_VERSION:
            demo_tasks.write_refcoco(raw, seed)  # built with expressions that did not pick out one object
        vcr_version = raw / "vcr" / "version.txt"
        if not vcr_version.exists() or vcr_version.read_text().strip() != demo_tasks.VCR_VERSION:
            demo_tasks.write_vcr(raw, seed)  # built with rationales that restated their answers
        if not (raw / "retrieval" / "dataset_flickr30k.json").exists():  # built before retrieval existed
            demo_tasks.write_retrieval(raw, seed)
        detection = raw / "detection" / "instances_val.json"
        if not detection.exists() or "sizes" not in json.loads(detection.read_text()):  # built before sizes
            demo_tasks.write_detection(raw)
        print(f"demo corpus already built under {out} (pass --force to rebuild)", file=sys.stderr)
        return out
    write_raw(out, n_images, n_val, seed, n_books, n_articles)
    write_flickr30k_entities(raw, seed)
    _write_vqg_split(raw, seed, n_images, n_val)
    demo_tasks.write_all(raw, seed)
    class_names = json.loads((raw / "class_names.json").read_text())
    meta = {"class_names": class_names, "num_classes": len(class_names)}
    for split in ("train", "val"):
        skips = SkipLog("images")
        boxes = load_box_file(raw / "boxes.jsonl", skips, len(class_names))
        manifest = write_caption_shards(iter_tsv(raw / f"captions_{split}.tsv"), shards / f"captions-{split}",
                                        boxes=boxes, skips=skips, max_count=500, meta=meta, progress=progress)
        print(f"captions-{split}: {manifest['total']} samples in {len(manifest['shards'])} shards; "
              f"{skips.skipped} skipped", file=sys.stderr)

    def documents():
        yield from iter_books(raw / "books")
        yield from iter_wiki(str(raw / "wiki" / "*.txt"))

    skips = SkipLog("documents")
    manifest = write_text_shards(documents(), shards / "text", tokenizer=load_tokenizer(tokenizer),
                                 skips=skips, max_count=1000, progress=progress)
    print(f"text: {manifest['total']} chunks in {len(manifest['shards'])} shards", file=sys.stderr)
    return out


def ensure_demo(out: str | Path = "data/demo", builder: bool = True, timeout_s: float = 1800) -> Path:
    """Build the demo corpus once when several processes start together: the builder builds, the
    others wait for its last manifest."""

    out = Path(out)
    last = out / "shards" / "text" / "manifest.json"
    if builder:
        return build_demo(out)
    deadline = time.monotonic() + timeout_s
    while not last.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f}s for the demo corpus under {out}")
        time.sleep(2)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Build the synthetic shapes-world demo corpus and its shards.",
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="data/demo")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--val", type=int, default=200, help="of --images, how many go to the val split")
    p.add_argument("--books", type=int, default=24)
    p.add_argument("--articles", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", help="local BERT tokenizer directory (default: packaged all-MiniLM-L6-v2)")
    p.add_argument("--force", action="store_true", help="rebuild even if the shards exist")
    args = p.parse_args(argv)
    if args.val >= args.images:
        p.error("--val must be smaller than --images")
    build_demo(args.out, n_images=args.images, n_val=args.val, seed=args.seed, n_books=args.books,
               n_articles=args.articles, tokenizer=args.tokenizer, force=args.force)
    print(f"demo corpus ready under {args.out}/shards", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
