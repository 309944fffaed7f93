"""The quick start's pretraining step on its own batches, by what its Fast R-CNN computes: the CNN trained from res3 up
with every padded RoI (before session 86), with res5 on the real boxes alone (`roi_index`, built by the masker), and
res5 alone trained (`freeze_res3` / `freeze_res4`: no backward through the backbone; the quick start since session
86). One module and AdamW (launch/configs/demo.yaml, the warm-up's detector when it is there), the stream's first
batches of one rank, one thread as each of the quick start's 2 CPU ranks runs; forward + backward + AdamW, interleaved
repeats, median (min-max). The rank's all-reduce and the loader are left out: the same in every variant.

    python -m bench.quickstart_step [--config launch/configs/demo.yaml] [--steps 6] [--repeats 3] [--write]
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from model.config import load_config
from pretrain.config import PretrainConfig
from pretrain.run import PretrainTask

from .pretrain_step import ensure_demo
from .report import bench_parser, machine, median_range, update_section
from .warmup_step import real_fractions

VARIANTS = {  # name: (res5 on the real boxes alone, res3 and res4 trained)
    "res3-res5 trained, every RoI (before)": (False, True),
    "res3-res5 trained, real RoIs": (True, True),
    "res5 trained, real RoIs (now)": (True, False),
}


def real_roi_fraction(batches: list[dict]) -> float:
    """Of the RoIs a batch's boxes pad to (each image's whole-image box and its padded boxes), the real share: the
    warm-up bench's count on the images' rows (the word views' rows repeat them), every padded box computed."""
    images = [{"images": b["caption"]["images"], "image_sizes": b["caption"]["image_sizes"],
               "box_mask": b["caption"]["box_mask"][: b["caption"]["images"].shape[0]]} for b in batches]
    return real_fractions(images)[1]


def run(config: str, steps: int, repeats: int) -> dict:
    if not torch.distributed.is_initialized():  # the task reads the world size for its run record
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29571")
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(1)
    overrides = ["engine.eval_every=0", "data.num_workers=0", "model.fast_rcnn.freeze_res3=false",
                 "model.fast_rcnn.freeze_res4=false"]
    cfg = load_config(PretrainConfig, config, overrides)
    if cfg.model.get("fast_rcnn", {}).get("weights") and not os.path.exists(cfg.model["fast_rcnn"]["weights"]):
        cfg.model["fast_rcnn"]["weights"] = None  # no warm-up yet: the same shapes from a random detector
    training = PretrainTask().build(cfg, None, 0, 1)
    module = training.module.train()
    loader = iter(training.loader)
    batches = [next(loader) for _ in range(steps + 1)]
    stages = [module.model.vl_bert.fast_rcnn.backbone.layer2, module.model.vl_bert.fast_rcnn.backbone.layer3]
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-6)

    def step(b, real, backbone):
        for stage in stages:
            stage.requires_grad_(backbone)
        if not real:
            b = {**b, "caption": {k: v for k, v in b["caption"].items() if k != "roi_index"}}
        loss, _ = module(b)
        optimizer.zero_grad(set_to_none=True)  # a frozen stage has no gradient: AdamW leaves it
        loss.backward()
        optimizer.step()

    for flags in VARIANTS.values():  # warm the allocator and oneDNN's kernels first
        step(batches[0], *flags)
    times = {name: [] for name in VARIANTS}
    for _ in range(repeats):
        for name, flags in VARIANTS.items():
            start = time.perf_counter()
            for b in batches[1:]:
                step(b, *flags)
            times[name].append(1000 * (time.perf_counter() - start) / steps)
    return {"times": times, "real_rois": real_roi_fraction(batches[1:]), "steps": steps, "repeats": repeats,
            "batch": f"{cfg.data.caption_batch_size} + {cfg.data.text_batch_size}",
            "views": cfg.masking.word_views}


def main(argv=None) -> int:
    p = bench_parser(__doc__)
    p.add_argument("--config", default="launch/configs/demo.yaml")
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args(argv)
    ensure_demo("data/demo")
    r = run(args.config, args.steps, args.repeats)
    before = statistics.median(r["times"]["res3-res5 trained, every RoI (before)"])
    rows = []
    for name, (real, _) in VARIANTS.items():
        t = r["times"][name]
        rois = 1.0 if real else r["real_rois"]
        rows.append(f"| {name} | {rois:.2f} | {median_range(t)} | {before / statistics.median(t):.2f} |")
    body = "\n".join([
        "## The quick start's pretraining step: res5 on the real boxes, the backbone frozen "
        "(`python -m bench.quickstart_step`)", "",
        f"Machine: {machine()}; 1 thread, as each of the quick start's 2 CPU ranks. {args.config}: {r['batch']} "
        f"samples a step, each caption in {r['views']} word views over one detector pass; the stream's first "
        f"{r['steps']} batches, {r['repeats']} interleaved repeats; forward, backward and AdamW (no all-reduce, "
        "no loader).", "",
        "| Fast R-CNN in the step | RoIs computed that are real | ms/step | speed against before |",
        "|---|---|---|---|", *rows])
    print(body)
    if args.write:
        update_section("quickstart_step", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
