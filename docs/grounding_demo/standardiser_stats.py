"""Are an export's appearance-standardiser statistics those of the regions it is evaluated on?

Pretraining updates the running mean and variance with every region it embeds, including the ones whose pixels
the masker zeroed. This reads an export's statistics and compares them with the appearance of the held-out regions
as its own Fast R-CNN sees them, once with every region in view and once with each image's regions all zeroed
(the grey crops pretraining embeds), per channel in units of the in-view regions' standard deviation.

    python docs/grounding_demo/standardiser_stats.py runs/demo/export [more exports] [--images 60]
"""

from __future__ import annotations

import argparse

import torch

from diagnostics.config import GroundingConfig
from diagnostics.grounding import GroundingData
from model.export import load_pretrained
from shards.tokenizer import load_tokenizer


def appearance(vb, data: GroundingData, zeroed: bool) -> torch.Tensor:
    rows = []
    for item in data.images:
        image, boxes, _ = data.load(item)
        n, (h, w) = len(boxes), image.shape[1:]
        out = vb.fast_rcnn(image[None], torch.tensor([[h, w]]), boxes[None], torch.ones(1, n, dtype=torch.bool),
                           torch.full((1, n), zeroed))
        rows.append(out["appearance"][0, 1:].float())
    return torch.cat(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exports", nargs="+")
    parser.add_argument("--images", type=int, default=60, help="held-out images (first N)")
    args = parser.parse_args(argv)
    cfg = GroundingConfig(flickr_root="data/demo/raw/flickr30k_entities", images="data/demo/raw/images",
                          boxes="data/demo/raw/flickr30k_entities/boxes_val.jsonl", max_images=args.images)
    print("| export | regions | running var / in-view var | grey - in-view mean | running - in-view mean |")
    print("|---|---|---|---|---|")
    for path in args.exports:
        model = load_pretrained(path).eval()
        data = GroundingData(cfg, load_tokenizer(path))
        with torch.no_grad():
            shown, grey = appearance(model.vl_bert, data, False), appearance(model.vl_bert, data, True)
        st = model.vl_bert.embeddings.appearance_standardiser
        mean, std = shown.mean(0), shown.var(0).sqrt()
        ratio = st.running_var.float() / shown.var(0)
        print(f"| {path} | {len(shown)} | median {ratio.median():.2f} (mean {ratio.mean():.2f}) "
              f"| {((grey.mean(0) - mean).abs() / std).median():.2f} sd "
              f"| {((st.running_mean.float() - mean).abs() / std).median():.2f} sd |")


if __name__ == "__main__":
    main()
