"""Length-aware batching: each role reads a pool of `length_buckets` batches' samples, sorts it by length, cuts
it into batches of neighbours and hands those out in a seeded random order; its position is the pool's start
plus the batches of it already delivered. Every sample is seen once per epoch; only padding shrinks."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator

from .seeding import python_rng
from .source import _Source, source_position


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


CAPTION_SIDE = ("key", "input_ids")  # of a caption sample; every other field is its image's


def paired_with_other_images(samples: list[dict], rng: random.Random) -> list[dict]:
    """Each caption sample's caption with the image side (pixels or features, boxes, classes, scores) of another
    sample of the list: one random cycle through all of them, so none keeps its own image and its partner is any
    other sample with equal chance."""
    n = len(samples)
    if n < 2:
        raise ValueError(f"pairing captions with other images needs at least 2 samples in a pool, got {n}")
    cycle = list(range(n))
    rng.shuffle(cycle)
    partner = {cycle[j]: cycle[(j + 1) % n] for j in range(n)}
    return [{**samples[partner[i]], **{k: samples[i][k] for k in CAPTION_SIDE}} for i in range(n)]


class _Batches:
    """A source's samples as batches: `size` at a time, or (pool > 1) length-grouped pools of `pool` batches.
    `state` is where a restarted role resumes: the source position of the current pool's start, the
    pool's number and how many of its batches were delivered; inside a pool also what a different world size
    needs to re-deal it (`elastic_positions`): the records of its batches not yet delivered and the source
    position after it was filled. `shuffle_images`: each caption is handed out with another sample's image from its
    pool (`paired_with_other_images`), batched by its own lengths, so its batch's captions are the unpaired run's."""

    def __init__(self, source: _Source, size: int, pool: int, length, seed: int, state: dict | None,
                 shuffle_images: bool = False):
        self.source, self.size, self.pool, self.length, self.seed = source, size, max(1, pool), length, seed
        self.shuffle_images = shuffle_images
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
                rng = python_rng(self.seed, "length pool", self.source.role, self.pool_index)
                groups = length_groups([self.length(s) for s in samples], self.size, rng)
            else:
                groups = [list(range(len(samples)))]
            self._group_keys = [[keys[i] for i in group] for group in groups]
            if self.shuffle_images:
                samples = paired_with_other_images(
                    samples, python_rng(self.seed, "image shuffle", self.source.role, self.pool_index))
            for group in groups[self.done:]:
                self.done += 1
                if self.done == len(groups):  # the pool is used up: resume after it
                    self.start, self.pool_index, self.done = self.source.state, self.pool_index + 1, 0
                yield [samples[i] for i in group]
