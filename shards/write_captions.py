"""Captioned images -> WebDataset tar shards for pretraining.

Input: a Conceptual-Captions-style TSV (`caption<TAB>image`) with an image folder, or img2dataset
output tars. Boxes: a box file (JSON lines keyed by image) or a detector pass (`--detector`).
Output per sample: `key.jpg`, `key.json` (caption, width, height, boxes in pixels, class ids, scores,
source) and, where the detector's class distributions are known, `key.probs.npy` (float16
[boxes, classes]); shards are size-capped and `manifest.json` lists the samples per shard and every
skip with its reason.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys

import numpy as np
from tqdm import tqdm

from model.config import load_config

from .caption_inputs import (
    BOX_DISTRIBUTIONS,
    BoxEntry,
    check_boxes,
    iter_img2dataset,
    iter_tsv,
    load_box_file,
    npy_bytes,
    open_image,
)
from .detect import DetectorConfig, RegionDetector, detect_records
from .sink import ShardSink
from .skips import SkipLog


def _jpeg_bytes(rec_bytes: bytes, image) -> bytes:
    """Keep JPEG bytes as they are (no recompression loss); re-encode anything else as JPEG."""
    if image.format == "JPEG" and image.mode in ("RGB", "L"):
        return rec_bytes
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def encode_sample(key: str, source: str, caption: str, jpeg: bytes, width: int, height: int,
                  entry: BoxEntry) -> dict:
    meta = {"caption": caption, "width": width, "height": height,
            "boxes": np.round(entry.boxes, 2).tolist(), "classes": entry.classes.tolist(),
            "scores": np.round(entry.scores, 4).tolist(), "source": source}
    sample = {"__key__": key, "jpg": jpeg, "json": json.dumps(meta).encode("utf-8")}
    for field, member in BOX_DISTRIBUTIONS.items():
        if getattr(entry, field) is not None:
            sample[member] = npy_bytes(getattr(entry, field).astype(np.float16))
    return sample


def write_caption_shards(records, out_dir: str, *, boxes: dict[str, BoxEntry] | None = None, detector=None,
                         skips: SkipLog, prefix: str = "captions", max_count: int = 5000,
                         max_bytes: int = 512 << 20, meta: dict | None = None, progress: bool = True) -> dict:
    sink = ShardSink(out_dir, prefix, max_count=max_count, max_bytes=max_bytes, kind="captions", meta=meta)
    index = 0

    def emit(rec, image, entry: BoxEntry):
        nonlocal index
        width, height = image.size
        entry, problem = check_boxes(entry, width, height)
        if problem:
            skips.skip("bad boxes", rec.where, problem)
            return
        sink.write(encode_sample(f"{index:09d}", rec.key, rec.caption, _jpeg_bytes(rec.image_bytes, image),
                                 width, height, entry))
        index += 1
        skips.ok()

    bar = tqdm(records, desc=f"captions -> {out_dir}", unit="img", disable=not progress)
    if detector is not None:

        for _key, rec, image, det in detect_records(bar, detector, skips):
            emit(rec, image, BoxEntry(det["boxes"], det["classes"].astype(np.int64), det["scores"],
                                      det["class_probs"]))
    else:
        for rec in bar:
            if rec.error:
                skips.skip(rec.error, rec.where, rec.detail)
                continue
            entry = boxes.get(rec.key)
            if entry is None:
                skips.skip("no boxes in the box file for this image", rec.where, rec.key)
                continue
            try:
                image = open_image(rec.image_bytes)
            except Exception as e:  # PIL raises many types for bad bytes
                skips.skip("undecodable image", rec.where, type(e).__name__)
                continue
            emit(rec, image, entry)
    return sink.close(skips.as_dict())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--tsv", help="CC-style TSV: caption<TAB>image (image path relative to --image-root)")
    src.add_argument("--img2dataset", help="img2dataset output tars (glob or brace pattern, comma-separated)")
    p.add_argument("--image-root", help="folder the TSV's image paths are relative to (default: TSV's folder)")
    det = p.add_mutually_exclusive_group(required=True)
    det.add_argument("--boxes", help="box file: JSON lines with image, boxes, classes, scores[, class_probs]")
    det.add_argument("--detector", metavar="CONFIG", help="run the detector pass with this DetectorConfig YAML")
    p.add_argument("--num-classes", type=int, help="detector class count (incl. background), checked in box file")
    p.add_argument("--class-names", help="JSON list of class names, stored in the manifest")
    p.add_argument("--out", required=True, help="output folder for shards and manifest.json")
    p.add_argument("--prefix", default="captions")
    p.add_argument("--max-count", type=int, default=5000, help="samples per shard at most")
    p.add_argument("--max-size-mb", type=float, default=512, help="bytes per shard at most (MB)")
    args = p.parse_args(argv)
    for flag in ("tsv", "boxes", "detector", "class_names", "image_root"):
        path = getattr(args, flag)
        if path and not os.path.exists(path):
            p.error(f"--{flag.replace('_', '-')} {path}: no such file or folder")

    skips = SkipLog("images")
    meta = {}
    if args.class_names:
        meta["class_names"] = json.loads(open(args.class_names).read())
        args.num_classes = args.num_classes or len(meta["class_names"])
    detector = boxes = None
    if args.detector:

        cfg = load_config(DetectorConfig, args.detector)
        detector = RegionDetector(cfg)
        meta["num_classes"] = cfg.num_classes
    else:
        boxes = load_box_file(args.boxes, skips, args.num_classes)
        if args.num_classes:
            meta["num_classes"] = args.num_classes
    records = iter_tsv(args.tsv, args.image_root) if args.tsv else iter_img2dataset(args.img2dataset)
    manifest = write_caption_shards(records, args.out, boxes=boxes, detector=detector, skips=skips,
                                    prefix=args.prefix, max_count=args.max_count,
                                    max_bytes=int(args.max_size_mb * (1 << 20)), meta=meta)
    print(f"{manifest['total']} samples in {len(manifest['shards'])} shards under {args.out}", file=sys.stderr)
    print(skips.summary(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
