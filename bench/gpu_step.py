"""The pretraining step on one GPU at the paper's end-to-end shapes: measured model-FLOPs utilisation beside
docs/SCALING.md's assumptions, and the same step through our Engine and through a plain PyTorch loop.

Shapes are the scaling model's (`bench.scaling`): VL-BERT-base or -large with a ResNet-101 C4 Fast R-CNN
(1,601 classes, RoIs 14 x 14, stem and res2 frozen, channels-last), per GPU 8 captions (13 word-pieces, 36
RoIs + the whole image, images 600 x 904) and 8 text sequences of 64 tokens. The batches are synthetic at the
collated level (random pixels, boxes, words and detector distributions) and then go through the real
`PretrainMasker` (whole-word MLM, MRC with zeroed pixels), so what the model computes is what pretraining
computes. Timed, each after warm-up steps and with one device sync per window (none inside it):
- plain: `VLBertPretraining` under `torch.autocast(bf16)`, fused AdamW, gradient clipping at 10;
- cnn: the Fast R-CNN's forward + backward alone on the same images and boxes (its share of the step);
- peer: torchvision's own ResNet C4 + RoIAlign on the same weights and batches (`bench.fast_rcnn_step`);
- cnn_folded: the same detector with each frozen norm folded into its convolution (`fast_rcnn.fold_frozen_norms`);
- ours: the `Engine` loop (DeepSpeed ZeRO-2, bf16, its non-finite flags and metric sums), when deepspeed is
  installed, timed in the same interleaved repeats as the plain loop (both models on the device);
  `--engine-stages` / `--engine-precisions` add other ZeRO stages and `bf16_autocast` beside it
  (`ours_zero<S>[_<precision>]`); `--profile` profiles the plain step and each Engine loop (kernels, host
  operators, device syncs).
MFU = counted model FLOPs (`model/flops.py`) per second over the GPU's dense bf16 peak (`--peak-tflops`, the
datasheet's; a large bf16 GEMM measured in the same run is reported beside it).

    python -m bench.gpu_step [--sizes base large] [--steps 10] [--repeats 3] [--tokenizer DIR] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from model.fast_rcnn import FastRCNN
from model.flops import measured_matmul_peak
from model.vl_bert import VLBertForPretraining
from pretrain.masking import MaskingConfig, PretrainMasker
from pretrain.tasks import LossConfig, VLBertPretraining
from shards.tokenizer import load_tokenizer
from train.engine import param_groups, to_device

from .fast_rcnn_step import TorchvisionC4
from .pretrain_step import engine_loop, engine_window, step_flops
from .report import bench_parser, machine
from .scaling import paper_config


def collated_batch(index: int, tokenizer, *, captions: int, texts: int, caption_tokens: int, text_tokens: int,
                   regions: int, height: int, width: int, num_classes: int) -> dict:
    """One batch as `shards.collate` gives it (before masking), random at the given shapes, seeded by index."""
    g = torch.Generator().manual_seed(index)
    first_word = 1999  # after [PAD], [unused*], [CLS], [SEP], [MASK] and the single characters of BERT's vocab
    pad_h, pad_w = -(-height // 32) * 32, -(-width // 32) * 32
    xy = torch.rand(captions, regions, 2, generator=g) * torch.tensor([width * 0.8, height * 0.8])
    wh = 16 + torch.rand(captions, regions, 2, generator=g) * torch.tensor([width * 0.5, height * 0.5])
    boxes = torch.cat([xy, (xy + wh).minimum(torch.tensor([width - 1.0, height - 1.0]))], -1)
    logits = torch.randn(captions, regions, num_classes, generator=g)
    words = lambda n, t: torch.randint(first_word, len(tokenizer), (n, t), generator=g)  # noqa: E731
    caption = {"keys": [f"c{index}_{i}" for i in range(captions)],
               "images": torch.randint(0, 256, (captions, 3, pad_h, pad_w), generator=g, dtype=torch.uint8),
               "image_sizes": torch.tensor([[height, width]] * captions),
               "resize_scales": torch.ones(captions), "boxes": boxes,
               "box_mask": torch.ones(captions, regions, dtype=torch.bool),
               "box_classes": logits.argmax(-1), "box_scores": torch.rand(captions, regions, generator=g),
               "class_probs": logits.softmax(-1).half(), "input_ids": words(captions, caption_tokens),
               "attention_mask": torch.ones(captions, caption_tokens, dtype=torch.bool)}
    text = {"keys": [f"t{index}_{i}" for i in range(texts)], "input_ids": words(texts, text_tokens),
            "attention_mask": torch.ones(texts, text_tokens, dtype=torch.bool)}
    return {"index": index, "caption": caption, "text": text}


def synced(fn, dev: torch.device) -> float:
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t


# CUDA runtime calls that copy or wait (a synchronize, or a copy to the host, stalls the launch queue; an async
# device-to-device copy does not, and is counted here only as a copy)
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def device_profile(run, steps: int, seconds_per_step: float) -> dict:
    """Where `steps` steps' time goes (`run` does them): the kernels' own time per step against the step's wall
    time (a GPU busy well under the wall is waiting for the host to launch work), the top kernels by it, the host
    operators by their own CPU time (what the host spends the step on), and the runtime's copy and synchronize
    calls (`syncs_per_step`)."""
    from torch.autograd import DeviceType  # lazy: only with --profile
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]  # the kernels, not the ops
    host = [e for e in events if e.device_type == DeviceType.CPU]
    kernel_s = sum(e.self_device_time_total for e in kernels) / 1e6 / steps
    top = sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)[:12]
    top_host = sorted(host, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
    return {"kernel_seconds_per_step": kernel_s, "device_busy_fraction": kernel_s / seconds_per_step,
            "kernels_per_step": sum(e.count for e in kernels) / steps,
            "syncs_per_step": {e.key: e.count / steps for e in host if e.key.startswith(SYNC_CALLS)},
            "top": [{"kernel": e.key[:120], "device_ms_per_step": e.self_device_time_total / 1e3 / steps,
                     "calls_per_step": e.count / steps} for e in top],
            "top_host": [{"op": e.key[:120], "cpu_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
                          "calls_per_step": e.count / steps} for e in top_host]}


def run_size(size: str, a, tokenizer) -> dict:
    cfg = paper_config(size, [*a.preset_overrides, *(["fast_rcnn.fold_frozen_norms=true"] if a.fold_norms else [])])
    masker = PretrainMasker(MaskingConfig(), tokenizer, cls_id=tokenizer.cls_token_id, sep_id=tokenizer.sep_token_id,
                            mask_id=tokenizer.mask_token_id, num_classes=cfg.fast_rcnn.num_classes)
    shape = dict(captions=a.captions, texts=a.captions, caption_tokens=a.caption_tokens, text_tokens=a.text_tokens,
                 regions=a.regions, height=a.image[0], width=a.image[1], num_classes=cfg.fast_rcnn.num_classes)
    batches = [masker(collated_batch(i, tokenizer, **shape)) for i in range(a.steps + 1)]
    torch.manual_seed(0)
    module = VLBertPretraining(VLBertForPretraining(cfg), LossConfig())
    initial = {k: v.clone() for k, v in module.state_dict().items()}
    dev = torch.device(a.device)
    on_gpu = [to_device(b, dev) for b in batches]
    module.to(dev)
    flops = step_flops(cfg, module.model.vl_bert.fast_rcnn, on_gpu[1:])
    opt = torch.optim.AdamW(param_groups(module, 1e-4), lr=1e-4, fused=dev.type == "cuda" or None)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16)

    def plain_step(b):
        with autocast:
            loss, _ = module(b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 10.0)
        opt.step()

    detector = module.model.vl_bert.fast_rcnn

    def detector_step(det):
        def step(b):
            c = b["caption"]
            with autocast:
                out = det(c["images"], c["image_sizes"], c["boxes"], c["box_mask"], c["masked_regions"])
            out["appearance"].float().sum().backward()
            det.zero_grad(set_to_none=True)
        return step

    cnn_step = detector_step(detector)
    peer = TorchvisionC4(detector).to(dev)
    # the same detector with each frozen norm inside its convolution (fast_rcnn.fold_frozen_norms), interleaved
    folded = None
    if not cfg.fast_rcnn.fold_frozen_norms:
        folded = FastRCNN(replace(cfg.fast_rcnn, fold_frozen_norms=True)).to(dev)
        folded.load_state_dict(detector.state_dict())

    def peer_step(b):
        c = b["caption"]
        with autocast:
            out = peer(c["images"], c["image_sizes"], c["boxes"], c["box_mask"])
        out.float().sum().backward()
        peer.zero_grad(set_to_none=True)

    def window(step):
        def run():
            for b in on_gpu[1:]:
                step(b)
        return run

    parts = {"plain": plain_step, "cnn": cnn_step, "peer": peer_step}
    if folded is not None:
        parts["cnn_folded"] = detector_step(folded)
    for step in parts.values():  # warm-up: cuDNN's algorithm search, the allocator, the fused optimizer
        for b in on_gpu[:2]:
            step(b)
    cuda = dev.type == "cuda"
    if cuda:  # the plain loop's own peak, before the Engine's copies share the device
        torch.cuda.reset_peak_memory_stats()
    window(plain_step)()
    memory = torch.cuda.max_memory_allocated() if cuda else None
    result = {"size": size, "samples_per_step": 2 * a.captions, "flops_per_step": flops,
              "peak_memory_bytes_plain": memory}
    tmp = tempfile.mkdtemp(prefix="bench_gpu_step_")
    engines = {}
    try:
        if not a.no_engine:
            engines = build_engines(cfg, initial, on_gpu, a, tmp, result)
        # every loop timed in each repeat, one after another: a ratio is not the drift of the machine between loops
        # (session 32 timed the Engine after the plain loop and read 0.86x and 1.08x for one configuration)
        windows = {k: window(step) for k, step in parts.items()}
        windows.update({k: (lambda e=e: engine_window(e, a.steps)) for k, e in engines.items()})
        times = {k: [] for k in windows}
        for _ in range(a.repeats):
            for k, run in windows.items():
                times[k].append(synced(run, dev) / a.steps)
        result["seconds_per_step"] = times
        result["profile"] = None
        if a.profile:
            for k in ("plain", *engines):
                result["profile" if k == "plain" else f"profile_{k}"] = device_profile(
                    windows[k], a.steps, statistics.median(times[k]))
    finally:
        for engine in engines.values():
            engine.engine.destroy()
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def build_engines(cfg, initial: dict, on_gpu: list, a, tmp: str, result: dict) -> dict:
    """Our Engine's loops, one per requested ZeRO stage and precision, each warmed up; {} (and `ours_error` in
    `result`) when deepspeed is missing or a loop cannot be built: the plain figures stand without them."""
    try:  # lazy: our Engine needs deepspeed (not in every GPU image), and it picks its accelerator when imported
        import deepspeed  # noqa: F401
    except ImportError as e:
        result["ours_error"] = f"deepspeed not importable: {e}"
        return {}
    engines = {}
    try:
        # "ours" is ZeRO-2 in bf16 (the pretraining configs'); other stages and precisions beside it
        for stage, precision in ((s, p) for s in a.engine_stages for p in a.engine_precisions):
            name = "ours" if (stage, precision) == (2, "bf16") else \
                f"ours_zero{stage}" + ("" if precision == "bf16" else f"_{precision}")
            engine = engine_loop(cfg, initial, on_gpu, stage, f"{tmp}/{name}", a.steps, 2 * a.captions,
                                 precision=precision, grad_clip=10.0)
            engines[name] = engine
            # the stage the loop ran at: ZeRO 1/2 on one rank with fp32 weights run as 0 (train.engine.run_stage), so
            # two names can time one configuration
            result.setdefault("stage_run", {})[name] = engine.cfg.zero_stage
            engine_window(engine, 2)  # warm-up beyond the first step
    except Exception as e:  # noqa: BLE001  the plain figures stand without it; say why it is missing
        result["ours_error"] = f"{type(e).__name__}: {e}"
    return engines


def summarise(r: dict, peak: float) -> dict:
    t = {k: statistics.median(v) for k, v in r["seconds_per_step"].items()}
    f = r["flops_per_step"]
    out = {"mfu_plain": (f["transformer"] + f["cnn"]) / t["plain"] / peak,
           "mfu_cnn": f["cnn"] / t["cnn"] / peak,
           "mfu_transformer": f["transformer"] / max(t["plain"] - t["cnn"], 1e-9) / peak,
           "cnn_share_of_step": t["cnn"] / t["plain"], "cnn_ours_over_peer_speed": t["peer"] / t["cnn"],
           "samples_per_s_plain": r["samples_per_step"] / t["plain"]}
    if "cnn_folded" in t:
        out["cnn_folded_over_cnn_speed"] = t["cnn"] / t["cnn_folded"]
    for k in t:
        if k.startswith("ours_zero"):
            out[f"{k}_over_plain_speed"] = t["plain"] / t[k]
    if "ours" in t:
        out.update(mfu_ours=(f["transformer"] + f["cnn"]) / t["ours"] / peak,
                   ours_over_plain_speed=t["plain"] / t["ours"], samples_per_s_ours=r["samples_per_step"] / t["ours"])
    return out


def main(argv=None) -> list[dict]:
    p = bench_parser(__doc__, write=False)
    p.add_argument("--sizes", nargs="+", default=["base", "large"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--captions", type=int, default=8, help="captions per step, with as many text sequences")
    p.add_argument("--caption-tokens", type=int, default=13)
    p.add_argument("--text-tokens", type=int, default=64)
    p.add_argument("--regions", type=int, default=36)
    p.add_argument("--image", type=int, nargs=2, default=[600, 904], metavar=("H", "W"))
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 (H100/H200 SXM datasheet)")
    p.add_argument("--tokenizer", help="local BERT tokenizer directory (default: the packaged MiniLM's, "
                                       "the same uncased vocabulary as bert-base-uncased)")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--fold-norms", action="store_true", help="fast_rcnn.fold_frozen_norms (each frozen norm inside "
                                                             "its convolution)")
    p.add_argument("--profile", action="store_true", help="also profile the plain step's and the Engine's kernels, "
                                                          "host operators and device syncs")
    p.add_argument("--no-engine", action="store_true", help="skip our Engine's loop")
    p.add_argument("--engine-stages", type=int, nargs="+", default=[2],
                   help="ZeRO stages of our Engine's loop to time (2 is the pretraining configs')")
    p.add_argument("--engine-precisions", nargs="+", default=["bf16"], choices=["bf16", "bf16_autocast"],
                   help="engine.precision of our Engine's loop: DeepSpeed's bf16 mode, or fp32 weights under autocast")
    p.add_argument("--device", default="cuda", help="cuda; cpu only to check the bench itself (tests)")
    p.add_argument("--preset-overrides", nargs="*", default=[], help=argparse.SUPPRESS)  # tests: a tiny model
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("needs a CUDA GPU (the CPU benches: python -m bench.pretrain_step / bench.fast_rcnn_step)")
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29573"}.items():
        os.environ.setdefault(k, v)
    if a.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    try:
        import deepspeed  # lazy: optional; the Engine's process group

        deepspeed.init_distributed(dist_backend="nccl" if a.device == "cuda" else "gloo")
    except ImportError:
        pass
    tokenizer = load_tokenizer(a.tokenizer)
    results = []
    for size in a.sizes:
        r = run_size(size, a, tokenizer)
        results.append(r)
        print(json.dumps(r), flush=True)
    peak = a.peak_tflops * 1e12
    report = {"machine": machine(), "peak_tflops": a.peak_tflops,
              "measured_bf16_gemm_tflops": measured_matmul_peak(8192 if a.device == "cuda" else 256, 10, a.device,
                                                                torch.bfloat16) / 1e12,
              "shape": {k: getattr(a, k) for k in ("captions", "caption_tokens", "text_tokens", "regions", "image")},
              "steps": a.steps, "repeats": a.repeats,
              "results": [{**r, **summarise(r, peak)} for r in results]}
    print(json.dumps(report, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))
    return report["results"]


if __name__ == "__main__":
    main()
