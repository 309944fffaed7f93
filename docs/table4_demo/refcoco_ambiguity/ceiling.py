"""How well a RefCOCO+ model could do on the demo's val split, and where a run's errors sit (docs/FINETUNE.md,
session 38).

An expression is only a fair question when exactly one object fits it as the picture shows it: by its colour,
shape and size words if it is visible; as "a cloth" if it lies under the grey cloth (what the cloth hides cannot be
seen). Where k objects fit, a perfect model is right 1/k of the time. This reads the refer toolkit's refs, the
scenes the corpus was drawn from and each run's `predictions_val.json`, and reports per expression kind: the
count, the share with more than one fitting object, that best possible accuracy, and each run's accuracy with a
95% interval from a bootstrap over images.

    python docs/table4_demo/refcoco_ambiguity/ceiling.py --refs 'data/demo/raw/refcoco+/refs(unc).p' \\
        --run pretrained=runs/x/refcoco_gt/pretrained --run none=runs/x/refcoco_gt/none --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from finetune.refcoco import read_refs  # noqa: E402

KINDS = ("colour and shape", "colour one", "cloth")


def kind(expression: str) -> str:
    words = set(expression.split())
    if words & {"cloth", "covered"}:
        return "cloth"
    return "colour one" if "one" in words else "colour and shape"


def fitting(expression: str, objects: list[dict]) -> int:
    """How many objects fit the expression as the picture shows them."""
    words = set(expression.split())
    if words & {"cloth", "covered"}:
        return sum(o["covered"] for o in objects)
    return sum(not o["covered"] and all(w in (o["colour"], o["category"], o["size"], "the", "one", "that", "is")
                                        for w in words) for o in objects)


def fmt(s: dict) -> str:
    return f"{100 * s['mean']:.2f} [{100 * s['ci95'][0]:.2f}, {100 * s['ci95'][1]:.2f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--refs", required=True)
    ap.add_argument("--scenes", default="data/demo/raw/scenes.jsonl")
    ap.add_argument("--split", default="val")
    ap.add_argument("--run", action="append", default=[], help="NAME=RUN_DIR (its predictions_<split>.json)")
    ap.add_argument("--track", default="gt", help="the runs' candidate boxes (gt or detected), for the report")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    scenes = [json.loads(line) for line in open(args.scenes)]
    rows = []  # (sent_id, image, kind, fitting)
    for ref in read_refs(args.refs):
        if ref["split"] != args.split:
            continue
        objects = scenes[ref["image_id"]]["objects"]
        for s in ref["sentences"]:
            rows.append((s["sent_id"], ref["image_id"], kind(s["sent"]), fitting(s["sent"], objects)))
    images = np.array([r[1] for r in rows])
    kinds = np.array([r[2] for r in rows])
    ceiling = 1.0 / np.array([r[3] for r in rows], dtype=np.float64)
    runs = {}
    for spec in args.run:
        name, run = spec.split("=", 1)
        predictions = json.loads((Path(run) / f"predictions_{args.split}.json").read_text())
        right = {p["sent_id"]: float(p["iou"] >= 0.5) for p in predictions}
        runs[name] = np.array([right.get(r[0], np.nan) for r in rows])
    report = {"refs": args.refs, "split": args.split, "kinds": {}}
    header = "| expressions | count | fitting > 1 object | best possible |" + "".join(f" {n} |" for n in runs)
    lines = [header, "|" + "---|" * (4 + len(runs))]
    for k in (*KINDS, "all"):
        sel = np.ones(len(rows), bool) if k == "all" else kinds == k
        if not sel.any():
            continue
        entry = {"count": int(sel.sum()), "ambiguous": int((ceiling[sel] < 1).sum()),
                 "best_possible": clustered_bootstrap(ceiling[sel], images[sel]),
                 "runs": {n: clustered_bootstrap(v[sel], images[sel]) for n, v in runs.items()}}
        report["kinds"][k] = entry
        lines.append(f"| {k} | {entry['count']} | {entry['ambiguous']} | {100 * entry['best_possible']['mean']:.2f} |"
                     + "".join(f" {fmt(s)} |" for s in entry["runs"].values()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ceiling.json").write_text(json.dumps(report, indent=1))
    text = "\n".join(lines) + (f"\n\nRefCOCO+ {args.split} ({args.track} boxes; best possible: as far as the "
                               "expressions allow), accuracy at IoU >= 0.5 in percent; 95% intervals from a bootstrap "
                               "over images (2,000 resamples).\n")
    (out / "ceiling.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
