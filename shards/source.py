"""Shard listing, splitting and the resumable position of one source (captions or text) for one role (a rank x
dataloader worker): the epoch-seeded shard order, the role's share of it, webdataset's tar iterator over those
shards, a seeded shuffle buffer of undecoded records, and a position that names the shard and member the
stream stands at plus the buffered records' (shard, member), so a resume reads only the shards in flight.
`Residual`: what the roles of another world size left of an epoch, dealt over the new roles (elastic resume)."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import webdataset as wds

from .seeding import python_rng
from .skips import SkipLog


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
        python_rng(self.seed, "shard order", epoch).shuffle(order)
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
            self._rng = python_rng(self.seed, "shuffle buffer", epoch, self.role)
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
