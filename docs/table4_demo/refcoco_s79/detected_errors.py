"""Where RefCOCO+'s detected track loses what the gt track gets (docs/FINETUNE.md, session 79). Each expression's
prediction on the detector's boxes is one of: a hit (IoU >= 0.5 with the referent); `undetected` (no detected box
reaches IoU 0.5 with the referent: no reader can hit it); `other_object` (the chosen box is another annotated object's
detection: a reading error, the kind the gt track makes); `stray` (the chosen box matches no object at 0.5: a false
positive or a badly placed box). Per row, over its seeds, with 95% intervals from a bootstrap over val images; and
the row minus the base paired by expression on all of them and on the detectable ones alone.

    python docs/table4_demo/refcoco_s79/detected_errors.py --base 'RUNS/img15_s*/none/predictions_val.json' \
        --row 'RUNS/img15_s*/pretrained/predictions_val.json' [--data data/demo_val4000/raw/refcoco+] \
        [--dets BOXES.json] [--out F]
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

import numpy as np
import torch
from torchvision.ops import box_iou

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.statistics import clustered_bootstrap, paired_test  # noqa: E402
from docs.table4_demo.lowdata_s62.name_reader import kind_of  # noqa: E402
from docs.table4_demo.vcr_s70.kind_pair import percent  # noqa: E402
from finetune.refcoco import read_detections, read_refs  # noqa: E402
from shards.coco import read_instances  # noqa: E402

OUTCOMES = ("hit", "undetected", "other_object", "stray")


def outcomes(files: list[str], refs: dict, anns: dict, by_image: dict, dets: dict) -> tuple[list, np.ndarray]:
    """(expression keys, [seeds, expressions] index into OUTCOMES)."""
    runs = [{(p["ref_id"], p["sent_id"]): p for p in json.loads(Path(f).read_text())} for f in files]
    keys = sorted(runs[0])
    codes = np.zeros((len(runs), len(keys)), dtype=np.int64)
    detectable: dict[int, bool] = {}
    for j, key in enumerate(keys):
        ref = refs[key[0]]
        image = int(ref["image_id"])
        objects = by_image[image]
        gt = torch.tensor([anns[a]["box"] for a in objects])
        referent = objects.index(int(ref["ann_id"]))
        if key[0] not in detectable:
            boxes = torch.tensor(dets.get(image, []), dtype=torch.float32).reshape(-1, 4)
            detectable[key[0]] = bool(len(boxes)) and bool((box_iou(boxes, gt[referent:referent + 1]) >= 0.5).any())
        for s, run in enumerate(runs):
            if key not in run:
                raise SystemExit(f"detected_errors: {files[s]} lacks expression {key}")
            chosen = torch.tensor([run[key]["box"]], dtype=torch.float32)
            iou = box_iou(chosen, gt)[0]
            if iou[referent] >= 0.5:
                codes[s, j] = 0
            elif not detectable[key[0]]:
                codes[s, j] = 1
            elif (iou >= 0.5).any():
                codes[s, j] = 2
            else:
                codes[s, j] = 3
    return keys, codes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="a glob of the base row's detected-track predictions_val.json")
    ap.add_argument("--row", required=True, help="the same for the row compared with it")
    ap.add_argument("--data", default="data/demo_val4000/raw/refcoco+", help="refs(unc).p, instances.json, dets.json")
    ap.add_argument("--dets", help="the box set the rows were scored on (default: --data's dets.json)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    data = Path(args.data)
    refs = {r["ref_id"]: r for r in read_refs(data / "refs(unc).p")}
    _, anns, by_image = read_instances(data / "instances.json")
    dets = read_detections(args.dets or data / "dets.json")
    report: dict = {}
    rows = {}
    for name, pattern in (("base", args.base), ("row", args.row)):
        files = sorted(glob.glob(pattern))
        if not files:
            raise SystemExit(f"detected_errors: no predictions match {pattern}")
        keys, codes = outcomes(files, refs, anns, by_image, dets)
        rows[name] = (keys, codes)
        report[name] = {"files": files}
        metrics = Path(files[0]).parent / "metrics_val.json"  # a random candidate's accuracy on this box set
        if metrics.exists():
            report["chance"] = json.loads(metrics.read_text())["chance"]
    keys, base = rows["base"]
    if rows["row"][0] != keys:
        raise SystemExit("detected_errors: the two rows scored different expressions")
    row = rows["row"][1]
    images = np.array([int(refs[k[0]]["image_id"]) for k in keys])
    sentence = {(ref_id, s["sent_id"]): s["sent"] for ref_id, ref in refs.items() for s in ref["sentences"]}
    kinds = np.array([kind_of(sentence[k]) for k in keys])
    detectable = (base[0] != 1)
    for name, codes in (("base", base), ("row", row)):
        for part, pick in (("all", kinds != ""), ("names", kinds == "names"), ("relational", kinds == "relational")):
            report[name][f"share_{part}"] = {o: percent(clustered_bootstrap((codes == i).mean(0)[pick], images[pick]))
                                             for i, o in enumerate(OUTCOMES)}
        report[name]["accuracy_detectable"] = percent(clustered_bootstrap((codes == 0).mean(0)[detectable],
                                                                          images[detectable]))
        report[name]["per_seed"] = [{o: round(100 * float((c == i).mean()), 2) for i, o in enumerate(OUTCOMES)}
                                    for c in codes]
    report["detectable_share"] = round(100 * float(detectable.mean()), 2)
    for part, pick in (("all", np.ones_like(detectable)), ("detectable", detectable),
                       ("detectable_names", detectable & (kinds == "names")),
                       ("detectable_relational", detectable & (kinds == "relational"))):
        a, b = (base == 0).mean(0)[pick], (row == 0).mean(0)[pick]
        t = paired_test(a, b, clusters=images[pick])
        report[f"row_minus_base_{part}"] = {"n": int(pick.sum()), "base": round(100 * float(a.mean()), 2),
                                            "row": round(100 * float(b.mean()), 2),
                                            "diff": round(100 * t["mean_diff"], 2),
                                            "ci95": [round(100 * v, 2) for v in t["ci95"]]}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
