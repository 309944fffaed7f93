"""V4L per held-out phrase, split by whether its sentence has a relation word (docs/ABLATION.md, session 71).

Reads the cross-modal diagnostic's per-phrase values (`python -m diagnostics.ablation ... --out DIR` writes
DIR/per_example_<model>.npz) and, per split, with 95% intervals from a bootstrap over images: each model's all - none,
its information against --reference (the reference's bits minus its own with the image), and each --pair's difference
of the bits with the image (b - a, paired by phrase: the difference of their information against any reference).

    python docs/grounding_demo/v4l_by_form.py --dir runs/v4l_s71 --reference control --pair default:relation
    python docs/grounding_demo/v4l_by_form.py --dir runs/v4l_s71_seed1 --pair default_s1:relation_s1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from diagnostics.config import DiagnosticConfig  # noqa: E402
from diagnostics.data import PhraseData  # noqa: E402
from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from model.config import load_config  # noqa: E402
from model.vl_bert import RELATIONS  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", required=True, help="the diagnostic's --out directory")
    p.add_argument("--config", default="launch/configs/heldout_demo.yaml", help="the diagnostic's --config")
    p.add_argument("--tokenizer", default=None, help="the models' tokenizer directory (default: the packaged one)")
    p.add_argument("--reference", default=None, help="a model of --dir read as the reader without the image")
    p.add_argument("--pair", action="append", default=[], metavar="A:B")
    p.add_argument("overrides", nargs="*", help="the diagnostic's key=value overrides, as it was run")
    args = p.parse_args()
    out_dir = Path(args.dir)
    models = {f.stem.removeprefix("per_example_"): np.load(f) for f in sorted(out_dir.glob("per_example_*.npz"))}
    tok = load_tokenizer(args.tokenizer)
    # the diagnostic's own examples, in its order (the per-phrase arrays follow it)
    data = PhraseData(load_config(DiagnosticConfig, args.config, args.overrides), tok, None)
    images = np.array([it.image_id for it in data.items])
    if any(len(v["v4l/none"]) != len(images) for v in models.values()):
        raise SystemExit(f"{out_dir}: the per-phrase arrays do not match {args.config}'s examples (other overrides?)")
    relation_ids = set(tok.convert_tokens_to_ids(list(RELATIONS)))
    relational = np.array([bool(relation_ids & set(it.ids.tolist())) for it in data.items])
    report: dict = {}
    for name, sel in (("all phrases", np.ones(len(images), bool)), ("relation word in the sentence", relational),
                      ("no relation word", ~relational)):
        row: dict = {"n": int(sel.sum())}
        for m, v in models.items():
            if m == args.reference:
                continue
            row[f"{m} all-none"] = clustered_bootstrap(v["v4l/all"][sel] - v["v4l/none"][sel], images[sel])
            if args.reference:
                row[f"{m} information"] = clustered_bootstrap(
                    models[args.reference]["v4l/none"][sel] - v["v4l/none"][sel], images[sel])
        for pair in args.pair:
            a, b = pair.split(":")
            row[f"{b} - {a} (none bits)"] = clustered_bootstrap(
                models[b]["v4l/none"][sel] - models[a]["v4l/none"][sel], images[sel])
        report[name] = row
        print(f"{name} ({row['n']} phrases)")
        for key, s in row.items():
            if key != "n":
                print(f"    {key}: {s['mean']:+.3f} [{s['ci95'][0]:+.3f}, {s['ci95'][1]:+.3f}]")
    (out_dir / "paired_by_form.json").write_text(json.dumps(report, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
