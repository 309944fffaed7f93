"""Readers for the captioned-image inputs users bring, and for box files.

- Conceptual-Captions-style TSV: `caption<TAB>image`, the image a path relative to an image folder.
- img2dataset output: WebDataset tars of `key.jpg` (or png/webp), `key.txt`, `key.json`.
- Box file: JSON lines keyed by image (`"image"`: the TSV's image field or the img2dataset key) with
  `boxes` (x1, y1, x2, y2 pixels), `classes`, `scores` and optionally per-box class distributions as
  `class_probs` (lists) or `class_probs_f16` (base64 of float16 [boxes, classes], as `shards.detect`
  writes them), and per-box attribute distributions likewise as `attribute_probs` / `attribute_probs_f16`
  ([boxes, attributes], in the detector's attribute order: a bottom-up-attention detector's attribute
  head; masked RoI classification's attribute targets, `losses.mrc_attribute_targets: shards`).

Bad records are yielded with an `error` (the reason) and a `where` naming file and line or shard and
key, so the writer counts and reports every skip.
"""

from __future__ import annotations

import base64
import glob
import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from braceexpand import braceexpand
from PIL import Image

from .skips import SkipLog, numbered_lines

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")


@dataclass
class CaptionRecord:
    key: str  # looks the record up in a box file: the TSV image field or the img2dataset key
    where: str  # file:line or shard:key, for messages
    caption: str = ""
    image_bytes: bytes | None = None
    error: str | None = None  # reason to skip, when the record is bad before decoding
    detail: str = ""


def expand_paths(pattern: str) -> list[str]:
    """Comma-separated globs or brace patterns -> sorted existing paths; an empty match is an error."""

    paths: list[str] = []
    for part in pattern.split(","):
        part = part.strip()
        if not part:
            continue
        if part.startswith("pipe:") or "://" in part:
            paths.extend(braceexpand(part))  # streamed (e.g. `pipe:aws s3 cp s3://.../{0..99}.tar -`)
            continue
        matched = sorted(p for expanded in braceexpand(part) for p in glob.glob(expanded))
        if not matched:
            raise FileNotFoundError(f"no files match '{part}'")
        paths.extend(matched)
    return paths


def iter_tsv(tsv_path: str | Path, image_root: str | Path | None = None) -> Iterator[CaptionRecord]:
    tsv_path = Path(tsv_path)
    root = Path(image_root) if image_root is not None else tsv_path.parent
    with open(tsv_path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            where = f"{tsv_path}:{lineno}"
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if lineno == 1 and [x.strip().lower() for x in fields] == ["caption", "image"]:
                continue  # optional header
            if len(fields) != 2:
                yield CaptionRecord("", where, error="malformed TSV line",
                                    detail=f"expected 2 tab-separated fields (caption, image), got {len(fields)}")
                continue
            text, image = fields[0].strip(), fields[1].strip()
            if not text:
                yield CaptionRecord(image, where, error="empty caption")
                continue
            path = root / image
            try:
                data = path.read_bytes()
            except OSError:
                yield CaptionRecord(image, where, text, error="missing image", detail=str(path))
                continue
            yield CaptionRecord(image, where, text, data)


def iter_img2dataset(pattern: str) -> Iterator[CaptionRecord]:
    for shard in expand_paths(pattern):
        yield from _iter_img2dataset_tar(shard)


def _iter_img2dataset_tar(shard: str) -> Iterator[CaptionRecord]:
    def finish(key: str, members: dict[str, bytes]) -> CaptionRecord:
        where = f"{shard}:{key}"
        meta = {}
        if "json" in members:
            try:
                meta = json.loads(members["json"])
            except ValueError:
                return CaptionRecord(key, where, error="bad JSON metadata")
        if meta.get("status", "success") != "success":
            return CaptionRecord(key, where, error="img2dataset download failed", detail=str(meta.get("status")))
        image = next((members[e] for e in IMAGE_EXTENSIONS if e in members), None)
        if image is None:
            return CaptionRecord(key, where, error="missing image")
        text = members.get("txt", b"").decode("utf-8", errors="replace").strip() or str(meta.get("caption") or "")
        if not text.strip():
            return CaptionRecord(key, where, error="empty caption")
        return CaptionRecord(key, where, text.strip(), image)

    key, members = None, {}
    try:
        with tarfile.open(shard, mode="r|*") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                name = Path(member.name).name
                if "." not in name:
                    continue
                k, ext = name.split(".", 1)
                k = str(Path(member.name).parent / k) if "/" in member.name else k
                if k != key and key is not None:
                    yield finish(key, members)
                    members = {}
                key = k
                members[ext.lower()] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError) as e:
        yield CaptionRecord(key or "", f"{shard}:{key or '<start>'}", error="truncated or unreadable tar",
                            detail=str(e))
        return
    if key is not None:
        yield finish(key, members)


@dataclass
class BoxEntry:
    boxes: np.ndarray  # [N, 4] float32 x1, y1, x2, y2 pixels
    classes: np.ndarray  # [N] int64
    scores: np.ndarray  # [N] float32
    class_probs: np.ndarray | None  # [N, C] float16
    attribute_probs: np.ndarray | None = None  # [N, A] float16


# a caption sample's per-box distributions: its decoded field -> its shard member (float16 [boxes, K] .npy)
BOX_DISTRIBUTIONS = {"class_probs": "probs.npy", "attribute_probs": "attrs.npy"}


def npy_bytes(array: np.ndarray) -> bytes:
    """An array as the bytes of a .npy shard member (no pickles)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def encode_probs(probs: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(probs, dtype=np.float16).tobytes()).decode("ascii")


def parse_box_entry(obj: dict, num_classes: int | None) -> BoxEntry:
    """Validate one box-file record; raises ValueError naming the bad field."""
    boxes = np.asarray(obj.get("boxes", []), dtype=np.float32).reshape(-1, 4) if obj.get("boxes") else None
    if boxes is None or len(boxes) == 0:
        raise ValueError("field 'boxes' is missing or empty")
    n = len(boxes)
    classes = np.asarray(obj.get("classes", [0] * n), dtype=np.int64)
    scores = np.asarray(obj.get("scores", [1.0] * n), dtype=np.float32)
    if classes.shape != (n,) or scores.shape != (n,):
        raise ValueError(f"'classes' and 'scores' must have one entry per box ({n})")
    probs = box_distributions(obj, "class_probs", n, "classes")
    if probs is not None and num_classes is not None and probs.shape[1] != num_classes:
        raise ValueError(f"'class_probs' has {probs.shape[1]} classes, config says {num_classes}")
    if num_classes is not None and ((classes < 0) | (classes >= num_classes)).any():
        raise ValueError(f"'classes' has ids outside [0, {num_classes})")
    return BoxEntry(boxes, classes, scores, probs, box_distributions(obj, "attribute_probs", n, "attributes"))


def box_distributions(obj: dict, field: str, n: int, what: str) -> np.ndarray | None:
    """A per-box distribution [n, K] float16 from `field` (lists) or `field`_f16 (base64 float16), or None."""
    if field in obj:
        probs = np.asarray(obj[field], dtype=np.float16)
    elif f"{field}_f16" in obj:
        flat = np.frombuffer(base64.b64decode(obj[f"{field}_f16"]), dtype=np.float16)
        if flat.size % n:
            raise ValueError(f"'{field}_f16' holds {flat.size} values, not a multiple of {n} boxes")
        probs = flat.reshape(n, -1)
    else:
        return None
    if probs.ndim != 2 or probs.shape[0] != n:
        raise ValueError(f"'{field}' must be [boxes={n}, {what}], got {list(probs.shape)}")
    return probs


def load_box_file(path: str | Path, skips: SkipLog, num_classes: int | None = None) -> dict[str, BoxEntry]:
    entries: dict[str, BoxEntry] = {}
    for where, line in numbered_lines(path):
        try:
            obj = json.loads(line)
            key = obj["image"]
            entries[str(key)] = parse_box_entry(obj, num_classes)
        except (ValueError, KeyError, TypeError) as e:
            reason = "box file line without 'image'" if isinstance(e, KeyError) else "bad box file line"
            skips.skip(reason, where, str(e))
    return entries


def image_regions(boxes: dict[str, BoxEntry], image_id: str, width: int, height: int) -> tuple[BoxEntry | None, str]:
    """An image's entry in a box file (keyed by its file name or its id), checked against the image's size:
    (entry, "") or (None, why the image is skipped)."""
    entry = boxes.get(f"{image_id}.jpg") or boxes.get(image_id)
    if entry is None:
        return None, "image has no regions in the box file"
    entry, problem = check_boxes(entry, width, height)
    return (None, f"bad regions: {problem}") if problem else (entry, "")


def check_boxes(entry: BoxEntry, width: int, height: int, tolerance: float = 1.0) -> tuple[BoxEntry, str | None]:
    """Clip boxes within `tolerance` pixels of the image; reject degenerate or outside boxes."""
    b = entry.boxes
    if not np.isfinite(b).all():
        return entry, "non-finite box coordinates"
    if ((b[:, 2] <= b[:, 0]) | (b[:, 3] <= b[:, 1])).any():
        return entry, "box with x2 <= x1 or y2 <= y1"
    lo, hi = -tolerance, np.array([width, height, width, height]) + tolerance
    if (b < lo).any() or (b > hi).any():
        bad = int(np.flatnonzero(((b < lo) | (b > hi)).any(1))[0])
        return entry, f"box {bad} {b[bad].tolist()} outside the {width}x{height} image"
    clipped = np.clip(b, 0, [width, height, width, height]).astype(np.float32)
    return replace(entry, boxes=clipped), None


def open_image(data: bytes) -> Image.Image:
    """Decode fully (PIL is lazy), so truncated files fail here, at the writer, not in training."""
    image = Image.open(io.BytesIO(data))
    image.load()
    return image
