"""Stage 0 <-> DeepSpeed's universal checkpoint layout, and the stage a run executes at.

The round trip is checked against the states a torch optimizer reached by itself; DeepSpeed's own universal loader
reading what `write_universal` writes (stage 0 on one rank -> ZeRO 2 on two) is
tests/pretrain/test_deepspeed_runs.py's elastic case (2, 1, 2)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.toy_engine import free_port, one_process_env
from train.engine import (
    STAGE0_MODEL_FILE,
    EngineConfig,
    OptimConfig,
    build_optimizer,
    load_universal_whole,
    run_stage,
    write_universal,
)

ROOT = Path(__file__).resolve().parents[2]


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 5)
        self.b = torch.nn.Linear(5, 2)
        self.frozen = torch.nn.Linear(2, 2)
        self.frozen.requires_grad_(False)
        self.unused = torch.nn.Linear(2, 3)  # trained but never given a gradient: no torch optimizer state

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))) + self.frozen.weight.sum()


def trained(optim: OptimConfig, steps: int = 3):
    torch.manual_seed(0)
    module = TwoLayers()
    opt, factor = build_optimizer(module, optim, 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    for i in range(steps):
        module(torch.randn(4, 3, generator=torch.Generator().manual_seed(i))).square().mean().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return module, opt


def save_stage0(path, module, opt):
    """What DeepSpeed writes at stage 0: the module and the whole optimizer in one model file."""
    path.mkdir(parents=True)
    torch.save({"module": module.state_dict(), "optimizer": opt.state_dict(), "dp_world_size": 1},
               path / STAGE0_MODEL_FILE)


def test_stage0_states_go_through_the_universal_layout_and_come_back_exactly(tmp_path):
    optim = OptimConfig(lr=1e-2, warmup_steps=2, weight_decay=0.01, lr_multipliers={"a.": 0.1})
    module, opt = trained(optim)
    save_stage0(tmp_path / "step_3", module, opt)
    write_universal(tmp_path / "step_3", tmp_path / "universal" / "step_3", module, optim)

    zero = tmp_path / "universal" / "step_3" / "zero"
    assert sorted(p.name for p in zero.iterdir()) == ["a.bias", "a.weight", "b.bias", "b.weight", "optimizer_state.pt",
                                                      "unused.bias", "unused.weight"]
    assert sorted(f.name for f in (zero / "a.weight").iterdir()) == ["exp_avg.pt", "exp_avg_sq.pt", "fp32.pt",
                                                                      "step.pt"]
    assert torch.equal(torch.load(zero / "a.weight" / "fp32.pt", weights_only=True)["param"], module.a.weight)
    copied = torch.load(tmp_path / "universal" / "step_3" / STAGE0_MODEL_FILE, weights_only=True)
    assert copied["optimizer"] is None and torch.equal(copied["module"]["frozen.weight"], module.frozen.weight)

    torch.manual_seed(1)  # other initial weights: every trained value must come from the files
    fresh = TwoLayers()
    fresh_opt, _ = build_optimizer(fresh, optim, 10)
    load_universal_whole(tmp_path / "universal" / "step_3", fresh, fresh_opt)
    # the frozen layer is no optimizer's: the engine loads it from the model file, as DeepSpeed does at stage 0
    assert not torch.equal(fresh.frozen.weight, module.frozen.weight)
    fresh.frozen.load_state_dict({k[7:]: v for k, v in copied["module"].items() if k.startswith("frozen.")})
    for (name, p), q in zip(module.named_parameters(), fresh.parameters()):
        if p.requires_grad:
            assert torch.equal(p, q), name
            for key in ("exp_avg", "exp_avg_sq", "step"):
                if name.startswith("unused."):  # as a ZeRO flat group holds it: zero moments, the group's step
                    assert torch.equal(fresh_opt.state[q][key], torch.tensor(3.0) if key == "step" else 0 * q)
                else:
                    assert torch.equal(opt.state[p][key], fresh_opt.state[q][key]), (name, key)
    assert [g["lr"] for g in fresh_opt.param_groups] == [g["lr"] for g in opt.param_groups]
    assert fresh_opt.param_groups[-1]["lr"] == pytest.approx(0.1 * fresh_opt.param_groups[0]["lr"])
    assert opt.state[module.a.weight]["step"] == 3

    # the optimizer's own next step from the loaded states equals the original's
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(9))
    for m, o in ((module, opt), (fresh, fresh_opt)):
        m(x).square().mean().backward()
        o.step()
    assert all(torch.equal(p, q) for p, q in zip(module.parameters(), fresh.parameters()) if p.requires_grad)


def test_another_grouping_is_refused_by_shape(tmp_path):
    optim = OptimConfig(lr=1e-2, lr_multipliers={"a.": 0.1})
    module, opt = trained(optim)
    save_stage0(tmp_path / "step_3", module, opt)
    # without the multiplier the groups, and so torch's parameter numbering, come in another order
    with pytest.raises(ValueError, match="another model or grouping"):
        write_universal(tmp_path / "step_3", tmp_path / "universal" / "step_3", module, OptimConfig(lr=1e-2))


def test_zero_1_and_2_run_as_stage_0_on_one_rank_only(tmp_path):
    assert run_stage(EngineConfig(zero_stage=2, precision="fp32"), 1) == 0
    assert run_stage(EngineConfig(zero_stage=1, precision="bf16_autocast"), 1) == 0
    assert run_stage(EngineConfig(zero_stage=2, precision="fp32"), 2) == 2
    assert run_stage(EngineConfig(zero_stage=3, precision="fp32"), 1) == 3
    assert run_stage(EngineConfig(zero_stage=2, precision="bf16"), 1) == 2  # DeepSpeed's bf16 optimizer stays
    offload = tmp_path / "offload.json"
    offload.write_text(json.dumps({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}))
    assert run_stage(EngineConfig(zero_stage=2, precision="fp32", deepspeed_config=str(offload)), 1) == 2
    offload.write_text(json.dumps({"zero_optimization": {"offload_optimizer": {"device": "none"}}}))
    assert run_stage(EngineConfig(zero_stage=2, precision="fp32", deepspeed_config=str(offload)), 1) == 0


_TOY = r"""
import json, sys
import torch
import torch.distributed as dist
from tests.toy_engine import CountingLoader
from train.engine import Engine, EngineConfig, OptimConfig, entry_point, init_distributed

args = json.loads(sys.argv[-1])  # the deepspeed launcher puts --local_rank first

class Slices(CountingLoader):
    # global batch i, the same whatever the world: each rank takes its rows, so one global step is one step
    def __init__(self, rank, world):
        super().__init__()
        self.rank, self.world = rank, world
    def batch(self, i):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 32, generator=g)
        n = 4 // self.world
        return {"x": x[self.rank * n:(self.rank + 1) * n], "y": y[self.rank * n:(self.rank + 1) * n]}
    def load_elastic(self, states):  # every old rank drew the same count
        self.i = states[0]["i"]

class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # every param group spans both ranks' ZeRO-2 partitions: DeepSpeed's universal loader fails on a rank
        # that holds no element of a group (a 2-element bias group did)
        self.a, self.b = torch.nn.Linear(8, 64), torch.nn.Linear(64, 32)
    def forward(self, batch):
        loss = (self.b(torch.tanh(self.a(batch["x"]))) - batch["y"]).square().mean()
        return loss, {"loss/total": loss.detach()}

def main():
    rank, world = init_distributed(0)
    torch.manual_seed(0)
    cfg = EngineConfig(run_dir=args["run_dir"], steps=args["steps"], zero_stage=2, precision="fp32", log_every=1,
                       checkpoint_every=args["steps"], progress=False, export=False, keep_freed_memory=False)
    # a schedule that does not depend on engine.steps (the first half runs with steps=4): warm-up, x0.1 at 6
    optim = OptimConfig(lr=3e-2, warmup_steps=2, schedule="step", decay_steps=[6], grad_clip=0.5,
                        weight_decay=0.01, lr_multipliers={"a.": 0.5})
    engine = Engine(Toy(), Slices(rank, world), cfg, optim, micro_batch_size=4 // world)
    engine.train(resume=args["resume"])
    if rank == 0:
        print("STAGE", engine.cfg.zero_stage)
    return 0

sys.exit(entry_point(main))
"""


def toy_run(tmp_path, run: str, world: int, steps: int, resume: bool = False) -> str:
    script = tmp_path / "toy.py"
    script.write_text(_TOY)
    args = json.dumps({"run_dir": str(tmp_path / run), "steps": steps, "resume": resume})
    cmd = ([sys.executable, str(script), args] if world == 1 else
           ["deepspeed", "--num_gpus", str(world), "--master_port", str(free_port()), str(script),
            args])
    proc = subprocess.run(cmd, cwd=ROOT, env=one_process_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


def losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss/total"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


@pytest.mark.skipif(shutil.which("deepspeed") is None, reason="deepspeed launcher not on PATH")
def test_stage_0_on_one_rank_and_zero_2_on_two_continue_each_other_exactly(tmp_path):
    """At one global batch the world size changes nothing but the layout: ZeRO 2 on two ranks -> stage 0 on one
    (ds_to_universal, then `load_universal_whole`) and stage 0 on one -> ZeRO 2 on two (`write_universal`, then
    DeepSpeed's universal loader) must continue the uninterrupted run's losses: weights, Adam moments, step
    counts, per-group LRs and the schedule all carried over."""
    assert "STAGE 0" in toy_run(tmp_path, "whole", 1, 8)
    expected = losses(tmp_path / "whole")
    for first, second in ((2, 1), (1, 2)):
        run = f"from{first}"
        toy_run(tmp_path, run, first, 4)
        assert json.loads((tmp_path / run / "checkpoints" / "step_0000004" / "COMPLETE").read_text())[
            "zero_stage"] == (0 if first == 1 else 2)
        out = toy_run(tmp_path, run, second, 8, resume=True)
        assert f"STAGE {0 if second == 1 else 2}" in out
        got = losses(tmp_path / run)
        assert sorted(got) == list(range(1, 9))
        for step in range(1, 9):
            assert got[step] == pytest.approx(expected[step], rel=1e-5, abs=1e-7), (first, second, step)
        assert abs(got[8] - got[4]) > 1e-3  # it did train on
