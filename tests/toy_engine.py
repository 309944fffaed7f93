"""The smallest things the engine trains, for the tests that start it in a subprocess: a loader whose position is
its state, a linear module whose loss is logged, and the environment such a subprocess runs in."""

import os
import random
import socket
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A port no process listens on now, for a job's master: the suite runs in parallel workers (pytest-xdist),
    so fixed or counted ports would collide between two jobs started at once. Drawn below the kernel's ephemeral
    range (Linux: 32768 and up), not asked of it: an ephemeral port it hands out here can go to another job's gloo
    connection before this job's master binds it (EADDRINUSE on the master port, seen once in a full suite)."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    draw, start = random.SystemRandom(), max(1024, low - 12000)
    if start >= low:  # an ephemeral range that starts at the bottom: nothing lies below it
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    for _ in range(200):
        port = draw.randrange(start, low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # taken: draw again
                continue
            return port
    raise RuntimeError(f"no free port below the ephemeral range ({low})")


def one_process_env() -> dict[str, str]:
    """The environment for a trainer started as its own single process on CPU: this repository importable, and no
    rank variables inherited from a caller (a launcher's would make it join another job's process group)."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


class CountingLoader:
    """Batch i (from 1) is `batch(i)`; the state is the count, so a resumed loader continues exactly."""

    def __init__(self):
        self.i = 0

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]

    def batch(self, i: int) -> dict:
        return {"x": torch.full((2, 3), float(i))}

    def __iter__(self):
        while True:
            self.i += 1
            yield self.batch(self.i)


class LinearModule(torch.nn.Module):
    def __init__(self, outputs: int = 1):
        super().__init__()
        self.lin = torch.nn.Linear(3, outputs)

    def forward(self, batch):
        loss = self.lin(batch["x"]).square().mean()
        return loss, {"loss/total": loss.detach()}
