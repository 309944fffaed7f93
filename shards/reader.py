"""Streaming readers: WebDataset shards -> mixed caption/text batches, resumable exactly.

Shape of the pipeline (open_clip's, made resumable):
  shard list --(epoch-seeded shuffle, split by rank and dataloader worker)--> tar records
  (webdataset's tar iterator) --> shuffle buffer (seeded) --> decode + resize --> 1:1 batches.

Splitting: every (rank, worker) pair is a *role*. With at least as many shards as roles, each role
reads its own shards; with fewer, every role reads all shards and keeps every n-th record, so ranks
still see disjoint data (a tiny demo corpus on 2 ranks x 2 workers works).

Exact resume in O(1): a role's position names the shard and member its tar stream stands at, the
records in its shuffle buffer by (shard, member) and the buffer's random state. Records are shuffled
before decoding, so a restored role reads again only the shards its buffered records and its cursor
lie in (a few, whatever the position in the epoch), decoding nothing, and continues with the identical
shuffle state (`bench/resume.py`: the cost at 90% of an epoch against 10%). A position saved in the
older form, (epoch, records pulled), replays the epoch's records up to it. Batches are numbered
`k * workers + worker`; the DataLoader delivers them in that order, and on resume its workers are
rotated so that worker 0 produces the next batch due.

Resume on another world size or worker count (`StreamLoader.load_elastic`, `elastic_positions`): the old
roles' positions say what each had not delivered; that residual is pooled, dealt over the new roles and read
once (in shard order), then the next epoch is split the new way.

Length-aware batching (`length_buckets` > 1): each role reads a pool of that many batches' samples,
sorts it by length (caption: image orientation, regions, then words; text: word-pieces), cuts it into
batches of neighbours and hands those out in a seeded random order. Every sample is still seen exactly
once per epoch and computes the same thing (attention masks make a sample's outputs independent of its
batch's padding); only padding shrinks. A role's position is then the pool's start plus the batches of it
already delivered.
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import math
import multiprocessing
import os
import random
import re
import signal
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import webdataset as wds
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.v2 import functional as TF

from .caption_inputs import expand_paths
from .skips import SkipLog
from .tokenizer import load_tokenizer


@dataclass
class StreamConfig:
    caption_shards: str = ""  # caption shard paths: globs or brace patterns, comma-separated
    text_shards: str = ""  # text-only shard paths; empty = caption batches only
    caption_batch_size: int = 4  # caption samples per batch (VL-BERT: 128 of 256)
    text_batch_size: int = 4  # text samples per batch; the ratio of the two is the mixing ratio
    shuffle_buffer: int = 256  # records held for shuffling, per role and source
    short_side: int = 600  # resize shorter image side to this (0 = keep the stored size) ...
    long_side: int = 1000  # ... unless the longer side would exceed this (VL-BERT: 600 / 1000)
    size_divisibility: int = 32  # pad batch images to a multiple of this
    max_regions: int = 100  # keep at most this many boxes per image (highest scores)
    tokenizer: str | None = None  # local BERT tokenizer dir; None = packaged all-MiniLM-L6-v2
    seed: int = 0
    num_workers: int = 2
    epochs: int | None = None  # None = stream forever (pretraining); 1 = one pass (evaluation)
    length_buckets: int = 1  # > 1: batch similar lengths together within pools of this many batches
    max_bad_fraction: float = 0.5  # stop with an error when more records than this are bad ...
    min_seen: int = 50  # ... once at least this many were read by one role


def resize_scale(height: int, width: int, short_side: int, long_side: int) -> float:
    """Detectron/VL-BERT rule: shorter side to `short_side`, unless the longer one exceeds `long_side`."""
    scale = short_side / min(height, width)
    if max(height, width) * scale > long_side:
        scale = long_side / max(height, width)
    return scale


def resized_size(width: int, height: int, short_side: int, long_side: int) -> tuple[int, int]:
    """(new width, new height) by `resize_scale` (short_side 0 = keep the size)."""
    scale = resize_scale(height, width, short_side, long_side) if short_side > 0 else 1.0
    return max(1, round(width * scale)), max(1, round(height * scale))


def _box_scale(w: int, h: int, nw: int, nh: int) -> torch.Tensor:
    return torch.tensor([nw / w, nh / h, nw / w, nh / h])


def load_resized(pil, short_side: int, long_side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A PIL image -> uint8 [3, H, W] resized by `resize_scale` (0 = keep), and the [4] factor that maps
    its pixel boxes (x1, y1, x2, y2) onto the resized image. From a file or bytes, `decode_resized` is
    faster for JPEGs."""

    w, h = pil.size
    nw, nh = resized_size(w, h, short_side, long_side)
    if nw < w / 2:
        pil.draft("RGB", (nw, nh))  # JPEG: decode at a reduced DCT scale, far cheaper than full size
    pil = pil.convert("RGB")
    if pil.size != (nw, nh):
        pil = pil.resize((nw, nh), Image.BILINEAR, reducing_gap=None)
    image = torch.from_numpy(np.array(pil)).permute(2, 0, 1)  # [3, H, W] uint8
    return image, _box_scale(w, h, nw, nh)


@functools.cache
def _torchvision_jpeg():
    """torchvision's JPEG decoder, or None where a torchvision release no longer has it (0.29 deprecates
    its image codecs in favour of TorchCodec): then PIL decodes."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
    except ImportError:
        return None
    return decode_jpeg


def decode_resized(data: bytes, short_side: int, long_side: int) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """Encoded image bytes -> (uint8 [3, H, W] resized as `load_resized` does, the box scale [4], the original
    (width, height)). JPEGs go through torchvision's libjpeg-turbo decoder and its uint8 antialiased
    resize, about 9x faster than PIL's decode + convert + resize on the demo images with the same pixels up
    to rounding; strong downscales (< 1/2) keep PIL's reduced-size DCT decode, other formats PIL."""

    pil = Image.open(io.BytesIO(data))  # reads the header only
    w, h = pil.size
    nw, nh = resized_size(w, h, short_side, long_side)
    fast = pil.format == "JPEG" and pil.mode in ("RGB", "L") and nw >= w / 2
    decode_jpeg = _torchvision_jpeg() if fast else None
    if decode_jpeg is None:
        image, box_scale = load_resized(pil, short_side, long_side)
        return image, box_scale, (w, h)

    with warnings.catch_warnings():  # the deprecation notice comes with every call
        warnings.simplefilter("ignore", DeprecationWarning)
        image = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    if (nw, nh) != (w, h):
        image = TF.resize(image, [nh, nw], interpolation=TF.InterpolationMode.BILINEAR, antialias=True)
    return image, _box_scale(w, h, nw, nh), (w, h)


# --- one source (captions or text) for one role ------------------------------------------------------

def source_position(saved) -> dict | tuple[int, int]:
    """A saved source position: the current dict, or the (epoch, records pulled) pair of older checkpoints."""
    return saved if isinstance(saved, dict) else tuple(saved)


class Residual:
    """What roles of an earlier world size left of their epochs, for a new world's roles to read once.

    `records`: single records [url, member] (those that sat in a shuffle buffer or an undelivered length
    pool). `units`: [urls, member, filters], the records of `urls` read in order from `member` of the first,
    kept where every filter [parts, role, count] passes in turn (count % parts == role; each filter's count runs
    over the records that passed the filters before it). A role's unread shards are units without filters;
    the fewer-shards-than-roles split is one unit over all shards with its role's filter. Reading consumes the
    residual, so `state()` is always what is left: a checkpoint inside it resumes exactly, or re-deals it again.
    Records are read shard by shard in the order given, not shuffled: the residual is the tail of one epoch."""

    def __init__(self, records: list | None = None, units: list | None = None):
        self.records: list[list] = records if records is not None else []
        self.units: list[list] = units if units is not None else []

    def copy(self) -> Residual:
        return Residual([[u, j] for u, j in self.records],
                        [[list(urls), member, [list(f) for f in filters]] for urls, member, filters in self.units])

    def state(self) -> dict:
        return self.copy().__dict__

    @classmethod
    def from_state(cls, state: dict) -> Residual:
        return cls(state["records"], state["units"]).copy()

    def __bool__(self) -> bool:
        return bool(self.records or self.units)

    def read(self, shard) -> Iterator[tuple[dict, list]]:
        """(record, [url, member]) for each record left; `shard(url)` iterates a shard's records."""
        while self.records:
            url = self.records[0][0]
            wanted = {j for u, j in self.records if u == url}
            for j, record in enumerate(shard(url)):
                if j in wanted:
                    self.records.remove([url, j])
                    wanted.discard(j)
                    yield record, [url, j]
                if not wanted:
                    break
            for j in wanted:  # gone from the shard: the shard changed since the checkpoint
                raise RuntimeError(f"resuming: record {j} of {url} is gone: the shards changed since the checkpoint")
        while self.units:
            urls, member, filters = self.units[0]
            while urls:
                for j, record in enumerate(shard(urls[0])):
                    if j < member:
                        continue
                    keep = True
                    for f in filters:
                        keep, f[2] = f[2] % f[0] == f[1], f[2] + 1
                        if not keep:
                            break
                    member = self.units[0][1] = j + 1
                    if keep:
                        yield record, [urls[0], j]
                urls.pop(0)
                member = self.units[0][1] = 0
            self.units.pop(0)

    def deal(self, parts: int, role: int) -> Residual:
        """This role's share when `parts` roles split the residual: every parts-th record, and every parts-th
        unit, or, with fewer units than roles, every unit with a filter keeping every parts-th of its records."""
        share = self.copy()
        share.records = share.records[role::parts]
        if len(share.units) >= parts:
            share.units = share.units[role::parts]
        else:
            for unit in share.units:
                unit[2].append([parts, role, 0])
        return share


class _Source:
    """A role's deterministic record stream over one shard set, with a resumable position.

    The position (`state`) names where the tar stream stands (the shard of the role's order and the member in
    it, plus the count of records read, which the fewer-shards-than-roles split keys on), the records in the
    shuffle buffer by (shard, member) in buffer order, and the buffer's random state. A restored role reads
    again only the shards those records and the cursor lie in: the buffer holds `buffer` records, each leaving
    it with probability 1/buffer per draw, so they come from the last few buffers' worth of records, whatever
    the position in the epoch (O(1) in the epoch, not O(position)). A position saved before this form,
    (epoch, records pulled), still resumes by replaying the epoch's records up to it."""

    def __init__(self, urls: list[str], role: int, parts: int, seed: int, buffer: int, decode, skips: SkipLog,
                 epochs: int | None, state: tuple[int, int] | dict | None):
        self.urls, self.role, self.parts, self.seed, self.buffer = urls, role, parts, seed, buffer
        self.decode, self.skips, self.epochs = decode, skips, epochs
        self._bad_tars: set[str] = set()  # shards reported unreadable in this pass
        self.replay_to = 0  # a legacy position: records of the epoch to replay before yielding
        self.restore: dict | None = None  # a position to restore the buffer from
        # the records an earlier world left of its epochs, read before `epoch` (see `elastic_positions`)
        self.residual: Residual | None = None
        self.last_key: list | None = None  # [url, member] of the record behind the last sample yielded
        if isinstance(state, dict):
            self.epoch, self.pulled = state["epoch"], state["pulled"]
            self.restore = state if state.get("rng") is not None else None
            if state.get("residual") is not None:
                self.residual = Residual.from_state(state["residual"])
        else:
            self.epoch, self.pulled = state if state is not None else (0, 0)
            self.replay_to = self.pulled
        self._reset()

    def _reset(self) -> None:
        self._buf: list[dict] = []
        self._keys: list[tuple[int, int]] = []  # (shard position, member) of each buffered record
        self._cursor = (0, 0, 0)  # next record: shard position, member in it, records read before it
        self._draining = False  # the epoch's records are all read: the buffer empties in its final order
        self._rng: random.Random | None = None

    @property
    def state(self) -> dict:
        rng = self._rng.getstate() if self._rng is not None else None
        return {"epoch": self.epoch, "pulled": self.pulled, "cursor": list(self._cursor),
                "buffer": [list(k) for k in self._keys], "draining": self._draining,
                "rng": None if rng is None else [rng[0], list(rng[1]), rng[2]],
                "residual": None if self.residual is None else self.residual.state()}

    @property
    def started(self) -> bool:
        """Whether the role has read anything of its current epoch."""
        return self.restore is not None or self._rng is not None or self.pulled > 0

    def left(self, newest: int) -> Residual:
        """What this role has not delivered of the epochs up to `newest`, after its residual if it is still in
        one: of its current epoch, the records in its buffer and the rest of its tar stream; of any later epoch
        up to `newest` (a role fallen behind the others), its whole share."""
        left = self.residual.copy() if self.residual is not None else Residual()
        last = newest if self.epochs is None else min(newest, self.epochs - 1)
        for epoch in range(self.epoch, last + 1):
            mine, by_shard = self._order(epoch)
            pos, member, count, draining = 0, 0, 0, False
            if epoch == self.epoch and self.started:
                if self.restore is None and self._rng is None:
                    raise ValueError(f"role {self.role}: a position saved as (epoch, records pulled) names no "
                                     "records; resume it once on the same world size, then change the world size")
                saved = self.restore or {"buffer": self._keys, "cursor": self._cursor, "draining": self._draining}
                left.records += [[mine[p], j] for p, j in saved["buffer"]]
                (pos, member, count), draining = saved["cursor"], saved["draining"]
            if draining:
                continue
            if by_shard:
                left.units += [[[url], member if i == pos else 0, []] for i, url in enumerate(mine) if i >= pos]
            else:
                left.units.append([mine[pos:], member, [[self.parts, self.role, count]]])
        return left

    def _handler(self, exn: Exception) -> bool:
        # A tar cut inside a member's data fails twice in webdataset: in the member loop (the message names the
        # open file, "... @ <_io.BufferedReader name='...'>") and then at the shard level (the url in args).
        # Both name one shard: it is counted and reported once per pass.
        message = str(exn.args[0]) if exn.args else str(exn)
        url = next((a for a in reversed(exn.args) if isinstance(a, str) and a.endswith(".tar")), None)
        if url is None:
            named = re.search(r"name='([^']+)'", message)
            url = named.group(1) if named else "?"
        if url != "?" and url in self._bad_tars:
            return True
        self._bad_tars.add(url)
        self.skips.skip("unreadable or truncated tar", str(url), f"{type(exn).__name__}: {message.split(' @ <')[0]}")
        return True

    def _order(self, epoch: int) -> tuple[list[str], bool]:
        order = list(self.urls)
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        by_shard = len(order) >= self.parts
        return (order[self.role::self.parts] if by_shard else order), by_shard

    def _shard(self, url: str) -> Iterator[dict]:
        return wds.tarfile_to_samples(handler=self._handler)(iter([{"url": url}]))

    def _read(self, mine: list[str], by_shard: bool, cursor: tuple[int, int, int]) -> Iterator[dict]:
        """The role's records from `cursor` on, each followed by the cursor after it. With fewer shards than
        roles every role reads every shard and keeps the records whose running count is its own."""
        shard, member, count = cursor
        for pos in range(shard, len(mine)):
            for j, record in enumerate(self._shard(mine[pos])):
                if pos == shard and j < member:
                    continue  # read before the position: counted in `count` already
                mine_too = by_shard or count % self.parts == self.role
                count += 1
                self._cursor = (pos, j + 1, count)
                if mine_too:
                    yield record

    def _restore(self, mine: list[str], saved: dict) -> None:
        """The buffer and random state of a saved position, reading only the shards its records lie in."""
        keys = [tuple(k) for k in saved["buffer"]]
        wanted: dict[int, set[int]] = {}
        for pos, j in keys:
            wanted.setdefault(pos, set()).add(j)
        found: dict[tuple[int, int], dict] = {}
        for pos, members in sorted(wanted.items()):
            last = max(members)
            for j, record in enumerate(self._shard(mine[pos])):
                if j in members:
                    found[pos, j] = record
                if j >= last:
                    break
        missing = [k for k in keys if k not in found]
        if missing:
            raise RuntimeError(f"resuming role {self.role}: shard records {missing[:3]} of the saved shuffle buffer "
                               f"are gone ({mine[missing[0][0]]}): the shards changed since the checkpoint")
        self._keys, self._buf = keys, [found[k] for k in keys]
        self._cursor, self._draining = tuple(saved["cursor"]), saved["draining"]
        version, internal, gauss = saved["rng"]
        self._rng = random.Random()
        self._rng.setstate((version, tuple(internal), gauss))

    def _records(self, epoch: int) -> Iterator[dict]:
        self._bad_tars = set()
        mine, by_shard = self._order(epoch)
        if self.restore is not None:
            self._restore(mine, self.restore)
            self.restore = None
        else:
            self._reset()
            # Seeded shuffle buffer, before decoding: restoring it on resume costs tar reads only.
            self._rng = random.Random((self.seed * 1_000_003 + epoch) * 7919 + self.role)
        buf, keys, rng = self._buf, self._keys, self._rng
        if not self._draining:
            for record in self._read(mine, by_shard, self._cursor):
                buf.append(record)
                keys.append((self._cursor[0], self._cursor[1] - 1))  # the record's own shard and member
                if len(buf) >= self.buffer:
                    j = rng.randrange(len(buf))
                    buf[j], buf[-1] = buf[-1], buf[j]
                    keys[j], keys[-1] = keys[-1], keys[j]
                    pos, member = keys.pop()
                    yield buf.pop(), [mine[pos], member]
            order = list(range(len(buf)))
            rng.shuffle(order)
            # the rest in a shuffled order, kept as a stack (last = next) so a position inside it is the stack
            buf[:] = [buf[i] for i in reversed(order)]
            keys[:] = [keys[i] for i in reversed(order)]
            self._draining = True
        while buf:
            pos, member = keys.pop()
            yield buf.pop(), [mine[pos], member]

    def _decoded(self, record: dict, key: list) -> dict | None:
        where = f"{record.get('__url__', '?')}:{record.get('__key__', '?')}"
        try:
            sample = self.decode(record)
        except Exception as e:  # any bad member: count it, name it, go on
            self.skips.skip("undecodable sample", where, f"{type(e).__name__}: {e}")
            return None
        self.skips.ok()
        self.last_key = key
        return sample

    def __iter__(self) -> Iterator[dict]:
        if self.residual is not None:
            for record, key in self.residual.read(self._shard):
                sample = self._decoded(record, key)
                if sample is not None:
                    yield sample
            self.residual = None
        while self.epochs is None or self.epoch < self.epochs:
            n = self.pulled if self.replay_to == 0 else 0
            for record, key in self._records(self.epoch):
                n += 1
                if n <= self.replay_to:
                    continue  # a legacy position: replaying up to it
                self.pulled = n
                sample = self._decoded(record, key)
                if sample is not None:
                    yield sample
            self.replay_to = 0
            if n == 0:
                raise RuntimeError(f"role {self.role} of {self.parts} got no records from {len(self.urls)} "
                                   f"shard(s) ({self.urls[:2]}...): fewer samples than ranks x workers?")
            self.epoch, self.pulled = self.epoch + 1, 0
            self._reset()


def length_groups(lengths: list, size: int, rng: random.Random) -> list[list[int]]:
    """A pool's indices cut into batches of `size` samples of neighbouring length, batches shuffled.

    A length may be (regions, words), or (group, regions, words): a caption batch pads its regions and its
    words separately, to their own maxima, so the pool is sorted by (group,) regions, cut into about
    sqrt(batches) runs, and each run sorted by (group,) words before it is cut into batches (on 10..100
    regions this halves the padding of sorting by the sum). The group (image orientation) stays together."""
    n = len(lengths)
    if n and isinstance(lengths[0], (tuple, list)):
        by_first = sorted(range(n), key=lambda i: (tuple(lengths[i][:-1]), i))
        run = size * max(1, round(math.sqrt(math.ceil(n / size))))
        order = [i for s in range(0, n, run)
                 for i in sorted(by_first[s: s + run], key=lambda i: (tuple(lengths[i][:-2]), lengths[i][-1], i))]
    else:
        order = sorted(range(n), key=lambda i: (lengths[i], i))
    groups = [order[j: j + size] for j in range(0, n, size)]
    rng.shuffle(groups)
    return groups


class _Batches:
    """A source's samples as batches: `size` at a time, or (pool > 1) length-grouped pools of `pool` batches.
    `state` is where a restarted role resumes: the source position of the current pool's start, the
    pool's number and how many of its batches were delivered; inside a pool also what a different world size
    needs to re-deal it (`elastic_positions`): the records of its batches not yet delivered and the source
    position after it was filled."""

    def __init__(self, source: _Source, size: int, pool: int, length, seed: int, state: dict | None):
        self.source, self.size, self.pool, self.length, self.seed = source, size, max(1, pool), length, seed
        state = state or {"source": source.state, "pool": 0, "done": 0}
        self.start, self.pool_index, self.done = source_position(state["source"]), state["pool"], state["done"]
        self._group_keys: list[list[list]] = []  # [url, member] of each sample of the pool's batches
        self._after: dict | None = None

    @property
    def state(self) -> dict:
        state = {"source": self.start, "pool": self.pool_index, "done": self.done}
        if self.done:
            state.update(pending=[key for group in self._group_keys[self.done:] for key in group], after=self._after)
        return state

    def __iter__(self) -> Iterator[list[dict]]:
        it = iter(self.source)
        while True:
            samples, keys = [], []
            for sample in itertools.islice(it, self.size * self.pool):
                samples.append(sample)
                keys.append(self.source.last_key)
            if not samples:
                return
            self._after = self.source.state
            if self.pool > 1:
                rng = random.Random((self.seed * 1_000_003 + self.source.role) * 7919 + self.pool_index)
                groups = length_groups([self.length(s) for s in samples], self.size, rng)
            else:
                groups = [list(range(len(samples)))]
            self._group_keys = [[keys[i] for i in group] for group in groups]
            for group in groups[self.done:]:
                self.done += 1
                if self.done == len(groups):  # the pool is used up: resume after it
                    self.start, self.pool_index, self.done = self.source.state, self.pool_index + 1, 0
                yield [samples[i] for i in group]


def caption_length(sample: dict) -> tuple[int, int, int]:
    """Sort key: orientation first (portrait 1, landscape or precomputed features 0), as Detectron's
    aspect-ratio grouping, so a batch does not pad landscape images to portrait height (half of a mixed
    batch's pixels, which the detector's backbone would run on); then regions, then words."""
    image = sample.get("image")
    portrait = int(image.shape[1] > image.shape[2]) if image is not None else 0
    return portrait, len(sample["boxes"]), len(sample["input_ids"])


def text_length(sample: dict) -> int:
    return len(sample["input_ids"])


# --- decoding ----------------------------------------------------------------------------------------

def kept_regions(scores: torch.Tensor, max_regions: int) -> torch.Tensor:
    """Indices of the regions a caption sample keeps: the highest scores first, ties in stored order."""
    return torch.argsort(scores, descending=True, stable=True)[:max_regions]


class CaptionDecoder:
    def __init__(self, cfg: StreamConfig):
        self.cfg = cfg

    def prepare(self) -> None:
        """Loads the tokenizer and the JPEG decoder (importing torchvision) now. Called in the training
        process before DataLoader workers fork, so they inherit both instead of each importing them at
        its first sample: 2-3 s per worker and per pass on 2 cores, longer than a pass of the demo loader."""
        _torchvision_jpeg()
        load_tokenizer(self.cfg.tokenizer)

    def __call__(self, record: dict) -> dict:
        """A caption sample: the resized image (uint8 [3, h, w]) with boxes in its pixels, or, for a
        features shard (`pretrain.features`), region_features [N, F] with boxes in the original image's
        pixels and image_hw (h, w) of that image."""
        cfg = self.cfg
        features = "feats.npy" in record
        for member in ("json",) if features else ("json", "jpg"):
            if member not in record:
                raise KeyError(f"missing member '{member}'")
        meta = json.loads(record["json"])
        visual: dict = {}
        if features:
            feats = torch.from_numpy(np.load(io.BytesIO(record["feats.npy"]), allow_pickle=False))
            if feats.ndim != 2 or len(feats) != len(meta["boxes"]):
                raise ValueError(f"feats.npy has shape {list(feats.shape)}, the JSON has {len(meta['boxes'])} boxes")
            visual = {"region_features": feats.float(), "image_hw": (meta["height"], meta["width"])}
            box_scale = torch.ones(4)
        else:
            image, box_scale, (w, h) = decode_resized(record["jpg"], cfg.short_side, cfg.long_side)
            if (meta["width"], meta["height"]) != (w, h):
                raise ValueError(f"JSON says {meta['width']}x{meta['height']}, image is {w}x{h}")
            # the resize factor: resampling spreads a box's pixels over a ring this wide around it (the masker)
            visual = {"image": image, "resize_scale": float(box_scale[:2].max())}
        boxes = torch.tensor(meta["boxes"], dtype=torch.float32).reshape(-1, 4) * box_scale
        scores = torch.tensor(meta["scores"], dtype=torch.float32)
        classes = torch.tensor(meta["classes"], dtype=torch.long)
        probs = None
        if "probs.npy" in record:
            probs = torch.from_numpy(np.load(io.BytesIO(record["probs.npy"])).astype(np.float16))
        if len(boxes) > cfg.max_regions:
            keep = kept_regions(scores, cfg.max_regions)
            boxes, scores, classes = boxes[keep], scores[keep], classes[keep]
            probs = probs[keep] if probs is not None else None
            if features:
                visual["region_features"] = visual["region_features"][keep]
        ids = load_tokenizer(cfg.tokenizer)(meta["caption"], add_special_tokens=False)["input_ids"]
        return {"key": record["__key__"], **visual, "boxes": boxes, "scores": scores,
                "classes": classes, "class_probs": probs, "input_ids": torch.tensor(ids, dtype=torch.long)}


def decode_text(record: dict) -> dict:
    meta = json.loads(record["json"])
    return {"key": record["__key__"], "input_ids": torch.tensor(meta["input_ids"], dtype=torch.long)}


# --- collation ---------------------------------------------------------------------------------------

def pad_ids(seqs: list[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    length = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = True
    return ids, mask


def batch_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor for a padded batch. In a DataLoader worker the batch goes to the trainer through
    shared memory: allocating it there (zero-filled by the OS), as `default_collate` does, saves copying it
    into a segment at send time (~2 MB per 600 x 1000 image)."""
    if torch.utils.data.get_worker_info() is None:
        return torch.zeros(shape, dtype=dtype)
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


def pad_images(images: list[torch.Tensor], size_divisibility: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [3, h, w] images -> [B, 3, H, W] (top-left aligned, zero padded to a multiple of the
    divisibility) and their sizes [B, 2] (h, w).

    The batch is channels-last in memory (`torch.channels_last`), the layout the decoders produce and
    the backbone runs in: each image row is one contiguous copy (30% less collation time than
    scattering into planes), and the detector has no layout conversion to make."""
    div = max(1, size_divisibility)
    hmax = math.ceil(max(im.shape[1] for im in images) / div) * div
    wmax = math.ceil(max(im.shape[2] for im in images) / div) * div
    out = batch_zeros((len(images), hmax, wmax, 3), torch.uint8)
    for i, im in enumerate(images):
        out[i, : im.shape[1], : im.shape[2]] = im.permute(1, 2, 0)
    return out.permute(0, 3, 1, 2), torch.tensor([list(im.shape[1:]) for im in images])


def collate_captions(samples: list[dict], size_divisibility: int = 32) -> dict:
    """Pads images (uint8, top-left aligned) or region features, boxes and words into batch tensors
    with masks."""
    b = len(samples)
    n = max(len(s["boxes"]) for s in samples)
    features = "region_features" in samples[0]
    if features != all("region_features" in s for s in samples):
        raise ValueError("a batch mixes samples with images and samples with precomputed features")
    if features:
        region_features = batch_zeros((b, n, samples[0]["region_features"].shape[1]), torch.float32)
        for i, s in enumerate(samples):
            region_features[i, : len(s["region_features"])] = s["region_features"]
        visual = {"region_features": region_features,  # [B, N, F]
                  "image_hw": torch.tensor([list(s["image_hw"]) for s in samples])}  # [B, 2] (h, w)
    else:
        images, image_sizes = pad_images([s["image"] for s in samples], size_divisibility)
        visual = {"images": images, "image_sizes": image_sizes,  # image_sizes [B, 2] (h, w)
                  "resize_scales": torch.tensor([s.get("resize_scale", 1.0) for s in samples])}  # [B]
    boxes = torch.zeros((b, n, 4))  # [B, N, 4] pixels of the resized image (of the original: features)
    box_mask = torch.zeros((b, n), dtype=torch.bool)
    classes = torch.full((b, n), -1, dtype=torch.long)
    scores = torch.zeros((b, n))
    with_probs = all(s["class_probs"] is not None for s in samples)
    probs = torch.zeros((b, n, samples[0]["class_probs"].shape[1]), dtype=torch.float16) if with_probs else None
    for i, s in enumerate(samples):
        k = len(s["boxes"])
        boxes[i, :k], box_mask[i, :k], classes[i, :k], scores[i, :k] = s["boxes"], True, s["classes"], s["scores"]
        if with_probs:
            probs[i, :k] = s["class_probs"]
    ids, mask = pad_ids([s["input_ids"] for s in samples])
    return {"keys": [s["key"] for s in samples], **visual,
            "boxes": boxes, "box_mask": box_mask, "box_classes": classes, "box_scores": scores,
            "class_probs": probs, "input_ids": ids, "attention_mask": mask}


def collate_text(samples: list[dict]) -> dict:
    ids, mask = pad_ids([s["input_ids"] for s in samples])
    return {"keys": [s["key"] for s in samples], "input_ids": ids, "attention_mask": mask}


# --- the mixed stream --------------------------------------------------------------------------------

def elastic_positions(states: list[dict], cfg: StreamConfig, rank: int, world_size: int) -> dict[int, dict]:
    """This rank's role positions when a loader saved by another world size (or worker count) resumes here.

    `states`: every old rank's `StreamLoader.state_dict()`. For each source, what the old roles had not
    delivered (single records from their length pools and shuffle buffers; their unread shards) is pooled into
    one `Residual` and dealt over the new roles; each new role reads its share, then goes on with the epoch
    after the newest any old role had started, split the new way. Roles read their shares at one pace and
    shares differ by up to a shard, so an old role may have fallen behind the others: its whole shares of the
    epochs between its own and the newest are in the residual too. No record of any epoch is read twice or
    skipped. What is not exact: the residual is read in shard order, unshuffled (the shuffle state belongs to
    the old roles), and the batches, so the losses, differ from what the old world would have made.
    """
    seeds = {s["seed"] for s in states}
    if seeds != {cfg.seed} or len(states) != states[0]["world_size"]:
        raise ValueError(f"elastic resume needs every old rank's loader state with this run's seed ({cfg.seed}): "
                         f"got {len(states)} states of {states[0]['world_size']} ranks, seeds {sorted(seeds)}")
    workers, old_workers = max(1, cfg.num_workers), states[0]["num_workers"]
    parts, old_parts = world_size * workers, len(states) * old_workers
    stream = MixedStream(cfg, rank, world_size)
    positions: dict[int, dict] = {wr: {"k": -1, "worker_role": wr} for wr in range(workers)}
    for name, urls in (("caption", stream.caption_urls), ("text", stream.text_urls)):
        if not urls:
            continue
        sources = []
        for state in sorted(states, key=lambda s: s["rank"]):
            for wr in range(old_workers):
                saved = state["role_states"].get(str(wr), state["role_states"].get(wr, {})).get(name)
                if saved is not None and not isinstance(saved, dict):  # a position saved before length buckets
                    saved = {"source": saved, "pool": 0, "done": 0}
                pending, position = [], None
                if saved is not None:
                    position = saved["source"]
                    if saved["done"]:
                        if "after" not in saved:
                            raise ValueError("elastic resume: this checkpoint's reader state predates it (no record "
                                             "of a length pool's undelivered batches); resume it on the same world "
                                             "size, then change the world size at a later checkpoint")
                        pending, position = saved["pending"], saved["after"]
                role = state["rank"] * old_workers + wr
                src = _Source(urls, role, old_parts, cfg.seed, cfg.shuffle_buffer, None, SkipLog(name), cfg.epochs,
                              source_position(position) if position is not None else None)
                sources.append((src, pending))
        newest = max(src.epoch if src.started else src.epoch - 1 for src, _ in sources)
        pooled = Residual()
        for src, pending in sources:
            left = src.left(newest)
            pooled.records += pending + left.records
            pooled.units += left.units
        for wr in range(workers):
            share = pooled.deal(parts, rank * workers + wr)
            position = {"epoch": newest + 1, "pulled": 0, "cursor": [0, 0, 0], "buffer": [], "draining": False,
                        "rng": None, "residual": share.state() if share else None}
            positions[wr][name] = {"source": position, "pool": 0, "done": 0}
    return positions


def _dist_rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()

    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class MixedStream(IterableDataset):
    """Yields batches of `caption_batch_size` caption samples and `text_batch_size` text samples."""

    def __init__(self, cfg: StreamConfig, rank: int | None = None, world_size: int | None = None,
                 transform=None):
        super().__init__()
        self.cfg = cfg
        self.transform = transform  # applied to each batch in the worker (e.g. pretraining's masking)
        if rank is None or world_size is None:
            rank, world_size = _dist_rank_world()
        self.rank, self.world_size = rank, world_size
        self.caption_urls = expand_paths(cfg.caption_shards) if cfg.caption_batch_size > 0 else []
        self.text_urls = expand_paths(cfg.text_shards) if cfg.text_batch_size > 0 else []
        if not self.caption_urls and not self.text_urls:
            raise ValueError("StreamConfig: neither caption_shards nor text_shards (with batch size > 0) given")
        self.role_states: dict[int, dict] = {}  # worker role -> state after its last delivered batch
        self.role_offset = 0

    def prepare(self) -> None:
        """Loads what decoding needs in this process (see `CaptionDecoder.prepare`)."""
        if self.caption_urls:
            CaptionDecoder(self.cfg).prepare()

    def _roles(self) -> tuple[int, int]:
        info = get_worker_info()
        workers = info.num_workers if info is not None else 1
        worker = info.id if info is not None else 0
        return (worker + self.role_offset) % workers, workers

    def __iter__(self) -> Iterator[dict]:
        cfg = self.cfg
        worker_role, workers = self._roles()
        role, parts = self.rank * workers + worker_role, self.world_size * workers
        state = self.role_states.get(worker_role, {})
        seed = cfg.seed

        def source(urls, decode, name, size, length):
            if not urls:
                return None
            skips = SkipLog(f"{name} samples", max_bad_fraction=cfg.max_bad_fraction, min_seen=cfg.min_seen)
            saved = state.get(name)
            if saved is not None and not isinstance(saved, dict):  # a position saved before length buckets
                saved = {"source": saved, "pool": 0, "done": 0}
            src = _Source(urls, role, parts, seed, cfg.shuffle_buffer, decode, skips, cfg.epochs,
                          source_position(saved["source"]) if saved else None)
            return _Batches(src, size, cfg.length_buckets, length, seed, saved)

        captions = source(self.caption_urls, CaptionDecoder(cfg), "caption", cfg.caption_batch_size, caption_length)
        texts = source(self.text_urls, decode_text, "text", cfg.text_batch_size, text_length)
        cap_it = iter(captions) if captions else None
        txt_it = iter(texts) if texts else None
        k = state.get("k", -1) + 1
        while True:
            caps = next(cap_it, []) if cap_it else []
            txts = next(txt_it, []) if txt_it else []
            if (cap_it and not caps) or (txt_it and not txts):
                return  # a finite stream (epochs set) ran out
            batch = {"index": k * workers + worker_role,
                     "state": {"k": k, "worker_role": worker_role,
                               "caption": captions.state if captions else None,
                               "text": texts.state if texts else None},
                     "skips": {n: s.source.skips.as_dict() for n, s in (("caption", captions), ("text", texts))
                               if s}}
            if caps:
                batch["caption"] = collate_captions(caps, cfg.size_divisibility)
            if txts:
                batch["text"] = collate_text(txts)
            yield self.transform(batch) if self.transform is not None else batch
            k += 1


def ignore_stop_signals(_worker_id: int) -> None:
    """DataLoader worker_init_fn: workers leave SIGTERM/SIGINT to the training process, which stops after
    its step and then shuts them down; a scheduler signalling the whole process group must not kill them
    mid-batch. Iterate such a loader with `worker_batches`, which stops them on every way out."""

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def worker_batches(loader: DataLoader) -> Iterator:
    """A DataLoader's batches, its workers stopped on any way out. Workers that ignore SIGTERM outlive an
    error: the error's traceback keeps the DataLoader's iterator alive, and at exit multiprocessing SIGTERMs
    its children and then waits on them forever, so the job hangs instead of failing. On an error (here, in
    a worker, or thrown in by the consumer) they are killed; closed or exhausted, they are shut down as usual."""

    before = {p.pid for p in multiprocessing.active_children()}
    batches = iter(loader)
    workers = [p for p in multiprocessing.active_children() if p.pid not in before]
    try:
        yield from batches
    except GeneratorExit:
        raise
    except BaseException:
        for p in workers:
            p.kill()
        raise
    finally:
        del batches


class StreamLoader:
    """DataLoader over a MixedStream whose position can be saved and restored exactly.

    `state_dict()` after n batches + `load_state_dict()` on a fresh loader (same config, ranks and
    workers) yields the same batch n+1, n+2, ... as the uninterrupted run.
    """

    def __init__(self, cfg: StreamConfig, rank: int | None = None, world_size: int | None = None,
                 pin_memory: bool = False, prefetch_factor: int = 2, transform=None):
        self.cfg = cfg
        self.dataset = MixedStream(cfg, rank, world_size, transform)
        self.pin_memory = pin_memory
        self.prefetch_factor = prefetch_factor
        self.next_index = 0
        self.role_states: dict[int, dict] = {}
        self.skips: dict[int, dict] = {}

    @property
    def workers(self) -> int:
        return max(1, self.cfg.num_workers)

    def state_dict(self) -> dict:
        return {"next_index": self.next_index, "num_workers": self.workers, "rank": self.dataset.rank,
                "world_size": self.dataset.world_size, "seed": self.cfg.seed,
                "role_states": {str(k): v for k, v in self.role_states.items()}}

    def load_state_dict(self, state: dict) -> None:
        for key, mine in (("num_workers", self.workers), ("world_size", self.dataset.world_size),
                          ("rank", self.dataset.rank), ("seed", self.cfg.seed)):
            if state[key] != mine:
                raise ValueError(f"loader state was saved with {key}={state[key]}, this run has {mine}: "
                                 f"exact resume needs the same {key}")
        self.next_index = state["next_index"]
        self.role_states = {int(k): v for k, v in state["role_states"].items()}

    def load_elastic(self, states: list[dict]) -> None:
        """Resume from the loader states of every rank of a run with another world size or worker count
        (`elastic_positions`); the same world and workers resume exactly through `load_state_dict`."""
        self.next_index = 0
        self.role_states = elastic_positions(states, self.cfg, self.dataset.rank, self.dataset.world_size)

    def __iter__(self) -> Iterator[dict]:
        self.dataset.role_states = dict(self.role_states)
        self.dataset.role_offset = self.next_index % self.workers
        workers = self.cfg.num_workers
        self.dataset.prepare()
        # Its own generator: the DataLoader's base-seed draw must not consume the global RNG, whose
        # state (dropout) an exact resume restores.
        generator = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + self.dataset.rank)
        loader = DataLoader(self.dataset, batch_size=None, num_workers=workers, pin_memory=self.pin_memory,
                            prefetch_factor=self.prefetch_factor if workers > 0 else None,
                            persistent_workers=False, generator=generator,
                            worker_init_fn=ignore_stop_signals if workers > 0 else None)
        for batch in worker_batches(loader):
            # Forever streams arrive strictly in order; a finite pass (epochs set) may not at its
            # end, where workers whose share ran out drop out of the rotation.
            if batch["index"] != self.next_index and self.cfg.epochs is None:
                raise RuntimeError(f"batch {batch['index']} arrived when {self.next_index} was due")
            state = batch.pop("state")
            self.skips[state["worker_role"]] = batch.pop("skips")
            self.role_states[state["worker_role"]] = state
            self.next_index = batch["index"] + 1
            yield batch

    # what the engine logs as data/skipped/<source>/<reason>: the same keys on every rank (summed over ranks)
    SKIP_REASONS = {"unreadable or truncated tar": "tar", "undecodable sample": "sample"}

    def skip_counts(self) -> dict[str, float]:
        """Skipped samples since this process started, by source and reason, under fixed keys."""
        slugs = [*self.SKIP_REASONS.values(), "other"]
        counts = {f"{source}/{slug}": 0.0 for source in ("caption", "text") for slug in slugs}
        for source, reasons in self.skip_summary().items():
            for reason, n in reasons.items():
                counts[f"{source}/{self.SKIP_REASONS.get(reason, 'other')}"] += n
        return counts

    def skip_summary(self) -> dict:
        """Skipped samples so far, summed over workers: {source: {reason: count}}."""
        total: dict[str, dict[str, int]] = {}
        for per_source in self.skips.values():
            for name, d in per_source.items():
                for reason, n in d["skipped"].items():
                    total.setdefault(name, {}).setdefault(reason, 0)
                    total[name][reason] += n
        return total
