"""RefCOCO+ box sets between the gt track and the detected one (docs/FINETUNE.md, session 79), in dets.json's format:
a detection is an object's when it reaches IoU 0.5 with one of the image's annotated objects (the demo's detections are
each object's box jittered, kept at 95%, plus 1-3 false positives a picture), a false positive otherwise.
  objects_only: the detections less the false positives (jittered boxes, 5% of objects missing);
  gt_and_false: every annotated box exact, plus the false positives.

    python docs/table4_demo/refcoco_s79/boxsets.py --data data/demo_val4000/raw/refcoco+ --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torchvision.ops import box_iou

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from shards.coco import read_instances, xywh_to_xyxy  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/demo_val4000/raw/refcoco+", help="instances.json and dets.json")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    data, out = Path(args.data), Path(args.out)
    _, anns, by_image = read_instances(data / "instances.json")
    dets = json.loads((data / "dets.json").read_text())
    per_image: dict[int, list[dict]] = {}
    for d in dets:
        per_image.setdefault(int(d["image_id"]), []).append(d)
    objects_only, gt_and_false = [], []
    counts = {"detections": len(dets), "false_positives": 0, "objects": 0}
    for image, ann_ids in by_image.items():
        gt = torch.tensor([anns[a]["box"] for a in ann_ids], dtype=torch.float32)
        found = per_image.get(image, [])
        boxes = torch.tensor([xywh_to_xyxy(d["box"]) for d in found], dtype=torch.float32).reshape(-1, 4)
        of_object = (box_iou(boxes, gt) >= 0.5).any(1) if len(found) else torch.zeros(0, dtype=torch.bool)
        for d, real in zip(found, of_object.tolist()):
            (objects_only if real else gt_and_false).append(d)
            counts["false_positives"] += not real
        for a in ann_ids:
            x1, y1, x2, y2 = anns[a]["box"]
            gt_and_false.append({"det_id": -1, "image_id": image, "category_id": anns[a]["category_id"],
                                 "box": [x1, y1, x2 - x1, y2 - y1], "score": 1.0})
            counts["objects"] += 1
    out.mkdir(parents=True, exist_ok=True)
    for name, items in (("objects_only", objects_only), ("gt_and_false", gt_and_false)):
        (out / f"{name}.json").write_text(json.dumps([dict(d, det_id=k) for k, d in enumerate(items)]))
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
