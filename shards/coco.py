"""COCO-format instance annotations (`instances_*.json`): images, boxes (x, y, w, h) and categories.

Optionally Visual-Genome-style attributes, as bottom-up-attention detectors are trained with: a
top-level `attributes: [{id, name}]` list next to `categories`, and `attribute_ids: [...]` on each
annotation. Optionally sizes, attributes read off the box's geometry rather than its pixels (RoIAlign
resamples every box to the same grid, so appearance cannot tell a large object from a small one): a
top-level `sizes: [{id, name}]` list and one `size_id` per annotation (0 or absent: none). Used by
RefCOCO+ (candidate regions) and the supervised detector warm-up.
"""

from __future__ import annotations

import json
from pathlib import Path


class CocoFormatError(ValueError):
    pass


def xywh_to_xyxy(b) -> list[float]:
    x, y, w, h = (float(v) for v in b)
    return [x, y, x + w, y + h]


def read_instances(path: str | Path) -> tuple[dict[int, dict], dict[int, dict], dict[int, list[int]]]:
    """images by id, annotations by id (box as x1, y1, x2, y2; category_id; attribute_ids; size_id; iscrowd)
    and annotation ids per image, in file order."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: not found") from None
    images = {}
    for i, im in enumerate(data.get("images", [])):
        try:
            images[int(im["id"])] = {"file_name": im["file_name"], "width": int(im["width"]),
                                     "height": int(im["height"])}
        except (KeyError, TypeError, ValueError) as e:
            raise CocoFormatError(f"{path}: images[{i}]: missing or bad field {e}") from None
    anns, by_image = {}, {}
    for i, a in enumerate(data.get("annotations", [])):
        try:
            anns[int(a["id"])] = {"image_id": int(a["image_id"]), "box": xywh_to_xyxy(a["bbox"]),
                                  "category_id": int(a.get("category_id", 0)),
                                  "attribute_ids": [int(k) for k in a.get("attribute_ids", [])],
                                  "size_id": int(a.get("size_id", 0)),
                                  "iscrowd": int(a.get("iscrowd", 0))}
        except (KeyError, TypeError, ValueError) as e:
            raise CocoFormatError(f"{path}: annotations[{i}]: missing or bad field {e}") from None
        by_image.setdefault(int(a["image_id"]), []).append(int(a["id"]))
    return images, anns, by_image


def read_vocabularies(path: str | Path) -> tuple[dict[int, str], dict[int, str], dict[int, str]]:
    """{id: name} of the file's categories, attributes and sizes (empty when it has none)."""
    data = json.loads(Path(path).read_text())
    out = []
    for key in ("categories", "attributes", "sizes"):
        try:
            out.append({int(c["id"]): str(c["name"]) for c in data.get(key, [])})
        except (KeyError, TypeError, ValueError) as e:
            raise CocoFormatError(f"{path}: {key}: missing or bad field {e}") from None
    return out[0], out[1], out[2]
