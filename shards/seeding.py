"""The one seeding scheme: every random stream of a run is a leaf of a `numpy.random.SeedSequence` tree rooted at
the configured seed and keyed by purpose, then by integers (rank, worker role, epoch, pool or batch index, image
index). SeedSequence hashes the whole key path, so two different paths give independent streams; the arithmetic
it replaces (`seed * prime + rank`, ...) collided across runs and purposes (seed 1 rank 0 drew what seed 0 rank 1
drew). It lives on the lowest floor that draws training randomness (the readers' shard order and shuffle
buffers); the runtime, the trainers and the demo corpus take their seeds from here too."""

from __future__ import annotations

import random

import numpy as np
import torch

# A purpose is a fixed position in this tuple, not a hash of its name: renaming one keeps its streams, and a
# misspelt purpose is an error instead of a silent new stream. Append only: a new purpose at the end keeps
# every existing stream.
PURPOSES = (
    "torch global",       # each rank's torch RNG (dropout, weights drawn before DeepSpeed broadcasts rank 0's)
    "shard order",        # the epoch's shuffle of the shard list, before it is split by role
    "shuffle buffer",     # each role's shuffle buffer per epoch
    "length pool",        # the order of a length pool's batches
    "loader workers",     # the DataLoader's base seed for its workers
    "epoch order",        # a finetuning epoch's permutation of the examples
    "masking",            # the words and regions masked in one batch
    "size classifier",    # the Fast R-CNN size head's re-initialisation before its fit
    "demo world",         # one demo image's scene and captions
    "demo entities",      # one demo image's Flickr30k-Entities-style sentences
    "demo questions",     # one demo image's VQG questions
    "demo vqa",           # one demo image's VQA questions
    "demo vcr",           # one demo image's VCR items
    "demo refcoco",       # one demo image's referring expressions
    "demo retrieval",     # one demo image's retrieval captions
    "bench pools",        # bench/padding.py's length pools
    "image shuffle",      # the shuffled-image control's pairing of captions with images (shards/batching.py)
    "training images",    # the order a finetuning's `train_images` subset takes the training images in
    "demo vcr evidence",  # the other colours one demo image's VCR rationales cite (appended: an index is a stream)
    "demo refcoco relation",  # one demo image's relational referring expressions (appended)
    "detector view",      # one caption image's boxes as a detector sees them (shards/detector_view.py; appended)
)


def seed_for(seed: int, purpose: str, *keys: int) -> int:
    """A 63-bit seed for the stream (purpose, *keys) of the run seeded `seed`: fits torch's, numpy's and
    Python's seeding alike."""
    if purpose not in PURPOSES:
        raise ValueError(f"seeding: unknown purpose {purpose!r}; known: {', '.join(PURPOSES)}")
    if seed < 0 or any(k < 0 for k in keys):
        raise ValueError(f"seeding: seeds and keys are non-negative integers, got seed={seed}, keys={keys}")
    words = np.random.SeedSequence(int(seed), spawn_key=(PURPOSES.index(purpose), *map(int, keys)))
    hi, lo = (int(w) for w in words.generate_state(2, np.uint32))
    return ((hi << 32) | lo) >> 1


def torch_generator(seed: int, purpose: str, *keys: int, device: str | torch.device = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed_for(seed, purpose, *keys))


def python_rng(seed: int, purpose: str, *keys: int) -> random.Random:
    return random.Random(seed_for(seed, purpose, *keys))


def numpy_rng(seed: int, purpose: str, *keys: int) -> np.random.Generator:
    return np.random.default_rng(seed_for(seed, purpose, *keys))
