import itertools
import json
from collections import Counter
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from bench.resume import counting_tar_reads, legacy
from shards.collate import collate_captions
from shards.decode import resize_scale
from shards.reader import StreamConfig, StreamLoader
from shards.skips import CorruptDataError

from .helpers import jpeg_bytes, write_caption_shard, write_text_shard


def caption_samples(start, n, w=40, h=30):
    return [{"key": f"{i:06d}", "caption": f"caption number {i}", "width": w, "height": h, "jpg": jpeg_bytes(w, h),
             "boxes": [[1.0, 2.0, 20.0, 12.0], [4.0, 4.0, 8.0, 30.0]], "classes": [1, 2], "scores": [0.9, 0.8],
             "probs": [[0.5, 0.5, 0.0], [0.1, 0.1, 0.8]]} for i in range(start, start + n)]


@pytest.fixture
def corpus(tmp_path):
    """5 caption shards of 6 samples and 3 text shards of 10 chunks."""
    for s in range(5):
        write_caption_shard(tmp_path / f"cap-{s}.tar", caption_samples(s * 6, 6))
    for s in range(3):
        write_text_shard(tmp_path / f"txt-{s}.tar", [[100 + s * 10 + i] * (5 + i) for i in range(10)], start=s * 10)
    return tmp_path


def cfg_for(root, **kw):
    base = dict(caption_shards=str(root / "cap-{0..4}.tar"), text_shards=str(root / "txt-*.tar"),
                caption_batch_size=2, text_batch_size=2, shuffle_buffer=4, short_side=0, num_workers=0)
    base.update(kw)
    return StreamConfig(**base)


def keys_of(loader, source):
    return [k for b in loader if source in b for k in b[source]["keys"]]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("pattern", ["cap-{0..4}.tar", "cap-0.tar"])  # by-shard and by-record split
def test_ranks_get_disjoint_data_covering_everything(corpus, workers, pattern):
    seen = []
    for rank in range(2):
        cfg = cfg_for(corpus, caption_shards=str(corpus / pattern), text_batch_size=0, epochs=1,
                      num_workers=workers, caption_batch_size=1)
        seen.append(keys_of(StreamLoader(cfg, rank=rank, world_size=2), "caption"))
    n = 30 if "{" in pattern else 6
    assert set(seen[0]).isdisjoint(seen[1])
    assert sorted(seen[0] + seen[1]) == [f"{i:06d}" for i in range(n)]


def test_every_batch_is_exactly_one_to_one(corpus):
    loader = StreamLoader(cfg_for(corpus, caption_batch_size=3, text_batch_size=3, num_workers=2))
    for _, batch in zip(range(12), loader, strict=False):
        assert len(batch["caption"]["keys"]) == 3 and len(batch["text"]["keys"]) == 3
        assert batch["text"]["input_ids"].shape[0] == batch["caption"]["images"].shape[0] == 3
    # other ratios come from the two batch sizes
    batch = next(iter(StreamLoader(cfg_for(corpus, caption_batch_size=1, text_batch_size=3))))
    assert (len(batch["caption"]["keys"]), len(batch["text"]["keys"])) == (1, 3)


@pytest.mark.parametrize("workers,stop", [(0, 5), (2, 5), (2, 8)])
def test_exact_resume(corpus, workers, stop):
    cfg = cfg_for(corpus, num_workers=workers)
    reference = [b for _, b in zip(range(stop + 6), StreamLoader(cfg), strict=False)]
    first = StreamLoader(cfg)
    for _, _b in zip(range(stop), first, strict=False):
        pass
    state = json.loads(json.dumps(first.state_dict()))  # survives serialisation
    resumed = StreamLoader(cfg)
    resumed.load_state_dict(state)
    for ref, got in zip(reference[stop:], resumed, strict=False):
        assert got["caption"]["keys"] == ref["caption"]["keys"] and got["text"]["keys"] == ref["text"]["keys"]
        assert torch.equal(got["caption"]["images"], ref["caption"]["images"])
        assert torch.equal(got["text"]["input_ids"], ref["text"]["input_ids"])
    with pytest.raises(ValueError, match="num_workers"):
        StreamLoader(cfg_for(corpus, num_workers=workers + 2)).load_state_dict(state)


def test_a_tar_cut_anywhere_is_reported_once_with_its_path(corpus, caplog):
    """Cut inside a member's data, webdataset raises twice for one shard (once naming the open file inside
    its message, once with the url): one skip, located at the shard, never at '?'."""
    import tarfile

    good = corpus / "cap-0.tar"
    with tarfile.open(good) as tar:
        members = tar.getmembers()
    first_jpg = next(m for m in members if m.name.endswith(".jpg"))
    last = members[-2]
    cuts = {"in the first image": first_jpg.offset_data + first_jpg.size // 2,
            "in a later member": last.offset_data + last.size // 2}
    for label, cut in cuts.items():
        caplog.clear()
        truncated = corpus / "trunc.tar"
        truncated.write_bytes(good.read_bytes()[:cut])
        # good shards after it in the seeded order: skip counts travel with the batches that follow
        shards = ",".join([str(truncated)] + [str(corpus / f"cap-{i}.tar") for i in range(1, 5)])
        loader = StreamLoader(cfg_for(corpus, caption_shards=shards, text_batch_size=0, caption_batch_size=1,
                                      epochs=1))
        keys_of(loader, "caption")
        assert loader.skip_summary()["caption"]["unreadable or truncated tar"] == 1, label
        reports = [r.getMessage() for r in caplog.records if "unreadable or truncated tar" in r.getMessage()]
        assert len(reports) == 1 and f"{truncated}: unreadable" in reports[0], (label, reports)


def test_corrupt_samples_are_skipped_and_counted(corpus, caplog):
    bad = caption_samples(100, 4)
    bad[1]["jpg"] = b"\xff\xd8 not really a jpeg"
    bad[2]["json_bytes"] = b"{broken json"
    write_caption_shard(corpus / "bad.tar", bad)
    good = corpus / "cap-0.tar"
    truncated = corpus / "trunc.tar"
    truncated.write_bytes(good.read_bytes()[:7000])
    cfg = cfg_for(corpus, caption_shards=f"{corpus / 'bad.tar'},{truncated},{good}", text_batch_size=0,
                  caption_batch_size=1, epochs=1)
    loader = StreamLoader(cfg)
    keys = keys_of(loader, "caption")
    assert "000101" not in keys and "000102" not in keys and {"000100", "000103"} <= set(keys)
    skipped = loader.skip_summary()["caption"]
    assert skipped["undecodable sample"] >= 2 and skipped["unreadable or truncated tar"] == 1
    counts = loader.skip_counts()  # what the engine logs as data/skipped/*: fixed keys, zeros included
    assert counts["caption/sample"] == skipped["undecodable sample"] and counts["caption/tar"] == 1
    assert counts["text/sample"] == 0 and counts["text/tar"] == 0
    assert "bad.tar:000101" in caplog.text and "trunc.tar" in caplog.text


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_skipped_after_the_last_batch_is_counted(tmp_path, workers):
    # The pass ends on a bad record: no batch follows to carry its count (it was lost before the end record).
    samples = caption_samples(0, 4)
    samples[3]["jpg"] = b"garbage"
    write_caption_shard(tmp_path / "end.tar", samples)
    cfg = StreamConfig(caption_shards=str(tmp_path / "end.tar"), text_batch_size=0, caption_batch_size=1,
                       num_workers=workers, epochs=1, shuffle_buffer=1, short_side=0)
    loader = StreamLoader(cfg)
    assert sorted(keys_of(loader, "caption")) == ["000000", "000001", "000002"]
    assert loader.skip_summary()["caption"] == {"undecodable sample": 1}


def test_mostly_bad_shards_stop_with_a_clear_error(tmp_path):
    samples = caption_samples(0, 30)
    for s in samples[:20]:
        s["jpg"] = b"garbage"
    write_caption_shard(tmp_path / "bad.tar", samples)
    cfg = StreamConfig(caption_shards=str(tmp_path / "bad.tar"), text_batch_size=0, caption_batch_size=2,
                       num_workers=0, min_seen=10, max_bad_fraction=0.5, shuffle_buffer=1)
    with pytest.raises(CorruptDataError, match="bad.tar"):
        keys_of(StreamLoader(cfg), "caption")


def test_resize_scales_boxes_with_the_image(corpus):
    cfg = cfg_for(corpus, short_side=60, long_side=1000, text_batch_size=0, num_workers=0)
    batch = next(iter(StreamLoader(cfg)))["caption"]
    # 40x30 image, shorter side 30 -> 60: scale 2 on both axes
    assert batch["image_sizes"][0].tolist() == [60, 80]
    assert batch["boxes"][0, 0].tolist() == [2.0, 4.0, 40.0, 24.0]
    assert batch["images"].shape[-2:] == (64, 96)  # padded to a multiple of 32
    assert resize_scale(300, 900, 600, 1000) == pytest.approx(1000 / 900)  # long side caps
    assert resize_scale(500, 400, 600, 1000) == pytest.approx(1.5)


def test_collation_pads_and_masks():
    a = {"key": "a", "image": torch.ones(3, 10, 20, dtype=torch.uint8), "boxes": torch.tensor([[0., 0, 5, 5]]),
         "scores": torch.tensor([0.9]), "classes": torch.tensor([3]), "class_probs": None,
         "input_ids": torch.tensor([5, 6, 7])}
    b = {"key": "b", "image": torch.full((3, 33, 8), 2, dtype=torch.uint8),
         "boxes": torch.tensor([[0., 0, 1, 1], [1., 1, 2, 2]]), "scores": torch.tensor([0.5, 0.4]),
         "classes": torch.tensor([1, 2]), "class_probs": None, "input_ids": torch.tensor([9])}
    b["image"] = torch.randint(0, 256, (3, 33, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    out = collate_captions([a, b], size_divisibility=32)
    assert out["images"].shape == (2, 3, 64, 32)
    # channels-last in memory, the same values as zero-padding each [3, h, w] image on the bottom right
    assert out["images"].is_contiguous(memory_format=torch.channels_last)
    reference = torch.stack([F.pad(s["image"], (0, 32 - s["image"].shape[2], 0, 64 - s["image"].shape[1]))
                             for s in (a, b)])
    assert torch.equal(out["images"], reference)
    assert out["images"][0, :, :10, :20].eq(1).all() and out["images"][0, :, 10:].eq(0).all()
    assert out["box_mask"].tolist() == [[True, False], [True, True]]
    assert out["box_classes"].tolist() == [[3, -1], [1, 2]]
    assert out["input_ids"].tolist() == [[5, 6, 7], [9, 0, 0]]
    assert out["attention_mask"].tolist() == [[True, True, True], [True, False, False]]


# --- length-aware batching -----------------------------------------------------------------------------

def test_length_groups_by_hand():
    import random

    from shards.batching import length_groups

    groups = length_groups([5, 1, 9, 3, 7, 2], 2, random.Random(0))
    assert sorted(groups) == [[1, 5], [3, 0], [4, 2]]  # neighbours by length: (1, 2), (3, 5), (7, 9)
    # (regions, words): 8 samples in batches of 2 -> runs of 2 batches by regions, each run sorted by words
    pairs = [(10, 9), (90, 1), (12, 1), (91, 8), (11, 5), (13, 2), (92, 2), (93, 9)]
    groups = length_groups(pairs, 2, random.Random(0))
    assert sorted(groups) == [[1, 6], [2, 5], [3, 7], [4, 0]]
    # (orientation, regions, words): runs by (orientation, regions), each sorted by (orientation, words), so
    # no batch mixes portrait (1) and landscape (0) images
    triples = [(1, 10, 9), (0, 90, 1), (0, 12, 1), (1, 91, 8), (0, 11, 5), (1, 13, 2), (0, 92, 2), (1, 93, 9)]
    groups = length_groups(triples, 2, random.Random(0))
    assert sorted(groups) == [[0, 7], [1, 2], [5, 3], [6, 4]]


def test_caption_sort_key_puts_orientation_first():
    from shards.decode import caption_length

    words, boxes = torch.zeros(7), torch.zeros(3, 4)
    assert caption_length({"image": torch.zeros(3, 90, 60), "boxes": boxes, "input_ids": words}) == (1, 3, 7)
    assert caption_length({"image": torch.zeros(3, 60, 90), "boxes": boxes, "input_ids": words}) == (0, 3, 7)
    assert caption_length({"region_features": torch.zeros(3, 8), "boxes": boxes, "input_ids": words}) == (0, 3, 7)


def text_padding(loader):
    real = total = 0
    for b in loader:
        real += int(b["text"]["attention_mask"].sum())
        total += b["text"]["attention_mask"].numel()
    return 1 - real / total


def test_length_buckets_keep_every_sample_once_and_cut_padding(corpus):
    plain = cfg_for(corpus, epochs=1)  # 30 captions and 30 texts, 2 + 2 a batch: both run out together
    bucketed = cfg_for(corpus, epochs=1, length_buckets=4)
    for source in ("text", "caption"):
        assert sorted(keys_of(StreamLoader(bucketed), source)) == sorted(keys_of(StreamLoader(plain), source))
    # Padding depends on the shuffle's draw (30 texts: per seed the ratio spans ~0.35-0.7), so over six seeds.
    pairs = [(text_padding(StreamLoader(replace(bucketed, seed=s))), text_padding(StreamLoader(replace(plain, seed=s))))
             for s in range(6)]
    assert all(b < 0.75 * p for b, p in pairs)
    assert sum(b for b, _ in pairs) < 0.6 * sum(p for _, p in pairs)


@pytest.mark.parametrize("workers,stop", [(0, 3), (2, 5)])
def test_exact_resume_inside_a_length_pool(corpus, workers, stop):
    cfg = cfg_for(corpus, num_workers=workers, length_buckets=3)
    reference = [b for _, b in zip(range(stop + 6), StreamLoader(cfg), strict=False)]
    first = StreamLoader(cfg)
    for _, _b in zip(range(stop), first, strict=False):
        pass
    resumed = StreamLoader(cfg)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    got = [b for _, b in zip(range(6), resumed, strict=False)]
    assert [b["text"]["keys"] for b in got] == [b["text"]["keys"] for b in reference[stop:]]
    assert [b["caption"]["keys"] for b in got] == [b["caption"]["keys"] for b in reference[stop:]]


@pytest.mark.parametrize("pattern,rank,pool", [("cap-{0..4}.tar", 0, 1), ("cap-{0..4}.tar", 1, 2),
                                               ("cap-0.tar", 1, 1)])  # by shard, in pools, by record
def test_exact_resume_at_every_position_of_two_epochs(corpus, pattern, rank, pool):
    """Stopped after every batch of two epochs (the buffer filling, full, draining at an epoch's end, the next
    epoch), a fresh loader on the saved state yields exactly the rest; so does the older (epoch, pulled) form."""
    cfg = cfg_for(corpus, caption_shards=str(corpus / pattern), text_batch_size=0, caption_batch_size=1,
                  shuffle_buffer=4, epochs=2, length_buckets=pool)
    reference = keys_of(StreamLoader(cfg, rank=rank, world_size=2), "caption")
    assert len(reference) >= 6  # two epochs of this rank's share
    for stop in range(len(reference)):
        first = StreamLoader(cfg, rank=rank, world_size=2)
        it = iter(first)
        for _ in range(stop):
            next(it)
        for state in (json.loads(json.dumps(first.state_dict())), legacy(first.state_dict())):
            resumed = StreamLoader(cfg, rank=rank, world_size=2)
            resumed.load_state_dict(state)
            assert reference[:stop] + keys_of(resumed, "caption") == reference, stop


def test_resume_reads_its_buffers_shards_not_the_epoch(tmp_path):
    """O(1) resume: 40 shards of 5 captions; stopped at 10% and at 90% of the epoch, a resumed loader reads
    about the same few tar records before its first batch (the shards its shuffle buffer and cursor lie in),
    where replaying the epoch up to the position (the older state's way) reads ~the position's records."""
    for s in range(40):
        write_caption_shard(tmp_path / f"c-{s:02d}.tar", caption_samples(s * 5, 5))
    cfg = cfg_for(tmp_path, caption_shards=str(tmp_path / "c-{00..39}.tar"), text_batch_size=0,
                  caption_batch_size=1, shuffle_buffer=4)
    with counting_tar_reads() as reads:
        cost = {}
        for stop in (20, 180):
            first = StreamLoader(cfg)
            it = iter(first)
            for _ in range(stop):
                next(it)
            for form, state in (("new", first.state_dict()), ("legacy", legacy(first.state_dict()))):
                resumed = StreamLoader(cfg)
                resumed.load_state_dict(state)
                reads[0] = 0
                next(iter(resumed))
                cost[form, stop] = reads[0]
    assert cost["new", 20] <= 25 and cost["new", 180] <= 25  # a handful of 5-record shards, at any position
    assert cost["legacy", 180] >= 180 and cost["legacy", 20] >= 20


@pytest.mark.parametrize("size,short,long", [((96, 64), 128, 192), ((300, 200), 100, 160), ((40, 30), 0, 0)])
def test_fast_jpeg_path_matches_pil(size, short, long):
    """torchvision's decoder + uint8 resize against PIL's (`load_resized`), on the same JPEG bytes: the same
    shape and box scale, pixels equal up to rounding. (300, 200) -> 100 is a 1/2 downscale, the fast path's limit."""
    import io

    import numpy as np
    from PIL import Image

    from shards.decode import decode_resized, load_resized

    rng = np.random.default_rng(0)
    smooth = np.kron(rng.integers(0, 255, (size[1] // 8 + 1, size[0] // 8 + 1, 3)), np.ones((8, 8, 1)))
    buf = io.BytesIO()
    Image.fromarray(smooth[: size[1], : size[0]].astype(np.uint8)).save(buf, format="JPEG", quality=95)
    fast, scale, wh = decode_resized(buf.getvalue(), short, long)
    ref, ref_scale = load_resized(Image.open(io.BytesIO(buf.getvalue())), short, long)
    assert wh == size and fast.shape == ref.shape and torch.equal(scale, ref_scale)
    assert (fast.float() - ref.float()).abs().mean() < 1.0


_FAILING_WORKERS = """
import sys, torch
from torch.utils.data import DataLoader, IterableDataset
from shards.reader import ignore_stop_signals, worker_batches

class Failing(IterableDataset):
    def __iter__(self):
        for i in range(1000):
            if i == 3 and torch.utils.data.get_worker_info().id == 0:
                raise ValueError("bad record in worker 0")
            yield torch.tensor(i)

loader = DataLoader(Failing(), batch_size=None, num_workers=2, worker_init_fn=ignore_stop_signals)
for batch in (worker_batches(loader) if sys.argv[1] == "guarded" else loader):
    pass
"""


@pytest.mark.parametrize("mode", ["guarded", "plain"])
def test_an_error_in_a_worker_ends_the_process_instead_of_hanging(mode):
    """Workers ignoring SIGTERM outlive an error (multiprocessing's exit SIGTERMs them, then waits forever);
    worker_batches kills them. The plain DataLoader is the control that shows the hang is real."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", _FAILING_WORKERS, mode], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=60 if mode == "guarded" else 12)
    except subprocess.TimeoutExpired:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        assert mode == "plain", "worker_batches: the process hung after a worker's error"
        return
    assert mode == "guarded", "the plain DataLoader did not hang: the control no longer shows the failure"
    assert proc.returncode != 0 and "bad record in worker 0" in err, err[-2000:]


# --- elastic resume: another world size (or worker count) goes on with what the old one left ---------------

def _world(cfg, world: int, stop: int | None, states: list | None = None, source: str = "caption"):
    """Each rank of a `world`-rank run for `stop` batches (None: to the end), starting from `states` of another
    world size if given: (the keys it delivered, every rank's loader state, JSON-serialised as a checkpoint)."""
    keys, saved = [], []
    for rank in range(world):
        loader = StreamLoader(cfg, rank=rank, world_size=world)
        if states is not None:
            loader.load_elastic(states)
        it = iter(loader)
        for batch in itertools.islice(it, stop):
            keys += batch[source]["keys"]
        it.close()
        saved.append(json.loads(json.dumps(loader.state_dict())))
    return keys, saved


def _source_cfg(corpus, source, pattern, pool, workers=0):
    if source == "caption":
        return cfg_for(corpus, caption_shards=str(corpus / pattern), text_batch_size=0, caption_batch_size=1,
                       epochs=2, length_buckets=pool, num_workers=workers)
    return cfg_for(corpus, caption_batch_size=0, text_batch_size=1, epochs=2, length_buckets=pool,
                   num_workers=workers)


@pytest.mark.parametrize("old,new", [(2, 1), (1, 2), (2, 3)])
@pytest.mark.parametrize("source,pattern,pool", [("caption", "cap-{0..4}.tar", 1), ("caption", "cap-{0..4}.tar", 3),
                                                 ("caption", "cap-0.tar", 2), ("text", None, 2)])
def test_elastic_resume_reads_every_record_of_both_epochs_once(corpus, old, new, source, pattern, pool):
    """Stopped anywhere in two epochs (roles inside a length pool, with a full buffer, one role already in the
    next epoch while another is not), the new world reads every record exactly once per epoch in all."""
    cfg = _source_cfg(corpus, source, pattern, pool)
    everything, _ = _world(cfg, 1, None, source=source)
    assert len(everything) == 2 * len(set(everything))
    for stop in (1, 4, 7, 13, 16):
        before, states = _world(cfg, old, stop, source=source)
        after, _ = _world(cfg, new, None, states, source=source)
        assert sorted(before + after) == sorted(everything), (stop, Counter(before + after) - Counter(everything))


def test_elastic_resume_twice_inside_the_residual_and_across_worker_counts(corpus):
    """2 ranks x 2 workers -> 3 ranks x 1 worker, stopped while reading the residual -> 1 rank x 2 workers."""
    cfg2, cfg0 = _source_cfg(corpus, "text", None, 2, workers=2), _source_cfg(corpus, "text", None, 2)
    everything, _ = _world(cfg0, 1, None, source="text")
    first, states = _world(cfg2, 2, 5, source="text")
    second, states = _world(cfg0, 3, 2, states, source="text")
    assert any(s["role_states"]["0"]["text"]["source"]["residual"] for s in states)  # stopped inside it
    third, _ = _world(cfg2, 1, None, states, source="text")
    assert sorted(first + second + third) == sorted(everything)


def test_elastic_resume_inside_the_residual_is_exact_on_the_same_world(corpus):
    cfg = _source_cfg(corpus, "caption", "cap-{0..4}.tar", 3)
    _, states = _world(cfg, 2, 6)
    loader = StreamLoader(cfg, rank=0, world_size=3)
    loader.load_elastic(states)
    reference = keys_of(loader, "caption")
    for stop in range(len(reference)):
        first = StreamLoader(cfg, rank=0, world_size=3)
        first.load_elastic(states)
        it = iter(first)
        for _ in range(stop):
            next(it)
        resumed = StreamLoader(cfg, rank=0, world_size=3)
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert reference[:stop] + keys_of(resumed, "caption") == reference, stop


def test_elastic_resume_refuses_missing_ranks_or_another_seed(corpus):
    cfg = _source_cfg(corpus, "text", None, 1)
    _, states = _world(cfg, 2, 3, source="text")
    with pytest.raises(ValueError, match="every old rank"):
        StreamLoader(cfg, rank=0, world_size=1).load_elastic(states[:1])
    with pytest.raises(ValueError, match="seed"):
        other = cfg_for(corpus, caption_batch_size=0, text_batch_size=1, epochs=2, seed=cfg.seed + 1)
        StreamLoader(other, rank=0, world_size=1).load_elastic(states)


def marked_corpus(root, shards=4, per_shard=8):
    """Caption sample i: 1 + i % 4 boxes of class i (the marker of its image), landscape when i is even."""
    for s in range(shards):
        samples = []
        for i in range(s * per_shard, (s + 1) * per_shard):
            k, (w, h) = 1 + i % 4, ((40, 30) if i % 2 == 0 else (30, 40))
            samples.append({"key": f"{i:06d}", "caption": f"caption number {i}", "width": w, "height": h,
                            "jpg": jpeg_bytes(w, h), "boxes": [[1.0, 2.0, 10.0 + j, 12.0] for j in range(k)],
                            "classes": [i] * k, "scores": [0.5 + i / 100] * k})
        write_caption_shard(root / f"marked-{s}.tar", samples)
    return str(root / f"marked-{{0..{shards - 1}}}.tar")


def test_shuffled_images_pair_each_caption_with_another_image_of_its_pool(tmp_path):
    """shuffle_images (pretraining's second control): the batches hold the same captions as without it; each
    caption is shown another sample's image, with that image's boxes, classes, scores and size; the images a pool's
    batches show are that pool's, none its own caption's, and most come from outside the caption's batch (a batch's
    neighbours share its region count: length pools sort by it)."""
    pool, size = 4, 2
    cfg = StreamConfig(caption_shards=marked_corpus(tmp_path), text_batch_size=0, caption_batch_size=size,
                       shuffle_buffer=4, short_side=0, num_workers=0, epochs=1, length_buckets=pool)
    plain = list(StreamLoader(cfg))
    shuffled = list(StreamLoader(cfg, shuffle_images=True))
    assert [b["caption"]["keys"] for b in shuffled] == [b["caption"]["keys"] for b in plain]
    same_batch = rows = 0
    for start in range(0, len(plain), pool):
        own, shown = [], []
        for p, s in zip(plain[start: start + pool], shuffled[start: start + pool], strict=True):
            p, s = p["caption"], s["caption"]
            assert torch.equal(s["input_ids"], p["input_ids"])
            marks = [int(c[0]) for c in s["box_classes"]]
            for row, (key, mark) in enumerate(zip(s["keys"], marks, strict=True)):
                k = int(s["box_mask"][row].sum())
                assert mark != int(key) and k == 1 + mark % 4
                assert torch.equal(s["box_classes"][row, :k], torch.full((k,), mark))
                assert s["box_scores"][row, 0].item() == pytest.approx(0.5 + mark / 100)
                assert s["image_sizes"][row].tolist() == ([30, 40] if mark % 2 == 0 else [40, 30])
                same_batch += str(mark).zfill(6) in s["keys"]
                rows += 1
            own += [int(k) for k in s["keys"]]
            shown += marks
        assert sorted(shown) == sorted(own)  # a permutation of the pool's own images
    assert rows == 32 and same_batch < 0.4 * rows  # any of 7 others: 1 in 7 from the caption's batch
    with pytest.raises(ValueError, match="at least 2 samples"):
        list(StreamLoader(replace(cfg, caption_batch_size=1, length_buckets=1), shuffle_images=True))


def test_shuffled_images_resume_exactly(tmp_path):
    cfg = StreamConfig(caption_shards=marked_corpus(tmp_path), text_batch_size=0, caption_batch_size=2,
                       shuffle_buffer=4, short_side=0, num_workers=0, length_buckets=3)
    reference = [b for _, b in zip(range(9), StreamLoader(cfg, shuffle_images=True), strict=False)]
    first = StreamLoader(cfg, shuffle_images=True)
    for _, _b in zip(range(4), first, strict=False):
        pass
    resumed = StreamLoader(cfg, shuffle_images=True)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for ref, got in zip(reference[4:], resumed, strict=False):
        assert got["caption"]["keys"] == ref["caption"]["keys"]
        assert torch.equal(got["caption"]["box_classes"], ref["caption"]["box_classes"])
