"""The one training engine: DeepSpeed ZeRO, the step loop, TensorBoard, checkpoints, exact resume.

Pretraining and every finetune task plug in a module `forward(batch) -> (loss, {name: scalar})`, a
loader with `state_dict()`/`load_state_dict()` (the shard reader's position), and optionally a
function drawing a batch for TensorBoard.

Checkpoints: `<run_dir>/checkpoints/step_NNNNNNN/` holds DeepSpeed's files (model, optimizer,
scheduler, step), one `rank_R.pt` per rank (reader position and RNG states) and, written last once
every rank has finished, `COMPLETE`. Resume takes the newest directory with `COMPLETE`, so a
checkpoint half-written when the job died is never taken. SIGTERM/SIGINT stop the run gracefully
after the current step, with a checkpoint.

Resume on another number of ranks (elastic) or at another ZeRO stage: the checkpoint is converted once to
DeepSpeed's universal form (`<checkpoint>/universal/`, by rank 0; stage 0 checkpoints load as they are on any
number of ranks), and the reader's position is re-dealt over the new ranks, so no sample of the epoch is seen
twice or skipped (`Engine.resume`). ZeRO 1 and 2 on one rank run as stage 0 (`run_stage`), so a run that goes
from one rank to several, or back, changes stage too.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import types
import uuid
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from model.config import ConfigError, deep_merge
from shards.seeding import seed_for

from .environment import environment
from .optim import BlockedAdamW


@dataclass
class OptimConfig:
    lr: float = 2e-5  # VL-BERT pretraining: Adam(W), 2e-5, betas 0.9/0.999, weight decay 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    weight_decay: float = 1e-4  # not applied to biases and LayerNorm gains
    warmup_steps: int = 8000  # linear warm-up from 0, then linear decay to 0 at engine.steps
    grad_clip: float = 1.0  # global gradient-norm clipping; 0 = off
    optimizer: str = "adamw"  # adamw | sgd (VL-BERT's VCR finetuning: SGD with momentum)
    momentum: float = 0.9  # sgd only
    schedule: str = "linear"  # linear: decay to 0 at engine.steps | step: x decay_factor at each of decay_steps
    # a negative milestone counts back from engine.steps (-40: the last 40 steps), so a cut before the end stays
    # before the end when a run's length is overridden
    decay_steps: list = field(default_factory=list)
    decay_factor: float = 0.1
    # learning-rate multipliers by parameter name: {substring: factor}, the first substring found in a
    # parameter's name wins, e.g. {fast_rcnn.: 0.1} keeps a warmed-up detector from being eroded while
    # the new visual layers learn at the full rate
    lr_multipliers: dict = field(default_factory=dict)


@dataclass
class EngineConfig:
    run_dir: str = "runs/pretrain"
    steps: int = 250_000  # optimizer steps
    zero_stage: int = 2  # DeepSpeed ZeRO stage 0/1/2/3
    gradient_accumulation_steps: int = 1
    # bf16 (DeepSpeed's mixed precision: bf16 weights, fp32 master copy) | bf16_autocast (fp32 weights, the forward
    # under torch.autocast, as a plain PyTorch AMP loop) | fp16 (dynamic loss scaling) | fp32 (CPU)
    precision: str = "bf16"
    log_every: int = 10  # scalars to TensorBoard and metrics.jsonl every N steps
    image_every: int = 500  # a drawn training sample every N steps (0 = never)
    checkpoint_every: int = 1000
    keep_checkpoints: int = 3  # complete checkpoints kept, newest first
    deepspeed_config: str | None = None  # a DeepSpeed JSON whose keys override the generated ones
    seed: int = 0
    progress: bool = True  # console progress bar on rank 0
    progress_label: str = "train"
    export: bool = True  # consolidated fp32 weights to <run_dir>/export at the end
    record_keys: bool = False  # append every sample key each rank trains on to <run_dir>/keys_rank<R>.txt
    eval_every: int = 0  # run the evaluator (e.g. the cross-modal diagnostic) every N steps; 0 = never
    # a collective waiting longer than this for a stuck rank ends the job with an error instead of a hang;
    # it must exceed the longest rank-0-only stretch (a final evaluation on a large split, an export)
    dist_timeout_s: float = 1800.0
    # A step whose loss or gradients are not finite is not applied (weights, optimizer state and so every
    # checkpoint stay finite) and is logged with its sample keys to <run_dir>/nonfinite.jsonl; more than this
    # many such steps in a run stop the job with an error (docs/RELIABILITY.md, non-finite policy)
    max_nonfinite_steps: int = 3
    # steps whose batches are drawn and dropped without a forward pass: resume past a known-bad batch
    # (--skip-batches 1200,1201 on the command line)
    skip_steps: list = field(default_factory=list)
    # CPU only: malloc keeps freed memory for reuse instead of page-faulting large blocks in again every step
    # (`keep_freed_memory`); the process keeps its peak resident size
    keep_freed_memory: bool = True


def add_run_arguments(parser, config_help: str, overrides_example: str) -> None:
    """The command line every engine entry point shares: --config, --resume, the launcher's --local_rank
    and key=value overrides of the config."""
    parser.add_argument("--config", help=config_help)
    parser.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the checkpoints and logs of a previous run in engine.run_dir")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.add_argument("--skip-batches", type=_step_list, default=[], metavar="STEP[,STEP...]",
                        help="drop the batches of these steps (e.g. those <run_dir>/nonfinite.jsonl names) and "
                             "go on: engine.skip_steps")
    parser.add_argument("overrides", nargs="*", help=f"key=value, e.g. {overrides_example}")


def _step_list(text: str) -> list[int]:
    try:
        steps = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of step numbers") from None
    if any(s < 1 for s in steps):
        raise argparse.ArgumentTypeError(f"'{text}': steps count from 1")
    return steps


def run_overrides(args) -> list[str]:
    """The key=value overrides of an entry point's command line, with its flags that stand for config keys."""
    extra = [f"engine.skip_steps={sorted(set(args.skip_batches))}"] if getattr(args, "skip_batches", None) else []
    return list(args.overrides) + extra


class RunDirInUse(ConfigError):
    """engine.run_dir holds another run, and neither --resume nor --overwrite was given."""


class NonFiniteSteps(FloatingPointError):
    """More steps than engine.max_nonfinite_steps had a non-finite loss or gradient."""


class NoRoomForCheckpoint(OSError):
    """The checkpoint directory's filesystem has less free space than the newest checkpoint took, on some rank;
    raised on every rank before any of them writes."""


class CheckpointNotWritten(RuntimeError):
    """Writing a checkpoint failed on this rank; the message says how much room there was."""


class FiniteGuard:
    """Skips an optimizer step whose gradients are not finite, for the one path where DeepSpeed applies it:
    ZeRO stage 0 with fp32 weights (`fp32`, `bf16_autocast`; its ZeRO 1-3 optimizers and its bf16/fp16 wrappers
    test the global gradient norm they compute for clipping and skip the step themselves). Installed as the torch
    optimizer's `step`.

    On that path it also clips (`max_norm` > 0; DeepSpeed's own clipping is then off, see `deepspeed_config`):
    the total norm it computes for the test is the one clipping needs, taken once with torch's multi-tensor
    kernels, where DeepSpeed's fp32 clipping loops over the parameters, and computes a second norm. `norm` keeps
    it (a device tensor) for the `grad_norm` metric, which DeepSpeed does not report on this path.

    A fused optimizer (CUDA) gets the flag as `found_inf`, the attribute torch's GradScaler uses: the fused
    kernels leave weights, moments and step count unchanged where it is set, so nothing waits on the device.
    The unfused ones (CPU, where there is no device to wait for) read the flag and skip the call; the
    `overflow` attribute it leaves tells DeepSpeed's engine the step was skipped (no LR scheduler step)."""

    def __init__(self, optimizer: torch.optim.Optimizer, max_norm: float = 0.0):
        self.optimizer, self.max_norm = optimizer, max_norm
        self.inner = optimizer.step
        self.fused = bool(optimizer.defaults.get("fused"))
        self.device_flag: torch.Tensor | None = None  # the fused path's last flag, read when the engine settles
        self.norm: torch.Tensor | None = None  # the last step's total gradient norm, before clipping

        def step(opt, *args, **kwargs):  # a method, as torch's LR schedulers expect to wrap one
            return self(*args, **kwargs)

        optimizer.step = types.MethodType(step, optimizer)

    def __call__(self, *args, **kwargs):
        opt = self.optimizer
        params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
        if not params:
            return self.inner(*args, **kwargs)
        self.norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        bad = ~torch.isfinite(self.norm)
        if self.max_norm > 0:  # a non-finite norm's step is skipped below, whatever this leaves in the grads
            torch.nn.utils.clip_grads_with_norm_(params, self.max_norm, self.norm)
        if self.fused:
            opt.grad_scale, opt.found_inf = None, bad.float()
            try:
                return self.inner(*args, **kwargs)
            finally:
                del opt.grad_scale, opt.found_inf
                self.device_flag = bad
        opt.overflow = bool(bad)
        if not opt.overflow:
            return self.inner(*args, **kwargs)


def entry_point(main) -> int:
    """Runs an entry point's main(): a configuration or usage error (ConfigError) is one line on rank 0 and
    exit code 2 on every rank, instead of a traceback per rank around the message (VLBERT_TRACEBACK=1 shows
    it); a run stopped by the non-finite policy (NonFiniteSteps, the same on every rank) likewise, exit code 3, and
    one stopped for want of room for its next checkpoint (NoRoomForCheckpoint, every rank) exit code 4.
    Any other failure once the process group is up: the traceback, then the process ends at once (exit code 1)
    rather than in the interpreter's teardown. On an H200 a rank that raised in an evaluation sat in that teardown
    for minutes (its data workers and NCCL process group still up) and the launcher waited with it; a rank that
    is gone lets the launcher stop the others and the job end."""
    try:
        return main()
    except (ConfigError, NonFiniteSteps, NoRoomForCheckpoint) as e:
        if os.environ.get("VLBERT_TRACEBACK"):
            raise
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {e}", file=sys.stderr, flush=True)
        code = 2 if isinstance(e, ConfigError) else 3 if isinstance(e, NonFiniteSteps) else 4
        if dist.is_initialized():
            # as below: the interpreter's teardown of a run stopped mid-training could end in std::terminate (exit
            # -6, "terminate called without an active exception", even after destroy_process_group) instead of
            # its code, in 1 of 2-4 runs of tests/pretrain/test_checkpoint_room.py on this machine
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    except Exception:
        if not dist.is_initialized():
            raise
        print(f"rank {dist.get_rank()} failed:", file=sys.stderr)
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a scheduler's cgroup or taskset, not the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@contextmanager
def every_core():
    """Work rank 0 does alone while the other ranks wait at a barrier (evaluations): it may use every core (the
    launcher gave each rank its share, e.g. OMP_NUM_THREADS=1 on 2 cores and 2 ranks)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, usable_cores()))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def seed_rank(seed: int, rank: int) -> None:
    """Every trainer's torch RNG: the seeding tree's ("torch global", rank) leaf. Ranks draw their own dropout
    masks (one seed for all would repeat them on every rank), and no run's rank shares another run's stream
    (seed + rank did: seed 1 rank 0 was seed 0 rank 1). Weights drawn before the engine starts differ by rank
    too: DeepSpeed broadcasts rank 0's when it starts."""
    torch.manual_seed(seed_for(seed, "torch global", rank))


def rank_threads(cores: int, local_ranks: int, omp_num_threads: str | None) -> int | None:
    """Intra-op threads for one CPU rank: its share of the cores its node's ranks run on, or None where the user set
    OMP_NUM_THREADS (torch has read it). The deepspeed launcher sets it only with --bind_cores_to_rank, so each of 2
    ranks on 2 cores ran 2 threads: 4 threads on 2 cores, the quick start's step 1.2x slower at ZeRO-1 and 3x at
    ZeRO-0 (docs/BENCHMARKS.md, session 89). torchrun sets 1 for the same reason."""
    if omp_num_threads:
        return None
    return max(1, cores // max(1, local_ranks))


def init_distributed(local_rank: int, timeout_s: float = 1800.0) -> tuple[int, int]:
    """Join the job's process group (NCCL on GPUs, gloo on CPU) and pick this rank's GPU; without a
    launcher, a world of one (the engine runs on DeepSpeed either way). Returns (rank, world size).
    timeout_s (engine.dist_timeout_s): a collective that waits longer for a stuck rank raises on the ranks
    waiting, which ends the job (the launcher then stops the rest) instead of hanging it."""

    # lazy: deepspeed picks its accelerator when imported; entry points set DS_ACCELERATOR first
    import deepspeed

    if "RANK" not in os.environ:
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(key, value)
        if "MASTER_PORT" not in os.environ:

            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    timeout = datetime.timedelta(seconds=timeout_s)
    # DeepSpeed builds its own groups (data parallel, ZeRO's reductions) with new_group(), which takes torch's
    # default timeout (30 min), not the world group's: set that default too. A module global of torch
    # (2.14); where it is missing, only the world group gets the timeout.

    for name in ("default_pg_timeout", "default_pg_nccl_timeout"):
        if isinstance(getattr(c10d, name, None), datetime.timedelta):
            setattr(c10d, name, timeout)
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo", timeout=timeout)
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    else:
        unlink_shm_buffer()
        # the deepspeed launcher's LOCAL_SIZE, torchrun's LOCAL_WORLD_SIZE: the ranks sharing this node's cores
        local = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or "1"
        threads = rank_threads(usable_cores(), int(local), os.environ.get("OMP_NUM_THREADS"))
        if threads is not None:
            torch.set_num_threads(threads)
    return dist.get_rank(), dist.get_world_size()


def shm_buffer_path(rank: int) -> Path:
    """The /dev/shm file of a rank's DeepSpeed CPU all-reduce workspace (its csrc/cpu/comm/shm.cpp names it by
    user, MASTER_ADDR, MASTER_PORT and global rank)."""
    return Path("/dev/shm") / (f"deepspeed_allreduce_buffer_{os.getuid()}_{os.environ.get('MASTER_ADDR', '')}_"
                               f"{os.environ.get('MASTER_PORT', '')}_{rank}")


def unlink_shm_buffer() -> None:
    """Remove this rank's DeepSpeed shm workspace name once every rank has mapped every workspace.

    DeepSpeed's CPU all-reduce (used when all ranks share a node) creates a 69 MB shared-memory file per rank and
    never unlinks it: every CPU run left them in /dev/shm, which is RAM, until a reboot (155 of them, 10.7 GB, had
    filled this machine's memory when a benchmark was OOM-killed, session 32). Each rank's initialize returns only
    after it has mapped every other rank's file, so after a barrier no one opens them by name again: unlinked now,
    the memory lives as long as the mappings and goes with the last process, a killed one's too."""
    # DeepSpeed's own test for the shm path (every rank on this node), the same on every rank, so that all of them
    # or none reach the barrier; a file of this name left by an earlier run must not decide it
    if int(os.environ.get("LOCAL_SIZE", "0")) != dist.get_world_size():
        return
    dist.barrier()
    shm_buffer_path(dist.get_rank()).unlink(missing_ok=True)


# A task's metric "X" may come with "X" + METRIC_WEIGHT, its step's weight (e.g. how many regions the step's mean is
# over): the log then shows the weighted mean over the window's steps and ranks, sum(X * w) / sum(w), instead of the
# plain mean over steps, which a step with nothing to measure (w = 0, X = 0) would pull towards 0. The weight itself
# is not logged; a window whose weights are all 0 logs no X.
METRIC_WEIGHT = "#weight"


def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def param_groups(module: torch.nn.Module, weight_decay: float, lr: float | None = None,
                 lr_multipliers: dict | None = None) -> list[dict]:
    """Decayed and undecayed parameters (biases, LayerNorm gains), split further by LR multiplier."""
    groups: dict[tuple[bool, float], list] = {}
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        decays = not (p.ndim < 2 or "LayerNorm" in name or "_ln_" in name)
        factor = next((float(f) for key, f in (lr_multipliers or {}).items() if key in name), 1.0)
        groups.setdefault((decays, factor), []).append(p)
    out = []
    for (decays, factor), params in sorted(groups.items(), key=lambda kv: (kv[0][1] != 1.0, not kv[0][0], kv[0][1])):
        group = {"params": params, "weight_decay": weight_decay if decays else 0.0}
        if lr is not None and factor != 1.0:
            group["lr"] = lr * factor
        out.append(group)
    return out


def linear_warmup_decay(warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))
    return factor


def warmup_step_decay(warmup: int, milestones: list[int], gamma: float):
    def factor(step: int) -> float:
        scale = gamma ** sum(step >= m for m in milestones)
        return scale * min(1.0, step / max(1, warmup))
    return factor


def build_optimizer(module: torch.nn.Module, optim: OptimConfig, total_steps: int):
    """The optimizer and the LR factor per step, from the config (AdamW: torch's fused kernels on CUDA, else
    the same arithmetic over cache-sized blocks, `train.optim.BlockedAdamW`; or SGD)."""
    groups = param_groups(module, optim.weight_decay, optim.lr, optim.lr_multipliers)
    if optim.optimizer == "adamw" and torch.cuda.is_available():
        optimizer = torch.optim.AdamW(groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps, fused=True)
    elif optim.optimizer == "adamw":
        optimizer = BlockedAdamW(groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps)
    elif optim.optimizer == "sgd":
        optimizer = torch.optim.SGD(groups, lr=optim.lr, momentum=optim.momentum)
    else:
        raise ValueError(f"optim.optimizer: '{optim.optimizer}' is not adamw or sgd")
    if optim.schedule == "linear":
        factor = linear_warmup_decay(optim.warmup_steps, total_steps)
    elif optim.schedule == "step":
        # a run shorter than the count back (a 1-step export, a test's few steps) is all of it in the last steps
        milestones = [int(m) if int(m) >= 0 else max(0, total_steps + int(m)) for m in optim.decay_steps]
        factor = warmup_step_decay(optim.warmup_steps, milestones, optim.decay_factor)
    else:
        raise ValueError(f"optim.schedule: '{optim.schedule}' is not linear or step")
    return optimizer, factor


def bucket_elements(num_params: int) -> int:
    """ZeRO communication bucket size for a model: an eighth of it, between 1M and DeepSpeed's default 500M
    elements. DeepSpeed's default alone makes every ZeRO-3 rank hold a 500M-element bucket (1 GB in bf16),
    several times the model states of a base-size model (docs/BENCHMARKS.md, ZeRO memory)."""
    return int(min(500_000_000, max(1 << 20, num_params // 8))) // 64 * 64  # NCCL alignment


# the precisions whose weights, gradients and optimizer stay fp32 (DeepSpeed runs no mixed-precision optimizer)
FP32_WEIGHTS = ("fp32", "bf16_autocast")


def run_stage(cfg: EngineConfig, world: int) -> int:
    """The ZeRO stage a run executes: ZeRO 1 and 2 on one rank with fp32 weights run as stage 0. One rank has
    nothing to partition, and the ZeRO optimizer still copies every gradient into its flat buffers and clips
    through them: at the base shape one CPU rank ran at 0.84-0.87x a plain PyTorch loop under ZeRO 2 and
    0.95-1.04x under ZeRO 0 (docs/BENCHMARKS.md). Kept as configured: stage 3 and any optimizer or parameter
    offload (ZeRO-Offload on one GPU is what they are for), and DeepSpeed's bf16/fp16 optimizers. Checkpoints
    record the stage they were written at; a resume at another stage converts through the universal form."""
    if world != 1 or cfg.zero_stage not in (1, 2) or cfg.precision not in FP32_WEIGHTS:
        return cfg.zero_stage
    if cfg.deepspeed_config:
        zero = json.loads(Path(cfg.deepspeed_config).read_text()).get("zero_optimization", {})
        if any(str((zero.get(key) or {}).get("device", "none")) != "none"
               for key in ("offload_optimizer", "offload_param")):
            return cfg.zero_stage
    return 0


def guarded(cfg: EngineConfig) -> bool:
    """Whether the engine's own FiniteGuard skips and clips (ZeRO 0 with fp32 weights), not DeepSpeed's optimizer."""
    return cfg.zero_stage == 0 and cfg.precision in FP32_WEIGHTS


def deepspeed_config(cfg: EngineConfig, optim: OptimConfig, micro_batch_size: int,
                     num_params: int | None = None) -> dict:
    zero: dict = {"stage": cfg.zero_stage}
    if num_params and cfg.zero_stage > 0:
        bucket = bucket_elements(num_params)
        zero.update(reduce_bucket_size=bucket, allgather_bucket_size=bucket)
        if cfg.zero_stage == 3:
            zero.update(stage3_prefetch_bucket_size=int(0.9 * bucket), stage3_max_live_parameters=2 * bucket,
                        stage3_max_reuse_distance=2 * bucket)
    ds = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        # ZeRO 0 in fp32: FiniteGuard clips (one multi-tensor norm, reported); elsewhere DeepSpeed does
        "gradient_clipping": 0.0 if guarded(cfg) else optim.grad_clip,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # torch AdamW (fused on CUDA) is ours, not DeepSpeed's
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if cfg.precision == "bf16":
        ds["bf16"] = {"enabled": True}
    elif cfg.precision == "fp16":
        ds["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    elif cfg.precision == "bf16_autocast":
        # DeepSpeed wraps the forward in torch.autocast; at ZeRO 1-3 it reduces the gradients of linear and conv
        # weights in bf16. Measured on one GPU, its bf16 mode doubles the kernel launches of a step and hooks every
        # gradient into fp32 buffers, at ZeRO 0 as at 2 (docs/BENCHMARKS.md, "Where the Engine's GPU time goes")
        ds["torch_autocast"] = {"enabled": True, "dtype": "bfloat16"}
    elif cfg.precision != "fp32":
        raise ValueError(f"engine.precision: '{cfg.precision}' is not bf16, bf16_autocast, fp16 or fp32")
    if cfg.deepspeed_config:
        # merged key by key: a user's `zero_optimization: {overlap_comm: true}` keeps the stage and the bucket
        # sizes above (a top-level merge replaced the whole block, and DeepSpeed fell back to its 500M buckets)
        overrides = json.loads(Path(cfg.deepspeed_config).read_text())
        ds = deep_merge(ds, overrides)
    return ds


def initialize_deepspeed(module: torch.nn.Module, optimizer: torch.optim.Optimizer, factor, cfg: EngineConfig,
                         optim: OptimConfig, micro_batch_size: int):
    """DeepSpeed's engine over `module` as the Engine runs it (and `bench.pretrain_step` measures it):
    (engine, optimizer, LR scheduler, FiniteGuard or None), the schedule `factor` of the step."""
    # lazy: deepspeed picks its accelerator when imported; entry points set DS_ACCELERATOR first
    import deepspeed

    guard = FiniteGuard(optimizer, optim.grad_clip) if guarded(cfg) else None
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=module, optimizer=optimizer,
        config=deepspeed_config(cfg, optim, micro_batch_size, sum(p.numel() for p in module.parameters())),
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, factor))
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world == 1 and guarded(cfg):
        # one rank has nothing to average with; DeepSpeed's all-reduce would still pass every gradient through
        # the process group (ZeRO and the mixed-precision optimizers reduce in their own hooks: left as they are)
        engine.enable_backward_allreduce = False
    return engine, optimizer, scheduler, guard


def _rng_state() -> dict:
    np_state = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(tuple(tuple(x) if isinstance(x, list) else x for x in state["python"]))
    torch.set_rng_state(state["torch"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep the memory the process frees, for the CPU path: every allocation from the heap
    (none mmap'd) and nothing handed back to the OS below 2 GB of free top. Why: glibc serves each block over
    32 MB with a fresh mmap and unmaps it on free, so a tensor of that size allocated every step (activations,
    ZeRO's flattened gradient partition) page-faults all its memory in again every step. Measured at the base
    shape (docs/BENCHMARKS.md): the plain loop 4.15 -> 3.39 s/step, ZeRO-2 6.12 -> 4.04 s/step, for 10-14% more
    peak resident memory, which the process then keeps. False where the C library has no mallopt (not glibc):
    nothing changed."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))


def to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def complete_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Checkpoint directories with a COMPLETE marker, oldest first."""
    if not ckpt_dir.exists():
        return []
    return sorted(p for p in ckpt_dir.glob("step_*") if (p / "COMPLETE").exists())


def checkpoint_bytes(path: Path) -> int:
    """Bytes a checkpoint's own files take here (on a node-local disk, this node's share), without the universal
    form a resume on another layout adds to it (the next checkpoint has none)."""
    return sum(f.stat().st_size for f in path.rglob("*")
               if f.is_file() and f.relative_to(path).parts[0] != "universal")


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem `path` is (or will be) on."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def megabytes(n: float) -> str:
    return f"{n / 2**20:,.0f} MB"


STAGE0_MODEL_FILE = "mp_rank_00_model_states.pt"  # DeepSpeed's model file; at stage 0 it holds the optimizer too


def write_universal(path: Path, out: Path, module: torch.nn.Module, optim: OptimConfig) -> None:
    """DeepSpeed's universal checkpoint layout from a stage-0 checkpoint (ds_to_universal reads only ZeRO 1-3
    partitions): out/zero/<parameter>/{fp32,<state>}.pt as `{"param": tensor}`, step.pt as saved,
    out/zero/optimizer_state.pt with what the stage 1-2 and stage 3 loaders read, and the model file without
    its optimizer. torch's optimizer state numbers parameters in param-group order: the groups are rebuilt
    from `module` and the same optimizer config, and every state's shape is checked against its parameter."""
    # lazy: deepspeed picks its accelerator when imported; entry points set DS_ACCELERATOR first
    import deepspeed

    model = torch.load(path / STAGE0_MODEL_FILE, map_location="cpu", weights_only=True)
    saved = model.pop("optimizer")
    if saved is None:
        raise ValueError(f"{path / STAGE0_MODEL_FILE} holds no optimizer state: not a stage-0 checkpoint")
    names = {id(p): name for name, p in module.named_parameters()}
    order = [names[id(p)] for group in param_groups(module, optim.weight_decay, optim.lr, optim.lr_multipliers)
             for p in group["params"]]
    indices = [i for group in saved["param_groups"] for i in group["params"]]
    if len(indices) != len(order):
        raise ValueError(f"{path}: its optimizer holds {len(indices)} parameters, this model trains {len(order)}")
    zero = out / "zero"
    # a parameter that never had a gradient has no torch state; in ZeRO's flat groups it has zero moments and the
    # group's step count, and DeepSpeed's loader wants a step for every parameter
    some = next(iter(saved["state"].values()), {})
    for index, name in zip(indices, order):
        weight = model["module"][name]
        (zero / name).mkdir(parents=True, exist_ok=True)
        torch.save({"param": weight.float()}, zero / name / "fp32.pt")
        state = saved["state"].get(index) or {k: v if k == "step" else torch.zeros_like(weight, dtype=v.dtype)
                                              for k, v in some.items() if v is not None}
        for key, value in state.items():
            if value is None:
                continue
            if key == "step":
                torch.save(value, zero / name / "step.pt")
                continue
            if value.shape != weight.shape:
                raise ValueError(f"{path}: optimizer state '{key}' of parameter {index} has shape "
                                 f"{tuple(value.shape)}, {name} has {tuple(weight.shape)}: another model or grouping")
            torch.save({"param": value}, zero / name / f"{key}.pt")
    groups = [{k: v for k, v in g.items() if k != "params"} for g in saved["param_groups"]]
    torch.save({"ds_version": deepspeed.__version__, "clip_grad": optim.grad_clip, "param_groups": groups,
                "optimizer_state_dict": {"state": {0: {"step": some.get("step", 0)}}, "param_groups": groups}},
               zero / "optimizer_state.pt")
    torch.save({**model, "optimizer": None}, out / STAGE0_MODEL_FILE)


def load_universal_whole(folder: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """A universal checkpoint's fp32 masters and optimizer states into a stage-0 module and torch optimizer
    (DeepSpeed's universal loader is its ZeRO optimizers'), and the param groups' saved hyperparameters."""
    # lazy: deepspeed picks its accelerator when imported; entry points set DS_ACCELERATOR first
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    names = {id(p): name for name, p in module.named_parameters()}
    zero = folder / "zero"
    # ds_to_universal's global state pickles DeepSpeed's stage enum and loss scaler beside the param groups
    with torch.serialization.safe_globals([ZeroStageEnum, LossScaler, DynamicLossScaler]):
        saved = torch.load(zero / "optimizer_state.pt", map_location="cpu", weights_only=True)
    for group, saved_group in zip(optimizer.param_groups, saved["param_groups"]):
        for p in group["params"]:
            files = {f.stem: f for f in (zero / names[id(p)]).glob("*.pt")}
            if "fp32" not in files:
                raise FileNotFoundError(f"{zero / names[id(p)]}: no fp32.pt for a trained parameter")
            for key, file in files.items():
                value = torch.load(file, map_location="cpu", weights_only=True)
                if key == "fp32":
                    p.data.copy_(value["param"].view_as(p))
                elif key == "step":
                    optimizer.state[p]["step"] = value if torch.is_tensor(value) else torch.tensor(float(value))
                else:
                    optimizer.state[p][key] = value["param"].view_as(p).to(p.dtype).clone()
        group.update({k: v for k, v in saved_group.items() if k != "params"})


class Engine:
    def __init__(self, module: torch.nn.Module, loader, cfg: EngineConfig, optim: OptimConfig, *,
                 micro_batch_size: int, count_batch=None, draw_batch=None, run_info: dict | None = None,
                 evaluate=None, evaluated_at_end: bool = False):
        self.cfg, self.optim_cfg, self.loader = cfg, optim, loader
        self.count_batch = count_batch  # batch -> {"samples": n, "tokens": n, "images": n} (CPU tensors)
        self.draw_batch = draw_batch  # batch -> uint8 [3, H, W] image for TensorBoard
        # (module, device) -> {name: float}: on rank 0 alone below ZeRO-3, on every rank at ZeRO-3 (its forwards are
        # collective); `_run_evaluation`
        self.evaluate = evaluate
        self.evaluated_at_end = evaluated_at_end  # the caller measures the last step's model: no evaluation there
        self.run_dir = Path(cfg.run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.configured_stage = cfg.zero_stage  # what a checkpoint marker without a stage was written at
        if (stage := run_stage(cfg, self.world)) != cfg.zero_stage:
            cfg = self.cfg = replace(cfg, zero_stage=stage)
            if self.rank == 0:
                print(f"engine.zero_stage {self.configured_stage} on one rank runs as stage 0 (nothing to "
                      "partition; see train.engine.run_stage)", flush=True)
        if not torch.cuda.is_available() and cfg.keep_freed_memory:
            keep_freed_memory()  # before DeepSpeed allocates its buffers
        optimizer, factor = build_optimizer(module, optim, cfg.steps)
        self.engine, self.optimizer, self.scheduler, self._guard = initialize_deepspeed(
            module, optimizer, factor, cfg, optim, micro_batch_size)
        self.device = self.engine.device
        # The per-step stop vote travels over a CPU (gloo) group: on NCCL a GPU tensor + .item() every
        # step would sync the device in the hot loop.
        self._vote_group = None
        if dist.is_initialized() and dist.get_backend() == "nccl":

            self._vote_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=cfg.dist_timeout_s))
        self.step = 0
        self.stop_requested = False
        self._pending_rng = None
        self.run_info = run_info or {}
        self.run_id: str | None = None  # names this run in run.json, metrics, eval and checkpoint markers
        self.writer = None  # rank 0, opened by train() once the run directory is known to be this run's
        self._pending_flags: list = []  # (step, flag: bool or device tensor, sample keys) since the last settle
        self.nonfinite_steps = 0

    # -- the run directory ----------------------------------------------------------------------------

    OWN_FILES = ("checkpoints", "tb", "metrics.jsonl", "eval.jsonl", "run.json", "nonfinite.jsonl")

    def _claim_run_dir(self, resume: bool, overwrite: bool) -> None:
        """A run directory holding another run's checkpoints or metrics is continued (--resume), replaced
        (--overwrite), or refused: a new run writing into it would overwrite and rotate away the other's
        checkpoints, interleave their metrics, and a later --resume would silently continue the old run."""
        found = complete_checkpoints(self.ckpt_dir)
        used = bool(found) or (self.run_dir / "metrics.jsonl").exists()
        if used and not resume:
            if not overwrite:
                what = f"checkpoints up to {found[-1].name}" if found else "metrics.jsonl"
                raise RunDirInUse(f"engine.run_dir: {self.run_dir} holds another run ({what}): pass --resume to "
                                  "continue it, --overwrite to replace it, or choose another engine.run_dir")
            self._barrier()  # every rank has looked before rank 0 deletes
            if self.rank == 0:
                for name in self.OWN_FILES:
                    path = self.run_dir / name
                    if path.is_dir():
                        shutil.rmtree(path)
                    elif path.exists():
                        path.unlink()
                for keys in self.run_dir.glob("keys_rank*.txt"):
                    keys.unlink()
                print(f"--overwrite: removed the previous run's checkpoints and logs from {self.run_dir}", flush=True)
            self._barrier()

    def _open_run(self) -> None:
        if self.run_id is None:

            self.run_id = uuid.uuid4().hex[:12]
        if _is_rank0() and self.writer is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.writer = SummaryWriter(str(self.run_dir / "tb"))
            path = self.run_dir / "run.json"
            # a resumed run keeps the environments of its earlier starts: a resume on another machine or version
            # is then visible beside the curve it may have bent
            earlier = []
            if path.exists():
                try:
                    before = json.loads(path.read_text())
                except (OSError, ValueError):
                    before = {}
                if before.get("run_id") == self.run_id:
                    earlier = before.get("environments", [])
            started = {"step": self.step, "started": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"), "world_size": self.world, **environment()}
            path.write_text(json.dumps({"run_id": self.run_id, **self.run_info, "environments": [*earlier, started]},
                                       indent=1, default=str))

    # -- checkpoints ----------------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        tag = f"step_{self.step:07d}"
        path = self.ckpt_dir / tag
        if self.rank == 0 and path.exists():
            shutil.rmtree(path)  # an incomplete leftover from a killed run
        self._barrier()
        need, free = self._room_for_checkpoint(tag)
        try:
            self.engine.save_checkpoint(str(self.ckpt_dir), tag=tag, client_state={"step": self.step})
            torch.save({"loader": self.loader.state_dict(), "rng": _rng_state(), "step": self.step},
                       path / f"rank_{self.rank}.pt")
        except Exception as e:
            # torch.save into a full disk says "unexpected pos 24090560 vs 24090448" (CI, session 46): say where
            # the room went, and what is still usable
            left = free_bytes(self.ckpt_dir)
            found = complete_checkpoints(self.ckpt_dir)
            usable = f"{found[-1].name} is intact (--resume continues from it)" if found else "no earlier checkpoint"
            raise CheckpointNotWritten(
                f"checkpoint {path} was not written on rank {self.rank} ({type(e).__name__}: {e}); its filesystem "
                f"had {megabytes(free)} free before it and has {megabytes(left)} now"
                + (f", the newest checkpoint took {megabytes(need)}" if need else "") + f"; {usable}") from e
        self._barrier()
        if self.rank == 0:
            (path / "COMPLETE").write_text(json.dumps({"step": self.step, "world_size": self.world,
                                                       "zero_stage": self.cfg.zero_stage, "run_id": self.run_id}))
            for old in complete_checkpoints(self.ckpt_dir)[: -self.cfg.keep_checkpoints]:
                shutil.rmtree(old, ignore_errors=True)
        self._barrier()
        return path

    def _room_for_checkpoint(self, tag: str) -> tuple[int, int]:
        """(bytes the newest complete checkpoint takes here, bytes free here). A checkpoint that does not fit fails
        deep inside torch.save after the run has spent its last steps on it, on one rank while the others wait in
        a barrier: when one rank's disk lacks the room the newest checkpoint took, every rank stops here first
        (one all-reduce, per checkpoint). The first checkpoint has nothing to go by and is only reported if it
        fails (`CheckpointNotWritten`)."""
        found = complete_checkpoints(self.ckpt_dir)
        need = checkpoint_bytes(found[-1]) if found else 0
        free = free_bytes(self.ckpt_dir)
        short = torch.tensor([1.0 if need > free else 0.0])
        if dist.is_initialized():
            dist.all_reduce(short, op=dist.ReduceOp.MAX, group=self._vote_group)
        if short.item():
            where = (f"{self.ckpt_dir} has {megabytes(free)} free" if need > free
                     else "another rank's filesystem has less free than the newest checkpoint took there")
            raise NoRoomForCheckpoint(
                f"engine.run_dir: no room for checkpoint {tag}: {where} (the newest, {found[-1].name}, took "
                f"{megabytes(need)} here); nothing was written: free space and --resume from {found[-1].name}")
        return need, free

    def resume(self) -> bool:
        found = complete_checkpoints(self.ckpt_dir)
        if not found:
            return False
        path = found[-1]
        marker = json.loads((path / "COMPLETE").read_text())
        old_world = marker["world_size"]
        if old_world != self.world and not hasattr(self.loader, "load_elastic"):
            raise ValueError(f"{path} was written by {old_world} ranks, this run has {self.world}: this trainer's "
                             "data loader resumes only on the same number of ranks")
        # markers before the stage was recorded were written at the configured stage
        client = self._load_states(path, old_world, marker.get("zero_stage", self.configured_stage))
        if old_world == self.world:
            own = torch.load(path / f"rank_{self.rank}.pt", map_location="cpu", weights_only=True)
            self.loader.load_state_dict(own["loader"])
            self._pending_rng = own["rng"]  # set once the loader's iterator exists (creating it draws a seed)
        else:
            # the reader re-deals what the old ranks had not delivered (`StreamLoader.load_elastic`). Not exact:
            # the batches differ from the old world's, and a rank without an old rank of its number keeps the
            # random state its seed gave it
            states = [torch.load(path / f"rank_{r}.pt", map_location="cpu", weights_only=True)
                      for r in range(old_world)]
            self.loader.load_elastic([s["loader"] for s in states])
            if self.rank < old_world:
                self._pending_rng = states[self.rank]["rng"]
        self.step = client["step"]
        self.run_id = marker.get("run_id") or self.run_id  # markers before run ids had none
        if _is_rank0():
            how = "" if old_world == self.world else f" (written by {old_world} ranks, resumed on {self.world})"
            print(f"resumed from {path} at step {self.step}{how}", flush=True)
        return True

    def _load_states(self, path: Path, old_world: int, old_stage: int) -> dict:
        """Model, optimizer and scheduler from a checkpoint; its client state. DeepSpeed loads its own files where
        the layout is the same: the same stage on the same world, or stage 0 (whole states) on any. Otherwise
        through the universal form, converted once by rank 0 into <checkpoint>/universal/: DeepSpeed's
        ds_to_universal from ZeRO 1-3, `write_universal` from stage 0; ZeRO 1-3 then load it with DeepSpeed's
        universal loader and stage 0 with `load_universal_whole`."""
        stage = self.cfg.zero_stage
        if old_stage == stage and (old_world == self.world or stage == 0):
            return self.engine.load_checkpoint(str(self.ckpt_dir), tag=path.name)[1]
        universal = path / "universal"
        if self.rank == 0 and not (universal / "COMPLETE").exists():
            shutil.rmtree(universal, ignore_errors=True)  # a conversion killed half-way
            print(f"converting {path} (ZeRO {old_stage}, {old_world} ranks) to a universal checkpoint for ZeRO "
                  f"{stage} on {self.world}", flush=True)
            if old_stage == 0:
                write_universal(path, universal / path.name, self.engine.module, self.optim_cfg)
            else:
                self._convert_to_universal(path, universal)
            (universal / "COMPLETE").write_text("")
        self._barrier()
        if stage == 0:
            # the module, scheduler and client state from the checkpoint's own model file (ZeRO 1 and 2 keep
            # the whole module there), the fp32 masters and moments from the universal files
            _, client = self.engine.load_checkpoint(str(self.ckpt_dir), tag=path.name, load_optimizer_states=False)
            load_universal_whole(universal / path.name, self.engine.module, self.optimizer)
            return client
        # DeepSpeed reads this flag at load time only; a run resuming on its own layout never sets it
        self.engine._config.load_universal_checkpoint = True
        try:
            _, client = self.engine.load_checkpoint(str(universal), tag=path.name)
        finally:
            self.engine._config.load_universal_checkpoint = False
        return client

    @staticmethod
    def _convert_to_universal(path: Path, universal: Path) -> None:
        """DeepSpeed's ds_to_universal on one checkpoint (our client state has no Megatron-style
        universal_checkpoint_info: --inject_missing_state supplies it)."""
        cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(path),
               "--output_folder", str(universal / path.name), "--inject_missing_state",
               "--num_extract_workers", "1", "--num_merge_workers", "1"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"converting {path} to a universal checkpoint failed:\n{done.stdout[-2000:]}"
                               f"{done.stderr[-2000:]}")

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    # -- the loop -------------------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """Trained to engine.steps. False only after a stop signal ended train() early (an error raises instead); a
        signal during the last step leaves the run finished."""
        return self.step >= self.cfg.steps

    def _on_signal(self, signum, frame) -> None:
        self.stop_requested = True

    def _stop_agreed(self) -> bool:
        flag = torch.tensor([1.0 if self.stop_requested else 0.0])
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._vote_group)
        return bool(flag.item())

    def _log(self, sums: dict[str, torch.Tensor], count: int, timing: dict[str, float], counts: dict[str, float]):
        names = sorted(sums)
        # weighted metrics and their weights stay sums: their ratio, taken after the reduction, is the weighted mean
        weighted = [n for n in names if n + METRIC_WEIGHT in sums]
        summed = set(weighted) | {n + METRIC_WEIGHT for n in weighted}
        values = (torch.stack([sums[n].float() if n in summed else sums[n].float() / count for n in names]) if names
                  else torch.zeros(0, device=self.device))  # a window of dropped steps only
        # bad records skipped so far (the same keys on every rank), in the same reduction: scaled by the world
        # size, their mean over ranks is their sum
        skip_counts = getattr(self.loader, "skip_counts", None)
        skips = skip_counts() if skip_counts is not None else {}
        skip_names = sorted(skips)
        values = torch.cat([values, torch.tensor([skips[k] * self.world for k in skip_names],
                                                 dtype=values.dtype, device=values.device)])
        if dist.is_initialized():  # mean over ranks
            values = values.to(self.device)
            dist.all_reduce(values)
            values = values / self.world
        scalars = dict(zip(names + [f"data/skipped/{k}" for k in skip_names],
                           values.cpu().tolist()))  # one host sync, every log_every steps
        for n in weighted:
            weight, total = scalars.pop(n + METRIC_WEIGHT), scalars.pop(n)
            if weight > 0:
                scalars[n] = total / weight
        elapsed = timing["step"]
        scalars.update({
            "lr": self.scheduler.get_last_lr()[0],
            "throughput/samples_per_s": counts["samples"] * self.world / elapsed,
            "throughput/tokens_per_s": counts["tokens"] * self.world / elapsed,
            "throughput/images_per_s": counts["images"] * self.world / elapsed,
            "data_wait_fraction": timing["wait"] / elapsed,
        })
        if self.nonfinite_steps:  # settled just before this log line
            scalars["nonfinite/skipped_steps"] = float(self.nonfinite_steps)
        if counts.get("positions"):
            scalars["padding_fraction"] = 1.0 - counts["tokens"] / counts["positions"]
        grad_norm = self.engine.get_global_grad_norm()
        if grad_norm is None and self._guard is not None:
            grad_norm = self._guard.norm
        if grad_norm is not None:
            scalars["grad_norm"] = float(grad_norm)
        scale = getattr(self.optimizer, "cur_scale", None) or getattr(self.optimizer, "loss_scale", None)
        scalars["loss_scale"] = float(scale) if isinstance(scale, (int, float)) else 1.0
        if torch.cuda.is_available():
            scalars["memory/peak_bytes"] = torch.cuda.max_memory_allocated()
        else:
            scalars["memory/peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.write_scalars(scalars, "metrics.jsonl")
        return scalars

    def write_scalars(self, scalars: dict[str, float], jsonl: str) -> None:
        """Rank 0: to TensorBoard and one JSON line of <run_dir>/<jsonl>."""
        if self.writer is None:
            return
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, self.step)
        with open(self.run_dir / jsonl, "a") as f:
            f.write(json.dumps({"step": self.step, "run_id": self.run_id, **scalars}) + "\n")

    def train(self, resume: bool = False, overwrite: bool = False) -> dict:
        cfg = self.cfg
        self._claim_run_dir(resume, overwrite)
        if resume:
            self.resume()
        self._open_run()
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        bar = None
        if _is_rank0() and cfg.progress:

            bar = tqdm(total=cfg.steps, initial=self.step, desc=cfg.progress_label, unit="step", dynamic_ncols=True)
        batches = iter(self.loader)
        if self._pending_rng is not None:
            _set_rng_state(self._pending_rng)
            self._pending_rng = None
        sums: dict[str, torch.Tensor] = {}
        window = {"wait": 0.0, "step": 0.0}
        counts = {"samples": 0.0, "tokens": 0.0, "images": 0.0}
        n_window, last = 0, {}
        skip_steps = {int(s) for s in cfg.skip_steps}
        fp16 = cfg.precision == "fp16"
        self.engine.train()
        try:
            while self.step < cfg.steps:
                start = time.perf_counter()
                if self.step + 1 in skip_steps:
                    self._drop_step(batches)
                    window["step"] += time.perf_counter() - start
                else:
                    step_sums: dict[str, torch.Tensor] = {}
                    loss_bad = None
                    keys: list[str] = []
                    skipped_before = self.engine.skipped_steps
                    for _ in range(cfg.gradient_accumulation_steps):
                        t0 = time.perf_counter()
                        batch = next(batches)
                        window["wait"] += time.perf_counter() - t0
                        batch_keys = self._batch_keys(batch)
                        keys += batch_keys
                        if cfg.record_keys:
                            self._record_keys(batch_keys)
                        if self.count_batch is not None:
                            for k, v in self.count_batch(batch).items():
                                counts[k] = counts.get(k, 0.0) + v
                        if self.writer is not None and self.draw_batch and cfg.image_every and \
                                (self.step + 1) % cfg.image_every == 0:
                            self.writer.add_image("train/sample", self.draw_batch(batch), self.step + 1)
                        loss, metrics = self.engine(to_device(batch, self.device))
                        self.engine.backward(loss)
                        self.engine.step()
                        bad = ~torch.isfinite(loss.detach())  # on the device: read when the engine settles
                        loss_bad = bad if loss_bad is None else loss_bad | bad
                        for k, v in metrics.items():
                            w = metrics.get(k + METRIC_WEIGHT)
                            step_sums[k] = step_sums.get(k, 0) + (v if w is None else v * w)
                    self.step += 1
                    window["step"] += time.perf_counter() - start
                    # a skip by DeepSpeed (or FiniteGuard's on the host) is a host fact already; under fp16 its skips
                    # are the loss scaler's search, not a fault
                    skipped = not fp16 and self.engine.skipped_steps > skipped_before
                    flag = loss_bad | skipped
                    if self._guard is not None and self._guard.device_flag is not None:
                        flag = flag | self._guard.device_flag
                        self._guard.device_flag = None  # this step's, read once
                    self._pending_flags.append((self.step, flag, keys))
                    # a skipped step's metrics (NaN) stay out of the window's means
                    for k, v in step_sums.items():
                        sums[k] = sums.get(k, 0) + torch.where(flag, torch.zeros_like(v), v)
                    n_window = n_window + (~flag).to(torch.float32) * cfg.gradient_accumulation_steps
                if self.step % cfg.log_every == 0 or self.step == cfg.steps:
                    self._settle_nonfinite()
                    last = self._log(sums, n_window, window, counts)
                    if bar is not None and "loss/total" in last:
                        bar.set_postfix(loss=f"{last['loss/total']:.3f}",
                                        samples_s=f"{last['throughput/samples_per_s']:.1f}")
                    sums, n_window = {}, 0
                    window = {"wait": 0.0, "step": 0.0}
                    counts = {k: 0.0 for k in counts}
                if self.evaluate is not None and cfg.eval_every and self.step % cfg.eval_every == 0 and not (
                        self.evaluated_at_end and self.step == cfg.steps):
                    self._run_evaluation()
                if bar is not None:
                    bar.update(1)
                stop = self._stop_agreed()
                if stop or self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps:
                    self._settle_nonfinite()  # the limit is enforced before a checkpoint names this step
                    self.save_checkpoint()
                if stop:
                    if _is_rank0():
                        print(f"\nstopped by signal after step {self.step}; checkpoint saved", flush=True)
                    break
        finally:
            # an error in the step leaves this frame (and so the loader's generator) referenced by its traceback:
            # close it here, so the loader stops its workers before the error ends the process
            # (shards.reader.worker_batches)
            close = getattr(batches, "close", None)
            if close is not None:
                close()
            for s, h in previous.items():
                signal.signal(s, h)
            if bar is not None:
                bar.close()
            if self.writer is not None:
                self.writer.flush()
        return last

    def _drop_step(self, batches) -> None:
        """engine.skip_steps: draw the step's batches (the stream stays where an applied step leaves it) and
        apply nothing; like a step DeepSpeed skips, the LR schedule stays where it was."""
        keys = []
        for _ in range(self.cfg.gradient_accumulation_steps):
            keys += self._batch_keys(next(batches))
        self.step += 1
        if _is_rank0():
            print(f"\nstep {self.step}: batch dropped (engine.skip_steps)", flush=True)
        self._append_nonfinite({"step": self.step, "rank": self.rank, "dropped": True, "keys": keys})

    def _settle_nonfinite(self) -> None:
        """Reads the flags of the steps since the last settle (one host read, at a log step or a checkpoint,
        never inside a step), logs the bad ones with their sample keys and enforces engine.max_nonfinite_steps.
        Every rank holds the same flags: a non-finite gradient on one rank is non-finite after the all-reduce on
        all of them, and DeepSpeed's skip decision is collective."""
        if not self._pending_flags:
            return
        flags = torch.stack([torch.as_tensor(f, device=self.device) for _, f, _ in self._pending_flags])
        bad_steps = []
        for (step, _, keys), bad in zip(self._pending_flags, flags.cpu().tolist()):
            if bad:
                bad_steps.append(step)
                self._append_nonfinite({"step": step, "rank": self.rank, "keys": keys})
        self._pending_flags = []
        if not bad_steps:
            return
        self.nonfinite_steps += len(bad_steps)
        if _is_rank0():
            print(f"\nnon-finite loss or gradients at step(s) {bad_steps}: not applied "
                  f"({self.nonfinite_steps} of at most {self.cfg.max_nonfinite_steps} in this run; sample keys "
                  f"in {self.run_dir / 'nonfinite.jsonl'})", flush=True)
        if self.nonfinite_steps > self.cfg.max_nonfinite_steps:
            done = complete_checkpoints(self.ckpt_dir)
            raise NonFiniteSteps(
                f"non-finite loss or gradients at {self.nonfinite_steps} steps, more than "
                f"engine.max_nonfinite_steps={self.cfg.max_nonfinite_steps} (last at step {bad_steps[-1]}; steps "
                f"and sample keys in {self.run_dir / 'nonfinite.jsonl'}). None was applied"
                + (f"; the newest checkpoint is {done[-1]}" if done else "")
                + ". Resume past known-bad batches with --resume --skip-batches STEP[,STEP...], or lower the LR.")

    def _append_nonfinite(self, record: dict) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "nonfinite.jsonl", "a") as f:  # one short line per append: ranks do not interleave
            f.write(json.dumps({"run_id": self.run_id, **record}) + "\n")

    @staticmethod
    def _batch_keys(batch: dict) -> list[str]:
        return [f"{source}/{k}" for source in ("caption", "text") if isinstance(batch.get(source), dict)
                for k in batch[source].get("keys", [])] + [str(k) for k in batch.get("keys", [])]

    def _run_evaluation(self) -> dict[str, float] | None:
        """The evaluator on the live model; rank 0's scalars (None on the others). Below ZeRO-3 every rank holds the
        whole module, so rank 0 evaluates alone on every core while the others wait (on 2 CPU ranks 0.6 of the time
        both ranks took on one core each); at ZeRO-3 forwards gather parameters collectively and every rank joins.
        The evaluators draw no random numbers, so a rank that skips one trains on exactly as it would have."""
        alone = self.world > 1 and self.cfg.zero_stage < 3
        if alone and self.rank != 0:
            self._barrier()
            return None
        start = time.perf_counter()
        self.engine.eval()
        try:
            with torch.no_grad(), every_core() if alone else nullcontext():
                scalars = dict(self.evaluate(self.engine.module, self.device))
        finally:
            self.engine.train()
        scalars["eval/seconds"] = time.perf_counter() - start
        self.write_scalars(scalars, "eval.jsonl")
        if alone:
            self._barrier()
        return scalars

    def _record_keys(self, keys: list[str]) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / f"keys_rank{self.rank}.txt", "a") as f:
            f.write("\n".join(keys) + "\n")

    def consolidated_state_dict(self) -> dict[str, torch.Tensor] | None:
        """fp32 weights gathered from the newest complete checkpoint (any ZeRO stage); rank 0 only."""
        self._barrier()
        if self.rank != 0:
            return None
        if self.cfg.zero_stage == 0:  # no ZeRO partitions: every rank holds the whole module
            return {k: v.detach().float().cpu() for k, v in self.engine.module.state_dict().items()}
        # lazy: deepspeed picks its accelerator when imported; entry points set DS_ACCELERATOR first
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        latest = complete_checkpoints(self.ckpt_dir)[-1]
        marker = json.loads((latest / "COMPLETE").read_text())
        if marker.get("run_id") != self.run_id or marker["step"] != self.step:
            raise RuntimeError(f"{latest} is run {marker.get('run_id')} at step {marker['step']}, not this run "
                               f"({self.run_id}, step {self.step}): refusing to export another run's weights")
        if marker.get("zero_stage") == 0:  # a one-rank run's, resumed here at its last step: whole fp32 weights
            module = torch.load(latest / STAGE0_MODEL_FILE, map_location="cpu", weights_only=True)["module"]
            return {k: v.detach().float() for k, v in module.items()}
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        state = get_fp32_state_dict_from_zero_checkpoint(str(self.ckpt_dir), tag=latest.name)
        if self.cfg.zero_stage == 1:
            # ZeRO-1 checkpoints keep no frozen parameters beside the optimizer's partitions (DeepSpeed saves them
            # from stage 2 on), and every rank holds the whole module: the frozen ones come from it, unchanged
            for name, value in self.engine.module.state_dict().items():
                state.setdefault(name, value.detach().float().cpu())
        return state
