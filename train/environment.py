"""What a run ran on: versions, the CPU and its kernel level, the accelerator, the source commit.

Float results depend on more than seeds: the same detector warm-up gave held-out object / colour accuracy 0.946 / 0.963
in one session and 0.938 / 0.958 in another, from the same code, config and seed (docs/FINETUNE.md, session 47). The
kernels torch picks (AVX2 or AVX-512 on a CPU, the GPU model) and the thread count change the order of float
reductions, so each start of a run records them in its run.json (`environments`), and two runs that disagree can
be told apart by what they ran on before anyone hunts a bug.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parents[1]
PACKAGES = ("torchvision", "deepspeed", "transformers", "numpy")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def source_commit(root: Path = SOURCE) -> str | None:
    """HEAD of the checkout this code runs from, "+dirty" when tracked files differ from it; None outside git."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def versions() -> dict[str, str | None]:
    # torch as imported, which is what ran, even beside another installed copy
    out: dict[str, str | None] = {"python": platform.python_version(), "torch": torch.__version__}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def environment() -> dict:
    """This process's environment, JSON-serialisable."""
    gpu = None
    if torch.cuda.is_available():
        i = torch.cuda.current_device()
        gpu = {"name": torch.cuda.get_device_name(i), "capability": list(torch.cuda.get_device_capability(i)),
               "cuda": torch.version.cuda, "count": torch.cuda.device_count()}
    return {"versions": versions(), "cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "gpu": gpu,
            "platform": platform.platform(), "executable": sys.executable, "source_commit": source_commit()}


def describe(env: dict) -> str:
    """One line for a report's header."""
    v = env["versions"]
    gpu = env["gpu"]["name"] if env["gpu"] else "no GPU"
    return (f"{env['cpu']} ({env['cpu_capability']}), {env['cores']} cores, {gpu}; Python {v['python']}, "
            f"torch {v['torch']}")
