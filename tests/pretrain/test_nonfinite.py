"""The non-finite policy: a step whose loss or gradients are not finite is never applied (so never
checkpointed), it is logged with its sample keys, more than engine.max_nonfinite_steps of them stop the job
(exit 3, one line), and --skip-batches resumes past known-bad batches.

The independent reference: the same run on clean data with the bad steps' batches dropped
(engine.skip_steps). Its weights must equal, bit for bit, those of the run that met the bad batches: any trace
of a bad update (in the weights, or in Adam's moments or step count, which shape every later update) breaks
the equality. At ZeRO 0 in fp32 the engine's FiniteGuard does the skip; at ZeRO 3 DeepSpeed's own
gradient-norm check does (ZeRO 1 and 2 on one rank run as stage 0, train.engine.run_stage: the guard's path again).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.toy_engine import one_process_env

ROOT = Path(__file__).resolve().parents[2]

_RUN = r"""
import json, sys
import torch
from tests.toy_engine import CountingLoader
from train.engine import Engine, EngineConfig, OptimConfig, entry_point, init_distributed

args = json.loads(sys.argv[1])

class Loader(CountingLoader):
    # batch i (from 1) is x = i-dependent values; data poison: NaN inputs; grad poison: an inf gradient
    # under a finite loss
    def batch(self, i):
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(i))
        if i in args["nan_data"]:
            x[1, 2] = float("nan")
        return {"x": x, "grad_poison": torch.tensor(i in args["inf_grad"]), "keys": [f"b{i}"]}

class Module(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
    def forward(self, batch):
        out = self.lin(batch["x"])
        if bool(batch["grad_poison"]):
            out.register_hook(lambda g: g * float("inf"))
        loss = (out - 1).square().mean()
        return loss, {"loss/total": loss.detach()}

def main():
    init_distributed(0)
    torch.manual_seed(0)
    cfg = EngineConfig(run_dir=args["run_dir"], steps=args["steps"], zero_stage=args["stage"], precision="fp32",
                       log_every=3, checkpoint_every=2, keep_checkpoints=10, progress=False, export=False,
                       max_nonfinite_steps=args["max"], skip_steps=args["skip"])
    engine = Engine(Module(), Loader(), cfg, OptimConfig(lr=5e-2, warmup_steps=0, schedule="step", grad_clip=1.0),
                    micro_batch_size=4)
    engine.train(resume=args.get("resume", False))
    torch.save({k: v.clone() for k, v in engine.engine.module.state_dict().items()}, args["run_dir"] + "/final.pt")
    return 0

sys.exit(entry_point(main))
"""


def run(run_dir: Path, stage: int, steps: int = 8, nan_data=(), inf_grad=(), skip=(), max_bad=3, resume=False):
    env = one_process_env()
    args = {"run_dir": str(run_dir), "stage": stage, "steps": steps, "nan_data": list(nan_data),
            "inf_grad": list(inf_grad), "skip": list(skip), "max": max_bad, "resume": resume}
    return subprocess.run([sys.executable, "-c", _RUN, json.dumps(args)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def final(run_dir: Path) -> dict:
    return torch.load(run_dir / "final.pt", weights_only=True)


def logged(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "nonfinite.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("stage", [0, 3])
def test_bad_steps_are_never_applied_and_are_logged_with_their_keys(tmp_path, stage):
    bad = run(tmp_path / "bad", stage, nan_data=[3], inf_grad=[6])
    assert bad.returncode == 0, bad.stderr[-3000:]
    assert [(r["step"], r["keys"]) for r in logged(tmp_path / "bad")] == [(3, ["b3"]), (6, ["b6"])]
    assert "non-finite loss or gradients at step(s) [3]" in bad.stdout

    ref = run(tmp_path / "ref", stage, skip=[3, 6])  # clean data, those batches dropped
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert [(r["step"], r.get("dropped")) for r in logged(tmp_path / "ref")] == [(3, True), (6, True)]
    got, want = final(tmp_path / "bad"), final(tmp_path / "ref")
    assert all(torch.isfinite(v).all() for v in got.values())
    assert all(torch.equal(got[k], want[k]) for k in want), "a bad step left a trace in the weights or optimizer"

    clean = run(tmp_path / "clean", stage)  # the control: applying those two batches changes the weights
    assert clean.returncode == 0, clean.stderr[-3000:]
    assert not all(torch.equal(final(tmp_path / "clean")[k], want[k]) for k in want)

    # the logged losses are the applied steps' (finite), with the count of skipped steps beside them
    rows = [json.loads(line) for line in (tmp_path / "bad" / "metrics.jsonl").read_text().splitlines()]
    assert all(v == v for r in rows for k, v in r.items() if k.startswith("loss/"))
    assert max(r.get("nonfinite/skipped_steps", 0) for r in rows) == 2


def test_too_many_bad_steps_stop_the_job_and_skip_batches_resumes_past_them(tmp_path):
    d = tmp_path / "run"
    stopped = run(d, 0, steps=10, nan_data=[3, 5], max_bad=1)
    assert stopped.returncode == 3, stopped.stderr[-3000:]
    err = stopped.stderr.strip().splitlines()
    assert err[-1].startswith("error: non-finite loss or gradients at 2 steps, more than "
                              "engine.max_nonfinite_steps=1"), stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "--skip-batches" in err[-1]
    # every checkpoint written holds finite weights: none at or after the step that broke the limit
    steps = sorted(int(p.parent.name.split("_")[1]) for p in (d / "checkpoints").glob("step_*/COMPLETE"))
    assert steps and max(steps) < 6, steps
    assert [r["step"] for r in logged(d)] == [3, 5]

    # resume from the newest checkpoint, dropping the logged bad batches: it finishes, and equals a run that
    # dropped them from the start
    resumed = run(d, 0, steps=10, nan_data=[3, 5], max_bad=1, skip=[3, 5], resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ref = run(tmp_path / "ref", 0, steps=10, skip=[3, 5])
    assert ref.returncode == 0, ref.stderr[-3000:]
    got, want = final(d), final(tmp_path / "ref")
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_skip_batches_on_the_command_line_sets_engine_skip_steps():
    import argparse

    from train.engine import add_run_arguments, run_overrides

    p = argparse.ArgumentParser()
    add_run_arguments(p, "config", "a=1")
    args = p.parse_args(["--skip-batches", "40,12,40", "optim.lr=1e-4"])
    assert run_overrides(args) == ["optim.lr=1e-4", "engine.skip_steps=[12, 40]"]
    with pytest.raises(SystemExit):
        p.parse_args(["--skip-batches", "12,x"])


@pytest.mark.parametrize("fused", [True, False])
def test_finite_guard_skips_on_the_device_or_the_host(fused):
    """FiniteGuard alone: a fused AdamW (CPU fused kernels, as on CUDA) gets the flag as found_inf and leaves
    weights, moments and step count as they were, with no host read; an unfused one skips the call. A finite
    step equals the unguarded optimizer's."""
    from train.engine import FiniteGuard

    def make():
        torch.manual_seed(0)
        lin = torch.nn.Linear(3, 2)
        return lin, torch.optim.AdamW(lin.parameters(), lr=0.1, fused=fused or None)

    lin, opt = make()
    guard = FiniteGuard(opt)
    ref_lin, ref_opt = make()
    for grad_value in (0.5, float("nan"), -0.25):
        for m in (lin, ref_lin):
            for p in m.parameters():
                p.grad = torch.full_like(p, grad_value)
        before = {k: v.clone() for k, v in lin.state_dict().items()}
        state_before = {k: {n: t.clone() for n, t in s.items()} for k, s in opt.state.items()}
        opt.step()
        bad = bool(guard.device_flag) if fused else opt.overflow
        assert bad == (grad_value != grad_value)
        if bad:
            assert all(torch.equal(before[k], v) for k, v in lin.state_dict().items())
            assert all(torch.equal(state_before[k][n], t) for k, s in opt.state.items() for n, t in s.items())
        else:
            ref_opt.step()
            assert all(torch.equal(ref_lin.state_dict()[k], v) for k, v in lin.state_dict().items())
            assert ("found_inf" not in vars(opt)) and all(torch.isfinite(v).all() for v in lin.state_dict().values())


def test_finite_guard_clips_as_torch_does_and_keeps_the_norm():
    """At ZeRO 0 in fp32 the guard clips in DeepSpeed's place: the same gradients and step as
    torch.nn.utils.clip_grad_norm_ before the optimizer, and the norm before clipping for the grad_norm metric;
    DeepSpeed's own clipping is off on that path only."""
    from train.engine import EngineConfig, FiniteGuard, OptimConfig, deepspeed_config

    def make():
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 3)
        return lin, torch.optim.AdamW(lin.parameters(), lr=0.1)

    lin, opt = make()
    guard = FiniteGuard(opt, max_norm=0.5)
    ref_lin, ref_opt = make()
    for scale in (10.0, 0.01):  # clipped, then under the limit
        for m in (lin, ref_lin):
            for i, p in enumerate(m.parameters()):
                p.grad = torch.arange(p.numel(), dtype=torch.float32).view_as(p) * scale * (i + 1)
        norm = torch.nn.utils.clip_grad_norm_(ref_lin.parameters(), 0.5)
        ref_opt.step()
        opt.step()
        assert torch.allclose(guard.norm, norm) and (norm > 0.5) == (scale == 10.0)
        for a, b in zip(lin.parameters(), ref_lin.parameters()):
            assert torch.equal(a.grad, b.grad) and torch.equal(a, b)
    optim = OptimConfig(grad_clip=0.5)
    assert deepspeed_config(EngineConfig(zero_stage=0, precision="fp32"), optim, 2)["gradient_clipping"] == 0.0
    assert deepspeed_config(EngineConfig(zero_stage=2, precision="fp32"), optim, 2)["gradient_clipping"] == 0.5
    assert deepspeed_config(EngineConfig(zero_stage=0, precision="bf16"), optim, 2)["gradient_clipping"] == 0.5
