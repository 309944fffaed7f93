"""A frozen Fast R-CNN over decoded caption samples: the region features a features-mode model reads
(`python -m pretrain.features` writes them into shards; the diagnostics recompute them for held-out images)."""

from __future__ import annotations

import torch

from model.fast_rcnn import FastRCNN

from .collate import collate_captions


class FeatureExtractor:
    """A frozen Fast R-CNN over decoded caption samples (`CaptionDecoder` output): [N, F] per sample."""

    def __init__(self, fast_rcnn_cfg, device: str | torch.device = "cpu"):
        if not fast_rcnn_cfg.weights:
            raise ValueError("model.fast_rcnn.weights is empty: features from a randomly initialised detector "
                             "carry nothing; train one first (python -m pretrain.detector)")
        self.device = torch.device(device)
        self.model = FastRCNN(fast_rcnn_cfg).to(self.device).eval()
        self.feature_size = self.model.feature_size

    @torch.no_grad()
    def __call__(self, samples: list[dict]) -> list[torch.Tensor]:
        b = collate_captions(samples)
        out = self.model(b["images"].to(self.device), b["image_sizes"].to(self.device), b["boxes"].to(self.device),
                         b["box_mask"].to(self.device))
        feats = out["appearance"][:, 1:].float().cpu()  # the whole image is recomputed by the model
        return [feats[i, : len(s["boxes"])] for i, s in enumerate(samples)]
