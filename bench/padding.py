"""Padded transformer positions in pretraining batches, without and with length-aware batching.

Two streams, each batched as the reader batches them (`shards.batching.length_groups`, the same code):
- the demo corpus through the real reader (`StreamLoader`, decoding included), per-rank batches of the
  demo config;
- paper-scale lengths: caption samples with CC-like caption lengths (word-pieces ~ lognormal around 13,
  clipped to 4..40) and 10..100 regions (VL-BERT's detector keeps 10 to 100 boxes), text samples with
  the lengths of the text writer's real chunks (<= 64 word-pieces, from the demo text shards);
  per-rank batches of 8 + 8 (VL-BERT's 256 over 16 GPUs).

A caption sample occupies words + [CLS]/[SEP] + the whole image + regions + [END]; a batch pads words
and regions to its longest. Padding fraction = padded positions / all positions.

    python -m bench.padding [--buckets 64] [--write]
"""

from __future__ import annotations

import glob
import json
import tarfile

import numpy as np
import torch

from pretrain.run import count_batch
from shards.batching import length_groups
from shards.reader import StreamConfig, StreamLoader
from shards.seeding import python_rng

from .report import bench_parser, machine, update_section


def caption_padding(batches: list[list[tuple[int, int]]]) -> tuple[int, int]:
    real = total = 0
    for b in batches:
        words, regions = max(w for w, _ in b), max(r for _, r in b)
        real += sum(w + 2 + r + 2 for w, r in b)
        total += len(b) * (words + 2 + regions + 2)
    return real, total


def text_padding(batches: list[list[int]]) -> tuple[int, int]:
    return sum(sum(b) for b in batches), sum(len(b) * max(b) for b in batches)


def batch_stream(items: list, size: int, pool: int, length, seed: int = 0) -> list[list]:
    """The reader's batching of one role's stream: `size` at a time, or length-grouped pools."""

    out = []
    for p, start in enumerate(range(0, len(items), size * pool)):
        chunk = items[start: start + size * pool]
        if pool > 1:
            groups = length_groups([length(x) for x in chunk], size, python_rng(seed, "bench pools", p))
        else:
            groups = [list(range(k, min(k + size, len(chunk)))) for k in range(0, len(chunk), size)]
        out.extend([chunk[i] for i in g] for g in groups)
    return out


def text_lengths(demo: str) -> list[int]:
    lengths = []
    for path in sorted(glob.glob(f"{demo}/shards/text/*.tar")):
        with tarfile.open(path) as tar:
            for m in tar:
                if m.name.endswith(".json"):
                    lengths.append(len(json.loads(tar.extractfile(m).read())["input_ids"]))
    return lengths


def paper_scale(demo: str, buckets: int, n: int = 16384, per_rank: int = 8) -> dict:
    rng = np.random.default_rng(0)
    words = np.clip(np.round(rng.lognormal(np.log(13), 0.45, n)), 4, 40).astype(int)
    regions = rng.integers(10, 101, n)
    captions = list(zip(words.tolist(), regions.tolist()))
    pool = text_lengths(demo)
    texts = [pool[i] + 2 for i in rng.integers(0, len(pool), n)]  # + [CLS]/[SEP]
    out = {}
    for name, k in (("plain", 1), ("buckets", buckets)):
        cr, ct = caption_padding(batch_stream(captions, per_rank, k, lambda x: (x[1], x[0])))
        tr, tt = text_padding(batch_stream(texts, per_rank, k, lambda x: x))
        out[name] = {"caption": 1 - cr / ct, "text": 1 - tr / tt, "all": 1 - (cr + tr) / (ct + tt)}
    return out


def demo_reader(demo: str, buckets: int, n_batches: int = 150) -> dict:
    """The real reader on the demo shards, demo config batch sizes, positions counted as the engine does."""

    out = {}
    for name, k in (("plain", 1), ("buckets", buckets)):
        cfg = StreamConfig(caption_shards=f"{demo}/shards/captions-train/*.tar",
                           text_shards=f"{demo}/shards/text/*.tar", caption_batch_size=4, text_batch_size=4,
                           short_side=128, long_side=192, num_workers=1, length_buckets=k)
        real = total = 0.0
        for _, b in zip(range(n_batches), StreamLoader(cfg, rank=0, world_size=1), strict=False):
            c, t = b["caption"], b["text"]  # the masker adds [CLS]/[SEP]; count them here
            b = {"caption": {"text_mask": _with_specials(c["attention_mask"]), "box_mask": c["box_mask"]},
                 "text": {"text_mask": _with_specials(t["attention_mask"]), "input_ids": t["input_ids"]}}
            counts = count_batch(b)
            real, total = real + counts["tokens"], total + counts["positions"]
        out[name] = {"all": 1 - real / total}
    return out


def _with_specials(mask):
    return torch.cat([mask[:, :1] | True, mask, mask[:, :1] | True], 1) if mask.numel() else mask


def main(argv=None):
    p = bench_parser(__doc__, repeats=None)
    p.add_argument("--buckets", type=int, default=64, help="batches per length pool (data.length_buckets)")
    p.add_argument("--demo", default="data/demo")
    args = p.parse_args(argv)
    r = {"paper_scale": paper_scale(args.demo, args.buckets), "demo_reader": demo_reader(args.demo, 16)}
    print(json.dumps(r, indent=1))
    if args.write:
        ps, dr = r["paper_scale"], r["demo_reader"]
        update_section("padding", f"""
## Padding in pretraining batches: plain vs length-aware batching

`python -m bench.padding --write`. Padded positions over all transformer positions. Paper-scale
lengths: CC-like captions (lognormal word-pieces around 13, 4..40) with 10..100 regions, and the text
writer's real chunk lengths, per-rank batches of 8 + 8, pools of {args.buckets} batches
(`data.length_buckets: {args.buckets}`). Demo: the real reader on the demo shards, 4 + 4 per batch, pools of 16.
Machine: {machine()}.

| stream | plain | length buckets |
| --- | --- | --- |
| paper-scale captions (words + regions) | {100 * ps['plain']['caption']:.1f}% | {100 * ps['buckets']['caption']:.1f}% |
| paper-scale text-only | {100 * ps['plain']['text']:.1f}% | {100 * ps['buckets']['text']:.1f}% |
| **paper-scale, all positions** | **{100 * ps['plain']['all']:.1f}%** | **{100 * ps['buckets']['all']:.1f}%** |
| demo reader, all positions | {100 * dr['plain']['all']:.1f}% | {100 * dr['buckets']['all']:.1f}% |

Every sample is still read once per epoch and computes the same thing (tests: the same keys per epoch,
and a sample's outputs do not depend on its batch's padding).
""")
    return r


if __name__ == "__main__":
    main()
