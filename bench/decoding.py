"""BERT-gen decoding: cached (encode X once, one new position per step through cached keys/values) vs
naive (the paper's procedure: re-encode `X y_<t [MASK]` every step), questions per second in the same
run, at generated lengths 10/20/40.

Both produce the same tokens (asserted here as in the tests); the length is forced (min_length =
max_length) so both decode exactly L tokens. Input: 36 regions + a 15-word caption, as in BERT-gen
on VQG_COCO; the transformer at BERT-base size (12 x 768) with random weights (speed does not depend
on them).

    python -m bench.decoding [--lengths 10 20 40] [--batch 8] [--repeats 3] [--size base|mini] [--write]
"""

from __future__ import annotations

import json
import time

import torch

from finetune.generate import DecodeConfig, generate
from model.bert_gen import BertGen
from model.config import model_config

from .report import bench_parser, machine, median_range, update_section

SIZES = {"base": [], "mini": ["hidden_size=384", "num_hidden_layers=6", "num_attention_heads=12",
                              "intermediate_size=1536"]}


def build(size: str, regions: int, words: int, batch: int):
    cfg = model_config("base", overrides=["visual_embedding=linear", *SIZES[size]])
    torch.manual_seed(0)
    gen = BertGen(cfg).eval()
    g = torch.Generator().manual_seed(0)
    inputs = dict(text_ids=torch.randint(1000, 20000, (batch, words), generator=g),
                  text_mask=torch.ones(batch, words, dtype=torch.bool),
                  features=torch.randn(batch, regions, cfg.precomputed_feature_size, generator=g).relu(),
                  boxes=torch.rand(batch, regions, 4, generator=g).sort(-1).values,
                  region_mask=torch.ones(batch, regions, dtype=torch.bool))
    return gen, inputs


def time_decode(gen, inputs, length: int, cached: bool):
    cfg = DecodeConfig(method="greedy", max_length=length, min_length=length, cached=cached)
    start = time.perf_counter()
    with torch.no_grad():
        inp = gen.embed_input(**inputs)
        out = generate(gen, inp, cfg, end_id=gen.cfg.sep_token_id)
    return time.perf_counter() - start, out.tokens


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__)
    p.add_argument("--lengths", type=int, nargs="+", default=[10, 20, 40])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", choices=sorted(SIZES), default="base")  # "mini": the demo's size (MiniLM)
    args = p.parse_args(argv)
    gen, inputs = build(args.size, 36, 15, args.batch)
    time_decode(gen, inputs, 2, True)  # warm-up
    rows, results = [], {}
    for length in args.lengths:
        fast, slow = [], []
        for _ in range(args.repeats):  # interleaved, so drifts in machine load hit both
            t_fast, tok_fast = time_decode(gen, inputs, length, True)
            t_slow, tok_slow = time_decode(gen, inputs, length, False)
            if not torch.equal(tok_fast, tok_slow):
                raise AssertionError(f"length {length}: cached and naive decoding disagree")
            fast.append(args.batch / t_fast)
            slow.append(args.batch / t_slow)
        ratios = [f / s for f, s in zip(fast, slow)]
        results[length] = {"cached_q_per_s": fast, "naive_q_per_s": slow, "ratio": ratios}
        rows.append(f"| {length} | {median_range(fast)} | {median_range(slow)} | **{median_range(ratios)}** |")
        print(f"length {length}: cached {median_range(fast)} q/s, naive {median_range(slow)} q/s, "
              f"ratio {median_range(ratios)}", flush=True)
    print(json.dumps(results))
    if args.write:
        size = "12 x 768 (BERT-base)" if args.size == "base" else "6 x 384 (MiniLM, the demo's)"
        update_section("decoding", f"""
## BERT-gen decoding: cached vs naive re-encoding

`python -m bench.decoding --write`: greedy decoding of exactly L tokens (forced length), batch
{args.batch}, input = 36 regions + a 15-word caption, transformer {size} with random weights; cached =
X encoded once and one position per step through cached keys/values; naive = the paper's
procedure, re-encoding `X y_<t [MASK]` from scratch every step. Both return identical tokens
(checked in the run). {args.repeats} interleaved repeats, median (min-max). Machine: {machine()}.

| L (tokens) | cached questions/s | naive questions/s | cached / naive |
| --- | --- | --- | --- |
""" + "\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
