"""VCR Q->A on the demo read without learning: the detector's colour names for "what color is [k] ?", the boxes'
centres for "where is [a] compared to [b] ?", and each finetuned run's accuracy split by the same two types.

The demo's VCR asks two kinds of question (val: 98 colour, 94 where). A colour question names its region by tag,
and the region word channel gives that region's token the detector's colour distribution: the names reader picks
the answer whose colour word is likeliest under it (softmax over the attributes, as `region_word_terms`). A where
question asks for one of right of / left of / above / below: the names say nothing of it, so the names reader is at
chance there (its expected accuracy, 1/4, is scored), and the boxes reader compares the two boxes' centres on the
axis where they differ most (image y grows downwards). If the finetuned rows sit at the names reader on both
types, what they read is the channel's names, which step 0 has as much as the pretrained row.

    python docs/table4_demo/lowdata_s62/vcr_reader.py --export runs/demo_step0/export \
        [--compare ROW=runs/lowdata/vcr/img150_s0/none/qa ...]
Prints JSON: each reader's and each run's accuracy per type with 95% intervals from a bootstrap over images.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from transformers import AutoTokenizer  # noqa: E402

from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from docs.table4_demo.lowdata_s62.name_reader import name_log_probs  # noqa: E402
from finetune.common import build_pretrained  # noqa: E402
from finetune.vcr import VCRConfig, VCRSet, read_vcr_jsonl  # noqa: E402
from model.config import load_config  # noqa: E402

DIRECTIONS = {"right": (0, 1.0), "left": (0, -1.0), "below": (1, 1.0), "above": (1, -1.0)}  # (axis, sign)


def kind_of(record: dict) -> str:
    return "colour" if "color" in record["question"] else "where"


def interval(values: list[float], images: list[str]) -> dict:
    b = clustered_bootstrap(np.asarray(values, dtype=float), np.asarray(images))
    return {"n": b["n"], "accuracy": round(100 * b["mean"], 2), "ci95": [round(100 * v, 2) for v in b["ci95"]]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", required=True)
    ap.add_argument("--config", default="launch/configs/vcr_demo.yaml")
    ap.add_argument("--split", default="val")
    ap.add_argument("--vocab", default="runs/detector-demo/fast_rcnn.vocab.json")
    ap.add_argument("--compare", action="append", default=[], help="ROW=a Q->A run dir with predictions_<split>")
    args = ap.parse_args(argv)
    cfg = load_config(VCRConfig, args.config, [f"backbone.init={args.export}"])
    model, tok_dir, _ = build_pretrained(cfg.backbone)
    vl_bert = model.vl_bert.eval()
    data = VCRSet(cfg, args.split, AutoTokenizer.from_pretrained(tok_dir))
    records = {r["annot_id"]: r for r in read_vcr_jsonl(Path(cfg.data.root) / f"{args.split}.jsonl",
                                                          need_labels=True)}
    colours = json.loads(Path(args.vocab).read_text())["attributes"]
    rows = {"names": {}, "boxes": {}}
    kinds, images = {}, {}
    with torch.no_grad():
        for start in range(0, len(data), 16):
            idx = list(range(start, min(start + 16, len(data))))
            batch = data.batch(idx)
            logp, boxes_norm = name_log_probs(vl_bert, batch)
            colour_logp = logp["attributes"]
            centres = (boxes_norm[..., :2] + boxes_norm[..., 2:]) / 2  # [B, N, (x, y)]
            for row, i in enumerate(idx):
                item = data.items[i]
                r = records[item["annot_id"]]
                kinds[item["annot_id"]], images[item["annot_id"]] = kind_of(r), item["img_fn"]
                label = r["answer_label"]
                if kind_of(r) == "colour":
                    k = next(t[0] for t in r["question"] if isinstance(t, list))
                    said = [next(w for w in c if isinstance(w, str) and w in colours) for c in r["answer_choices"]]
                    pick = int(np.argmax([float(colour_logp[row, k, colours.index(w)]) for w in said]))
                    rows["names"][item["annot_id"]] = rows["boxes"][item["annot_id"]] = float(pick == label)
                else:
                    a, b = [t[0] for t in r["question"] if isinstance(t, list)][:2]
                    d = (centres[row, a] - centres[row, b]).tolist()
                    axis = int(abs(d[1]) > abs(d[0]))
                    said = [next(w for w in c if isinstance(w, str) and w in DIRECTIONS) for c in r["answer_choices"]]
                    fits = [DIRECTIONS[w][0] == axis and DIRECTIONS[w][1] * d[axis] > 0 for w in said]
                    rows["names"][item["annot_id"]] = 0.25
                    rows["boxes"][item["annot_id"]] = float(fits.index(True) == label) if any(fits) else 0.25
    for spec in args.compare:
        name, run = spec.split("=", 1)
        preds = json.loads((Path(run) / f"predictions_{args.split}.json").read_text())
        rows[name] = {k: float(np.argmax(p["probs"]) == p["label"]) for k, p in preds.items() if k in kinds}
    report = {"export": args.export, "split": args.split, "questions": len(kinds)}
    for name, hits in rows.items():
        report[name] = {kind: interval([hits[k] for k in hits if kinds[k] == kind or kind == "all"],
                                       [images[k] for k in hits if kinds[k] == kind or kind == "all"])
                        for kind in ("all", "colour", "where")}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
