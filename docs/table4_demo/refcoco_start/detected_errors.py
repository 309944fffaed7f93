"""Where RefCOCO+ runs on detected boxes go wrong (docs/FINETUNE.md, session 49).

Each val expression's chosen detection is put in one of five outcomes by its overlap with the image's annotated
objects (torchvision's box_iou; the referent is the ref's annotation):

- right: IoU >= 0.5 with the referent (the accuracy's hit);
- referent, loose box: the object it overlaps most is the referent, but IoU < 0.5;
- another object: IoU >= 0.5 with an object that is not the referent (the choice of object is wrong);
- another object, loose box: it overlaps another object most, IoU < 0.5;
- background: it overlaps no object.

The same split of the same rows' gt-box runs has only "right" and "another object", so the two tracks' difference
says how much of the detected track's loss is picking a worse box around the right object rather than the wrong
object. Every share is averaged over the finetuning seeds per expression, with a 95% interval from a bootstrap
over images; a row minus the base is paired by expression.

    python docs/table4_demo/refcoco_start/detected_errors.py --images 15 --base none \\
        --row pretrained_mrcattr_shards --row pretrained_mrcattr_shards_p1 --out DIR \\
        [--also gt_model_on_detected=runs/nc_long/refcoco_cross/gt_model_on_detected ...]

"detected" and "gt" are runs trained and evaluated on that track's boxes; --also adds runs evaluated otherwise (a
model of one track on the other's boxes, `finetune.refcoco --eval-only track=...`), split the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from torchvision.ops import box_iou

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.statistics import clustered_bootstrap, paired_test  # noqa: E402
from finetune.refcoco import read_detections, read_refs  # noqa: E402
from shards.coco import read_instances  # noqa: E402

OUTCOMES = ("right", "referent, loose box", "another object", "another object, loose box", "background")
# the "another object" outcomes by what the chosen object shares with the referent
CONFUSIONS = ("same colour, other shape", "same shape, other colour", "same colour and shape", "other colour and shape",
              "either covered")


def outcomes(predictions: list[dict], referent: dict[int, int], anns: dict,
             by_image: dict) -> tuple[dict[int, int], dict[int, int]]:
    """{sent_id: index into OUTCOMES} of each prediction's chosen box, and {sent_id: the annotation id it overlaps
    most} where that is another object at IoU >= 0.5."""
    out, other = {}, {}
    for p in predictions:
        ids = by_image[p["image_id"]]
        iou = box_iou(torch.tensor([p["box"]]), torch.tensor([anns[a]["box"] for a in ids]))[0]
        best = int(iou.argmax())
        target = ids.index(referent[p["sent_id"]])
        if float(iou[target]) >= 0.5:
            k = 0
        elif float(iou[best]) <= 0.0:
            k = 4
        elif best == target:
            k = 1
        else:
            k = 2 if float(iou[best]) >= 0.5 else 3
        out[p["sent_id"]] = k
        if k == 2:
            other[p["sent_id"]] = ids[best]
    return out, other


def confusion(chosen: dict, target: dict) -> int:
    """Index into CONFUSIONS of a wrong object against the referent (scene objects: colour, category, covered)."""
    if chosen["covered"] or target["covered"]:
        return 4
    colour, shape = chosen["colour"] == target["colour"], chosen["category"] == target["category"]
    return 2 if colour and shape else 0 if colour else 1 if shape else 3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, required=True, help="training images (the img<N>_s<seed> directories)")
    ap.add_argument("--base", default="none")
    ap.add_argument("--row", action="append", required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--detected", default="runs/nc_long/refcoco_detected")
    ap.add_argument("--gt", default="runs/nc_long/refcoco")
    ap.add_argument("--also", action="append", default=[],
                    help="NAME=ROOT: more runs of the same rows and seeds, e.g. models of one track evaluated on the "
                         "other's boxes (finetune --eval-only)")
    ap.add_argument("--refs", default="data/demo/raw/refcoco+/refs(unc).p")
    ap.add_argument("--instances", default="data/demo/raw/refcoco+/instances.json")
    ap.add_argument("--detections", default="data/demo/raw/refcoco+/dets.json")
    ap.add_argument("--scenes", default="data/demo/raw/scenes.jsonl", help="the objects' colours and shapes")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    _, anns, by_image = read_instances(args.instances)
    dets = read_detections(args.detections)
    referent, image = {}, {}
    for ref in read_refs(args.refs):
        if ref["split"] == "val":
            for s in ref["sentences"]:
                referent[s["sent_id"]], image[s["sent_id"]] = int(ref["ann_id"]), int(ref["image_id"])
    keys = sorted(referent)
    clusters = np.array([image[k] for k in keys])
    # whether any detection could be right: the track's recall, the ceiling of "right"
    recall = np.array([float(bool(dets.get(image[k])) and bool(
        (box_iou(torch.tensor(dets[image[k]]), torch.tensor([anns[referent[k]]["box"]])) >= 0.5).any())) for k in keys])

    scenes = [json.loads(line)["objects"] for line in open(args.scenes)]
    objects = {a: scenes[im][k] for im, ids in by_image.items() for k, a in enumerate(ids)}
    columns = (*OUTCOMES, *CONFUSIONS)
    position = {k: i for i, k in enumerate(keys)}

    def shares(root: str, row: str) -> np.ndarray:
        """(expressions, columns): each outcome's share over the seeds, then the "another object" ones by what the
        chosen object shares with the referent."""
        counts = np.zeros((len(keys), len(columns)))
        for s in seeds:
            run = Path(root) / f"img{args.images}_s{s}" / row
            got, other = outcomes(json.loads((run / "predictions_val.json").read_text()), referent, anns, by_image)
            counts[np.arange(len(keys)), [got[k] for k in keys]] += 1
            for k, a in other.items():
                counts[position[k], len(OUTCOMES) + confusion(objects[a], objects[referent[k]])] += 1
        return 100 * counts / len(seeds)

    def paired(a: np.ndarray, b: np.ndarray) -> dict:
        return {c: {k: t[k] for k in ("mean_diff", "ci95")} for i, c in enumerate(columns)
                for t in [paired_test(a[:, i], b[:, i], clusters=clusters)]}

    rows = [args.base, *args.row]
    roots = {"detected": args.detected, "gt": args.gt, **dict(a.split("=", 1) for a in args.also)}
    table = {track: {r: shares(root, r) for r in rows} for track, root in roots.items()}
    report = {"images": args.images, "seeds": seeds, "expressions": len(keys),
              "detection_recall": clustered_bootstrap(recall, clusters),
              "tracks": {track: {r: {c: clustered_bootstrap(v[:, i], clusters) for i, c in enumerate(columns)}
                                 for r, v in t.items()} for track, t in table.items()},
              "minus_base": {track: {r: paired(t[args.base], t[r]) for r in args.row} for track, t in table.items()},
              # which outcomes the detected track's loss goes to
              "detected_minus_gt": {r: paired(table["gt"][r], table["detected"][r]) for r in rows}}

    def cell(s: dict) -> str:
        return f"{s['mean']:.2f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]"

    def diff(s: dict) -> str:
        return f"{s['mean_diff']:+.2f} [{s['ci95'][0]:+.2f}, {s['ci95'][1]:+.2f}]"

    lines = [f"RefCOCO+ val, {len(keys)} expressions, {args.images} training images, seeds {args.seeds} averaged per "
             f"expression; percent of expressions, 95% intervals from a bootstrap over images. A detection at IoU "
             f">= 0.5 with the referent exists for {100 * recall.mean():.2f}% of them.", ""]
    for names, title in ((OUTCOMES, "outcome"), (CONFUSIONS, '"another object" by what it shares with the referent')):
        for track in roots:
            lines += [f"**{track}: {title}**", "", "| row |" + "".join(f" {c} |" for c in names),
                      "|---|" + "---|" * len(names)]
            for r in rows:
                lines.append(f"| {r} |" + "".join(f" {cell(report['tracks'][track][r][c])} |" for c in names))
            for r in args.row:
                lines.append(f"| {r} minus {args.base} |"
                             + "".join(f" {diff(report['minus_base'][track][r][c])} |" for c in names))
            lines.append("")
        lines += [f"**detected minus gt, per row: {title}** (paired by expression)", "",
                  "| row |" + "".join(f" {c} |" for c in names), "|---|" + "---|" * len(names)]
        for r in rows:
            lines.append(f"| {r} |" + "".join(f" {diff(report['detected_minus_gt'][r][c])} |" for c in names))
        lines.append("")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "detected_errors.json").write_text(json.dumps(report, indent=1))
    text = "\n".join(lines) + "\n"
    (out / "detected_errors.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
