"""Transformer training step with precomputed region features, against transformers' VisualBERT.

Both models at the same size (default BERT-base, 12 x 768, 2048-d region features), on the same inputs
(batch 32: ~30 word-pieces of varying length, 36 regions, 15% of words masked), trained the same way
(fp32, torch AdamW, one process, no DeepSpeed), in the same run:

- ours: `VLBertPretraining` with `region_features`: MLM at the masked positions plus masked RoI
  classification (1601 soft classes) at 15% of the regions, which VisualBERT does not do at all; the
  batch's `real_positions` counted as the pretraining masker counts them, so the layers skip padding;
- peer: `transformers.VisualBertForPreTraining`, MLM with `labels` (its head scores every position).

Also reports utilisation: the counted transformer FLOPs (`model/flops.py`, real tokens only) per
second of our step, over a large fp32 GEMM measured in the same run.

    python -m bench.transformer_step [--batch 32] [--steps 2] [--repeats 3] [--write]
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from model.config import model_config
from model.flops import measured_matmul_peak, transformer_flops
from model.vl_bert import VLBertForPretraining, real_positions
from pretrain.tasks import LossConfig, VLBertPretraining

from .report import bench_parser, machine, median_range, update_section

OURS = ("SDPA, MLM logits at masked positions only, layers on real positions only, one vocabulary lookup, "
        "integer-draw CPU dropout")


def make_inputs(batch: int, words: int, regions: int, feature: int, classes: int, seed: int = 0) -> dict:
    """One batch in both models' terms; word counts vary around `words` (+-20%) so there is padding."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(int(words * 0.8), int(words * 1.2) + 1, (batch,), generator=g)
    t = int(lens.max()) + 2  # [CLS] words [SEP]
    ids = torch.zeros(batch, t, dtype=torch.long)
    mask = torch.zeros(batch, t, dtype=torch.bool)
    masked = torch.zeros(batch, t, dtype=torch.bool)
    for i, n in enumerate(lens.tolist()):
        ids[i, 0], ids[i, 1: n + 1], ids[i, n + 1] = 101, torch.randint(1000, 30000, (n,), generator=g), 102
        mask[i, : n + 2] = True
        masked[i, 1: n + 1] = torch.rand(n, generator=g) < 0.15
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    inputs = torch.where(masked, torch.full_like(ids, 103), ids)
    feats = torch.rand(batch, regions, feature, generator=g) * 2  # post-ReLU-like, as bottom-up features
    xy = torch.rand(batch, regions, 2, generator=g) * 400
    boxes = torch.cat([xy, xy + 20 + torch.rand(batch, regions, 2, generator=g) * 180], -1)
    mrc = torch.rand(batch, regions, generator=g) < 0.15
    probs = torch.softmax(torch.randn(batch, regions, classes, generator=g) * 3, -1)
    return {"input_ids": inputs, "text_mask": mask, "labels": labels, "masked_words": masked,
            "features": feats, "boxes": boxes, "mrc": mrc, "probs": probs, "lens": lens}


def ours_batch(x: dict) -> dict:
    b, t = x["input_ids"].shape
    mrc = x["mrc"]
    box_mask = torch.ones_like(mrc)
    return {"caption": {
        "input_ids": x["input_ids"], "text_mask": x["text_mask"], "token_type_ids": torch.zeros_like(x["input_ids"]),
        "region_features": x["features"], "image_hw": torch.tensor([[600.0, 800.0]]).expand(b, 2),
        "boxes": x["boxes"], "box_mask": box_mask, "masked_regions": mrc,
        "mlm_positions": x["masked_words"].flatten().nonzero().squeeze(1),
        "mlm_labels": x["labels"][x["masked_words"]],
        "mrc_positions": mrc.flatten().nonzero().squeeze(1), "mrc_probs": x["probs"][mrc],
        "mrc_labels": x["probs"][mrc].argmax(-1),
        "real_positions": real_positions(x["text_mask"], box_mask)}}  # as the pretraining masker counts them


def peer_inputs(x: dict) -> dict:
    b, n = x["mrc"].shape
    return {"input_ids": x["input_ids"], "attention_mask": x["text_mask"].long(),
            "token_type_ids": torch.zeros_like(x["input_ids"]), "visual_embeds": x["features"],
            "visual_attention_mask": torch.ones(b, n, dtype=torch.long),
            "visual_token_type_ids": torch.ones(b, n, dtype=torch.long),
            "labels": torch.cat([x["labels"], torch.full((b, n), -100)], 1)}


def build(layers: int, hidden: int, heads: int, feature: int, classes: int):
    # lazy: transformers (~0.7 s to import) only for the VisualBERT peer
    from transformers import VisualBertConfig, VisualBertForPreTraining

    torch.manual_seed(0)
    cfg = model_config("base", updates={"num_hidden_layers": layers, "hidden_size": hidden,
                                        "num_attention_heads": heads, "intermediate_size": 4 * hidden,
                                        "visual_size": feature, "geometry_size": feature,
                                        "fast_rcnn": {"num_classes": classes}})
    ours = VLBertPretraining(VLBertForPretraining(cfg, with_fast_rcnn=False), LossConfig())
    peer = VisualBertForPreTraining(VisualBertConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * hidden,
        visual_embedding_dim=feature, vocab_size=cfg.vocab_size))
    return cfg, ours, peer


def trainer(module, loss_of):
    opt = torch.optim.AdamW(module.parameters(), lr=1e-5)

    def step(inputs):
        loss = loss_of(module, inputs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def timed(step, inputs, steps: int) -> float:
    step(inputs)  # warm-up
    t = time.perf_counter()
    for _ in range(steps):
        step(inputs)
    return (time.perf_counter() - t) / steps


def run(batch: int, words: int, regions: int, layers: int, hidden: int, heads: int, steps: int, repeats: int) -> dict:
    feature, classes = 2048, 1601
    cfg, ours, peer = build(layers, hidden, heads, feature, classes)
    ours.train()
    peer.train()
    x = make_inputs(batch, words, regions, feature, classes)
    mine, theirs = ours_batch(x), peer_inputs(x)
    step_ours = trainer(ours, lambda m, b: m(b)[0])
    step_peer = trainer(peer, lambda m, b: m(**b).loss)
    results = {"ours": [], "peer": []}
    for _ in range(repeats):  # interleaved, so drift hits both
        results["ours"].append(timed(step_ours, mine, steps))
        results["peer"].append(timed(step_peer, theirs, steps))
    seq = (x["lens"] + 2 + regions + 2).tolist()  # [CLS] words [SEP] + whole image + regions + [END]
    flops = transformer_flops(cfg, seq, int(x["masked_words"].sum()), int(x["mrc"].sum()))
    peak = measured_matmul_peak()
    real = mine["caption"]["real_positions"]
    padded = batch * (x["text_mask"].shape[1] + regions + 2)
    return {"batch": batch, "words_mean": float(x["lens"].float().mean()), "regions": regions, "layers": layers,
            "hidden": hidden, "seconds_per_step": results,
            "samples_per_s": {k: [batch / s for s in v] for k, v in results.items()},
            "ratio": [p / o for o, p in zip(results["ours"], results["peer"])],
            "transformer_flops_per_step": flops, "matmul_peak_flops": peak,
            "utilisation": [flops / s / peak for s in results["ours"]], "padding_fraction": 1 - real / padded}


def main(argv=None):
    p = bench_parser(__doc__)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--words", type=int, default=30)
    p.add_argument("--regions", type=int, default=36)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args(argv)
    r = run(args.batch, args.words, args.regions, args.layers, args.hidden, args.heads, args.steps, args.repeats)
    print(json.dumps(r, indent=1))
    if args.write:
        sps, ratio, util = r["samples_per_s"], r["ratio"], [100 * u for u in r["utilisation"]]
        update_section("transformer_step", f"""
## Transformer step with precomputed region features vs `transformers.VisualBertForPreTraining`

`python -m bench.transformer_step --write`: {r['layers']} x {r['hidden']}, batch {r['batch']} (word-pieces
{r['words_mean']:.0f} on average, varying +-20%; {r['regions']} regions of 2048-d features), fp32, torch AdamW, one
process, both models in the same run ({args.steps} timed steps after a warm-up, {args.repeats} interleaved repeats;
median (min-max)). Ours also trains masked RoI classification (1601 classes at 15% of regions), which
VisualBERT does not. Utilisation: counted transformer FLOPs (real tokens only) per second of our step
over a 2048^3 fp32 GEMM measured in the same run ({r['matmul_peak_flops'] / 1e9:.0f} GFLOP/s). Machine:
{machine()}.

| model | samples/s |
| --- | --- |
| VL-BERT (ours: {OURS}) | {median_range(sps['ours'])} |
| `transformers.VisualBertForPreTraining` | {median_range(sps['peer'])} |
| **ours / VisualBERT** | **{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})** |
| utilisation of our step (transformer FLOPs / GEMM peak) | {median_range(util)}% |
| padded positions in this batch | {100 * r['padding_fraction']:.1f}% |
""")
    return r


if __name__ == "__main__":
    main()
