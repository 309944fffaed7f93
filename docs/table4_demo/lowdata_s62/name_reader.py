"""RefCOCO+ on the demo read by the detector's names alone: no finetuning, no transformer, no pretraining.

Each candidate region (the track's boxes, as `finetune.refcoco` evaluates them) gets the exported Fast R-CNN's
class, colour and size distributions, the ones the region word channel adds to its token (softmax over the
foreground classes, the attributes, the sizes: `VLBertEmbeddings.region_word_terms`). An expression's words that
are one of those names score each region by the sum of log p(name | region); the best region is the answer, hit
when its IoU with the referent is >= 0.5 (the task's metric). If this reader is where the finetuned rows are,
the task at demo scale is read off the names the channel already gives step 0, and pretraining has no room.

    python docs/table4_demo/lowdata_s62/name_reader.py --export runs/demo_step0/export --track detected \
        [--vocab runs/detector-demo/fast_rcnn.vocab.json] [--compare runs/lowdata/refcoco_detected/img15_s0/none]
Prints JSON: accuracy with a 95% interval from a bootstrap over images, the random candidate's, and with
--compare the finetuned run's predictions scored on the same expressions (and how often the two agree).

Since the demo's RefCOCO+ version 3 (session 75) look-alikes are also told by an object beside them ("the circle
left of the blue star"); each figure comes for all expressions and for the names and the relational ones apart
(`kind_of`), and a second reader, names + boxes, reads a relational expression as a person would: the landmark is
the region its colour and class names fit best, the referent the region of the category's name in the relation to
it, compared by the boxes' centres along the axis they differ most (`shards.shapes_world.relation`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from transformers import AutoTokenizer  # noqa: E402

from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from finetune.common import build_pretrained  # noqa: E402
from finetune.refcoco import RefConfig, RefSet, read_refs  # noqa: E402
from model.config import load_config  # noqa: E402

RELATIONAL = re.compile(r"the (\w+) (left of|right of|above|below) the (\w+) (\w+)")


def kind_of(sentence: str) -> str:
    """"relational" for a look-alike told by an object beside it (demo RefCOCO+ version 3), "names" otherwise."""
    return "relational" if RELATIONAL.fullmatch(sentence) else "names"


def relation_scores(boxes: torch.Tensor, landmark: int, relation: str) -> torch.Tensor:
    """[N]: 0 where a box is in `relation` to box `landmark` by their centres (the axis they differ most on, as the
    demo's captions word it), -inf elsewhere and at the landmark itself."""
    centre = (boxes[:, :2] + boxes[:, 2:]) / 2
    dx, dy = (centre - centre[landmark]).unbind(-1)
    horizontal = dx.abs() >= dy.abs()
    fits = {"left of": horizontal & (dx < 0), "right of": horizontal & (dx > 0),
            "above": ~horizontal & (dy < 0), "below": ~horizontal & (dy > 0)}[relation]
    fits[landmark] = False
    return torch.where(fits, 0.0, float("-inf"))


def name_log_probs(vl_bert, batch: dict) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """{kind: [B, N, K] log p(name | region)} for the batch's regions, and their normalised boxes [B, N, 4] (the
    whole-image element dropped from both)."""
    appearance, boxes_norm, _ = vl_bert.region_features(images=batch["images"], image_sizes=batch["image_sizes"],
                                                        boxes=batch["boxes"], box_mask=batch["box_mask"])
    det = vl_bert.fast_rcnn
    out = {"classes": det.object_classifier(appearance)[..., 1:].float().log_softmax(-1)[:, 1:]}
    if det.attribute_classifier is not None:
        out["attributes"] = det.attribute_classifier(appearance).float().log_softmax(-1)[:, 1:]
    if det.size_classifier is not None:
        out["sizes"] = det.size_logits(boxes_norm).float().log_softmax(-1)[:, 1:]
    return out, boxes_norm[:, 1:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", required=True)
    ap.add_argument("--config", default="launch/configs/refcoco_demo.yaml")
    ap.add_argument("--track", default="detected", choices=("gt", "detected"))
    ap.add_argument("--split", default="val")
    ap.add_argument("--vocab", default="runs/detector-demo/fast_rcnn.vocab.json")
    ap.add_argument("--compare", action="append", default=[], help="a finetuned run dir with predictions_<split>")
    args = ap.parse_args(argv)
    cfg = load_config(RefConfig, args.config, [f"track={args.track}", f"backbone.init={args.export}"])
    model, tok_dir, _ = build_pretrained(cfg.backbone)
    vl_bert = model.vl_bert.eval()
    data = RefSet(cfg, args.split, AutoTokenizer.from_pretrained(tok_dir), train=False)
    vocab = json.loads(Path(args.vocab).read_text())
    names = {"classes": vocab["classes"][1:], "attributes": vocab["attributes"], "sizes": vocab["sizes"]}
    sentences = {}
    for ref in read_refs(cfg.data.refs):
        for s in ref["sentences"]:
            sentences[(ref["ref_id"], s["sent_id"])] = s["sent"]
    hits, box_hits, kinds, chance, images, keys = [], [], [], [], [], []
    named = {k: 0 for k in names}
    with torch.no_grad():
        order = list(range(len(data)))
        for start in range(0, len(order), 32):
            idx = order[start:start + 32]
            batch = data.batch(idx)
            logp, _ = name_log_probs(vl_bert, batch)
            for row, i in enumerate(idx):
                item = data.items[i]
                words = re.findall(r"[a-z]+", sentences[(item["ref_id"], item["sent_id"])].lower())
                n = int(batch["box_mask"][row].sum())
                score = torch.zeros(n)
                for kind, vocab_k in names.items():
                    for w in words:
                        if w in vocab_k and kind in logp:
                            score += logp[kind][row, :n, vocab_k.index(w)]
                            named[kind] += 1
                k = int(score.argmax())
                iou = batch["iou"][row, :n]  # RefSet.batch's IoU of each candidate with the referent
                hits.append(float(iou[k] >= 0.5))
                parts = RELATIONAL.fullmatch(sentences[(item["ref_id"], item["sent_id"])])
                if parts and "attributes" in logp:
                    category, relation, colour, landmark = parts.groups()
                    mark = int((logp["classes"][row, :n, names["classes"].index(landmark)]
                                + logp["attributes"][row, :n, names["attributes"].index(colour)]).argmax())
                    fit = logp["classes"][row, :n, names["classes"].index(category)] + relation_scores(
                        batch["boxes"][row, :n].float(), mark, relation)
                    k = int(fit.argmax()) if torch.isfinite(fit).any() else k
                box_hits.append(float(iou[k] >= 0.5))
                kinds.append(kind_of(sentences[(item["ref_id"], item["sent_id"])]))
                chance.append(float((iou >= 0.5).float().mean()))
                images.append(item["image_id"])
                keys.append((item["ref_id"], item["sent_id"]))
    hits_a, box_a, images_a, kinds_a = np.array(hits), np.array(box_hits), np.array(images), np.array(kinds)
    report = {"export": args.export, "track": args.track, "split": args.split, "expressions": len(hits),
              "images": len(set(images)), "names_read": named}
    for kind in ("all", "names", "relational"):
        pick = (kinds_a == kind) | (kind == "all")
        if not pick.any():
            continue
        report[kind] = {"expressions": int(pick.sum()), "random_candidate": round(
            100 * float(np.mean(np.array(chance)[pick])), 2)}
        for reader, h in (("name_reader", hits_a), ("names_and_boxes", box_a)):
            report[kind][reader] = {"accuracy": round(100 * h[pick].mean(), 2), "ci95": [
                round(100 * v, 2) for v in clustered_bootstrap(h[pick], images_a[pick])["ci95"]]}
    report["name_reader"], report["random_candidate"] = report["all"]["name_reader"], report["all"]["random_candidate"]
    hit_of = dict(zip(keys, hits))
    for run in args.compare:
        preds = json.loads((Path(run) / f"predictions_{args.split}.json").read_text())
        ft = {(p["ref_id"], p["sent_id"]): float(p["iou"] >= 0.5) for p in preds}
        common = [k for k in keys if k in ft]
        both = np.array([[hit_of[k], ft[k]] for k in common])
        kind_of_key = dict(zip(keys, kinds))
        report.setdefault("compare", {})[run] = {
            "expressions": len(common), "finetuned": round(100 * both[:, 1].mean(), 2),
            "finetuned_by_kind": {kind: round(100 * float(np.mean([ft[k] for k in common if kind_of_key[k] == kind])),
                                              2) for kind in sorted(set(kinds))},
            "name_reader": round(100 * both[:, 0].mean(), 2),
            "both_hit": round(100 * float((both.min(1) == 1).mean()), 2),
            "only_finetuned": round(100 * float(((both[:, 1] == 1) & (both[:, 0] == 0)).mean()), 2),
            "only_name_reader": round(100 * float(((both[:, 0] == 1) & (both[:, 1] == 0)).mean()), 2)}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
