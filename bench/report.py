"""Shared benchmark plumbing: machine/version header and rewriting one section of docs/BENCHMARKS.md."""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

from train.environment import describe, environment

DOC = Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md"


def bench_parser(doc: str, repeats: int | None = 3, write: bool = True) -> argparse.ArgumentParser:
    """Every bench's command line: its docstring's first paragraph as the description, `--repeats` (timed
    repeats, interleaved where a bench compares) and `--write` (rewrite its section of docs/BENCHMARKS.md)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    if repeats is not None:
        p.add_argument("--repeats", type=int, default=repeats)
    if write:
        p.add_argument("--write", action="store_true", help="rewrite this bench's section of docs/BENCHMARKS.md")
    return p


def machine() -> str:
    return describe(environment())


def median_range(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def update_section(name: str, body: str) -> None:
    """Replace the text between `<!-- bench:name -->` and `<!-- /bench:name -->` (appending if new)."""
    DOC.parent.mkdir(exist_ok=True)
    header = "# Benchmarks\n\nEvery figure is a ratio against a peer measured in the same run.\n"
    text = DOC.read_text() if DOC.exists() else header
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.strip()}\n{end}"
    if start in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.write_text(text)
