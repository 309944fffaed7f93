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
    each batch where it is built (e.g. counts its real positions on the host)."""

    def __init__(self, data, micro_batch: int, seed: int, rank: int = 0, world: int = 1, num_workers: int = 0,
                 prepare=unchanged):
        self.data, self.micro, self.seed, self.rank, self.world = data, micro_batch, seed, rank, world
        self.prepare = prepare
        self.num_workers = num_workers
        self.epoch, self.position = 0, 0

    @property
    def batches_per_epoch(self) -> int:
        return max(1, len(self.data) // self.world // self.micro)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def _order(self) -> list[int]:
        g = torch_generator(self.seed, "epoch order", self.epoch)
        return torch.randperm(len(self.data), generator=g)[self.rank:: self.world].tolist()

    def __iter__(self):
        while True:
            order = self._order()
            batches = [order[k * self.micro: (k + 1) * self.micro]
                       for k in range(self.position, self.batches_per_epoch)]
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
