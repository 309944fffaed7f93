"""Held-out masked words of two recipes' exports, paired draw by draw (docs/ABLATION.md, session 82): each export's
words on the first 100 held-out images (`launch/configs/heldout_demo.yaml`, as the run's own final table), then per
category the difference row - base on the same words, averaged over the draws, with a 95% interval from a bootstrap
that resamples held-out images (an image's words, in every draw, move together).

    python docs/grounding_demo/quickstart_s82/paired.py --base runs/demo runs/demo_draw1 \\
        --row runs/demo_s8 runs/demo_s8_draw1 --out docs/grounding_demo/quickstart_s82/paired.json

Each export's per-word results are kept beside it (<run>/grounding/words.npz) and reused.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from diagnostics.ablation import feature_extractor  # noqa: E402
from diagnostics.config import GroundingConfig  # noqa: E402
from diagnostics.grounding import GroundingEval  # noqa: E402
from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from model.config import load_config  # noqa: E402
from model.export import load_pretrained  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402

HELD_OUT = "launch/configs/heldout_demo.yaml"
CATEGORIES = ("colour", "shape", "size")


def words(run: str) -> dict[str, np.ndarray]:
    cache = Path(run) / "grounding" / "words.npz"
    if cache.is_file():
        return dict(np.load(cache))
    export = str(Path(run) / "export")
    cfg = load_config(GroundingConfig, HELD_OUT, ["max_images=100"])
    model = load_pretrained(export).eval()
    ev = GroundingEval(cfg, load_tokenizer(export), feature_extractor(model, "cpu"))
    with torch.no_grad():
        values = {k: np.asarray(v) for k, v in ev(model, "cpu", progress=True)["words"].items()}
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, **values)
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", nargs="+", required=True, help="runs of the base recipe, one per draw")
    parser.add_argument("--row", nargs="+", required=True, help="runs of the other recipe, the same draws in order")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if len(args.base) != len(args.row):
        parser.error(f"{len(args.base)} base runs against {len(args.row)} row runs: one of each per draw")
    torch.set_num_threads(2)
    base, row = [words(r) for r in args.base], [words(r) for r in args.row]
    for b, r in zip(base, row):
        if not (np.array_equal(b["category"], r["category"]) and np.array_equal(b["cluster"], r["cluster"])):
            raise SystemExit("the runs scored different held-out words: not the same held-out set")
    out = {"base": args.base, "row": args.row}
    for cat in CATEGORIES:
        sel = base[0]["category"] == cat
        diff = np.mean([r["image"][sel] - b["image"][sel] for b, r in zip(base, row)], axis=0)
        out[cat] = {"base_per_draw": [float(b["image"][sel].mean()) for b in base],
                    "row_per_draw": [float(r["image"][sel].mean()) for r in row],
                    "row_minus_base": clustered_bootstrap(diff, base[0]["cluster"][sel])}
        d = out[cat]["row_minus_base"]
        print(f"{cat}: base {np.round(out[cat]['base_per_draw'], 3)} row {np.round(out[cat]['row_per_draw'], 3)} "
              f"row - base {d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] ({d['n']} words)")
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
