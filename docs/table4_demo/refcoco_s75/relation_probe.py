"""Where the relation word of a relational RefCOCO+ expression ("the circle left of the blue star", demo version 3)
puts its alignment: for each val expression, the relation word's weight on the referent against the other regions of
the referent's category (the look-alikes it must be told from), read off an export's model as finetuning starts
(`alignment_weights`, the words' side; `region_aligned_words` hands the same weights to the regions). No training.

    python docs/table4_demo/refcoco_s75/relation_probe.py --export runs/demo_s73/export [--out OUT.json] \
        [--set backbone.model.relation_alignment_landmark_first=false]     # any config override
Prints JSON: how often the referent has the largest weight among its category, the mean weight on the referent and
on its look-alikes, and how often a look-alike has at least half the referent's weight (docs/FINETUNE.md, session 75).
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

from docs.table4_demo.lowdata_s62.name_reader import RELATIONAL  # noqa: E402
from finetune.common import build_pretrained, encode  # noqa: E402
from finetune.refcoco import RefConfig, RefSet, read_instances, read_refs  # noqa: E402
from model.config import load_config  # noqa: E402
from model.vl_bert import assemble_text  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", required=True)
    ap.add_argument("--config", default="launch/configs/refcoco_demo.yaml")
    ap.add_argument("--split", default="val")
    ap.add_argument("--out")
    ap.add_argument("--set", action="append", default=[], help="a config override, KEY=VALUE")
    args = ap.parse_args(argv)
    cfg = load_config(RefConfig, args.config, ["track=gt", f"backbone.init={args.export}", *args.set])
    model, tok_dir, _ = build_pretrained(cfg.backbone)
    vl_bert = model.vl_bert.eval()
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    data = RefSet(cfg, args.split, tokenizer, train=False)
    _, anns, _ = read_instances(cfg.data.instances)
    sentences = {(r["ref_id"], s["sent_id"]): s["sent"] for r in read_refs(cfg.data.refs) for s in r["sentences"]}
    by_box = {}  # (image, rounded box) -> category id: the gt track's candidates are the image's annotations
    for a in anns.values():
        by_box[(a["image_id"], tuple(round(v, 1) for v in a["box"]))] = a["category_id"]
    captured, sides = [], []
    weights_of, scores_of = vl_bert.embeddings.alignment_weights, vl_bert.embeddings.relation_scores

    def capture(*a, **k):
        w = weights_of(*a, **k)
        captured.append(w.detach())
        return w

    def capture_sides(*a, **k):  # the relation word's scores from the object after it and from the one before
        after, before = scores_of(*a, **k)
        sides.append((after.detach(), before.detach()))
        return after, before

    vl_bert.embeddings.alignment_weights = capture
    vl_bert.embeddings.relation_scores = capture_sides
    relation_ids = {tokenizer.convert_tokens_to_ids(w) for w in ("left", "right", "above", "below")}
    stats = {name: {"top": [], "referent": [], "others": [], "close": []} for name in ("aligned", "after_side_alone")}
    picks = [i for i, item in enumerate(data.items) if RELATIONAL.fullmatch(sentences[(item["ref_id"],
                                                                                        item["sent_id"])])]
    with torch.no_grad():
        for start in range(0, len(picks), 32):
            idx = picks[start:start + 32]
            batch = data.batch(idx)
            captured.clear()
            sides.clear()
            encode(vl_bert, batch)
            aligned = captured[-1]  # [B, T, 1 + N]
            # the after side's scores alone, through the alignment's softmax with its "no region" option
            after = sides[-1][0]
            c = vl_bert.cfg
            after_alone = (torch.cat([after, after.new_full((*after.shape[:2], 1), c.region_word_alignment)], -1)
                           * c.region_word_alignment_scale).softmax(-1)[..., :-1]
            c = vl_bert.cfg
            ids = assemble_text(batch["a_ids"], batch["a_mask"], cls_id=c.cls_token_id, sep_id=c.sep_token_id,
                                pad_id=c.pad_token_id)[0]
            for row, i in enumerate(idx):
                item = data.items[i]
                t = next(k for k in range(ids.shape[1]) if int(ids[row, k]) in relation_ids)
                regions = data.regions[item["image_id"]]
                cats = [by_box[(item["image_id"], tuple(round(float(v), 1) for v in b))] for b in regions]
                ref = int(batch["iou"][row, :len(regions)].argmax())
                same = [k for k in range(len(regions)) if cats[k] == cats[ref] and k != ref]
                for name, weights in (("aligned", aligned), ("after_side_alone", after_alone)):
                    w, st = weights[row, t, 1:1 + len(regions)], stats[name]
                    st["top"].append(float(all(w[ref] > w[k] for k in same)))
                    st["referent"].append(float(w[ref]))
                    st["others"].append(float(np.mean([float(w[k]) for k in same])))
                    st["close"].append(float(any(w[k] >= 0.5 * w[ref] for k in same)))
    report = {"export": args.export, "overrides": args.set, "expressions": len(picks)}
    for name, st in stats.items():
        report[name] = {"referent_above_its_lookalikes": round(100 * float(np.mean(st["top"])), 2),
                        "mean_weight_referent": round(float(np.mean(st["referent"])), 3),
                        "mean_weight_lookalikes": round(float(np.mean(st["others"])), 3),
                        "a_lookalike_at_half_or_more": round(100 * float(np.mean(st["close"])), 2)}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
