"""Visual question generation data in the formats as distributed.

- VQG_COCO (Mostafazadeh et al. 2016): `coco_{train,val,test}_all.csv`, header
  `image_id,image_url,questions,ratings`, an image's questions (and ratings) separated by `---`.
- VQA v1.0 as VQG data: `OpenEnded_mscoco_<split>2014_questions.json` (`questions[]` with `image_id`,
  `question`, `question_id`), questions grouped by image.
- Captions: COCO's `captions_<split>2014.json` (`annotations[]` with `image_id`, `id`, `caption`).
- Region features: bottom-up-attention TSV (`image_id, image_w, image_h, num_boxes, boxes, features`,
  tab-separated, boxes and features base64 float32), read through a byte-offset index so a large file
  is never loaded whole; or WebDataset shards converted from it (`python -m finetune.vqg_data`).

Malformed input raises `VQGFormatError` naming the file and line (or shard and key).
"""

from __future__ import annotations

import argparse
import base64
import csv
import glob
import io
import json
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import webdataset as wds
from tqdm import tqdm

TSV_FIELDS = ["image_id", "image_w", "image_h", "num_boxes", "boxes", "features"]


class VQGFormatError(ValueError):
    pass


@dataclass
class VQGImage:
    image_id: str
    questions: list[str]
    url: str = ""
    ratings: list[str] | None = None


def read_vqg_coco_csv(path: str | Path) -> list[VQGImage]:
    path = Path(path)
    out = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != ["image_id", "image_url", "questions"]:
            raise VQGFormatError(f"{path}:1: expected the header image_id,image_url,questions,ratings, got {header}")
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if not row or not "".join(row).strip():
                continue
            if len(row) < 3:
                raise VQGFormatError(f"{where}: expected 4 fields (image_id,image_url,questions,ratings), "
                                     f"got {len(row)}")
            questions = [q.strip() for q in row[2].split("---") if q.strip()]
            if not row[0].strip() or not questions:
                raise VQGFormatError(f"{where}: empty image_id or no questions")
            ratings = [r.strip() for r in row[3].split("---")] if len(row) > 3 and row[3].strip() else None
            out.append(VQGImage(row[0].strip(), questions, row[1].strip(), ratings))
    return out


def read_vqa_questions(path: str | Path) -> list[VQGImage]:
    """VQA v1.0 (or v2) questions as VQG data: every question of an image is a reference."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        by_image: dict[str, list[str]] = {}
        for i, q in enumerate(data["questions"]):
            try:
                by_image.setdefault(str(q["image_id"]), []).append(q["question"].strip())
            except (KeyError, AttributeError) as e:
                raise VQGFormatError(f"{path}: questions[{i}]: missing {e}") from None
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise VQGFormatError(f"{path}: not a VQA questions file ({e})") from None
    return [VQGImage(k, v) for k, v in by_image.items()]


def read_coco_captions(paths) -> dict[str, list[str]]:
    """image_id -> captions in annotation-id order, from one or more COCO captions files."""
    out: dict[str, list[tuple[int, str]]] = {}
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
            for i, a in enumerate(data["annotations"]):
                if not {"image_id", "caption"} <= a.keys():
                    raise VQGFormatError(f"{path}: annotations[{i}] needs image_id and caption")
                out.setdefault(str(a["image_id"]), []).append((int(a.get("id", i)), a["caption"].strip()))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise VQGFormatError(f"{path}: not a COCO captions file ({e})") from None
    return {k: [c for _, c in sorted(v)] for k, v in out.items()}


# --- region features ---------------------------------------------------------------------------------

@dataclass
class RegionFeatures:
    width: int
    height: int
    boxes: np.ndarray  # [N, 4] float32 pixel x1, y1, x2, y2
    features: np.ndarray  # [N, F] float32


def _b64_floats(field: str, rows: int, where: str, name: str) -> np.ndarray:
    if field.startswith(("b'", 'b"')):  # files written by Python 3 ports that str()-ed the bytes
        field = field[2:-1]
    try:
        flat = np.frombuffer(base64.b64decode(field), dtype=np.float32)
    except ValueError as e:
        raise VQGFormatError(f"{where}: field '{name}' is not base64 ({e})") from None
    if rows <= 0 or flat.size % rows:
        raise VQGFormatError(f"{where}: field '{name}' holds {flat.size} floats, not a multiple of num_boxes={rows}")
    return flat.reshape(rows, -1)


def parse_tsv_line(line: str, where: str) -> tuple[str, RegionFeatures]:
    fields = line.rstrip("\r\n").split("\t")
    if len(fields) != len(TSV_FIELDS):
        raise VQGFormatError(f"{where}: expected {len(TSV_FIELDS)} tab-separated fields {TSV_FIELDS}, "
                             f"got {len(fields)}")
    try:
        w, h, n = int(float(fields[1])), int(float(fields[2])), int(fields[3])
    except ValueError as e:
        raise VQGFormatError(f"{where}: image_w/image_h/num_boxes must be numbers ({e})") from None
    boxes = _b64_floats(fields[4], n, where, "boxes")
    if boxes.shape[1] != 4:
        raise VQGFormatError(f"{where}: boxes must be [num_boxes, 4], got {list(boxes.shape)}")
    return fields[0], RegionFeatures(w, h, boxes, _b64_floats(fields[5], n, where, "features"))


def format_tsv_line(image_id: str, r: RegionFeatures) -> str:
    enc = [base64.b64encode(np.ascontiguousarray(a, dtype=np.float32).tobytes()).decode("ascii")
           for a in (r.boxes, r.features)]
    return "\t".join([str(image_id), str(r.width), str(r.height), str(len(r.boxes)), *enc]) + "\n"


class TsvFeatures:
    """Random access to bottom-up-attention TSV files by image_id (one scan builds a byte-offset index)."""

    def __init__(self, paths):
        self.paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
        self.index: dict[str, tuple[int, int, int]] = {}  # image_id -> (file, offset, line)
        for fi, path in enumerate(self.paths):
            with open(path, "rb") as f:
                offset, lineno = 0, 0
                for raw in f:
                    lineno += 1
                    if raw.strip():
                        self.index[raw.split(b"\t", 1)[0].decode()] = (fi, offset, lineno)
                    offset += len(raw)

    def __contains__(self, image_id) -> bool:
        return str(image_id) in self.index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, image_id) -> RegionFeatures:
        fi, offset, lineno = self.index[str(image_id)]
        with open(self.paths[fi], "rb") as f:
            f.seek(offset)
            line = f.readline().decode()
        return parse_tsv_line(line, f"{self.paths[fi]}:{lineno}")[1]


def tsv_to_shards(tsv, out: str | Path, max_count: int = 2000) -> dict:
    """Bottom-up TSV -> WebDataset shards of `<id>.json` (size, boxes count), `<id>.boxes.npy`, `<id>.features.npy`."""

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    with wds.ShardWriter(str(out / "features-%06d.tar"), maxcount=max_count, verbose=0) as sink:
        for path in [tsv] if isinstance(tsv, (str, Path)) else tsv:
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(tqdm(f, desc=f"{Path(path).name} -> shards", unit="img"), 1):
                    if not line.strip():
                        continue
                    image_id, r = parse_tsv_line(line, f"{path}:{lineno}")
                    sink.write({"__key__": image_id, "json": {"image_id": image_id, "image_w": r.width,
                                                              "image_h": r.height, "num_boxes": len(r.boxes)},
                                "boxes.npy": r.boxes, "features.npy": r.features})
                    total += 1
    manifest = {"total": total, "shards": sorted(p.name for p in out.glob("features-*.tar"))}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


class ShardFeatures:
    """Random access to converted feature shards by image_id (tar member offsets, read on demand)."""

    def __init__(self, pattern: str):
        self.paths = sorted(glob.glob(pattern))
        if not self.paths:
            raise FileNotFoundError(f"{pattern}: no feature shards")
        self.index: dict[str, dict[str, tuple[int, int, int]]] = {}
        for si, path in enumerate(self.paths):
            with tarfile.open(path) as tar:
                for m in tar:
                    key, _, ext = m.name.partition(".")
                    self.index.setdefault(key, {})[ext] = (si, m.offset_data, m.size)

    def __contains__(self, image_id) -> bool:
        return str(image_id) in self.index

    def __len__(self) -> int:
        return len(self.index)

    def _read(self, entry) -> bytes:
        si, offset, size = entry
        with open(self.paths[si], "rb") as f:
            f.seek(offset)
            return f.read(size)

    def __getitem__(self, image_id) -> RegionFeatures:
        parts = self.index[str(image_id)]
        try:
            meta = json.loads(self._read(parts["json"]))
            boxes = np.load(io.BytesIO(self._read(parts["boxes.npy"])))
            feats = np.load(io.BytesIO(self._read(parts["features.npy"])))
        except KeyError as e:
            raise VQGFormatError(f"{self.paths[parts[next(iter(parts))][0]]}: key {image_id} lacks {e}") from None
        return RegionFeatures(int(meta["image_w"]), int(meta["image_h"]), boxes.astype(np.float32),
                              feats.astype(np.float32))


def open_features(spec: str):
    """A TSV file (or comma-separated list) or a shard glob (`*.tar`)."""
    if spec.endswith(".tar") or "*" in spec or "{" in spec:
        return ShardFeatures(spec)
    return TsvFeatures(spec.split(","))


class DerangedFeatures:
    """A feature store in which every image is answered with the next image's regions (in `order`, cyclically): the
    image control of VQG diagnostics (same model and questions, another image)."""

    def __init__(self, features, order: list[str]):
        self.features, self.source = features, {k: order[(i + 1) % len(order)] for i, k in enumerate(order)}

    def __contains__(self, image_id) -> bool:
        return image_id in self.source

    def __getitem__(self, image_id):
        return self.features[self.source[image_id]]


def feature_size(features) -> int:
    """F of the region features an `open_features` store holds (read off its first image)."""
    return features[next(iter(features.index))].features.shape[1]


# --- batches -----------------------------------------------------------------------------------------

def region_tensors(items: list[RegionFeatures], max_regions: int):
    """Padded features [B, N, F], boxes normalised by image size [B, N, 4], mask [B, N]."""
    n = max(1, min(max_regions, max(len(r.boxes) for r in items)))
    f = items[0].features.shape[1]
    feats = torch.zeros(len(items), n, f)
    boxes = torch.zeros(len(items), n, 4)
    mask = torch.zeros(len(items), n, dtype=torch.bool)
    for i, r in enumerate(items):
        k = min(n, len(r.boxes))
        feats[i, :k] = torch.tensor(r.features[:k])
        scale = np.array([r.width, r.height, r.width, r.height], dtype=np.float32)
        boxes[i, :k] = torch.tensor(r.boxes[:k] / scale)
        mask[i, :k] = True
    return feats, boxes, mask


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Convert bottom-up-attention TSV region features into WebDataset shards.")
    p.add_argument("--tsv", nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-count", type=int, default=2000, help="images per shard")
    args = p.parse_args(argv)
    manifest = tsv_to_shards(args.tsv, args.out, args.max_count)
    print(f"{manifest['total']} images in {len(manifest['shards'])} shards under {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
