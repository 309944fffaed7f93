"""DeepSpeed's CPU all-reduce workspaces (one 69 MB file per rank in /dev/shm, which it never unlinks) are unlinked
by `train.engine.init_distributed` once every rank has mapped them: mapped, they still carry the reduction, and
nothing is left in /dev/shm however the ranks end. The same ranks, started without OMP_NUM_THREADS (as the deepspeed
launcher starts them), each take their share of the cores (`rank_threads`)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_RANK = r"""
import json, os, sys
import torch
from train.engine import init_distributed, shm_buffer_path
import deepspeed.comm as ds_comm
rank, world = init_distributed(int(os.environ["LOCAL_RANK"]))
torch.distributed.barrier()  # every rank has returned, so has unlinked its own file
names = [shm_buffer_path(r).name for r in range(world)]
maps = open("/proc/self/maps").read()
tensor = torch.arange(1000, dtype=torch.float32) * (rank + 1)
ds_comm.inference_all_reduce(tensor)
print(json.dumps({
    "left_in_dev_shm": [shm_buffer_path(r).name for r in range(world) if shm_buffer_path(r).exists()],
    # mapped and unlinked: the kernel lists such a mapping as "(deleted)"
    "mapped_deleted": [n for n in names if f"/dev/shm/{n} (deleted)" in maps],
    "shm_kernel": getattr(ds_comm.comm.cdb, "shm_vector_kernel_level", 0),
    "threads": torch.get_num_threads(), "cores": len(os.sched_getaffinity(0)),
    "sum": tensor.tolist()}))
torch.distributed.barrier()
"""


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm (not Linux)")
def test_shm_workspaces_are_unlinked_after_every_rank_mapped_them():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    world = 2
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
        env.pop("OMP_NUM_THREADS", None)
        procs.append(subprocess.Popen([sys.executable, "-c", _RANK], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    names = [f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_{r}" for r in range(world)]
    expected = [float(3 * i) for i in range(1000)]  # ranks 1x and 2x the same vector
    for out in outs:
        assert out["left_in_dev_shm"] == []
        assert sorted(out["mapped_deleted"]) == names  # DeepSpeed made and mapped every rank's workspace
        assert out["threads"] == max(1, out["cores"] // world)  # 2 cores, 2 ranks: 1 thread each
        if out["shm_kernel"] >= 1:  # the shm kernel ran (fp32 needs AVX2), through the unlinked mappings
            assert out["sum"] == expected
    assert not any((Path("/dev/shm") / n).exists() for n in names)


def test_rank_threads_share_the_cores_unless_the_user_set_them():
    from train.engine import rank_threads

    assert rank_threads(2, 2, None) == 1
    assert rank_threads(16, 2, "") == 8
    assert rank_threads(2, 4, None) == 1  # more ranks than cores: one thread each, never 0
    assert rank_threads(8, 1, None) == 8
    assert rank_threads(8, 2, "3") is None  # OMP_NUM_THREADS=3 stands (torch read it at import)
