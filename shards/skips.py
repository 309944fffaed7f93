"""Counted skips: bad records are skipped, named, counted by reason, and reported, never lost silently.

Writers use it to build their final summary; streaming readers use it to warn about corrupt samples
(rate-limited, so a bad shard does not flood the log) and to stop with a clear error when most of
a shard set is bad.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


def numbered_lines(path: str | Path) -> Iterator[tuple[str, str]]:
    """(where, line) for every non-blank line of a text file: `where` is 'path:line', what a skip or an error
    names. A missing file raises FileNotFoundError naming it."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                yield f"{path}:{lineno}", line


class CorruptDataError(RuntimeError):
    """Raised when so much of the input is bad that continuing would train on noise."""


class SkipLog:
    def __init__(self, what: str = "records", *, max_bad_fraction: float = 1.0, min_seen: int = 50,
                 warn_first: int = 5, warn_every: int = 100):
        self.what = what
        self.max_bad_fraction = max_bad_fraction
        self.min_seen = min_seen
        self.warn_first = warn_first
        self.warn_every = warn_every
        self.good = 0
        self.reasons: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}

    @property
    def skipped(self) -> int:
        return sum(self.reasons.values())

    def ok(self) -> None:
        self.good += 1

    def skip(self, reason: str, where: str, detail: str = "") -> None:
        """Count one bad record; `where` names it (file and line, or shard and key)."""
        self.reasons[reason] += 1
        n = self.reasons[reason]
        message = f"{where}: {reason}" + (f" ({detail})" if detail else "")
        self.examples.setdefault(reason, [])
        if len(self.examples[reason]) < 3:
            self.examples[reason].append(message)
        if n <= self.warn_first or n % self.warn_every == 0:
            log.warning("skipped %s #%d: %s", self.what, n, message)
        self.check()

    def check(self) -> None:
        seen = self.good + self.skipped
        if seen >= self.min_seen and self.skipped / seen > self.max_bad_fraction:
            raise CorruptDataError(
                f"{self.skipped} of {seen} {self.what} were bad (limit {self.max_bad_fraction:.0%}); "
                f"first problems: {'; '.join(e for ex in self.examples.values() for e in ex[:1])}")

    def summary(self) -> str:
        lines = [f"{self.good} {self.what} written, {self.skipped} skipped"]
        for reason, n in self.reasons.most_common():
            lines.append(f"  {n:>8} x {reason}, e.g. {self.examples[reason][0]}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"good": self.good, "skipped": dict(self.reasons),
                "examples": {k: v for k, v in self.examples.items()}}
