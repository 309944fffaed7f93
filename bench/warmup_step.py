"""The detector warm-up's step on its own batches: every step's images of one orientation and res5 on the real boxes
alone (`group_by_aspect`, `FastRCNN`'s `roi_index`: the warm-up since session 85) against the mixed batches with every
padded RoI computed (the warm-up before), and the RoIs alone in between. The same module, optimizer and config
(launch/configs/detector_demo.yaml), the first steps of each loader's epoch 0; forward + backward + AdamW,
interleaved repeats, median (min-max). What each pays for: the batches' padded pixels and RoIs that are real.

    python -m bench.warmup_step [--config launch/configs/detector_demo.yaml] [--steps 6] [--repeats 3] [--write]
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import torch

from model.config import load_config
from pretrain.detector import BoxSet, DetectorConfig, DetectorWarmup
from shards.coco import read_vocabularies
from train.loaders import EpochLoader

from .pretrain_step import ensure_demo
from .report import bench_parser, machine, median_range, update_section

VARIANTS = {  # name: (group by orientation, res5 on the real boxes alone)
    "mixed, every RoI (before)": (False, False),
    "mixed, real RoIs": (False, True),
    "grouped, real RoIs (now)": (True, True),
}


def real_fractions(batches: list[dict]) -> tuple[float, float]:
    """Of the pixels the backbone runs on and of the RoIs res5 runs on (every padded box, or the batch's
    `roi_index` alone), the real share."""
    pixels = padded = rois = real = 0
    for b in batches:
        h, w = b["image_sizes"].unbind(-1)
        pixels += int((h * w).sum())
        padded += b["images"].shape[0] * b["images"].shape[-2] * b["images"].shape[-1]
        real += int(b["box_mask"].sum()) + b["box_mask"].shape[0]  # + the whole-image boxes
        rois += len(b["roi_index"]) if "roi_index" in b else b["box_mask"].numel() + b["box_mask"].shape[0]
    return pixels / padded, real / rois


def run(config: str, steps: int, repeats: int) -> dict:
    cfg = load_config(DetectorConfig, config)
    _, attributes, sizes = read_vocabularies(cfg.train)
    data = BoxSet(cfg.train, cfg, cfg.fast_rcnn.num_classes, max(attributes, default=0), max(sizes, default=0))
    torch.manual_seed(cfg.seed)
    module = DetectorWarmup(replace(cfg.fast_rcnn, num_sizes=0), data.num_attributes, cfg.attribute_weight,
                            cfg.attribute_loss)
    optimizer = torch.optim.AdamW(module.parameters(), lr=cfg.optim.lr)
    batches = {}
    for name, (grouped, real) in VARIANTS.items():
        loader = iter(EpochLoader(data, cfg.batch_size, cfg.seed, groups=data.orientations() if grouped else None))
        batches[name] = [next(loader) for _ in range(steps)]
        if not real:
            for b in batches[name]:
                del b["roi_index"]

    def step(b):
        loss, _ = module(b)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for name in VARIANTS:  # warm the allocator and oneDNN's kernels on every shape first
        step(batches[name][0])
    times = {name: [] for name in VARIANTS}
    for _ in range(repeats):
        for name in VARIANTS:
            start = time.perf_counter()
            for b in batches[name]:
                step(b)
            times[name].append(1000 * (time.perf_counter() - start) / steps)
    return {"times": times, "fractions": {name: real_fractions(batches[name]) for name in VARIANTS},
            "threads": torch.get_num_threads(), "steps": steps, "repeats": repeats, "batch_size": cfg.batch_size}


def main(argv=None) -> int:
    p = bench_parser(__doc__)
    p.add_argument("--config", default="launch/configs/detector_demo.yaml")
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args(argv)
    ensure_demo("data/demo")
    r = run(args.config, args.steps, args.repeats)
    before = statistics.median(r["times"]["mixed, every RoI (before)"])
    rows = []
    for name in VARIANTS:
        pixels, rois = r["fractions"][name]
        t = r["times"][name]
        rows.append(f"| {name} | {pixels:.2f} | {rois:.2f} | {median_range(t)} | {before / statistics.median(t):.2f} |")
    body = "\n".join([
        "## The detector warm-up's step: orientation groups and real RoIs (`python -m bench.warmup_step`)", "",
        f"Machine: {machine()}; {r['threads']} threads, one process as the warm-up runs on CPU. {args.config}: "
        f"{r['batch_size']} images a step, the first {r['steps']} steps of each loader, {r['repeats']} interleaved "
        "repeats.", "",
        "| batches | padded pixels real | RoIs computed that are real | ms/step | speed against before |",
        "|---|---|---|---|---|", *rows])
    print(body)
    if args.write:
        update_section("warmup_step", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
