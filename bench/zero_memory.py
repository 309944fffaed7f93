"""Per-rank model-state memory under ZeRO-1/2/3 with 2 ranks, against DeepSpeed's own formulas.

For mixed-precision Adam (bf16 parameters and gradients, fp32 master weights and two fp32 moments, so
K = 12 bytes of optimizer state per parameter), the ZeRO paper and DeepSpeed's memory estimators give
per rank, with P parameters and N ranks:
  stage 1: 2P + 2P + 12P/N      stage 2: 2P + (2 + 12)P/N      stage 3: (2 + 2 + 12)P/N

Measured: every tensor storage alive in a rank after the backward pass of a second training step (found
through the garbage collector, each storage counted once, views included), minus what was alive before the
model was built
(DeepSpeed's own communication buffers are counted: they are part of what a rank holds). The model is
the VL-BERT transformer with its pretraining heads (precomputed-feature mode, no CNN), bf16, our torch
AdamW wrapped by DeepSpeed, communication buckets sized as the engine sizes them (`bucket_elements`).

    python -m bench.zero_memory [--layers 6] [--hidden 512] [--write]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import tempfile
from pathlib import Path

import torch

from model.config import model_config
from model.vl_bert import VLBertForPretraining
from pretrain.tasks import LossConfig, VLBertPretraining
from train.engine import EngineConfig, OptimConfig, deepspeed_config, param_groups

from .report import bench_parser, machine, update_section
from .transformer_step import make_inputs, ours_batch

FORMULA = {1: lambda p, n: 4 * p + 12 * p / n, 2: lambda p, n: 2 * p + 14 * p / n, 3: lambda p, n: 16 * p / n}


def live_tensor_bytes() -> int:
    gc.collect()
    seen, total = set(), 0
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor) or obj.device.type == "meta":
                continue
            storage = obj.untyped_storage()
        except Exception:  # noqa: BLE001 - half-built or foreign objects in the heap
            continue
        key = storage.data_ptr()
        if key and key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def worker(stage: int, layers: int, hidden: int, out: str) -> None:
    # lazy: deepspeed picks its accelerator when imported; entry points set DS_ACCELERATOR first
    import deepspeed

    from train.engine import unlink_shm_buffer  # lazy: after DS_ACCELERATOR, as deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    unlink_shm_buffer()  # its ranks share a node under the launcher: DeepSpeed's shm workspaces, else left behind
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    x = make_inputs(2, 12, 8, 2048, 1601)
    batch = ours_batch(x)
    batch["caption"]["region_features"] = batch["caption"]["region_features"].bfloat16()
    before = live_tensor_bytes()
    torch.manual_seed(0)
    cfg = model_config("base", updates={"num_hidden_layers": layers, "hidden_size": hidden,
                                        "num_attention_heads": hidden // 64, "intermediate_size": 4 * hidden,
                                        "fast_rcnn": {"num_classes": 1601}})
    module = VLBertPretraining(VLBertForPretraining(cfg, with_fast_rcnn=False), LossConfig())
    params = sum(p.numel() for p in module.parameters())
    optim = OptimConfig(lr=1e-4, warmup_steps=1)
    opt = torch.optim.AdamW(param_groups(module, 0.01), lr=1e-4)
    ds = deepspeed_config(EngineConfig(zero_stage=stage, precision="bf16", steps=10), optim, 2, params)
    engine, *_ = deepspeed.initialize(model=module, optimizer=opt, config=ds)
    del module, opt
    for step in range(2):  # the optimizer states exist after the first step
        loss, _ = engine(batch)
        engine.backward(loss)
        del loss
        if step == 1:  # the formulas' moment: gradients reduced, optimizer states alive, before the update
            held = live_tensor_bytes() - before
        engine.step()
    result = {"stage": stage, "rank": rank, "world": world, "params": params, "bytes": held,
              "formula": FORMULA[stage](params, world)}
    Path(f"{out}.{rank}").write_text(json.dumps(result))
    torch.distributed.barrier()


def measure(stage: int, layers: int, hidden: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/r"
        env = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"),
               "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        cmd = ["deepspeed", "--num_gpus", "2", "--master_port", str(29610 + stage), "--module", "bench.zero_memory",
               "--worker", "--stage", str(stage), "--layers", str(layers), "--hidden", str(hidden), "--out", out]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"stage {stage} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]


def main(argv=None):
    p = bench_parser(__doc__, repeats=None)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--stage", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--local_rank", "--local-rank", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.stage, args.layers, args.hidden, args.out)
        return None
    rows = [r for stage in (1, 2, 3) for r in measure(stage, args.layers, args.hidden)]
    print(json.dumps(rows, indent=1))
    if args.write:
        table = "\n".join(
            f"| {r['stage']} | {r['rank']} | {r['bytes'] / 2**20:.1f} | {r['formula'] / 2**20:.1f} | "
            f"{100 * (r['bytes'] / r['formula'] - 1):+.1f}% |" for r in rows)
        update_section("zero_memory", f"""
## Model-state memory per rank under ZeRO-1/2/3 (2 ranks) vs DeepSpeed's formulas

`python -m bench.zero_memory --write`: VL-BERT transformer + pretraining heads, {args.layers} x {args.hidden}
(P = {rows[0]['params'] / 1e6:.1f} M parameters), bf16 with fp32 master weights and Adam moments, 2 CPU ranks
(gloo). Measured = every tensor storage alive in the rank after the second step's backward, minus those alive
before the model was built. Formulas (mixed-precision Adam, K = 12): stage 1 4P + 12P/N, stage 2 2P + 14P/N,
stage 3 16P/N. Machine: {machine()}.

| ZeRO stage | rank | measured MiB | formula MiB | difference |
| --- | --- | --- | --- | --- |
{table}
""")
    return rows


if __name__ == "__main__":
    main()
