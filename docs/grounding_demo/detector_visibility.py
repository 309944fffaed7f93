"""The detector's held-out object and colour accuracy by how much of each object the image shows.

Objects drawn later occlude earlier ones; `shards.shapes_world.visible_fractions` gives each object's share of
its own pixels left in view. A detector cannot name what is hidden, so its errors on mostly hidden objects say
nothing about its quality, and its accuracy on objects in view is the figure to improve (docs/ABLATION.md,
session 15).

    python docs/grounding_demo/detector_visibility.py FAST_RCNN.pt [--config DETECTOR.yaml] [key=value ...]
"""

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, ".")
from model.boxes import box_iou  # noqa: E402
from model.config import load_config  # noqa: E402
from pretrain.detector import BoxSet, DetectorConfig, DetectorWarmup, read_vocabularies  # noqa: E402
from shards.shapes_world import Scene, ShapeObject, visible_fractions  # noqa: E402

BINS = [(0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 0.95), (0.95, 1.01)]

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("weights")
p.add_argument("--config", default="launch/configs/detector_demo.yaml")
p.add_argument("overrides", nargs="*", help="DetectorConfig fields, e.g. fast_rcnn.feature_stride=8")
args = p.parse_args()
torch.set_num_threads(2)
cfg = load_config(DetectorConfig, args.config, args.overrides)
_, attributes = read_vocabularies(cfg.train)
module = DetectorWarmup(replace(cfg.fast_rcnn, weights=None, norm="frozen"), max(attributes), cfg.attribute_weight)
module.fast_rcnn.load_state_dict(torch.load(args.weights, map_location="cpu", weights_only=True), strict=False)
module.eval()
val = BoxSet(cfg.val, cfg, cfg.fast_rcnn.num_classes, max(attributes))
scenes = [json.loads(line) for line in (Path(cfg.image_root) / "scenes.jsonl").read_text().splitlines()]
rows = []  # (visible fraction, object right, colour right)
with torch.no_grad():
    for start in range(0, len(val), cfg.eval_batch_size):
        indices = list(range(start, min(len(val), start + cfg.eval_batch_size)))
        batch = val.batch(indices)
        cls, att = module.logits(batch)
        for b, i in enumerate(indices):
            image_id, _, anns = val.items[i]
            scene = scenes[image_id]
            objects = [ShapeObject(o["category"], o["colour"], o["size"], tuple(o["box"]), o["covered"])
                       for o in scene["objects"]]
            fractions = visible_fractions(Scene(scene["width"], scene["height"], (0, 0, 0), objects))
            # the annotation's object: the scene object with the same box
            match = box_iou(torch.tensor([a["box"] for a in anns]), torch.tensor([o.box for o in objects])).argmax(1)
            for j, a in enumerate(anns):
                rows.append((fractions[int(match[j])], int(cls[b, j, 1:].argmax()) + 1 == a["category_id"],
                             int(att[b, j].argmax()) + 1 in a["attribute_ids"]))
r = np.array(rows, dtype=float)
print(f"{args.weights}: {len(r)} held-out objects, object {r[:, 1].mean():.3f}, colour {r[:, 2].mean():.3f}\n")
print("| visible fraction | objects | object accuracy | colour accuracy |\n|---|---|---|---|")
for lo, hi in BINS:
    s = (r[:, 0] >= lo) & (r[:, 0] < hi)
    if s.any():
        print(f"| {lo:.2f}-{min(hi, 1.0):.2f} | {int(s.sum())} | {r[s, 1].mean():.3f} | {r[s, 2].mean():.3f} |")
