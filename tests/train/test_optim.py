"""The engine's CPU optimizer and allocator settings: BlockedAdamW is torch's AdamW bit for bit (weights and
state, over several steps, tensors split into ragged blocks, channels-last weights, two parameter groups,
amsgrad and maximize), its state loads into torch's AdamW; keep_freed_memory serves a large tensor from the heap
where glibc would mmap it (read from glibc's own mallinfo2)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from train.engine import OptimConfig, build_optimizer
from train.optim import BlockedAdamW

ROOT = Path(__file__).resolve().parents[2]


def make_params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    big = torch.randn(37, 29, generator=g)  # 1,073 elements: blocks of 100 leave a ragged last one
    conv = torch.randn(8, 3, 3, 3, generator=g).to(memory_format=torch.channels_last)  # not contiguous
    bias = torch.randn(5, generator=g)
    unused = torch.randn(300, generator=g)  # never gets a gradient
    return [torch.nn.Parameter(t) for t in (big, conv, bias, unused)]


def groups(params, **extra):
    big, conv, bias, unused = params
    return [{"params": [big, conv], "weight_decay": 0.05, **extra},
            {"params": [bias, unused], "weight_decay": 0.0, "lr": 3e-3}]


def run(opt_cls, params, steps, **kwargs):
    opt = opt_cls(groups(params, **kwargs.pop("group", {})), lr=1e-2, betas=(0.8, 0.95), eps=1e-6, **kwargs)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params[:3]:
            d = torch.randn(p.shape, generator=g) * 0.3
            p.grad = d.contiguous(memory_format=torch.channels_last) if p.dim() == 4 else d
        opt.step()
    return opt


@pytest.mark.parametrize("options", [{}, {"amsgrad": True}, {"maximize": True}])
def test_blocked_adamw_is_torch_adamw_bit_for_bit(options):
    ours, ref = make_params(0), make_params(0)
    opt = run(BlockedAdamW, ours, 4, block=100, **options)
    ref_opt = run(torch.optim.AdamW, ref, 4, foreach=False, **options)
    for p, q in zip(ours, ref):
        assert torch.equal(p, q)
    assert not torch.equal(ours[0], make_params(0)[0])  # it did move them
    state, ref_state = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    assert state.keys() == ref_state.keys() == {0, 1, 2}  # no state for the parameter without a gradient
    for k in state:
        assert state[k].keys() == ref_state[k].keys()
        for name in state[k]:
            assert torch.equal(state[k][name], ref_state[k][name]), (k, name)


def test_blocked_adamw_state_goes_on_in_torch_adamw_and_back():
    """Checkpoints hold torch's AdamW state: 2 steps here, 2 in torch's AdamW from that state, 2 more here from
    torch's, equal to 6 steps of torch's AdamW."""
    ours, ref = make_params(0), make_params(0)
    ref_opt = run(torch.optim.AdamW, ref, 6, foreach=False)
    opt = run(BlockedAdamW, ours, 2, block=100)
    torch_opt = torch.optim.AdamW(groups(ours), lr=1e-2, betas=(0.8, 0.95), eps=1e-6, foreach=False)
    torch_opt.load_state_dict(opt.state_dict())
    g = torch.Generator().manual_seed(1)
    draws = [[torch.randn(p.shape, generator=g) * 0.3 for p in ours[:3]] for _ in range(6)]

    def steps(o, which):
        for i in which:
            for p, d in zip(ours[:3], draws[i]):
                p.grad = d.contiguous(memory_format=torch.channels_last) if p.dim() == 4 else d
            o.step()
    steps(torch_opt, [2, 3])
    back = BlockedAdamW(groups(ours), lr=1e-2, betas=(0.8, 0.95), eps=1e-6, block=100)
    back.load_state_dict(torch_opt.state_dict())
    steps(back, [4, 5])
    for p, q in zip(ours, ref):
        assert torch.equal(p, q)
    assert ref_opt.state_dict()["state"][0]["step"].item() == back.state_dict()["state"][0]["step"].item() == 6


def test_a_negative_decay_milestone_counts_back_from_the_last_step():
    """The quick start's cut (x0.1 for the last 40 of its steps) stays the last 40 when the run's length changes."""
    cfg = OptimConfig(lr=1e-3, warmup_steps=20, schedule="step", decay_steps=[-40], decay_factor=0.1)
    for total, cut in ((330, 290), (1000, 960)):
        _, factor = build_optimizer(torch.nn.Linear(2, 2), cfg, total)
        assert [factor(s) for s in (10, 20, cut - 1, cut, total - 1)] == pytest.approx([0.5, 1.0, 1.0, 0.1, 0.1])
    # mixed with a step from the start; a run shorter than the count back is in its last steps throughout
    _, factor = build_optimizer(torch.nn.Linear(2, 2), OptimConfig(warmup_steps=0, schedule="step",
                                                                   decay_steps=[100, -10]), 200)
    assert [factor(s) for s in (99, 100, 189, 190)] == pytest.approx([1.0, 0.1, 0.1, 0.01])
    _, factor = build_optimizer(torch.nn.Linear(2, 2), cfg, 30)
    assert [factor(s) for s in (0, 10, 29)] == pytest.approx([0.0, 0.05, 0.1])


def test_the_engine_builds_blocked_adamw_on_cpu():
    opt, _ = build_optimizer(torch.nn.Linear(3, 2), OptimConfig(lr=1e-3, betas=(0.9, 0.98), eps=1e-7), 10)
    assert isinstance(opt, BlockedAdamW) and opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-7
    with pytest.raises(ValueError, match="block"):
        BlockedAdamW([torch.nn.Parameter(torch.zeros(2))], block=0)


_MALLINFO = r"""
import ctypes, sys, torch
from train.engine import keep_freed_memory

class Mallinfo2(ctypes.Structure):  # glibc's struct mallinfo2 (malloc.h)
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2
if sys.argv[1] == "keep":
    assert keep_freed_memory()
before = libc.mallinfo2()
t = torch.empty(25_000_000)  # 100 MB
after = libc.mallinfo2()
print(after.hblkhd - before.hblkhd, after.arena - before.arena)
"""


@pytest.mark.skipif(not hasattr(__import__("ctypes").CDLL(None), "mallinfo2"), reason="glibc >= 2.33 only")
def test_keep_freed_memory_serves_large_tensors_from_the_heap():
    def grown(mode):
        out = subprocess.run([sys.executable, "-c", _MALLINFO, mode], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return [int(x) for x in out.stdout.split()]
    mapped, heap = grown("default")
    assert mapped >= 100_000_000 and heap < 1_000_000  # glibc's default: its own mmap, unmapped on free
    mapped, heap = grown("keep")
    assert mapped == 0 and heap >= 90_000_000  # (less any free heap it reused)
