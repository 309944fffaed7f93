"""An export with another export's Fast R-CNN (or other parts): the interventions behind docs/FINETUNE.md's RefCOCO+
deficit (session 43).

The pretrained row of the no-channel pair trailed step 0 on colour-only expressions while its detector's held-out
colour accuracy fell during pretraining. Finetuning the pretrained transformer on the warm-up's detector (step 0's,
identical to the warm-up's weights) separates the two: if the deficit goes, the drifted features caused it.

With `--take PREFIX` (repeatable) the tensors whose names start with one of the prefixes come from --detector
instead of the detector's (`vl_bert.fast_rcnn.`): e.g. the visual embedding's, to ask whether the pretrained model's
deficit sits in how it embeds regions. Everything else comes from --model, including the appearance standardiser's
running statistics (finetuning updates them in its first batches: momentum 0.05). The two exports must share a
config except for where the detector's weights came from.

    python docs/table4_demo/refcoco_start/swap_parts.py --model runs/A/export --detector runs/B/export --out DIR
        [--take vl_bert.embeddings.visual_ ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

DETECTOR = "vl_bert.fast_rcnn."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="the export whose transformer, heads and embeddings are kept")
    ap.add_argument("--detector", required=True,
                    help="the export whose Fast R-CNN (or --take parts) replace --model's")
    ap.add_argument("--out", required=True)
    ap.add_argument("--take", action="append", metavar="PREFIX",
                    help=f"tensor name prefix taken from --detector (repeatable; default {DETECTOR})")
    args = ap.parse_args(argv)
    model, detector, out = Path(args.model), Path(args.detector), Path(args.out)
    take = tuple(args.take or [DETECTOR])

    def architecture(d: Path) -> dict:  # config.json less where the detector's weights were read from
        config = json.loads((d / "config.json").read_text())
        config["fast_rcnn"] = {k: v for k, v in config["fast_rcnn"].items() if k != "weights"}
        return config

    if architecture(model) != architecture(detector):
        raise SystemExit(f"{model}/config.json and {detector}/config.json describe different models")

    with safe_open(str(model / "model.safetensors"), "pt") as a, \
            safe_open(str(detector / "model.safetensors"), "pt") as b:
        if set(a.keys()) != set(b.keys()):
            raise SystemExit(f"{model} and {detector}: different tensor names")
        tensors = {k: (b if k.startswith(take) else a).get_tensor(k) for k in a.keys()}
        metadata = dict(a.metadata() or {})
        taken = [k for k in a.keys() if k.startswith(take)]
        changed = sum(not tensors[k].equal(a.get_tensor(k)) for k in taken)
    swapped = len(taken)
    if not swapped:
        raise SystemExit(f"{model}: no tensor names start with {', '.join(take)}")
    metadata["taken_from"] = f"{detector}: {', '.join(take)}"
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata=metadata)
    for f in model.iterdir():
        if f.name not in ("model.safetensors", "verify.json") and f.is_file():  # verify.json checked --model's weights
            shutil.copy(f, out / f.name)
    print(f"{out}: {len(tensors) - swapped} tensors from {model}, {swapped} tensors from {detector} "
          f"({changed} of them differ from {model}'s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
