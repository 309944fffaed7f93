"""Where V4L's `object` condition costs more than `all` (docs/ABLATION.md, session 74): the cross-modal diagnostic's
per-phrase bits by the objects in view, none / object / all and object - all with its 95% interval by image.

The paper's order is none < object < all: hiding the phrase's own object costs less than hiding the whole image. A model
that binds the masked phrase to another region when its own is hidden pays more for `object` than for `all` (where
no real region is left to mislead it), and more so the more objects the picture holds.

    python docs/grounding_demo/object_vs_all.py OUT.md --config launch/configs/heldout_demo.yaml \
        LABEL=DIR/per_example_model.npz ...

The .npz files are `python -m diagnostics.ablation --out DIR`'s per-example values.
"""

import argparse
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from diagnostics.config import DiagnosticConfig  # noqa: E402
from diagnostics.data import PhraseData  # noqa: E402
from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from model.config import load_config  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--config", required=True, help="the held-out data's config (launch/configs/heldout_demo.yaml)")
    p.add_argument("models", nargs="+", metavar="LABEL=NPZ")
    args = p.parse_args()
    cfg = load_config(DiagnosticConfig, args.config, [])
    data = PhraseData(cfg, load_tokenizer(None), 9)
    clusters = np.array([it.image_id for it in data.items])
    annotations = Path(cfg.flickr_root) / "Annotations"
    objects = {i: len(re.findall(r"<object>", (annotations / f"{i}.xml").read_text())) for i in set(clusters)}
    in_view = np.array([objects[i] for i in clusters])
    lines = [f"### V4L's object and all conditions by the objects in view ({len(data)} phrases, "
             f"{len(set(clusters))} images; bits per phrase word-piece, 95% interval by image)", "",
             "| model | objects in view | phrases (images) | none | object | all | object - all |", "|---" * 7 + "|"]
    for spec in args.models:
        label, path = spec.split("=", 1)
        v = np.load(path)
        none, obj, whole = v["v4l/none"], v["v4l/object"], v["v4l/all"]
        if len(none) != len(data):
            raise ValueError(f"{path}: {len(none)} phrases, the held-out data ({cfg.flickr_root}) has {len(data)}")
        for n in (*range(2, 9), None):
            pick = in_view == n if n is not None else np.ones(len(data), bool)
            if not pick.any():
                continue
            c = clusters[pick]
            d = clustered_bootstrap(obj[pick] - whole[pick], c, resamples=2000, seed=0)
            lines.append(f"| {label} | {n or '**all**'} | {int(pick.sum())} ({len(set(c))}) | {none[pick].mean():.3f} "
                         f"| {obj[pick].mean():.3f} | {whole[pick].mean():.3f} | {d['mean']:+.3f} "
                         f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] |")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
