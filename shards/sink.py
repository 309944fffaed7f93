"""Size-capped tar shard output with a manifest of sample counts per shard.

Each shard is written under a temporary name and renamed when closed, so a crashed writer never
leaves a truncated shard that looks complete; the manifest is written last.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import webdataset as wds


class ShardSink:
    def __init__(self, out_dir: str | Path, prefix: str, *, max_count: int = 10_000,
                 max_bytes: int = 1 << 30, kind: str, meta: dict | None = None):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.kind = kind
        self.meta = dict(meta or {})
        self.shards: list[dict] = []
        self._writer: wds.TarWriter | None = None
        self._count = 0
        self._bytes = 0

    def _open(self) -> None:
        name = f"{self.prefix}-{len(self.shards):06d}.tar"
        self._tmp = self.out_dir / f".{name}.partial"
        self._name = name
        self._stream = open(self._tmp, "wb")
        self._writer = wds.TarWriter(self._stream)
        self._count = 0
        self._bytes = 0

    def _close(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        os.replace(self._tmp, self.out_dir / self._name)
        self.shards.append({"name": self._name, "samples": self._count,
                            "bytes": (self.out_dir / self._name).stat().st_size})
        self._writer = None

    def write(self, sample: dict) -> None:
        """`sample` maps "__key__" and member extensions ("jpg", "json", "probs.npy") to bytes."""
        size = sum(len(v) for k, v in sample.items() if not k.startswith("__"))
        if self._writer is not None and (self._count >= self.max_count
                                         or (self._count and self._bytes + size > self.max_bytes)):
            self._close()
        if self._writer is None:
            self._open()
        self._writer.write(sample)
        self._count += 1
        self._bytes += size

    def close(self, skips: dict | None = None) -> dict:
        self._close()
        manifest = {"kind": self.kind, "total": sum(s["samples"] for s in self.shards),
                    "shards": self.shards, **self.meta}
        if skips is not None:
            manifest["skips"] = skips
        (self.out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
        return manifest
