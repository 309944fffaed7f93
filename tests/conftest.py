import os

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def pytest_configure(config):
    """Each parallel worker (pytest-xdist) gets its share of the cores for torch's threads, and so does every
    process it starts (they inherit OMP_NUM_THREADS; the deepspeed launcher sets its ranks' own). Unshared, two
    workers ran 2 x 2 OpenMP threads on 2 cores: the suite took 1,366 s against 1,058 s with one thread each
    (user time 2,178 s against 1,634 s; the idle threads spin while they wait for the others; the first run also
    compiled DeepSpeed's shm op, as every fresh CI machine does)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        # lazy: torch and the engine only where the threads are shared
        import torch

        from train.engine import usable_cores

        share = max(1, usable_cores() // workers)
        os.environ["OMP_NUM_THREADS"] = str(share)
        torch.set_num_threads(share)


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory):
    """A tiny shapes-world corpus built by the real demo builder (raw files + shards)."""
    from shards.demo import build_demo

    out = tmp_path_factory.mktemp("demo")
    build_demo(out, n_images=40, n_val=8, n_books=3, n_articles=12, seed=123, progress=False)
    return out
