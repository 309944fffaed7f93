"""A metric the task weights (train.engine.METRIC_WEIGHT): the log shows sum(X * w) / sum(w) over the window's steps,
micro-batches and ranks, not the plain mean over steps, which a step with nothing to measure (w = 0) pulls towards 0
(session 46 found acc/mrc_attribute biased low that way). Two real ranks (gloo), two micro-batches a step; the
expected figures are computed here from the batches' listing, independently of the engine."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.toy_engine import free_port, one_process_env

ROOT = Path(__file__).resolve().parents[2]

# rows a micro-batch measures, by (step, micro-batch, rank); every other micro-batch measures none. Window 1 (steps
# 1-3) mixes counts of 0 to 3; window 2 (steps 4-6) measures nothing anywhere.
CHOSEN = {(1, 0, 1): [0, 1], (2, 1, 0): [2], (3, 0, 0): [0, 1, 3], (3, 1, 1): [1]}
STEPS, MICRO, WORLD, LOG_EVERY = 6, 2, 2, 3


def value(step: int, micro: int, rank: int, row: int) -> float:
    return step + 0.1 * row + 0.01 * micro + 0.5 * rank


_RUN = r"""
import json, os, sys
import torch
from tests.toy_engine import CountingLoader
from train.engine import METRIC_WEIGHT, Engine, EngineConfig, OptimConfig, entry_point, init_distributed

args = json.loads(sys.argv[1])
chosen = {tuple(json.loads(k)): v for k, v in args["chosen"].items()}

class Loader(CountingLoader):
    # batch i (from 1) is micro-batch (i - 1) % micro of step (i - 1) // micro + 1
    def batch(self, i):
        step, micro, rank = (i - 1) // args["micro"] + 1, (i - 1) % args["micro"], int(os.environ["RANK"])
        v = step + 0.1 * torch.arange(4, dtype=torch.float32) + 0.01 * micro + 0.5 * rank
        pick = torch.zeros(4, dtype=torch.bool)
        pick[chosen.get((step, micro, rank), [])] = True
        return {"x": torch.ones(4, 3), "v": v, "pick": pick}

class Module(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)
    def forward(self, batch):
        loss = self.lin(batch["x"]).square().mean()
        n = batch["pick"].float().sum()
        part = (batch["v"] * batch["pick"]).sum() / n.clamp(min=1)
        return loss, {"loss/total": loss.detach(), "acc/part": part, "acc/part" + METRIC_WEIGHT: n,
                      "acc/plain": batch["v"].mean()}

def main():
    init_distributed(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(0)
    cfg = EngineConfig(run_dir=args["run_dir"], steps=args["steps"], zero_stage=1, precision="fp32",
                       log_every=args["log_every"], checkpoint_every=100, progress=False, export=False,
                       gradient_accumulation_steps=args["micro"])
    Engine(Module(), Loader(), cfg, OptimConfig(lr=1e-3, warmup_steps=0, schedule="step"), micro_batch_size=4).train()
    return 0

sys.exit(entry_point(main))
"""


def test_a_weighted_metric_is_logged_as_its_weighted_mean_over_steps_micro_batches_and_ranks(tmp_path):
    args = {"run_dir": str(tmp_path / "run"), "steps": STEPS, "micro": MICRO, "log_every": LOG_EVERY,
            "chosen": {json.dumps(list(k)): v for k, v in CHOSEN.items()}}
    port = str(free_port())
    procs = []
    for rank in range(WORLD):
        env = {**one_process_env(), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen([sys.executable, "-c", _RUN, json.dumps(args)], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=280)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * WORLD, outputs[0][-3000:] + outputs[1][-3000:]
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [3, 6]

    picked = [value(s, m, r, row) for (s, m, r), rows in CHOSEN.items() for row in rows]
    assert lines[0]["acc/part"] == pytest.approx(sum(picked) / len(picked), rel=1e-6)  # 7 rows
    # the plain mean over steps of the step's means, what the log showed before: a different, lower figure
    micro = [(s, m, r) for s in (1, 2, 3) for m in range(MICRO) for r in range(WORLD)]
    means = [sum(value(*k, row) for row in CHOSEN.get(k, [])) / max(1, len(CHOSEN.get(k, []))) for k in micro]
    assert sum(means) / len(means) < 0.6 * lines[0]["acc/part"]
    # a plain metric is still the mean over steps, micro-batches and ranks
    plain = [value(s, m, r, row) for s in (1, 2, 3) for m in range(MICRO) for r in range(WORLD) for row in range(4)]
    assert lines[0]["acc/plain"] == pytest.approx(sum(plain) / len(plain), rel=1e-6)
    # nothing measured in the second window: no figure rather than a 0; the weights are never logged
    assert "acc/part" not in lines[1] and "acc/plain" in lines[1]
    assert not any(k.endswith("#weight") for line in lines for k in line)
