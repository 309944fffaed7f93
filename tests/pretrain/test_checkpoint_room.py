"""A checkpoint the disk has no room for: the run stops before writing with one line saying how much room the last
one took, or, when a write fails anyway, says which checkpoint, how much room there was and what is still usable;
--resume then goes on from the last complete checkpoint. The CI of session 46 failed on a full disk with torch's
"unexpected pos 24090560 vs 24090448" and nothing else to go by."""

import json
import subprocess
import sys
from pathlib import Path

from tests.toy_engine import one_process_env

ROOT = Path(__file__).resolve().parents[2]

_RUN = r"""
import json, resource, signal, sys
import torch
import train.engine
from train.engine import Engine, EngineConfig, OptimConfig, entry_point, init_distributed

from tests.toy_engine import CountingLoader as Loader, LinearModule as Module

def main():
    run_dir, steps, fault = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if fault == "full":  # the filesystem reports 1 MB free
        train.engine.free_bytes = lambda path: 2**20
    elif fault == "fsize":  # any file written past 100 kB fails (EFBIG), as a full disk's write does (ENOSPC)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    init_distributed(0)
    torch.manual_seed(0)
    cfg = EngineConfig(run_dir=run_dir, steps=steps, zero_stage=0, precision="fp32", log_every=1,
                       checkpoint_every=2, progress=False, export=False)
    # 3 x 40,000 weights: each checkpoint ~1.4 MB (weights and Adam's two moments), more than the 1 MB "free"
    engine = Engine(Module(outputs=40_000), Loader(), cfg, OptimConfig(lr=1e-2, warmup_steps=0), micro_batch_size=2)
    engine.train(resume=fault != "first", overwrite=False)
    return 0

sys.exit(entry_point(main))
"""


def run(run_dir: Path, steps: int, fault: str):
    return subprocess.run([sys.executable, "-c", _RUN, str(run_dir), str(steps), fault], cwd=ROOT,
                          env={**one_process_env(), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)


def steps_logged(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_no_room_stops_before_writing_and_a_failed_write_says_why(tmp_path):
    d = tmp_path / "run"
    first = run(d, 2, "first")
    assert first.returncode == 0, first.stderr[-3000:]
    size = sum(f.stat().st_size for f in (d / "checkpoints/step_0000002").rglob("*") if f.is_file())
    assert size > 2**20  # the "full" disk's 1 MB is too little

    # less free than the newest checkpoint took: stopped before writing, one line, exit code 4
    full = run(d, 6, "full")
    assert full.returncode == 4, full.stderr[-3000:]
    assert "Traceback" not in full.stderr
    line = next(x for x in full.stderr.splitlines() if x.startswith("error: "))
    assert "no room for checkpoint step_0000004" in line and "has 1 MB free" in line
    assert f"took {size / 2**20:,.0f} MB" in line and "--resume from step_0000002" in line
    assert not (d / "checkpoints/step_0000004").exists()
    assert steps_logged(d) == [1, 2, 3, 4]  # it trained up to the checkpoint it could not write

    # a write that fails (here: past the file size limit) names the checkpoint, the room and what is intact
    failed = run(d, 6, "fsize")
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "CheckpointNotWritten: checkpoint" in failed.stderr and "step_0000004 was not written on rank 0" in (
        failed.stderr)
    assert "free before it" in failed.stderr and "step_0000002 is intact (--resume continues from it)" in (
        failed.stderr)
    assert not (d / "checkpoints/step_0000004/COMPLETE").exists()

    # with room again, --resume goes on from step 2 (the failed step 4's leftovers are replaced)
    resumed = run(d, 6, "resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert steps_logged(d)[-4:] == [3, 4, 5, 6]
    assert (d / "checkpoints/step_0000006/COMPLETE").exists() and (d / "checkpoints/step_0000004/COMPLETE").exists()
