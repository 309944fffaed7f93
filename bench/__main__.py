"""Run every benchmark and rewrite its table in docs/BENCHMARKS.md (one after another, each in its own
process so one's threads and memory do not colour the next).

    python -m bench [--only loader padding ...] [--quick]

`--quick` runs each with fewer repeats (a smoke run of the whole suite, e.g. on a new machine).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

SUITE = {
    "loader": [],
    "padding": [],
    "pretrain_step": ["--scaling"],
    "transformer_step": [],
    "decoding": ["--size", "mini", "--batch", "32", "--lengths", "10", "40", "--repeats", "7"],
    "zero_memory": [],
    "resume": [],
    "fast_rcnn_step": [],
    "warmup_step": [],
    "quickstart_step": [],
}
QUICK = {"loader": ["--repeats", "1", "--samples", "320"], "resume": ["--repeats", "1"],
         "fast_rcnn_step": ["--repeats", "1", "--steps", "2"], "warmup_step": ["--repeats", "1", "--steps", "2"],
         "quickstart_step": ["--repeats", "1", "--steps", "2"],
         "pretrain_step": ["--repeats", "1", "--steps", "2"],
         "transformer_step": ["--repeats", "1", "--steps", "1"], "decoding": ["--repeats", "1"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=sorted(SUITE), help="run only these")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    env = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")}
    failed = []
    for name in args.only or SUITE:
        extra = SUITE[name] + (QUICK.get(name, []) if args.quick else [])
        start = time.perf_counter()
        print(f"== bench.{name} {' '.join(extra)}", flush=True)
        if subprocess.run([sys.executable, "-m", f"bench.{name}", "--write", *extra], env=env).returncode != 0:
            failed.append(name)
        print(f"== bench.{name}: {time.perf_counter() - start:.0f} s", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
