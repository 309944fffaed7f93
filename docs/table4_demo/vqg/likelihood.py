"""How much a VQG model's questions depend on the image, without decoding. Beam search reports one question per
image and collapses onto generic ones (docs/VQG.md), so the own-question rate of a decode moves with which generic
question wins. The model's likelihood of the references does not: for every reference question q of image i,

    information(q) = log2 P(q | i's regions) - log2 P(q | another image's regions)   (bits)

with the other image's regions from `finetune.vqg_data.DerangedFeatures` (image i gets image i + 1's, in image-id
order). A model that ignores the image scores 0; one that knows which questions fit which image scores more on its
own image's non-generic questions (the generic ones fit any image). Also log2 P(q | own regions) itself.

Writes `image_information_<split>.json` into each run (read by docs/table4_demo/ablation_rows/report.py, which puts
the rows side by side over seeds) and prints each run's means with 95% intervals from a bootstrap over images.

    python docs/table4_demo/vqg/likelihood.py RUN [RUN ...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from finetune.table4 import open_vqg_run  # noqa: E402
from finetune.vqg_data import DerangedFeatures  # noqa: E402
from finetune.vqg_decoding import asked_of, generic_of, norm, reference_scores  # noqa: E402


def information(run: Path, device: str) -> dict:
    r = open_vqg_run(run, device)
    cfg = r.cfg
    if cfg.inputs != "image":
        raise SystemExit(f"{run}: inputs={cfg.inputs}; the image's information is measured on image-only runs")
    own = r.eval_set()
    order = sorted({im.image_id for im in own.images})
    other = r.eval_set(DerangedFeatures(r.features, order))
    if [(own.images[i].image_id, q) for i, q in own.pairs] != [(other.images[i].image_id, q) for i, q in other.pairs]:
        raise SystemExit(f"{run}: the split's questions differ between its own and another image's regions")
    mine, theirs = (reference_scores(r.gen, data, cfg.eval_batch_size, device)[0] / math.log(2)
                    for data in (own, other))
    generic = generic_of(*asked_of(cfg.data.train))
    return {"run": str(run), "split": cfg.eval_split, "generic": sorted(generic),
            "image_id": [own.images[i].image_id for i, _ in own.pairs], "question": [q for _, q in own.pairs],
            "is_generic": [norm(q) in generic for _, q in own.pairs],
            "log2p_own": mine.tolist(), "log2p_other": theirs.tolist()}


NAMES = ("image information, own non-generic questions (bits)", "image information, generic questions (bits)",
         "log2 P, own non-generic questions (bits)")


def summary(r: dict) -> dict:
    images = np.asarray(r["image_id"])
    own, other = np.asarray(r["log2p_own"]), np.asarray(r["log2p_other"])
    keep = ~np.asarray(r["is_generic"])
    return dict(zip(NAMES, (clustered_bootstrap((own - other)[keep], images[keep]),
                            clustered_bootstrap((own - other)[~keep], images[~keep]),
                            clustered_bootstrap(own[keep], images[keep]))))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="finetune.vqg run directories (inputs=image)")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    lines = ["| run | " + " | ".join(NAMES) + " |", "|---" * (1 + len(NAMES)) + "|"]
    for run in tqdm(args.runs, desc="runs", unit="run"):
        r = information(Path(run), device)
        (Path(run) / f"image_information_{r['split']}.json").write_text(json.dumps(r))
        cells = [f"{s['mean']:+.3f} [{s['ci95'][0]:+.3f}, {s['ci95'][1]:+.3f}]" for s in summary(r).values()]
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
