"""The Fast R-CNN's training step against torchvision's own parts at the same shapes: our `FastRCNN`
(pixel normalisation with masked boxes zeroed, ResNet C4 trunk, RoIAlign over every box + the whole image,
res5 per region, mean pool) vs the same network assembled from torchvision alone (`resnet*` with its
`FrozenBatchNorm2d`, `torchvision.ops.RoIAlign`, `layer4`, mean pool), the same weights, frozen layers,
layout and batches. Forward + backward of the pooled features' sum, interleaved repeats, median (min-max);
then a profile of our step by operator, so what the step costs is read, not guessed.

    python -m bench.fast_rcnn_step [--shape demo|base|all] [--steps 4] [--repeats 3] [--write]
"""

from __future__ import annotations

import statistics
import time
from collections import OrderedDict
from dataclasses import replace

import torch
import torchvision
from torch import nn

from model.config import model_config
from model.fast_rcnn import FastRCNN

from .pretrain_step import SHAPES, ensure_demo, make_batches, shape_parser
from .report import machine, median_range, update_section

COLUMNS = ["shape", "images x RoIs / step (padding included)", "ours ms/step", "torchvision ms/step",
           "ours / torchvision (speed)", "ours, norms folded, ms/step", "folded / ours (speed)",
           "top operators of our step (share of its time)"]


class TorchvisionC4(nn.Module):
    """The peer: ResNet C4 Fast R-CNN feature extraction from torchvision's parts only."""

    def __init__(self, ours):
        super().__init__()
        cfg = ours.cfg
        resnet = getattr(torchvision.models, cfg.backbone)(weights=None,
                                                           norm_layer=torchvision.ops.FrozenBatchNorm2d)
        self.trunk = nn.Sequential(OrderedDict((n, getattr(resnet, n)) for n in (
            "conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3")))
        self.head = resnet.layer4
        # our strides (feature stride 8 moves res4's stride) and weights, so both compute the same network
        for (_, mine), (_, theirs) in zip(ours.backbone.named_modules(), self.trunk.named_modules()):
            if isinstance(mine, nn.Conv2d):
                theirs.stride, theirs.padding, theirs.dilation = mine.stride, mine.padding, mine.dilation
        self.trunk.load_state_dict(ours.backbone.state_dict())
        self.head.load_state_dict(ours.box_head.state_dict())
        for mine, theirs in zip(ours.parameters(), list(self.trunk.parameters()) + list(self.head.parameters())):
            theirs.requires_grad_(mine.requires_grad)
        self.roi_align = torchvision.ops.RoIAlign(cfg.roi_output_size, 1 / cfg.feature_stride,
                                                  cfg.roi_sampling_ratio, aligned=cfg.box_convention != "inclusive")
        self.register_buffer("mean", torch.tensor(cfg.pixel_mean).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor(cfg.pixel_std).view(1, 3, 1, 1) * 255)
        self.inclusive = cfg.box_convention == "inclusive"
        self.layout = torch.channels_last if cfg.channels_last else torch.contiguous_format

    def forward(self, images, image_sizes, boxes, box_mask):
        x = (images.float() - self.mean) / self.std
        # torchvision normalises each image, then pads the batch with 0 (GeneralizedRCNNTransform)
        rows = torch.arange(x.shape[2], device=x.device).view(1, -1, 1) < image_sizes[:, 0].view(-1, 1, 1)
        cols = torch.arange(x.shape[3], device=x.device).view(1, 1, -1) < image_sizes[:, 1].view(-1, 1, 1)
        x = (x * (rows & cols).unsqueeze(1)).contiguous(memory_format=self.layout)
        features = self.trunk(x)
        h, w = image_sizes[:, 0:1].float(), image_sizes[:, 1:2].float()
        if self.inclusive:  # detectron's legacy corners: the last pixel's index
            h, w = h - 1, w - 1
        whole = torch.cat([torch.zeros_like(h), torch.zeros_like(h), w, h], 1).unsqueeze(1)
        rois = [torch.cat([whole[i], boxes[i]]) for i in range(len(boxes))]  # torchvision's list-of-boxes form
        return self.head(self.roi_align(features, rois)).mean((2, 3))


def run_shape(name: str, steps: int, repeats: int, demo_dir: str) -> dict:
    shape = SHAPES[name]
    cfg = model_config(shape["preset"], None, shape["overrides"]).fast_rcnn
    batches = [b["caption"] for b in make_batches(shape, steps + 1, demo_dir)]
    torch.manual_seed(0)
    ours = FastRCNN(cfg)
    peer = TorchvisionC4(ours)
    folded = FastRCNN(replace(cfg, fold_frozen_norms=True))  # the same weights, each frozen norm in its conv
    folded.load_state_dict(ours.state_dict())
    with torch.no_grad():  # the same network: the peer's features equal ours on an unmasked batch
        c = batches[0]
        mine = ours(c["images"], c["image_sizes"], c["boxes"], c["box_mask"])["appearance"]
        theirs = peer(c["images"], c["image_sizes"], c["boxes"], c["box_mask"])
        err = float((mine.flatten(0, 1) - theirs).abs().max() / theirs.abs().max())
        if err > 1e-4:
            raise AssertionError(f"{name}: the peer computes another network (relative difference {err:.2e})")

    def stepper(model):
        def step(c):
            out = model(c["images"], c["image_sizes"], c["boxes"], c["box_mask"], c["masked_regions"])
            out["appearance"].sum().backward()
            model.zero_grad(set_to_none=True)
        return step

    step_ours, step_folded = stepper(ours), stepper(folded)

    def step_peer(c):
        peer(c["images"], c["image_sizes"], c["boxes"], c["box_mask"]).sum().backward()
        peer.zero_grad(set_to_none=True)

    def timed(step):
        step(batches[0])  # warm-up
        t = time.perf_counter()
        for c in batches[1:]:
            step(c)
        return (time.perf_counter() - t) / steps * 1000

    times = {"ours": [], "peer": [], "folded": []}
    for _ in range(repeats):
        times["ours"].append(timed(step_ours))
        times["peer"].append(timed(step_peer))
        times["folded"].append(timed(step_folded))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for c in batches[1:]:
            step_ours(c)
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    total = sum(e.self_cpu_time_total for e in events)
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:4]
    rois = sum(c["boxes"].shape[0] * (c["boxes"].shape[1] + 1) for c in batches[1:]) / steps  # padded ones too
    return {"shape": name, "images": shape["captions"], "rois": rois, "times": times,
            "ratio": [p / o for o, p in zip(times["ours"], times["peer"])],
            "folded_ratio": [o / f for o, f in zip(times["ours"], times["folded"])],
            "top": [(e.key, e.self_cpu_time_total / total) for e in top]}


def main(argv=None) -> int:
    args = shape_parser(__doc__).parse_args(argv)
    ensure_demo(args.demo)
    rows = []
    for name in (["demo", "base"] if args.shape == "all" else [args.shape]):
        r = run_shape(name, args.steps, args.repeats, args.demo)
        ratio = statistics.median(r["ratio"])
        row = [name, f"{r['images']} x {r['rois']:.0f}", median_range(r["times"]["ours"]),
               median_range(r["times"]["peer"]), f"{ratio:.2f} ({min(r['ratio']):.2f}-{max(r['ratio']):.2f})",
               median_range(r["times"]["folded"]), f"{statistics.median(r['folded_ratio']):.2f} "
               f"({min(r['folded_ratio']):.2f}-{max(r['folded_ratio']):.2f})",
               "; ".join(f"{k} {s:.0%}" for k, s in r["top"])]
        rows.append("| " + " | ".join(row) + " |")
        print(rows[-1], flush=True)
    body = ("## Fast R-CNN step: ours vs torchvision's own parts\n\n"
            "`python -m bench.fast_rcnn_step --write`: forward + backward of the pooled region features (their sum) "
            f"on the pretraining step's caption batches (`bench.pretrain_step` shapes), {args.steps} timed steps "
            f"after a warm-up, {args.repeats} interleaved repeats, median (min-max). The peer is the same network "
            "built from torchvision alone (its ResNet with `FrozenBatchNorm2d`, `ops.RoIAlign` on a list of boxes, "
            "`layer4`, mean pool), loaded with our weights and checked to give our features; ratio > 1: ours "
            "is faster. \"Norms folded\": ours with `fast_rcnn.fold_frozen_norms` (each frozen norm applied inside "
            f"the convolution before it; the same weights), in the same interleaved repeats. Machine: {machine()}.\n\n"
            "| " + " | ".join(COLUMNS) + " |\n|" + " --- |" * len(COLUMNS) + "\n" + "\n".join(rows))
    if args.write:
        update_section("fast_rcnn_step", body)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
