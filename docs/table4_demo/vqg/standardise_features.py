"""A diagnostic input for BERT-gen: a region-feature TSV with every feature dimension standardised by the training
split's regions (zero mean, unit variance), so that W starts from features whose shared component is gone.

Our Fast R-CNN's RoI features share a large common direction (session 40, the quick start's detector on the VQG test
images: the mean feature's norm is 0.70 of a region's, any two regions' cosine 0.50; standardised, 0.02). BERT-gen
maps them with a fresh linear W; VL-BERT's own visual embedding standardises them first
(`standardise_appearance`). Written to test whether that difference is why BERT-gen does not use the image.

    python docs/table4_demo/vqg/standardise_features.py IN.tsv OUT.tsv --train data/demo/raw/vqg/coco_train_all.csv
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from finetune.vqg import read_split  # noqa: E402
from finetune.vqg_data import RegionFeatures, TsvFeatures, format_tsv_line  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tsv")
    ap.add_argument("out")
    ap.add_argument("--train", required=True, help="the training split (its images' regions give the statistics)")
    args = ap.parse_args(argv)
    features = TsvFeatures(args.tsv)
    train = [im.image_id for im in read_split(args.train) if im.image_id in features]
    regions = np.concatenate([features[k].features for k in train]).astype(np.float64)
    mean, std = regions.mean(0), regions.std(0) + 1e-6
    out = Path(args.out)
    with open(f"{out}.part", "w") as f:
        for image_id in tqdm(list(features.index), desc="standardise", unit="image"):
            r = features[image_id]
            f.write(format_tsv_line(image_id, RegionFeatures(r.width, r.height, r.boxes,
                                                             ((r.features - mean) / std).astype(np.float32))))
    Path(f"{out}.part").rename(out)
    stats = {"source": args.tsv, "train_images": len(train), "train_regions": len(regions),
             "mean_norm_over_region_norm": float(np.linalg.norm(mean) / np.linalg.norm(regions, axis=1).mean())}
    Path(f"{out}.json").write_text(json.dumps(stats, indent=1))
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
