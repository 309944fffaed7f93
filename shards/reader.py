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

Modules, one stage each: `source` (shard listing and splitting, the tar stream, the shuffle buffer, the
resumable position), `decode` (record -> sample), `batching` (length-aware pools), `collate` (samples -> tensors),
and this one (the 1:1 mixed stream, the DataLoader around it, elastic positions). webdataset supplies the tar
iteration (`wds.tariterators`); its `shuffle`, `split_by_node`/`split_by_worker` and `WebLoader` stages are not
used because none of them can say where it stands: resuming through them means replaying the epoch from its
start (O(position)), or, for the shuffle buffer, losing which records it held. torch's DataLoader is used as is,
with its workers rotated on resume so that the next batch due comes first.
"""


from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .batching import _Batches
from .caption_inputs import expand_paths
from .collate import collate_captions, collate_text
from .decode import CaptionDecoder, caption_length, decode_text, text_length
from .seeding import torch_generator
from .skips import SkipLog
from .source import Residual, _Source, source_position
from .stream_config import StreamConfig


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
    """Yields batches of `caption_batch_size` caption samples and `text_batch_size` text samples.

    `shuffle_images` (a control for pretraining): each caption comes with the image of another caption sample of
    its length pool, any other with equal chance; batches are cut by the captions' own lengths, so they hold the
    same captions as without it. Drawn across the pool, not the batch: a batch's samples have about the same
    region count and orientation, which a caption would read off a batch neighbour's image."""

    def __init__(self, cfg: StreamConfig, rank: int | None = None, world_size: int | None = None,
                 transform=None, shuffle_images: bool = False):
        super().__init__()
        self.cfg = cfg
        self.transform = transform  # applied to each batch in the worker (e.g. pretraining's masking)
        self.shuffle_images = shuffle_images
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

        def source(urls, decode, name, size, length, shuffle_images=False):
            if not urls:
                return None
            skips = SkipLog(f"{name} samples", max_bad_fraction=cfg.max_bad_fraction, min_seen=cfg.min_seen)
            saved = state.get(name)
            if saved is not None and not isinstance(saved, dict):  # a position saved before length buckets
                saved = {"source": saved, "pool": 0, "done": 0}
            src = _Source(urls, role, parts, seed, cfg.shuffle_buffer, decode, skips, cfg.epochs,
                          source_position(saved["source"]) if saved else None)
            return _Batches(src, size, cfg.length_buckets, length, seed, saved, shuffle_images)

        captions = source(self.caption_urls, CaptionDecoder(cfg), "caption", cfg.caption_batch_size, caption_length,
                          self.shuffle_images)
        texts = source(self.text_urls, decode_text, "text", cfg.text_batch_size, text_length)
        cap_it = iter(captions) if captions else None
        txt_it = iter(texts) if texts else None
        k = state.get("k", -1) + 1

        def skips():
            return {n: s.source.skips.as_dict() for n, s in (("caption", captions), ("text", texts)) if s}

        while True:
            caps = next(cap_it, []) if cap_it else []
            txts = next(txt_it, []) if txt_it else []
            if (cap_it and not caps) or (txt_it and not txts):
                # A finite stream (epochs set) ran out. Samples skipped after the last batch reach the
                # loader's counts only through this record: it carries no batch.
                yield {"end_of_pass": worker_role, "skips": skips()}
                return
            batch = {"index": k * workers + worker_role,
                     "state": {"k": k, "worker_role": worker_role,
                               "caption": captions.state if captions else None,
                               "text": texts.state if texts else None},
                     "skips": skips()}
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
                 pin_memory: bool = False, prefetch_factor: int = 2, transform=None, shuffle_images: bool = False):
        self.cfg = cfg
        self.dataset = MixedStream(cfg, rank, world_size, transform, shuffle_images)
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
        generator = torch_generator(self.cfg.seed, "loader workers", self.dataset.rank)
        loader = DataLoader(self.dataset, batch_size=None, num_workers=workers, pin_memory=self.pin_memory,
                            prefetch_factor=self.prefetch_factor if workers > 0 else None,
                            persistent_workers=False, generator=generator,
                            worker_init_fn=ignore_stop_signals if workers > 0 else None)
        for batch in worker_batches(loader):
            if "end_of_pass" in batch:
                self.skips[batch["end_of_pass"]] = batch["skips"]
                continue
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
