"""Region features from our own Fast R-CNN, written in the bottom-up-attention TSV format, so BERT-gen
(and any tool reading that format) can use them like Anderson et al.'s.

The detector is a VL-BERT export's end-to-end-trained Fast R-CNN (`--model DIR`), or one built from
a FastRCNNConfig (`--backbone`, `--weights`: a local torchvision ResNet state dict). Boxes come from a
box file (`shards.write_captions --boxes` format, e.g. written by `python -m shards.detect`), keyed by
image path relative to `--image-root`. image_id = the last run of digits in the file name (COCO's
`COCO_val2014_000000123456.jpg` -> 123456), else the file stem.

  python -m finetune.vqg_features --image-root coco --boxes boxes.jsonl --model runs/pretrain/export --out feats.tsv
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from model.config import FastRCNNConfig
from model.export import load_pretrained
from model.fast_rcnn import FastRCNN
from shards.caption_inputs import load_box_file
from shards.collate import collate_captions
from shards.decode import decode_resized
from shards.skips import SkipLog

from .vqg_data import RegionFeatures, format_tsv_line


def image_id_of(path: str) -> str:
    digits = re.findall(r"\d+", Path(path).stem)
    return str(int(digits[-1])) if digits else Path(path).stem


def build_detector(model_dir: str | None, backbone: str, weights: str | None, seed: int = 0):
    if model_dir:

        return load_pretrained(model_dir).vl_bert.fast_rcnn, f"Fast R-CNN of {model_dir}"
    torch.manual_seed(seed)
    how = f"{backbone} from {weights}" if weights else f"{backbone}, untrained (seed {seed})"
    return FastRCNN(FastRCNNConfig(backbone=backbone, weights=weights, num_classes=2)), how


@torch.no_grad()
def extract(detector, entries: list[tuple[str, np.ndarray]], image_root: Path, out: Path, *, short_side: int,
            long_side: int, batch_size: int = 8, progress: bool = True) -> int:
    """entries: (image path relative to image_root, pixel boxes [N, 4]) -> TSV lines; returns images written."""

    detector.eval()
    written = 0
    no_words = torch.zeros(0, dtype=torch.long)
    with open(out, "w") as f:
        for start in tqdm(range(0, len(entries), batch_size), desc="region features", unit="batch",
                          disable=not progress):
            chunk = entries[start: start + batch_size]
            samples, originals = [], []
            for rel, bx in chunk:
                img, scale, size = decode_resized((image_root / rel).read_bytes(), short_side, long_side)
                originals.append(size)
                n = len(bx)  # the pretraining collator pads images and boxes; classes are not needed here
                samples.append({"key": rel, "image": img, "boxes": torch.from_numpy(bx).float() * scale,
                                "classes": torch.zeros(n, dtype=torch.long), "scores": torch.ones(n),
                                "class_probs": None, "input_ids": no_words})
            b = collate_captions(samples)
            out_ = detector(b["images"], b["image_sizes"], b["boxes"], b["box_mask"])
            feats = out_["appearance"][:, 1:].float().numpy()  # regions only: no whole-image element
            for i, (rel, bx) in enumerate(chunk):
                ow, oh = originals[i]
                f.write(format_tsv_line(image_id_of(rel), RegionFeatures(ow, oh, bx.astype(np.float32),
                                                                         feats[i, : len(bx)])))
                written += 1
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Region features from our Fast R-CNN as bottom-up-attention TSV.",
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image-root", required=True)
    p.add_argument("--boxes", required=True, help="box file (JSON lines with image, boxes)")
    p.add_argument("--out", required=True)
    p.add_argument("--model", help="VL-BERT export directory whose Fast R-CNN to use")
    p.add_argument("--backbone", default="resnet101")
    p.add_argument("--weights", help="local torchvision ResNet state dict (without --model)")
    p.add_argument("--images", help="only these images: a file listing one relative path per line")
    p.add_argument("--short-side", type=int, default=600)
    p.add_argument("--long-side", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    skips = SkipLog("images")
    boxes = load_box_file(args.boxes, skips)
    wanted = Path(args.images).read_text().split() if args.images else sorted(boxes)
    missing = [w for w in wanted if w not in boxes]
    if missing:
        raise SystemExit(f"{args.boxes}: no boxes for {len(missing)} listed images, e.g. {missing[:3]}")
    detector, how = build_detector(args.model, args.backbone, args.weights, args.seed)
    n = extract(detector, [(w, boxes[w].boxes) for w in wanted], Path(args.image_root), Path(args.out),
                short_side=args.short_side, long_side=args.long_side, batch_size=args.batch_size)
    print(f"{n} images -> {args.out} (detector: {how}; {skips.skipped} box-file lines skipped)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
