"""Does a VQG model use the image it is given? Each BERT-gen run's model decodes its evaluation split twice: with
every image's own region features, and with another image's (a fixed derangement of the split: image i gets image
i + 1's regions, in image-id order). Same model, decoding and references; only which image it sees changes.
A model that reads the image asks its own image's questions more often with its own regions than with another's.

Per run: CIDEr-D x100 and the own non-generic question rate (`finetune.table4.vqg_metrics`) with its own regions
(as the run's predictions file has them) and with another image's, the paired difference with a 95% interval from
a bootstrap over images, and the share of images whose question changes.

    python docs/table4_demo/vqg/image_control.py RUN [RUN ...] --out docs/table4_demo/vqg/image_control
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from finetune.table4 import open_vqg_run, vqg_examples  # noqa: E402
from finetune.vqg import generate_questions  # noqa: E402
from finetune.vqg_data import DerangedFeatures  # noqa: E402


def control(run: Path, device: str) -> dict:
    r = open_vqg_run(run, device)
    cfg, raw = r.cfg, r.raw
    own = {p["image_id"]: p["question"] for p in json.loads((run / f"predictions_{cfg.eval_split}.json").read_text())}
    order = sorted(own)
    data = r.eval_set(DerangedFeatures(r.features, order))
    other = {p["image_id"]: p["question"] for p in generate_questions(r.gen, data, cfg.decode, cfg.eval_batch_size,
                                                                      device, cfg.max_eval_images, progress=False)}
    if sorted(other) != order:
        raise SystemExit(f"{run}: decoded {len(other)} images with other regions, {len(own)} with their own")
    mine, prior = vqg_examples(raw, own)
    theirs, _ = vqg_examples(raw, other, with_prior=False)  # same images and references: the prior is mine's
    out = {"run": str(run), "images": len(order),
           "question_changed": float(np.mean([own[k] != other[k] for k in order])), "metrics": {}}
    for name, ex in mine.items():
        diff = ex.values - theirs[name].values  # both in image order
        out["metrics"][name] = {"own_regions": clustered_bootstrap(ex.values, ex.images),
                                "other_regions": clustered_bootstrap(theirs[name].values, ex.images),
                                "own_minus_other": clustered_bootstrap(diff, ex.images), "prior": prior[name]}
    out["examples"] = [{"image_id": k, "own_regions": own[k], "other_regions": other[k]} for k in order[:8]]
    return out


def markdown(rows: list[dict]) -> str:
    def cell(s: dict, signed: bool = False) -> str:
        f = "+.2f" if signed else ".2f"
        return f"{s['mean']:{f}} [{s['ci95'][0]:{f}}, {s['ci95'][1]:{f}}]"

    names = list(rows[0]["metrics"])
    lines = ["# VQG with each image's own regions and with another image's", "",
             "Same model and decoding; every image's regions replaced by the next image's (a fixed derangement). "
             "95% intervals from a bootstrap over images; the difference paired by image.", ""]
    for name in names:
        lines += [f"## {name}", "", "| run | own regions | another image's | own minus another | questions changed "
                  "| one question for every image |", "|---|---|---|---|---|---|"]
        for r in rows:
            m = r["metrics"][name]
            lines.append(f"| {r['run']} | {cell(m['own_regions'])} | {cell(m['other_regions'])} | "
                         f"{cell(m['own_minus_other'], True)} | {100 * r['question_changed']:.1f}% | "
                         f"{m['prior']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="finetune.vqg run directories")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = [control(Path(r), device) for r in tqdm(args.runs, desc="runs", unit="run")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "image_control.json").write_text(json.dumps(rows, indent=1))
    text = markdown(rows)
    (out / "image_control.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
