"""Resume cost of the shard reader: how long a restored `StreamLoader` takes to its first batch when the
checkpoint was written at 10% of an epoch against 90%, on a corpus of 120 shards; the peer is the same
restore from the older position form, (epoch, records pulled), which replays the epoch's tar records up
to the position. Each figure is the median of several restores (and the tar records each reads).

    python -m bench.resume [--shards 120] [--per-shard 40] [--repeats 5] [--write]
"""

from __future__ import annotations

import io
import json
import statistics
import tarfile
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import webdataset as wds
from PIL import Image

from shards.reader import StreamConfig, StreamLoader

from .report import bench_parser, machine, median_range, update_section


def write_corpus(root: Path, shards: int, per_shard: int) -> str:
    """Caption shards in the reader's format (jpg + json per sample), small images: the cost measured is
    reading tars, not decoding."""
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, format="JPEG", quality=90)
    jpg = buf.getvalue()
    for s in range(shards):
        with tarfile.open(root / f"cap-{s:04d}.tar", "w") as tar:
            for i in range(per_shard):
                key = f"{s * per_shard + i:08d}"
                meta = json.dumps({"caption": f"caption {key}", "width": 64, "height": 48,
                                   "boxes": [[1.0, 2.0, 30.0, 20.0]], "classes": [1], "scores": [0.9]}).encode()
                for name, data in ((f"{key}.jpg", jpg), (f"{key}.json", meta)):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return str(root / f"cap-{{0000..{shards - 1:04d}}}.tar")


def legacy(state: dict) -> dict:
    """The loader state in the pre-O(1) form: each source position as (epoch, records pulled), which a loader
    restores by replaying the epoch up to it."""
    state = json.loads(json.dumps(state))
    for role in state["role_states"].values():
        for name in ("caption", "text"):
            if role.get(name):
                src = role[name]["source"]
                role[name]["source"] = [src["epoch"], src["pulled"]]
    return state


@contextmanager
def counting_tar_reads():
    """Within it, webdataset's tar stage counts the records it yields: `with counting_tar_reads() as reads:`,
    then `reads[0]` (set it to 0 before the read measured)."""
    reads = [0]
    tar_samples = wds.tarfile_to_samples

    def counting(*args, **kwargs):
        stage = tar_samples(*args, **kwargs)

        def counted(src):
            for record in stage(src):
                reads[0] += 1
                yield record
        return counted

    wds.tarfile_to_samples = counting
    try:
        yield reads
    finally:
        wds.tarfile_to_samples = tar_samples


def main(argv=None) -> int:
    p = bench_parser(__doc__, repeats=5)
    p.add_argument("--shards", type=int, default=120)
    p.add_argument("--per-shard", type=int, default=40)
    args = p.parse_args(argv)
    results: dict[tuple[str, int], list[float]] = {}
    records: dict[tuple[str, int], int] = {}
    with tempfile.TemporaryDirectory() as tmp, counting_tar_reads() as reads:
        cfg = StreamConfig(caption_shards=write_corpus(Path(tmp), args.shards, args.per_shard), text_batch_size=0,
                           caption_batch_size=8, short_side=0, num_workers=0, shuffle_buffer=256)
        epoch = args.shards * args.per_shard // cfg.caption_batch_size
        for fraction in (0.1, 0.9):
            stop = int(fraction * epoch)
            first = StreamLoader(cfg)
            it = iter(first)
            for _ in range(stop):
                next(it)
            states = {"ours": first.state_dict(), "replay": legacy(first.state_dict())}
            for form, state in states.items():
                for _ in range(args.repeats):
                    resumed = StreamLoader(cfg)
                    resumed.load_state_dict(state)
                    reads[0] = 0
                    t0 = time.perf_counter()
                    next(iter(resumed))
                    results.setdefault((form, stop), []).append(time.perf_counter() - t0)
                    records[form, stop] = reads[0]
    stops = sorted({s for _, s in results})
    med = {k: statistics.median(v) for k, v in results.items()}
    lines = []
    for form, name in (("ours", "O(1) position (shards of the buffer)"), ("replay", "older (epoch, pulled): replay")):
        row = [f"{median_range([x * 1000 for x in results[form, s]])} ms, {records[form, s]} records" for s in stops]
        lines.append(f"| {name} | {' | '.join(row)} | {med[form, stops[1]] / med[form, stops[0]]:.2f} |")
    body = f"""
### Resume cost of the shard reader (`python -m bench.resume`)

Time from a restored `StreamLoader` to its first batch (median and range of {args.repeats} restores) and the tar
records it reads, for a checkpoint written at 10% and at 90% of an epoch of {args.shards} caption shards x
{args.per_shard} samples (batch {cfg.caption_batch_size}, shuffle buffer {cfg.shuffle_buffer}). Machine: {machine()}.

| position form | at 10% ({stops[0]} batches) | at 90% ({stops[1]} batches) | 90% / 10% |
|---|---|---|---|
{chr(10).join(lines)}
"""
    print(body)
    if args.write:
        update_section("resume", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
