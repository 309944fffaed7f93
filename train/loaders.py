"""Epochs over an in-memory dataset (`__len__` and `batch(indices) -> dict`), for the trainers that read
files rather than shards (the finetune tasks, the detector warm-up): a seeded, resumable order per epoch
split across ranks, and the evaluation pass in order."""

from __future__ import annotations

import torch
from tqdm import tqdm

from shards.reader import ignore_stop_signals, worker_batches
from shards.seeding import torch_generator


def unchanged(batch: dict) -> dict:
    return batch


class _Batches(torch.utils.data.Dataset):
    def __init__(self, data, batches: list[list[int]], prepare):
        self.data, self.batches, self.prepare = data, batches, prepare

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, k):
        return self.prepare(self.data.batch(self.batches[k]))


class EpochLoader:
    """Epochs over a dataset with `__len__` and `batch(indices) -> dict`: a seeded permutation per epoch,
    split across ranks, with a resumable position (the engine checkpoints `state_dict()`). With workers,
    batches are built (images decoded) in background processes, in the same order. `prepare(batch)` finishes
    each batch where it is built (e.g. counts its real positions on the host).

    `groups` (one key per item, e.g. an image's orientation): every global batch (all ranks' micro-batches of one
    step) holds items of one group, as Detectron's aspect-ratio grouping: a batch is filled in the epoch's order
    from its group's items and leaves when full, and what an epoch leaves unfilled is dropped. Images of one
    orientation pad to far fewer pixels than a mixed batch (the demo's warm-up: 0.82 of the padded pixels real,
    against 0.55). Without groups, global batch k is the permutation's k-th run of micro x world items."""

    def __init__(self, data, micro_batch: int, seed: int, rank: int = 0, world: int = 1, num_workers: int = 0,
                 prepare=unchanged, groups: list | None = None):
        self.data, self.micro, self.seed, self.rank, self.world = data, micro_batch, seed, rank, world
        self.prepare = prepare
        self.num_workers = num_workers
        if groups is not None and len(groups) != len(data):
            raise ValueError(f"EpochLoader: {len(groups)} group keys for {len(data)} items")
        self.groups = groups
        self.epoch, self.position = 0, 0

    @property
    def batches_per_epoch(self) -> int:
        return len(self._global_batches())  # grouped, an epoch's count does not depend on its order

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def _global_batches(self) -> list[list[int]]:
        """The epoch's global batches, each micro x world items in rank order (rank r takes items r, r + world, ...)."""
        g = torch_generator(self.seed, "epoch order", self.epoch)
        order = torch.randperm(len(self.data), generator=g).tolist()
        size = self.micro * self.world
        if self.groups is None:
            batches = [order[k * size: (k + 1) * size] for k in range(len(order) // size)]
        else:
            filling: dict = {}
            batches = []
            for i in order:
                pool = filling.setdefault(self.groups[i], [])
                pool.append(i)
                if len(pool) == size:
                    batches.append(pool)
                    filling[self.groups[i]] = []
        return batches or [order]  # fewer items than one batch: they are the epoch's one batch

    def __iter__(self):
        while True:
            batches = [b[self.rank:: self.world] for b in self._global_batches()[self.position:]]
            if self.num_workers > 0:
                source = worker_batches(torch.utils.data.DataLoader(
                    _Batches(self.data, batches, self.prepare), batch_size=None, num_workers=self.num_workers,
                    worker_init_fn=ignore_stop_signals))
            else:
                source = (self.prepare(self.data.batch(b)) for b in batches)
            for batch in source:
                self.position += 1
                yield batch
            self.epoch, self.position = self.epoch + 1, 0


def eval_batches(data, batch_size: int, limit: int = 0, desc: str = "evaluate", prepare=unchanged):
    n = len(data) if not limit else min(limit, len(data))
    for start in tqdm(range(0, n, batch_size), desc=desc, unit="batch"):
        idx = list(range(start, min(n, start + batch_size)))
        yield idx, prepare(data.batch(idx))
