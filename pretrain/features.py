"""Precomputed region features: run a frozen Fast R-CNN once over caption shards and write shards
whose samples carry the regions' appearance features instead of the image.

    python -m pretrain.features --config launch/configs/demo_features.yaml \\
        --input 'data/demo/shards/captions-train/*.tar' --out data/demo/shards/features-train

The extractor is the config's `model.fast_rcnn` (backbone, RoIAlign size, and its `weights` file), the
images are resized as `data.short_side` / `data.long_side` say, and at most `data.max_regions` boxes
are kept, highest scores first: exactly what the end-to-end model's detector would see in the
pretraining reader, minus the training. Each output sample keeps the input's key, caption, boxes,
classes, scores and class distributions (`json`, `probs.npy`) and gains `feats.npy`: float16 [N, F],
one row per box, in the JSON's box order. The whole-image element is not stored: a features model
computes it as the mean of the regions it is given, so a masked region leaves it.

This is how UNITER/volta-style pipelines pretrain (Bottom-Up features computed once); it trades the
end-to-end detector for a step several times cheaper, since the CNN forward and backward dominate a
VL-BERT step at small transformer sizes (docs/BENCHMARKS.md). The manifest records the extractor.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import webdataset as wds
from tqdm import tqdm

from model.config import load_config
from shards.caption_inputs import BOX_DISTRIBUTIONS, expand_paths, npy_bytes
from shards.decode import CaptionDecoder, kept_regions
from shards.region_features import FeatureExtractor
from shards.sink import ShardSink
from shards.skips import SkipLog
from shards.tokenizer import resolve_bert_dir

from .config import PretrainConfig, build_model_config


def write_features(inputs: list[str], out_dir: str | Path, extractor: FeatureExtractor, decoder: CaptionDecoder, *,
                   batch_size: int = 16, samples_per_shard: int = 500, meta: dict | None = None) -> dict:
    """Every readable sample of `inputs`, in order, with its features; unreadable ones are counted."""
    skips = SkipLog("caption samples")
    sink = ShardSink(out_dir, "captions", max_count=samples_per_shard, kind="captions",
                     meta={"features": {**(meta or {}), "feature_size": extractor.feature_size}})
    records = wds.tarfile_to_samples(handler=wds.warn_and_continue)(iter([{"url": u} for u in inputs]))
    pending: list[tuple[dict, dict]] = []

    def flush():
        for (record, sample), feats in zip(pending, extractor([s for _, s in pending]), strict=True):
            meta_in = json.loads(record["json"])
            keep = len(sample["boxes"])
            if len(meta_in["boxes"]) > keep:  # the decoder kept the highest-scoring boxes: store those
                order = kept_regions(torch.tensor(meta_in["scores"], dtype=torch.float32), keep).tolist()
                for k in ("boxes", "classes", "scores"):
                    meta_in[k] = [meta_in[k][i] for i in order]
            out = {"__key__": record["__key__"], "json": json.dumps(meta_in).encode(),
                   "feats.npy": npy_bytes(feats.numpy().astype(np.float16))}
            for field, member in BOX_DISTRIBUTIONS.items():
                if sample[field] is not None:
                    out[member] = npy_bytes(sample[field].numpy())
            sink.write(out)
            skips.ok()
        pending.clear()

    for record in tqdm(records, desc="region features", unit="img"):
        where = f"{record.get('__url__', '?')}:{record.get('__key__', '?')}"
        try:
            sample = decoder(record)
        except Exception as e:  # a bad sample is named and counted, the pass goes on
            skips.skip("undecodable sample", where, f"{type(e).__name__}: {e}")
            continue
        if "region_features" in sample:
            raise ValueError(f"{where}: already a features shard (it has feats.npy)")
        pending.append((record, sample))
        if len(pending) >= batch_size:
            flush()
    if pending:
        flush()
    manifest = sink.close(skips.as_dict())
    print(skips.summary(), file=sys.stderr)
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="PretrainConfig YAML: model.fast_rcnn is the extractor, "
                   "data.short_side/long_side/max_regions the image and region settings")
    p.add_argument("--input", required=True, help="caption shards (globs or brace patterns, comma-separated)")
    p.add_argument("--out", required=True, help="folder for the feature shards and their manifest.json")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--samples-per-shard", type=int, default=500)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. model.fast_rcnn.weights=PATH")
    args = p.parse_args(argv)
    cfg = load_config(PretrainConfig, args.config, args.overrides)
    inputs = expand_paths(args.input)
    if not inputs:
        p.error(f"--input '{args.input}' matches no file")
    fast_rcnn = build_model_config(cfg).fast_rcnn
    extractor = FeatureExtractor(fast_rcnn, args.device)

    data = replace(cfg.data, tokenizer=str(resolve_bert_dir(cfg.data.tokenizer)))
    manifest = write_features(inputs, args.out, extractor, CaptionDecoder(data), batch_size=args.batch_size,
                              samples_per_shard=args.samples_per_shard,
                              meta={"extractor": fast_rcnn.weights, "backbone": fast_rcnn.backbone,
                                    "roi_output_size": fast_rcnn.roi_output_size, "short_side": data.short_side,
                                    "long_side": data.long_side, "max_regions": data.max_regions,
                                    "inputs": inputs})
    print(f"{manifest['total']} samples with {extractor.feature_size}-d region features in "
          f"{len(manifest['shards'])} shard(s) under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
