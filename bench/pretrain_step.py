"""Pretraining step throughput and model-FLOPs utilisation: our training engine vs a plain PyTorch
loop (same module, same batches, AdamW + clipping), in one process, in the same run.

"Ours" is the `Engine`'s own loop (`Engine.train`: DeepSpeed's forward, backward and step, the non-finite
flags, the metric sums, the per-step stop vote, a log line per window), checkpoints switched off, configured at
ZeRO 2 (the configs' default; on one rank it runs as stage 0, `train.engine.run_stage`), with the engine's CPU
optimizer (`train.optim.BlockedAdamW`). Data loading is
excluded (the same pre-made batches feed both), so the ratio isolates the step. Both run under the engine's
allocator setting (`train.engine.keep_freed_memory`, process-wide: set before either is timed).
Utilisation = counted model FLOPs per second (model/flops.py, by part) over a large fp32 GEMM
measured in the same run.

    python -m bench.pretrain_step [--shape demo|base|all] [--steps 4] [--repeats 3] [--write] [--scaling]

`--scaling` adds data-parallel scaling: the same Engine loop on 1 and on 2 ranks (processes on this machine,
gloo, one thread and one core each; each rank its own batch of the shape's size), at ZeRO 2 and 0; weak-scaling
efficiency = the 2-rank step's throughput over twice the 1-rank step's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from model.config import model_config
from model.flops import cnn_flops, measured_matmul_peak, transformer_flops
from model.vl_bert import VLBertForPretraining
from pretrain.masking import MaskingConfig, PretrainMasker
from pretrain.run import count_batch
from pretrain.tasks import LossConfig, VLBertPretraining
from shards.demo import build_demo
from shards.reader import StreamConfig, StreamLoader
from shards.tokenizer import load_tokenizer
from train.engine import Engine, EngineConfig, OptimConfig, keep_freed_memory, linear_warmup_decay, param_groups

from .report import bench_parser, machine, median_range, update_section

SHAPES = {
    # the demo config: MiniLM-sized transformer, ResNet-18, small images, 4 + 4 samples
    "demo": dict(preset="base", overrides=["hidden_size=384", "num_hidden_layers=6", "num_attention_heads=12",
                                           "intermediate_size=1536", "visual_size=512", "geometry_size=128",
                                           "fast_rcnn.backbone=resnet18", "fast_rcnn.num_classes=9",
                                           "fast_rcnn.roi_output_size=8", "fast_rcnn.freeze_stem=false",
                                           "fast_rcnn.freeze_res2=false"],
                 short_side=128, long_side=192, captions=4, texts=4),
    # base size: 12 x 768 and ResNet-50, images at shorter side 320, 2 + 2 samples (CPU-sized)
    "base": dict(preset="base", overrides=["fast_rcnn.backbone=resnet50", "fast_rcnn.num_classes=9"],
                 short_side=320, long_side=512, captions=2, texts=2),
}


COLUMNS = ["shape", "samples/step", "ours (ZeRO-2 configured) samples/s", "plain loop samples/s", "ours / plain",
           "GFLOP/step (transformer / CNN)", "util.", "CNN share of step", "util. CNN / transformer"]
HEADER = "| " + " | ".join(COLUMNS) + " |\n|" + " --- |" * len(COLUMNS)


def make_batches(shape: dict, n: int, demo_dir: str):
    cfg = StreamConfig(caption_shards=f"{demo_dir}/shards/captions-train/*.tar",
                       text_shards=f"{demo_dir}/shards/text/*.tar", caption_batch_size=shape["captions"],
                       text_batch_size=shape["texts"], short_side=shape["short_side"], long_side=shape["long_side"],
                       num_workers=0)
    masker = PretrainMasker(MaskingConfig(co_mask_iou=0.5), load_tokenizer(None), cls_id=101, sep_id=102,
                            mask_id=103, num_classes=9)
    return [b for _, b in zip(range(n), StreamLoader(cfg, rank=0, world_size=1, transform=masker))]


def step_flops(model_cfg, fast_rcnn, batches) -> dict[str, float]:
    transformer = cnn = 0.0
    for b in batches:
        c, t = b["caption"], b["text"]
        lens = ((c["text_mask"].sum(1) + c["box_mask"].sum(1) + 2).tolist() + t["text_mask"].sum(1).tolist())
        transformer += transformer_flops(model_cfg, lens, len(c["mlm_positions"]) + len(t["mlm_positions"]),
                                         len(c["mrc_positions"]))
        cnn += cnn_flops(fast_rcnn, c["images"], c["image_sizes"], c["boxes"], c["box_mask"])
    return {"transformer": transformer / len(batches), "cnn": cnn / len(batches)}


def engine_loop(model_cfg, initial: dict, batches: list, stage: int, run_dir: str, steps: int, samples: int,
                precision: str = "fp32", grad_clip: float = 1.0):
    """Our Engine over `batches[1:]`, round and round, after one warm-up step; no checkpoints."""

    class Batches:  # the Engine's loader: the same pre-made batches
        def __iter__(self):
            while True:
                yield from batches[1:]

    module = VLBertPretraining(VLBertForPretraining(model_cfg), LossConfig())
    module.load_state_dict(initial)
    cfg = EngineConfig(run_dir=run_dir, zero_stage=stage, precision=precision, steps=1, log_every=steps,
                       checkpoint_every=1 << 30, progress=False, export=False)
    engine = Engine(module, Batches(), cfg, OptimConfig(lr=1e-4, warmup_steps=10, grad_clip=grad_clip),
                    micro_batch_size=samples, count_batch=count_batch)
    engine.save_checkpoint = lambda: None  # the loop alone: no checkpoint at a window's end
    engine.train()  # one warm-up step
    return engine


def engine_window(engine, steps: int) -> float:
    """Seconds per step of `steps` more steps of the Engine's own loop."""
    engine.cfg.steps = engine.step + steps
    t = time.perf_counter()
    engine.train(resume=True)  # no checkpoint to resume from: it goes on from where it is
    return (time.perf_counter() - t) / steps


def scaling_rank(rank: int, world: int, port: int, name: str, steps: int, repeats: int, demo_dir: str,
                 out: str) -> None:
    """One rank of the scaling bench (started by torch.multiprocessing): the Engine loop at ZeRO 2 and 0 on one
    thread; rank 0 writes the seconds per step of each window."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    # lazy: deepspeed picks its accelerator when imported; entry points set DS_ACCELERATOR first
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    shape = SHAPES[name]
    samples = shape["captions"] + shape["texts"]
    model_cfg = model_config(shape["preset"], None, shape["overrides"])
    batches = make_batches(shape, steps + 1, demo_dir)
    torch.manual_seed(0)
    initial = VLBertPretraining(VLBertForPretraining(model_cfg), LossConfig()).state_dict()
    engines = {stage: engine_loop(model_cfg, initial, batches, stage, f"{out}.run{world}/zero{stage}", steps, samples)
               for stage in (2, 0)}
    times = {stage: [engine_window(engines[stage], steps) for _ in range(repeats)] for stage in engines}
    if rank == 0:
        # with the stage each loop ran at: ZeRO 1/2 at one rank with fp32 weights run as 0 (train.engine.run_stage)
        Path(out).write_text(json.dumps({"times": {str(k): v for k, v in times.items()},
                                         "stage_run": {str(k): e.cfg.zero_stage for k, e in engines.items()}}))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def run_scaling(name: str, steps: int, repeats: int, demo_dir: str) -> dict:
    """Seconds per step at 1 and 2 ranks (one thread each), and the weak-scaling efficiency t1 / t2."""

    tmp = tempfile.mkdtemp(prefix="bench_scaling_")
    times, stage_run = {}, {}
    for world, port in ((1, 29581), (2, 29582)):
        out = f"{tmp}/world{world}.json"
        mp.spawn(scaling_rank, args=(world, port, name, steps, repeats, demo_dir, out), nprocs=world)
        written = json.loads(Path(out).read_text())  # string keys, as its JSON round trip gives
        times[str(world)], stage_run[str(world)] = written["times"], written["stage_run"]
    shutil.rmtree(tmp, ignore_errors=True)
    efficiency = {stage: statistics.median(times["1"][stage]) / statistics.median(times["2"][stage])
                  for stage in times["1"]}
    return {"shape": name, "seconds_per_step": times, "stage_run": stage_run, "efficiency": efficiency}


def run_shape(name: str, steps: int, repeats: int, demo_dir: str) -> dict:
    keep_freed_memory()  # the engines below set it for the process anyway: the plain loop gets it from the start
    shape = SHAPES[name]
    samples = shape["captions"] + shape["texts"]
    model_cfg = model_config(shape["preset"], None, shape["overrides"])
    batches = make_batches(shape, steps + 1, demo_dir)
    torch.manual_seed(0)
    base = VLBertPretraining(VLBertForPretraining(model_cfg), LossConfig())
    flops = step_flops(model_cfg, base.model.vl_bert.fast_rcnn, batches[1:])
    initial = {k: v.clone() for k, v in base.state_dict().items()}

    def plain():
        base.load_state_dict(initial)
        opt = torch.optim.AdamW(param_groups(base, 1e-4), lr=1e-4)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_warmup_decay(10, 1000))

        def one(b):
            loss, _ = base(b)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(base.parameters(), 1.0)
            opt.step()
            sched.step()
        return one

    tmp = tempfile.mkdtemp(prefix="bench_pretrain_step_")
    engine = engine_loop(model_cfg, initial, batches, 2, f"{tmp}/zero2", steps, samples)

    def timed(make):
        step = make()
        step(batches[0])  # warm-up
        t = time.perf_counter()
        for b in batches[1:]:
            step(b)
        return (time.perf_counter() - t) / steps

    def cnn_only():
        # the detector's share of a step: its forward and backward on the same images and boxes, with
        # the gradient the transformer would send replaced by a sum (same shapes, same kernels)
        detector = base.model.vl_bert.fast_rcnn

        def one(b):
            c = b["caption"]
            out = detector(c["images"], c["image_sizes"], c["boxes"], c["box_mask"], c["masked_regions"])
            out["appearance"].sum().backward()
            detector.zero_grad(set_to_none=True)
        return one

    results = {"ours": [], "plain": [], "cnn": []}
    for _ in range(repeats):  # interleaved
        results["ours"].append(engine_window(engine, steps))
        results["plain"].append(timed(plain))
        results["cnn"].append(timed(cnn_only))
    shutil.rmtree(tmp, ignore_errors=True)
    peak = measured_matmul_peak()
    total = flops["transformer"] + flops["cnn"]
    t_ours, t_cnn = statistics.median(results["ours"]), statistics.median(results["cnn"])
    t_rest = statistics.median(results["plain"]) - t_cnn  # transformer, heads, losses, optimizer
    return {"shape": name, "samples_per_step": samples, "stage_run": engine.cfg.zero_stage, "seconds_per_step": results,
            "samples_per_s": {k: [samples / s for s in v] for k, v in results.items() if k != "cnn"},
            "ratio": [p / o for o, p in zip(results["ours"], results["plain"])],
            "flops_per_step": flops, "matmul_peak_flops": peak,
            "cnn_share_of_plain_step": t_cnn / statistics.median(results["plain"]),
            "utilisation": {"total": total / t_ours / peak, "transformer_share_of_flops": flops["transformer"] / total,
                            "cnn": flops["cnn"] / t_cnn / peak, "transformer": flops["transformer"] / t_rest / peak}}


def shape_parser(doc: str) -> argparse.ArgumentParser:
    """The command line of the benches that run at `SHAPES` on the demo corpus' batches."""
    p = bench_parser(doc)
    p.add_argument("--shape", default="all", choices=["demo", "base", "all"])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--demo", default="data/demo")
    return p


def ensure_demo(demo_dir: str) -> None:
    """Build the demo corpus the batches come from, on a fresh machine."""
    if not os.path.exists(f"{demo_dir}/shards/text/manifest.json"):

        build_demo(demo_dir)


def write_scaling(scaling: list[dict], steps: int, repeats: int) -> None:
    """The scaling section of docs/BENCHMARKS.md from `run_scaling`'s results (or their JSON)."""
    rows = []
    for r in scaling:
        t = r["seconds_per_step"]
        samples = SHAPES[r["shape"]]["captions"] + SHAPES[r["shape"]]["texts"]
        run = r.get("stage_run", {"1": {}, "2": {}})
        for stage in ("2", "0"):
            runs_as = f"{run['1'].get(stage, stage)} / {run['2'].get(stage, stage)}"
            rows.append(f"| {r['shape']} | {stage} | {runs_as} | "
                        f"{median_range([samples / x for x in t['1'][stage]])} | "
                        f"{median_range([2 * samples / x for x in t['2'][stage]])} | "
                        f"{r['efficiency'][stage]:.2f} |")
    update_section("pretrain_scaling", f"""
## Pretraining step: 1 rank against 2 (data-parallel scaling)

`python -m bench.pretrain_step --scaling --write`: the same Engine loop as above on 1 and on 2 ranks
(processes on this machine over gloo, one thread and one core each), each rank with its own batch of the
shape's size; {steps} timed steps after a warm-up, {repeats} repeats; median (min-max). Weak-scaling
efficiency = the 2 ranks' samples/s over twice the 1 rank's (1.0: the gradient exchange costs nothing).
"Runs as": the stage each loop ran at, 1 rank / 2 ranks (ZeRO 1/2 on one rank with fp32 weights run as stage 0,
`train.engine.run_stage`, so the ZeRO-2 row's 1-rank loop is the ZeRO-0 one's configuration).
Machine: {machine()}.

| shape | ZeRO stage | runs as | 1 rank samples/s | 2 ranks samples/s | efficiency |
| --- | --- | --- | --- | --- | --- |
{chr(10).join(rows)}
""")


def main(argv=None):
    p = shape_parser(__doc__)
    p.add_argument("--scaling", action="store_true", help="also 1 vs 2 ranks (one thread each): efficiency")
    args = p.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29571"}.items():
        os.environ.setdefault(k, v)
    # lazy: deepspeed picks its accelerator when imported; entry points set DS_ACCELERATOR first
    import deepspeed

    ensure_demo(args.demo)
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    shapes = ["demo", "base"] if args.shape == "all" else [args.shape]
    out = [run_shape(s, args.steps, args.repeats, args.demo) for s in shapes]
    scaling = [run_scaling(s, args.steps, args.repeats, args.demo) for s in shapes] if args.scaling else []
    print(json.dumps(out + scaling, indent=1))
    if args.write:
        rows = []
        for r in out:
            sps = r["samples_per_s"]
            rows.append(f"| {r['shape']} | {r['samples_per_step']} | {median_range(sps['ours'])} | "
                        f"{median_range(sps['plain'])} | {statistics.median(r['ratio']):.2f} "
                        f"({min(r['ratio']):.2f}-{max(r['ratio']):.2f}) | "
                        f"{r['flops_per_step']['transformer'] / 1e9:.1f} / {r['flops_per_step']['cnn'] / 1e9:.1f} | "
                        f"{100 * r['utilisation']['total']:.1f}% | {100 * r['cnn_share_of_plain_step']:.0f}% | "
                        f"{100 * r['utilisation']['cnn']:.1f}% / {100 * r['utilisation']['transformer']:.1f}% |")
        update_section("pretrain_step", f"""
## Pretraining step: our engine vs a plain PyTorch loop

`python -m bench.pretrain_step --write`: one process; ours is the `Engine`'s loop (DeepSpeed's forward,
backward and step, the non-finite flags, metric sums, the per-step stop vote and a log line; no checkpoint)
configured at ZeRO-2, which on one rank runs as stage 0 (`train.engine.run_stage`: the engine skips DeepSpeed's
gradient all-reduce and clips in its FiniteGuard), with its CPU optimizer (torch's AdamW arithmetic over cache-sized
blocks, `train.optim.BlockedAdamW`); the plain loop: torch's AdamW and `clip_grad_norm_`. Both under the
engine's allocator setting (`keep_freed_memory`: freed memory kept for reuse); fp32, the same module and the
same pre-made batches (data loading excluded) for all; {args.steps} timed steps after a warm-up step,
{args.repeats} interleaved repeats; median (min-max). Utilisation = counted model FLOPs (`model/flops.py`:
transformer 6N per token + attention + heads at masked positions; CNN by FlopCounterMode, x3 for
backward) per second of our step, over a {2048}^3 fp32 GEMM measured in the same run
({out[0]['matmul_peak_flops'] / 1e9:.0f} GFLOP/s). By part: the detector's forward + backward timed alone on the
same batches (its share of the plain loop's step), and the transformer part = the plain step minus that
(so it carries the heads, losses and optimizer). Machine: {machine()}.

{HEADER}
{chr(10).join(rows)}
""")
    if args.write and scaling:
        write_scaling(scaling, args.steps, args.repeats)
    return out + scaling


if __name__ == "__main__":
    main()
