"""engine.precision=bf16_autocast: fp32 weights, gradients and optimizer, the forward under torch.autocast.

The independent reference is a plain PyTorch AMP loop written here (torch.autocast around the forward, fp32
backward, clip_grad_norm_, torch's AdamW, LambdaLR with the engine's schedule) from the same initial weights on
the same batches: at ZeRO 0 the engine's weights must equal it, and must differ from the same loop without
autocast (so the forward did run in bf16). ZeRO 2 on one rank runs as stage 0 (`train.engine.run_stage`); on
several, DeepSpeed's own optimizer wrapper clips and may reduce linear weights' gradients in bf16 across ranks
(at one rank, before it ran as stage 0, it measured equal to the AMP loop within 1.5e-8)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.toy_engine import one_process_env
from train.engine import EngineConfig, OptimConfig, deepspeed_config, guarded

ROOT = Path(__file__).resolve().parents[2]

_RUN = r"""
import json, sys
import torch
from tests.toy_engine import CountingLoader
from train.engine import Engine, EngineConfig, OptimConfig, build_optimizer, entry_point, init_distributed

args = json.loads(sys.argv[1])
STEPS = 4
OPTIM = OptimConfig(lr=1e-2, warmup_steps=2, schedule="linear", grad_clip=0.5, weight_decay=0.01)

class Loader(CountingLoader):
    def batch(self, i):
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(8, 16, generator=g), "y": torch.randn(8, 4, generator=g)}

class Module(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                       torch.nn.Linear(32, 4))
    def forward(self, batch):
        out = self.net(batch["x"])
        loss = (out.float() - batch["y"]).square().mean()
        return loss, {"loss/total": loss.detach()}

def reference(initial, autocast):
    module = Module()
    module.load_state_dict(initial)
    opt, factor = build_optimizer(module, OPTIM, STEPS)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    loader = iter(Loader())
    for _ in range(STEPS):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, _ = module(next(loader))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), OPTIM.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    return module.state_dict()

def main():
    init_distributed(0)
    torch.manual_seed(0)
    module = Module()
    initial = {k: v.clone() for k, v in module.state_dict().items()}
    cfg = EngineConfig(run_dir=args["run_dir"], steps=STEPS, zero_stage=args["stage"], precision="bf16_autocast",
                       log_every=2, checkpoint_every=100, progress=False, export=False)
    engine = Engine(module, Loader(), cfg, OPTIM, micro_batch_size=8)
    logged = engine.train()
    ours = engine.engine.module.state_dict()
    out = {"logged_loss": logged.get("loss/total"), "stage": engine.cfg.zero_stage,
           "dtypes": sorted({str(v.dtype) for v in ours.values()})}
    for name, autocast in (("amp", True), ("fp32", False)):
        ref = reference(initial, autocast)
        out[name] = max(float((ours[k] - ref[k]).abs().max()) for k in ref)
        out[name + "_scale"] = max(float((ref[k] - initial[k]).abs().max()) for k in ref)
    print("RESULT " + json.dumps(out))
    return 0

sys.exit(entry_point(main))
"""


def run(tmp_path: Path, stage: int) -> dict:
    env = one_process_env()
    args = {"run_dir": str(tmp_path / f"zero{stage}"), "stage": stage}
    proc = subprocess.run([sys.executable, "-c", _RUN, json.dumps(args)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_config_turns_on_deepspeeds_autocast_and_the_engines_guard():
    cfg = EngineConfig(zero_stage=0, precision="bf16_autocast")
    ds = deepspeed_config(cfg, OptimConfig(grad_clip=2.0), 4)
    assert ds["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"} and "bf16" not in ds
    assert guarded(cfg) and ds["gradient_clipping"] == 0.0  # FiniteGuard clips, as in fp32
    ds2 = deepspeed_config(EngineConfig(zero_stage=2, precision="bf16_autocast"), OptimConfig(grad_clip=2.0), 4)
    assert not guarded(EngineConfig(zero_stage=2, precision="bf16_autocast")) and ds2["gradient_clipping"] == 2.0
    with pytest.raises(ValueError, match="bf16_autocast"):
        deepspeed_config(EngineConfig(precision="bf16-amp"), OptimConfig(), 4)


def test_zero0_equals_a_plain_amp_loop(tmp_path):
    r = run(tmp_path, 0)
    assert r["dtypes"] == ["torch.float32"]  # the weights stay fp32
    assert r["amp"] <= 1e-6 * max(1.0, r["amp_scale"])  # the plain AMP loop's weights
    assert r["fp32"] > 1e-4  # and not the fp32 loop's: the forward ran in bf16
    assert r["logged_loss"] is not None


def test_zero2_on_one_rank_runs_as_stage_0_and_equals_the_plain_amp_loop(tmp_path):
    r = run(tmp_path, 2)
    assert r["stage"] == 0 and r["dtypes"] == ["torch.float32"]
    assert r["amp"] <= 1e-6 * max(1.0, r["amp_scale"])
