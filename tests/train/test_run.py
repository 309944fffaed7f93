"""train.run: the one flow every trainer runs. A toy task records what the flow hands it: the config with the
command line's overrides, this rank's seed, the steps the engine trained, the last logged metrics, and no
engine at all when the task has nothing to train (--eval-only)."""

import json
import subprocess
import sys
from pathlib import Path

from shards.seeding import seed_for
from tests.toy_engine import one_process_env

ROOT = Path(__file__).resolve().parents[2]

_TASK = r"""
import json, sys
from dataclasses import dataclass, field
import torch
from train.engine import EngineConfig, OptimConfig, entry_point
from train.run import Training, run

@dataclass
class ToyConfig:
    seed: int = 5
    engine: EngineConfig = field(default_factory=EngineConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

from tests.toy_engine import CountingLoader as Loader, LinearModule as Module

class Toy:
    description, doc, config_cls = "toy", "", ToyConfig
    config_help, overrides_example = "ToyConfig YAML", "engine.steps=3"
    def add_arguments(self, parser):
        parser.add_argument("--eval-only", action="store_true")
        parser.add_argument("--fail-in-finish", action="store_true")
        parser.add_argument("--signal-at", type=int, default=0)
    def seed(self, cfg):
        return cfg.seed
    def build(self, cfg, args, rank, world):
        self.seen = {"seed": torch.initial_seed(), "rank": rank, "world": world, "steps": cfg.engine.steps}
        if args.eval_only:
            return None
        loader = Loader()
        if args.signal_at:
            # a scheduler's preemption, delivered while the engine draws batch N
            import os, signal
            draw = loader.batch
            loader.batch = lambda i: (os.kill(os.getpid(), signal.SIGTERM) if i == args.signal_at else None, draw(i))[1]
        return Training(Module(), loader, 2, count_batch=lambda b: {"samples": 2.0, "tokens": 6.0, "images": 0.0})
    def finish(self, engine, last, cfg, args, rank):
        self.seen.update(trained=None if engine is None else engine.step, last=sorted(last))
        if args.fail_in_finish:
            import threading, time
            # what a normal interpreter exit would wait for (as a crashed GPU rank waited in its teardown)
            threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()
            raise RuntimeError("planted failure")
        print("SEEN " + json.dumps(self.seen))

sys.exit(entry_point(lambda: run(Toy(), sys.argv[1:])))
"""


def toy_process(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = one_process_env()
    script = tmp_path / "toy.py"
    script.write_text(_TASK)
    plain = ["engine.zero_stage=1", "engine.precision=fp32", "engine.log_every=1", "engine.checkpoint_every=100",
             "engine.progress=false", "engine.export=false", "optim.warmup_steps=0"]
    return subprocess.run([sys.executable, str(script), *args, *plain], capture_output=True, text=True, env=env,
                          timeout=timeout)


def toy(tmp_path: Path, *args: str) -> dict:
    out = toy_process(tmp_path, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("SEEN ")]
    assert line, out.stdout[-2000:]
    return json.loads(line[-1][5:])


def test_run_trains_the_task_and_hands_it_the_engine(tmp_path):
    seen = toy(tmp_path, f"engine.run_dir={tmp_path / 'run'}", "engine.steps=3", "seed=7")
    expected = (seed_for(7, "torch global", 0), 0, 1, 3, 3)  # the rank's leaf of the seeding tree
    assert (seen["seed"], seen["rank"], seen["world"], seen["steps"], seen["trained"]) == expected
    assert "loss/total" in seen["last"]
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 3


def test_a_task_with_nothing_to_train_goes_straight_to_finish(tmp_path):
    seen = toy(tmp_path, "--eval-only", f"engine.run_dir={tmp_path / 'run'}")
    assert seen["trained"] is None and seen["last"] == [] and seen["seed"] == seed_for(5, "torch global", 0)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_flag_between_overrides_as_a_launcher_places_it(tmp_path):
    """`bash launch/finetune_retrieval.sh --eval-only ...` runs `... engine.run_dir=X --eval-only ...`: the flag
    between two runs of overrides is read, and the overrides on both sides of it too."""
    seen = toy(tmp_path, "engine.steps=2", "--eval-only", f"engine.run_dir={tmp_path / 'run'}")
    assert seen["trained"] is None and seen["steps"] == 2


def test_a_failing_rank_exits_with_its_traceback_instead_of_waiting_in_teardown(tmp_path):
    """An unexpected exception after the process group is up: the traceback, exit code 1, and no wait for what
    the interpreter's teardown would wait for (here a non-daemon thread sleeping an hour)."""
    out = toy_process(tmp_path, "--fail-in-finish", f"engine.run_dir={tmp_path / 'run'}", "engine.steps=1",
                      timeout=120)
    assert out.returncode == 1
    assert "rank 0 failed:" in out.stderr and "RuntimeError: planted failure" in out.stderr


def test_a_run_stopped_by_a_signal_writes_no_final_outputs_until_resumed(tmp_path):
    """SIGTERM mid-run: the engine stops after the step with a checkpoint, and the task's finish (the export, the
    saved model, the final metrics: what marks a run done) is not called for weights that are not the final
    ones; --resume trains the remaining steps and finishes."""
    run_dir = tmp_path / "run"
    out = toy_process(tmp_path, "--signal-at", "4", f"engine.run_dir={run_dir}", "engine.steps=10")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "stopped by signal after step 4; checkpoint saved" in out.stdout
    assert "not finished (4 of 10 steps)" in out.stdout and "--resume" in out.stdout
    assert not [x for x in out.stdout.splitlines() if x.startswith("SEEN ")], out.stdout[-2000:]
    assert (run_dir / "checkpoints" / "step_0000004" / "COMPLETE").exists()
    seen = toy(tmp_path, "--resume", f"engine.run_dir={run_dir}", "engine.steps=10")
    assert seen["trained"] == 10 and "loss/total" in seen["last"]
