"""Retrieval recall from two finetune runs on the same split, paired: per caption (text -> image) and per image
(image -> text), the difference of the two runs' hits at K, with a 95% interval from a bootstrap over images
(docs/FINETUNE.md, session 22). Reads each run's rankings_<split>.json (each query's top 10) and the split file.

    python docs/table4_demo/retrieval_paired.py runs/retrieval/long_size runs/retrieval/long_step0 \\
        [--karpathy data/demo/raw/retrieval/dataset_flickr30k.json] [--split val] [--images images/{filename}]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from diagnostics.statistics import clustered_bootstrap  # noqa: E402


def hits(run: Path, split: str, own: dict[str, set[int]], k: int) -> tuple[dict, dict]:
    r = json.loads((run / f"rankings_{split}.json").read_text())
    text = {x["sentid"]: (x["image"], float(x["image"] in x["top10"][:k])) for x in r["text_to_image"]}
    image = {x["image"]: float(bool(own[x["image"]] & set(x["top10"][:k]))) for x in r["image_to_text"]}
    return text, image


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_a", type=Path)
    p.add_argument("run_b", type=Path)
    p.add_argument("--karpathy", default="data/demo/raw/retrieval/dataset_flickr30k.json")
    p.add_argument("--split", default="val")
    p.add_argument("--images", default="images/{filename}", help="as the run's data.images")
    args = p.parse_args(argv)
    images = json.loads(Path(args.karpathy).read_text())["images"]
    own = {args.images.format(filename=i["filename"], filepath=i.get("filepath", "")):
           {s["sentid"] for s in i["sentences"]} for i in images}
    print(f"| recall | {args.run_a} - {args.run_b} (95% interval by image) |\n|---|---|")
    for k in (1, 5, 10):
        ta, ia = hits(args.run_a, args.split, own, k)
        tb, ib = hits(args.run_b, args.split, own, k)
        ids = sorted(ta)
        names = sorted({ta[i][0] for i in ids})
        cluster = np.array([names.index(ta[i][0]) for i in ids])
        s = clustered_bootstrap(np.array([ta[i][1] - tb[i][1] for i in ids]) * 100, cluster)
        print(f"| text -> image R@{k} | {s['mean']:+.1f} [{s['ci95'][0]:+.1f}, {s['ci95'][1]:+.1f}] |")
        keys = sorted(ia)
        s = clustered_bootstrap(np.array([ia[x] - ib[x] for x in keys]) * 100, np.arange(len(keys)))
        print(f"| image -> text R@{k} | {s['mean']:+.1f} [{s['ci95'][0]:+.1f}, {s['ci95'][1]:+.1f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
