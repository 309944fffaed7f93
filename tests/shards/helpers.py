"""Small input files written from the formats themselves (not from our writers' output)."""

import io
import json
import tarfile

import numpy as np
from PIL import Image


def jpeg_bytes(w, h, colour=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), colour).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def write_tsv_corpus(root, rows, boxes):
    """rows: (caption, image name, (w, h) or None for a missing file, raw line override or None)."""
    (root / "img").mkdir(parents=True, exist_ok=True)
    lines = []
    for caption, name, size, raw in rows:
        if size is not None:
            (root / "img" / name).write_bytes(jpeg_bytes(*size))
        lines.append(raw if raw is not None else f"{caption}\t{name}")
    (root / "cc.tsv").write_text("\n".join(lines) + "\n")
    with open(root / "boxes.jsonl", "w") as f:
        for name, entry in boxes.items():
            f.write(json.dumps({"image": name, **entry}) + "\n")
    return root / "cc.tsv"


def add_member(tar, name, data: bytes):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_caption_shard(path, samples):
    """samples: dicts with key, caption, image bytes, boxes, classes, scores[, probs]."""
    with tarfile.open(path, "w") as tar:
        for s in samples:
            meta = {"caption": s["caption"], "width": s["width"], "height": s["height"], "boxes": s["boxes"],
                    "classes": s["classes"], "scores": s["scores"]}
            add_member(tar, f"{s['key']}.jpg", s["jpg"])
            add_member(tar, f"{s['key']}.json", s.get("json_bytes") or json.dumps(meta).encode())
            if "probs" in s:
                buf = io.BytesIO()
                np.save(buf, np.asarray(s["probs"], dtype=np.float16))
                add_member(tar, f"{s['key']}.probs.npy", buf.getvalue())


def write_text_shard(path, chunks, start=0):
    with tarfile.open(path, "w") as tar:
        for i, ids in enumerate(chunks):
            add_member(tar, f"{start + i:09d}.json", json.dumps({"input_ids": ids, "text": "", "source": "t"}).encode())
