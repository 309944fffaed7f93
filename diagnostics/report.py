"""How every measuring command leaves its result: `<stem>.json` (everything, for scripts), `<stem>.md` (the
table people read) and the figures, side by side in one folder."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def write_report(out: Path, stem: str, data: dict, markdown: str,
                 figures: Callable[[], Path | list[Path] | None] | None = None) -> list[Path]:
    """Write `<out>/<stem>.json` and `<stem>.md`, then draw `figures()` (it writes under `out` and returns what it
    wrote); returns every path written, to be printed."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / f"{stem}.json", out / f"{stem}.md"]
    written[0].write_text(json.dumps(data, indent=1))
    written[1].write_text(markdown)
    drawn = figures() if figures is not None else None
    return written + (drawn if isinstance(drawn, list) else [drawn] if drawn is not None else [])
