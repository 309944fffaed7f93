"""A run directory belongs to one run: a new run refuses another's checkpoints unless told to continue
(--resume) or replace (--overwrite) them, runs carry an id and the environment of each start, and export refuses
another run's weights."""

import json
import subprocess
import sys
from pathlib import Path

import torch

from tests.toy_engine import one_process_env

ROOT = Path(__file__).resolve().parents[2]

_RUN = r"""
import json, sys
import torch
from model.config import ConfigError
from train.engine import Engine, EngineConfig, OptimConfig, entry_point, init_distributed

from tests.toy_engine import CountingLoader as Loader, LinearModule as Module

def main():
    run_dir, steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    init_distributed(0)
    torch.manual_seed(0)
    # ZeRO 3: the export reads the newest checkpoint (ZeRO 1 and 2 on one rank run as stage 0, which exports the
    # live module)
    cfg = EngineConfig(run_dir=run_dir, steps=steps, zero_stage=3, precision="fp32", log_every=1,
                       checkpoint_every=2, progress=False, export=False)
    engine = Engine(Module(), Loader(), cfg, OptimConfig(lr=1e-2, warmup_steps=0), micro_batch_size=2)
    engine.train(resume=mode == "resume", overwrite=mode == "overwrite")
    if mode == "tamper":  # the newest checkpoint claims another run
        marker = sorted((engine.ckpt_dir).glob("step_*/COMPLETE"))[-1]
        marker.write_text(json.dumps({**json.loads(marker.read_text()), "run_id": "someone-else"}))
    try:
        engine.consolidated_state_dict()
        print("EXPORTED", engine.run_id)
    except RuntimeError as e:
        print("REFUSED", e)
    return 0

sys.exit(entry_point(main))
"""


def run(run_dir: Path, steps: int, mode: str = "new"):
    env = one_process_env()
    return subprocess.run([sys.executable, "-c", _RUN, str(run_dir), str(steps), mode], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_used_run_dir_is_refused_continued_or_replaced(tmp_path):
    d = tmp_path / "run"
    first = run(d, 4)
    assert first.returncode == 0, first.stderr[-3000:]
    run_id = json.loads((d / "run.json").read_text())["run_id"]
    assert "EXPORTED " + run_id in first.stdout
    assert {r["run_id"] for r in rows(d)} == {run_id} and [r["step"] for r in rows(d)] == [1, 2, 3, 4]
    marker = json.loads((d / "checkpoints/step_0000004/COMPLETE").read_text())
    assert marker["run_id"] == run_id
    # what it ran on, against this interpreter and git: one start, at step 0
    (env,) = json.loads((d / "run.json").read_text())["environments"]
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert env["step"] == 0 and env["world_size"] == 1 and env["versions"]["torch"] == torch.__version__
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and env["executable"] == sys.executable
    if head.returncode == 0:
        assert env["source_commit"].removesuffix("+dirty") == head.stdout.strip()
    before = (d / "metrics.jsonl").read_text()

    # a new run into it: one line naming the directory and the ways out, exit 2, nothing touched
    refused = run(d, 6)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    assert f"engine.run_dir: {d} holds another run (checkpoints up to step_0000004)" in refused.stderr
    assert "--resume" in refused.stderr and "--overwrite" in refused.stderr
    assert (d / "metrics.jsonl").read_text() == before and json.loads((d / "run.json").read_text())["run_id"] == run_id

    # --resume continues the same run (same id) from step 4
    resumed = run(d, 6, "resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["step"] for r in rows(d)] == [1, 2, 3, 4, 5, 6] and {r["run_id"] for r in rows(d)} == {run_id}
    assert "EXPORTED " + run_id in resumed.stdout
    assert [e["step"] for e in json.loads((d / "run.json").read_text())["environments"]] == [0, 4]  # both starts

    # --overwrite replaces it: the old checkpoints and metrics are gone, a new id
    replaced = run(d, 2, "overwrite")
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    new_id = json.loads((d / "run.json").read_text())["run_id"]
    assert new_id != run_id and [r["step"] for r in rows(d)] == [1, 2]
    assert {r["run_id"] for r in rows(d)} == {new_id}
    assert [e["step"] for e in json.loads((d / "run.json").read_text())["environments"]] == [0]  # not the old run's
    assert sorted(p.name for p in (d / "checkpoints").glob("step_*")) == ["step_0000002"]


def test_export_refuses_another_runs_checkpoint(tmp_path):
    out = run(tmp_path / "run", 2, "tamper")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REFUSED" in out.stdout and "someone-else" in out.stdout and "another run's weights" in out.stdout
