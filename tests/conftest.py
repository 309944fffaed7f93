import os

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory):
    """A tiny shapes-world corpus built by the real demo builder (raw files + shards)."""
    from shards.demo import build_demo

    out = tmp_path_factory.mktemp("demo")
    build_demo(out, n_images=40, n_val=8, n_books=3, n_articles=12, seed=123, progress=False)
    return out
