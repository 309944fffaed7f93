"""Where a whole masked phrase's alignment lands, with and without `model.relation_alignment_window`, at step 0.

The quick start's model as pretraining builds it before its first step (the packaged MiniLM, the warmed-up detector,
region words), no training: for each held-out phrase masked whole (the cross-modal diagnostic's examples), the mean
over its word-pieces of the alignment weight on the regions over its gold box (IoT > 0.5) and of the weight aligned in
all, split by whether its sentence has a relation word (docs/ABLATION.md, session 71).

    python docs/grounding_demo/relation_probe.py [--examples 600] [pretraining key=value ...]   # the quick start's
    python docs/grounding_demo/relation_probe.py model.relation_alignment_window=0                 # without
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from diagnostics.conditions import Ablator  # noqa: E402
from diagnostics.config import DiagnosticConfig  # noqa: E402
from diagnostics.data import PhraseData, regions_over  # noqa: E402
from model.config import deep_merge, load_config  # noqa: E402
from model.hf_import import load_hf_bert  # noqa: E402
from model.vl_bert import RELATIONS, VLBertForPretraining  # noqa: E402
from pretrain.config import PretrainConfig, build_model_config  # noqa: E402
from pretrain.run import name_updates  # noqa: E402
from shards.tokenizer import bert_source_dir, load_tokenizer  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="launch/configs/demo.yaml")
    p.add_argument("--heldout", default="launch/configs/heldout_demo.yaml")
    p.add_argument("--examples", type=int, default=600)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    cfg = load_config(PretrainConfig, args.config, args.overrides)
    tok = load_tokenizer(str(bert_source_dir(cfg.bert)))
    cfg.model = deep_merge(cfg.model, name_updates(cfg, tok))
    torch.manual_seed(0)
    model = VLBertForPretraining(build_model_config(cfg))
    load_hf_bert(model, bert_source_dir(cfg.bert))
    model.eval()
    data = PhraseData(load_config(DiagnosticConfig, args.heldout, [f"max_examples={args.examples}"]), tok,
                      model.cfg.fast_rcnn.num_classes)
    emb, seen = model.vl_bert.embeddings, {}
    weights_of = emb.alignment_weights

    def recorded(*a, **k):
        seen["weights"] = weights_of(*a, **k)
        return seen["weights"]

    emb.alignment_weights = recorded
    relation_ids = set(tok.convert_tokens_to_ids(list(RELATIONS)))
    ablator, rows = Ablator(model), []
    with torch.no_grad():
        for b in data.batches():
            ids, types, mask = ablator.text(b, "phrase")
            model.vl_bert(ids, mask, types, boxes=b["boxes"], box_mask=b["box_mask"], images=b["images"],
                          image_sizes=b["image_sizes"])
            weights = seen["weights"]  # [B, T, 1 + N]
            gold = regions_over(b["boxes"], b["box_mask"], b["gold"], b["gold_mask"], 0.5)  # [B, N]
            phrase = torch.nn.functional.pad(b["phrase"], (1, 1))[:, : weights.shape[1]]  # shifted by [CLS]
            for r in range(weights.shape[0]):
                if not gold[r].any():
                    continue
                w = weights[r][phrase[r]]  # [pieces, 1 + N]
                relational = bool(relation_ids & set(b["input_ids"][r][b["attention_mask"][r]].tolist()))
                rows.append((relational, float(w[:, 1:][:, gold[r]].sum(-1).mean()), float(w.sum(-1).mean())))
    a = np.array(rows)
    for flag, name in ((1, "sentences with a relation word"), (0, "the others")):
        s = a[a[:, 0] == flag]
        print(f"{name}: {len(s)} phrases, weight on the phrase's object {s[:, 1].mean():.3f}, aligned in all "
              f"{s[:, 2].mean():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
