"""What a RefCOCO+ finetune starts from (docs/FINETUNE.md, session 38): the exports' region outputs on the demo's
val expressions before any finetuning step.

With little labelled data the step-0 model learns RefCOCO+ in ~60 steps and the quick start's export sits at chance
for ~150 (its gradient norms 2-5x smaller). This measures, per export, on val expressions with their gt regions:
- how alike one image's region outputs are (mean pairwise cosine over the image's real regions: 1 leaves the
  scorer nothing to tell them apart by);
- how much of a region output the expression moves (cosine between a region's output with the expression and with
  a different expression of the same length scrambled from the vocabulary: 1 = the text does not reach it);
- zero-shot, parameter-free: whether the referent's output is the one nearest the mean of the expression's word
  outputs (accuracy, against the random candidate's).

    python docs/table4_demo/refcoco_start/probe.py --export step0=runs/demo_step0/export \\
        --export pretrained=runs/demo/export --out docs/table4_demo/refcoco_start
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from finetune.common import encode, eval_batches  # noqa: E402
from finetune.refcoco import RefConfig, RefSet  # noqa: E402
from model.config import load_config  # noqa: E402
from model.export import load_pretrained  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402


def probe(export: str, cfg: RefConfig, n: int, seed: int) -> dict[str, np.ndarray]:
    torch.manual_seed(seed)
    model = load_pretrained(export).eval()
    vl_bert = model.vl_bert
    tok = load_tokenizer(export)
    data = RefSet(cfg, "val", tok, train=False)
    g = torch.Generator().manual_seed(seed)
    out = {"alike": [], "text_reach": [], "nearest_right": [], "chance": [], "image": []}
    with torch.no_grad():
        for _, batch in eval_batches(data, 32, n, f"probe {export}"):
            real = batch["box_mask"]  # [B, N]
            hidden = encode(vl_bert, batch)
            regions = hidden.region_hidden[:, 1:]  # [B, N, H]
            words = hidden.text_hidden[:, 1:-1]  # [CLS] A [SEP]: the expression's word-pieces
            scrambled = dict(batch, a_ids=torch.randint(1000, vl_bert.cfg.vocab_size, batch["a_ids"].shape,
                                                        generator=g).masked_fill(batch["a_mask"] == 0, 0))
            other = encode(vl_bert, scrambled).region_hidden[:, 1:]
            unit = F.normalize(regions, dim=-1)
            cos = unit @ unit.transpose(1, 2)  # [B, N, N]
            pair = real[:, :, None] & real[:, None, :] & ~torch.eye(real.shape[1], dtype=torch.bool)[None]
            out["alike"].append((cos * pair).sum((1, 2)) / pair.sum((1, 2)).clamp(min=1))
            reach = F.cosine_similarity(regions, other, dim=-1)
            out["text_reach"].append((reach * real).sum(1) / real.sum(1))
            mask = batch["a_mask"][:, :, None].float()
            query = F.normalize((words * mask).sum(1) / mask.sum(1), dim=-1)  # [B, H]
            score = (unit @ query[:, :, None]).squeeze(-1).masked_fill(~real, float("-inf"))
            out["nearest_right"].append((batch["iou"].gather(1, score.argmax(1, keepdim=True))[:, 0] >= 0.5).float())
            out["chance"].append(((batch["iou"] >= 0.5) & real).sum(1) / real.sum(1))
            out["image"].append(torch.tensor([int(k) for k in batch["image_keys"]]))
    return {k: torch.cat(v).numpy().astype(np.float64) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--export", action="append", required=True, help="NAME=EXPORT_DIR")
    ap.add_argument("--config", default="launch/configs/refcoco_demo.yaml")
    ap.add_argument("--examples", type=int, default=320)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    cfg = load_config(RefConfig, args.config)
    report, lines = {}, ["| export | region outputs alike (cosine) | text reach (cosine, scrambled text) | "
                         "nearest to the expression, zero-shot | random candidate |", "|---|---|---|---|---|"]
    for spec in args.export:
        name, export = spec.split("=", 1)
        m = probe(export, cfg, args.examples, seed=0)
        stats = {k: clustered_bootstrap(m[k], m["image"]) for k in ("alike", "text_reach", "nearest_right", "chance")}
        report[name] = {"export": export, **stats}
        lines.append(f"| {name} | " + " | ".join(f"{s['mean']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]"
                                                 for s in stats.values()) + " |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps(report, indent=1))
    text = "\n".join(lines) + (f"\n\nRefCOCO+ val, the first {args.examples} expressions with their gt regions, before "
                               "finetuning; 95% intervals from a bootstrap over images.\n")
    (out / "probe.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
