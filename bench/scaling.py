"""A scaling model for VL-BERT pretraining end to end on H100 clusters: step time, MFU, time to train, the
global batch and LR at each size, and the data-loader rate each GPU needs (docs/SCALING.md).

Measured here: the model FLOPs per sample (`model/flops.py`: the transformer counted 6N per token + attention +
heads at masked positions, the Fast R-CNN by torch's FlopCounterMode on the real modules at the real shapes,
built on the meta device so nothing is computed) and the parameters ZeRO communicates. Taken from elsewhere,
each a flag: the GPU's peak, the utilisation each part reaches, link bandwidths, and our loader's rate per
CPU core (docs/BENCHMARKS.md). ZeRO's communication volume per step follows the ZeRO paper (Rajbhandari et al.
2020, section 7): stages 1 and 2 move 2 x params per GPU (reduce-scatter of gradients + all-gather of
parameters, as much as data parallelism's all-reduce), stage 3 3 x params (one more all-gather in the
backward pass); in bf16, 2 bytes each, times (N - 1) / N on a ring.

    python -m bench.scaling [--gpus 8 64 512] [--regions 36] [--mfu-transformer 0.45] [--mfu-cnn 0.25] [--write]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from model.config import model_config
from model.flops import cnn_flops, transformer_flops
from model.vl_bert import VLBertForPretraining

DOC = Path(__file__).resolve().parents[1] / "docs" / "SCALING.md"
PAPER_BATCH = 256  # 128 captions + 128 text sequences (VL-BERT A.2)
PAPER_STEPS = 250_000
PAPER_WARMUP = 8_000
PAPER_LR = 2e-5


@dataclass
class Sample:
    transformer: float  # training FLOPs of one caption + one text sample (the 1:1 pair)
    cnn: float  # training FLOPs of the Fast R-CNN on the caption's image
    params: int  # trainable parameters (what ZeRO reduces and gathers)


def paper_config(size: str, overrides=()):
    """VL-BERT-base/large end to end as the official configs: ResNet-101 C4 (Visual Genome's 1,600 classes +
    background), RoIs pooled 14 x 14, stem and res2 frozen, channels-last convolutions."""
    fast_rcnn = {"backbone": "resnet101", "num_classes": 1601, "roi_output_size": 14, "freeze_stem": True,
                 "freeze_res2": True, "channels_last": True}
    return model_config(size, overrides=overrides, updates={"fast_rcnn": fast_rcnn})


def sample_flops(size: str, regions: int, caption_tokens: int, text_tokens: int, height: int, width: int) -> Sample:
    cfg = paper_config(size)
    with torch.device("meta"):
        model = VLBertForPretraining(cfg)
        images = torch.zeros(1, 3, height, width, dtype=torch.uint8)
        boxes = torch.zeros(1, regions, 4)
        box_mask = torch.ones(1, regions, dtype=torch.bool)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    # [CLS] caption [SEP] [IMG] x (whole image + regions) [END]; text: the official SEQ_LEN 64
    caption_len = 1 + caption_tokens + 1 + (1 + regions) + 1
    masked_words = round(0.15 * caption_tokens) + round(0.15 * text_tokens)
    transformer = transformer_flops(cfg, [caption_len, text_tokens], masked_words, round(0.15 * regions))
    cnn = cnn_flops(model.vl_bert.fast_rcnn, images, torch.tensor([[height, width]], device="meta"), boxes, box_mask)
    return Sample(transformer, cnn, params)


def predict(s: Sample, gpus: int, a) -> dict:
    per_gpu = a.captions_per_gpu  # and as many text samples
    global_batch = per_gpu * 2 * gpus
    accumulation = max(1, math.ceil(PAPER_BATCH / global_batch))  # below the paper's batch: accumulate up to it
    global_batch *= accumulation
    peak = a.peak_tflops * 1e12
    compute = accumulation * per_gpu * (s.transformer / (peak * a.mfu_transformer) + s.cnn / (peak * a.mfu_cnn))
    volume = {1: 2, 2: 2, 3: 3}[a.zero_stage] * s.params * 2 * (gpus - 1) / gpus  # bytes per GPU per step
    bandwidth = (a.nvlink_gbs if gpus <= a.gpus_per_node else a.ib_gbps / 8 * a.link_efficiency) * 1e9
    comm = volume / bandwidth
    step_overlap, step_serial = max(compute, comm), compute + comm
    flops_step = accumulation * per_gpu * (s.transformer + s.cnn)
    samples = PAPER_BATCH * PAPER_STEPS  # the paper's 64M samples, the same at every size
    steps = math.ceil(samples / global_batch)
    return {
        "gpus": gpus, "global_batch": global_batch, "accumulation": accumulation,
        # Adam's square-root rule from the paper's 256 (a starting point to validate; LAMB beyond ~8k)
        "lr": PAPER_LR * math.sqrt(global_batch / PAPER_BATCH),
        "warmup_steps": max(1, round(PAPER_WARMUP * PAPER_BATCH / global_batch)),  # the same warm-up samples
        "steps": steps, "compute_s": compute, "comm_s": comm, "step_overlap_s": step_overlap,
        "step_serial_s": step_serial,
        "mfu_overlap": flops_step / (step_overlap * peak), "mfu_serial": flops_step / (step_serial * peak),
        "hours_overlap": steps * step_overlap / 3600, "hours_serial": steps * step_serial / 3600,
        "images_per_s_per_gpu": accumulation * per_gpu / step_overlap,
        "loader_cores_per_gpu": accumulation * per_gpu / step_overlap / a.loader_images_per_core,
    }


def table(size: str, s: Sample, rows: list[dict]) -> str:
    out = [f"### VL-BERT-{size} end to end: {s.params / 1e6:.0f}M trainable parameters; per caption + text pair "
           f"{s.transformer / 1e9:.1f} GFLOP transformer + {s.cnn / 1e9:.0f} GFLOP Fast R-CNN "
           f"({100 * s.cnn / (s.cnn + s.transformer):.0f}% CNN)", "",
           "| GPUs | global batch (accum.) | LR | warm-up steps | steps | compute s/step | ZeRO comm s/step | "
           "step s (overlap - serial) | MFU (overlap - serial) | hours for 64M samples | images/s per GPU | "
           "loader cores per GPU |", "|" + "---|" * 12]
    for r in rows:
        out.append(f"| {r['gpus']} | {r['global_batch']} ({r['accumulation']}) | {r['lr']:.2e} | {r['warmup_steps']} "
                   f"| {r['steps']} | {r['compute_s']:.3f} | {r['comm_s']:.3f} | {r['step_overlap_s']:.3f} - "
                   f"{r['step_serial_s']:.3f} | {100 * r['mfu_overlap']:.0f}% - {100 * r['mfu_serial']:.0f}% | "
                   f"{r['hours_overlap']:.1f} - {r['hours_serial']:.1f} | {r['images_per_s_per_gpu']:.0f} | "
                   f"{r['loader_cores_per_gpu']:.1f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, nargs="+", default=[8, 64, 512])
    p.add_argument("--sizes", nargs="+", default=["base", "large"])
    p.add_argument("--regions", type=int, default=36, help="RoIs per image (CC's bottom-up boxes: 10-100)")
    p.add_argument("--caption-tokens", type=int, default=13, help="word-pieces per caption (CC: ~10 words)")
    p.add_argument("--text-tokens", type=int, default=64, help="the official SEQ_LEN for the text corpus")
    p.add_argument("--image", type=int, nargs=2, default=[600, 904], metavar=("H", "W"),
                   help="padded image batch shape (shorter side 600, longer <= 1000; length buckets)")
    p.add_argument("--captions-per-gpu", type=int, default=8, help="per GPU, with as many text samples")
    p.add_argument("--zero-stage", type=int, default=2, choices=[1, 2, 3])
    p.add_argument("--peak-tflops", type=float, default=989.0, help="H100 SXM dense bf16")
    p.add_argument("--mfu-transformer", type=float, default=0.45, help="assumed share of peak, transformer")
    p.add_argument("--mfu-cnn", type=float, default=0.25, help="assumed share of peak, Fast R-CNN")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--nvlink-gbs", type=float, default=450.0, help="NVLink GB/s per GPU per direction")
    p.add_argument("--ib-gbps", type=float, default=400.0, help="InfiniBand Gb/s per GPU (one NIC per GPU)")
    p.add_argument("--link-efficiency", type=float, default=0.8, help="achieved share of the IB line rate")
    p.add_argument("--loader-images-per-core", type=float, default=183.0,
                   help="our StreamLoader with length buckets at 600/1000: 366 samples/s on 2 cores")
    p.add_argument("--write", action="store_true", help=f"write the tables into {DOC.name}")
    a = p.parse_args(argv)
    tables = []
    for size in a.sizes:
        s = sample_flops(size, a.regions, a.caption_tokens, a.text_tokens, *a.image)
        tables.append(table(size, s, [predict(s, g, a) for g in a.gpus]))
    body = "\n\n".join(tables)
    print(body)
    if a.write:
        text = DOC.read_text()
        start, end = "<!-- scaling:tables -->", "<!-- /scaling:tables -->"
        head, rest = text.split(start, 1)
        DOC.write_text(head + start + "\n" + body + "\n" + end + rest.split(end, 1)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
