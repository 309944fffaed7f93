"""What a RefCOCO+ finetune picks when it misses a relational expression ("the heart below the blue cross"): the
object its box covers best in the scene, sorted into a look-alike (the referent's category: the relation misread),
the landmark itself, an object of the landmark's category or of its colour (drawn by the landmark's words), or
another; counts summed over the seeds a glob matches, per row (docs/FINETUNE.md, session 76).

    python docs/table4_demo/refcoco_s76/errors.py \
        --row step0='runs/refcoco_s75/rl_table_gt/full_s*/none/predictions_val.json' \
        --row pretrained='runs/refcoco_s75/rl_table_gt/full_s*/pretrained/predictions_val.json' [--out OUT.json]
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from collections import Counter
from pathlib import Path

import torch
from torchvision.ops import box_iou

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from docs.table4_demo.lowdata_s62.name_reader import kind_of  # noqa: E402
from finetune.refcoco import read_refs  # noqa: E402

KINDS = ("right", "look-alike", "the landmark", "landmark's category", "landmark's colour", "other")


def best_covered(box: list[float], objects: list[dict]) -> dict:
    """The scene object (its box [x1, y1, x2, y2]) a prediction's [x, y, w, h] box overlaps most."""
    x, y, w, h = box
    iou = box_iou(torch.tensor([[x, y, x + w, y + h]]), torch.tensor([o["box"] for o in objects]))[0]
    return objects[int(iou.argmax())]


def classify(sentence: str, picked: dict) -> str:
    """A missed "the <category> <relation> the <colour> <landmark>": which of its words the picked object has."""
    words = sentence.split()
    head, colour, landmark = words[1], words[-2], words[-1]
    if picked["category"] == head:
        return "look-alike"
    if (picked["category"], picked["colour"]) == (landmark, colour):
        return "the landmark"
    if picked["category"] == landmark:
        return "landmark's category"
    if picked["colour"] == colour:
        return "landmark's colour"
    return "other"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--row", action="append", required=True, help="NAME=GLOB of predictions_val.json, one per seed")
    ap.add_argument("--refs", default="data/demo/raw/refcoco+/refs(unc).p")
    ap.add_argument("--instances", default="data/demo/raw/refcoco+/instances.json")
    ap.add_argument("--scenes", default="data/demo/raw/scenes.jsonl", help="the corpus' objects with their colours")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    sentences = {(r["ref_id"], s["sent_id"]): s["sent"] for r in read_refs(args.refs) for s in r["sentences"]}
    files = {i["id"]: Path(i["file_name"]).name for i in json.loads(Path(args.instances).read_text())["images"]}
    scenes = {Path(s["image"]).name: s["objects"] for s in map(json.loads, open(args.scenes))}
    report = {}
    for spec in args.row:
        name, _, pattern = spec.partition("=")
        paths = sorted(glob.glob(pattern))
        if not paths:
            raise SystemExit(f"errors: no predictions match {pattern}")
        counts: Counter = Counter()
        for path in paths:
            for p in json.loads(Path(path).read_text()):
                sentence = sentences[(p["ref_id"], p["sent_id"])]
                if kind_of(sentence) != "relational":
                    continue
                if p["iou"] >= 0.5:
                    counts["right"] += 1
                    continue
                objects = scenes[files[p["image_id"]]]
                counts[classify(sentence, best_covered(p["box"], objects))] += 1
        report[name] = {"files": paths, **{k: counts[k] for k in KINDS}}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
