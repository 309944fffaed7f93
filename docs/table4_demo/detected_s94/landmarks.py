"""RefCOCO+'s relational expressions ("the circle left of the blue hexagon") split by their landmark, from two rows'
predictions (docs/FINETUNE.md, session 94): each row's accuracy averaged over its seeds with a 95% interval from a
bootstrap over val images, and the row minus the base paired by expression (the same bootstrap).

Why these splits: the tokenizer cuts "hexagon" into "he ##xa ##gon", and no piece alone is the name: in a model
finetuned from the quick start's export the three align to the hexagons with mass 0.03 / 0.18 / 0.17 (data/demo's
30 val expressions with a hexagon landmark; session 94), so none names and the run of naming words that
`relation_anchors` reads as the object after a relation word is the colour word alone: every region of that colour,
which is the landmark only where no other object in view shares its colour (the corpus makes the landmark unique by
colour and category together, not by colour alone; `model.align_whole_names` reads the pieces as the name). The
groups:
  landmark: hexagon / another category;
  colour: the landmark's colour shared with another uncovered object of the image / its own;
and their crossing, where the hypothesis predicts the loss: a hexagon landmark whose colour another object shares.

    python docs/table4_demo/detected_s94/landmarks.py --base 'runs/s94/on/refcoco_val4000/img15_s*/none/...' \
        --row '.../pretrained/predictions_val.json' [--data data/demo_val4000/raw] [--out OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from docs.table4_demo.lowdata_s62.name_reader import RELATIONAL  # noqa: E402
from docs.table4_demo.vcr_s70.kind_pair import load, paired_cell  # noqa: E402
from finetune.refcoco import read_refs  # noqa: E402


def groups(data: Path) -> dict[tuple[int, int], dict[str, str]]:
    """(ref_id, sent_id) -> {"landmark": hexagon / other, "colour": shared / own} for each relational expression."""
    scenes = [json.loads(line) for line in open(data / "scenes.jsonl")]
    by_image = {int(Path(s["image"]).stem): s["objects"] for s in scenes}
    out = {}
    for ref in read_refs(data / "refcoco+" / "refs(unc).p"):
        if ref["split"] != "val":
            continue
        objects = by_image[ref["image_id"]]
        for s in ref["sentences"]:
            match = RELATIONAL.fullmatch(s["sent"])
            if not match:
                continue
            _, _, colour, category = match.groups()
            same_colour = sum(not o["covered"] and o["colour"] == colour for o in objects)
            if same_colour < 1:
                raise SystemExit(f"landmarks: no uncovered {colour} object in image {ref['image_id']} for "
                                 f"'{s['sent']}' (ref {ref['ref_id']}): scenes.jsonl and the refs disagree")
            out[(ref["ref_id"], s["sent_id"])] = {"landmark": "hexagon" if category == "hexagon" else "other",
                                                  "colour": "shared" if same_colour > 1 else "own"}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="a glob of the base row's predictions_val.json, one per seed")
    ap.add_argument("--row", required=True, help="the same for the row compared with it")
    ap.add_argument("--data", default="data/demo_val4000/raw", help="the corpus' raw folder (scenes.jsonl, refcoco+)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    kinds = groups(Path(args.data))
    base_files, keys, base, images = load(args.base, "refcoco")
    row_files, row_keys, row, _ = load(args.row, "refcoco")
    if keys != row_keys:
        raise SystemExit("landmarks: the two rows scored different expressions")
    missing = [k for k in kinds if k not in set(keys)]
    if missing:
        raise SystemExit(f"landmarks: {len(missing)} relational val expressions have no prediction (first "
                         f"{missing[0]}): --data is not the corpus these predictions were scored on")
    tests = {
        "relational": lambda g: True,
        "landmark hexagon": lambda g: g["landmark"] == "hexagon",
        "landmark other": lambda g: g["landmark"] == "other",
        "colour shared": lambda g: g["colour"] == "shared",
        "colour own": lambda g: g["colour"] == "own",
        "hexagon, colour shared": lambda g: g["landmark"] == "hexagon" and g["colour"] == "shared",
        "hexagon, colour own": lambda g: g["landmark"] == "hexagon" and g["colour"] == "own",
        "other, colour shared": lambda g: g["landmark"] == "other" and g["colour"] == "shared",
        "other, colour own": lambda g: g["landmark"] == "other" and g["colour"] == "own",
    }
    report: dict = {"base": base_files, "row": row_files}
    for name, test in tests.items():
        pick = np.array([k in kinds and test(kinds[k]) for k in keys])
        if pick.any():
            report[name] = paired_cell(base, row, images, pick)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
