"""Loader throughput: our streaming shard reader vs a plain map-style Dataset over an image folder.

Both do the same work per sample (JPEG decode, resize by the shorter/longer-side rule, boxes scaled,
caption tokenised) and share the same collation, DataLoader worker count and batch size; the figure
is samples/s, median of several passes, and the ratio of the two in the same run.

    python -m bench.loader [--demo data/demo] [--workers 2] [--repeats 3] [--write]
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from shards.caption_inputs import load_box_file
from shards.collate import collate_captions
from shards.decode import resize_scale
from shards.demo import build_demo
from shards.reader import StreamConfig, StreamLoader
from shards.skips import SkipLog
from shards.tokenizer import load_tokenizer

from .report import bench_parser, machine, median_range, update_section


class FolderDataset(Dataset):
    """The baseline users write first: a TSV, an image folder and a box file, read per item."""

    def __init__(self, raw: Path, short_side: int, long_side: int):
        self.items = [line.rstrip("\n").split("\t") for line in open(raw / "captions_train.tsv")]
        self.boxes = load_box_file(raw / "boxes.jsonl", SkipLog())
        self.raw, self.short_side, self.long_side = raw, short_side, long_side

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        caption, name = self.items[i]
        image = Image.open(self.raw / name).convert("RGB")
        w, h = image.size
        s = resize_scale(h, w, self.short_side, self.long_side)
        nw, nh = round(w * s), round(h * s)
        image = image.resize((nw, nh), Image.BILINEAR)
        entry = self.boxes[name]
        boxes = torch.from_numpy(entry.boxes) * torch.tensor([nw / w, nh / h, nw / w, nh / h])
        ids = load_tokenizer(None)(caption, add_special_tokens=False)["input_ids"]
        return {"key": name, "image": torch.from_numpy(np.array(image)).permute(2, 0, 1), "boxes": boxes,
                "scores": torch.from_numpy(entry.scores), "classes": torch.from_numpy(entry.classes),
                "class_probs": torch.from_numpy(entry.class_probs), "input_ids": torch.tensor(ids)}


def image_padding(cfg: StreamConfig, batches: int = 20) -> float:
    """Share of the padded image tensors' pixels that are padding, over the first batches."""
    real = total = 0
    for _, b in zip(range(batches), StreamLoader(dataclasses.replace(cfg, num_workers=0))):
        sizes, images = b["caption"]["image_sizes"], b["caption"]["images"]
        real += int((sizes[:, 0] * sizes[:, 1]).sum())
        total += images.shape[0] * images.shape[2] * images.shape[3]
    return 1 - real / total


def time_loader(batches, n_samples: int) -> float:
    seen = 0
    start = time.perf_counter()
    for batch in batches:
        seen += len(batch["keys"])
        if seen >= n_samples:
            break
    return seen / (time.perf_counter() - start)


def main(argv=None):
    p = bench_parser(__doc__)
    p.add_argument("--demo", default="data/demo", help="demo corpus folder (built if missing)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--samples", type=int, default=1600, help="samples timed per pass")
    p.add_argument("--short-side", type=int, default=600)
    p.add_argument("--long-side", type=int, default=1000)
    p.add_argument("--length-buckets", type=int, default=16, help="pool size of the grouped row (the demo's)")
    args = p.parse_args(argv)
    demo = Path(args.demo)
    if not (demo / "shards" / "captions-train" / "manifest.json").exists():

        build_demo(demo)
    torch.manual_seed(0)
    cfg = StreamConfig(caption_shards=str(demo / "shards" / "captions-train" / "*.tar"), text_batch_size=0,
                       caption_batch_size=args.batch_size, num_workers=args.workers, short_side=args.short_side,
                       long_side=args.long_side, shuffle_buffer=256)
    grouped = dataclasses.replace(cfg, length_buckets=args.length_buckets)
    folder = FolderDataset(demo / "raw", args.short_side, args.long_side)
    results = {"ours": [], "grouped": [], "folder": []}

    def folder_batches():
        return iter(_Repeat(DataLoader(folder, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                       collate_fn=collate_captions, persistent_workers=False)))

    # untimed warm-up: what a process loads once (torchvision, the tokenizer) is not a loader's cost per pass
    time_loader((b["caption"] for b in StreamLoader(cfg)), args.batch_size)
    time_loader(folder_batches(), args.batch_size)
    for _ in range(args.repeats):  # interleaved, so drift in machine load hits both alike
        results["ours"].append(time_loader((b["caption"] for b in StreamLoader(cfg)), args.samples))
        results["grouped"].append(time_loader((b["caption"] for b in StreamLoader(grouped)), args.samples))
        results["folder"].append(time_loader(folder_batches(), args.samples))
    ratios = [a / b for a, b in zip(results["ours"], results["folder"])]
    grouped_ratios = [a / b for a, b in zip(results["grouped"], results["folder"])]
    summary = {"ours_samples_per_s": results["ours"], "grouped_samples_per_s": results["grouped"],
               "folder_samples_per_s": results["folder"], "ratio": ratios, "grouped_ratio": grouped_ratios,
               "image_padding": {"plain": image_padding(cfg), "grouped": image_padding(grouped)}}
    print(json.dumps(summary, indent=1))
    if args.write:
        pads = summary["image_padding"]
        update_section("loader", f"""
## Loader throughput (decode + resize + collate)

`python -m bench.loader --write` on the demo corpus: {args.batch_size} captioned images per batch, {args.workers}
DataLoader workers, images resized to shorter side {args.short_side} / longer side <= {args.long_side}, {args.samples}
samples per pass, {args.repeats} interleaved passes; median (min-max). Padded pixels: the share of a
batch's image tensor that is padding (20 batches). Machine: {machine()}.

| loader | samples/s | padded pixels | / folder |
| --- | --- | --- | --- |
| `shards.reader.StreamLoader` (tar shards) | {median_range(results["ours"])} | {pads["plain"]:.0%} | \
**{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})** |
| the same, `length_buckets: {args.length_buckets}` (orientation, regions, words) | \
{median_range(results["grouped"])} | {pads["grouped"]:.0%} | \
**{statistics.median(grouped_ratios):.2f} ({min(grouped_ratios):.2f}-{max(grouped_ratios):.2f})** |
| map-style Dataset over the image folder | {median_range(results["folder"])} | {pads["plain"]:.0%} | 1 |
""")
    return summary


class _Repeat:
    """Cycles a DataLoader so a pass can time more samples than one epoch holds."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        while True:
            yield from self.loader


if __name__ == "__main__":
    main()
