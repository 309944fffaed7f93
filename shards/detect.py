"""The detector pass: a torchvision Faster R-CNN proposes the regions VL-BERT reads.

Boxes are kept by VL-BERT's rule: score > 0.5, at most 100, at least 10 (topping up with the best
boxes below the threshold). For every kept box the detector's full class distribution is also
computed (re-running the box head on the kept boxes), because masked RoI classification is trained
against it.

Weights come from a local state-dict file with torchvision's `fasterrcnn_resnet50_fpn` key names
(`backbone.body.*`, `backbone.fpn.*`, `rpn.*`, `roi_heads.*`); a checkpoint dict holding it under
"model" or "state_dict" also works. With no weights file the detector is randomly initialised
(tests and smoke runs only).

CLI: `python -m shards.detect --tsv captions.tsv --out boxes.jsonl [--config det.yaml] [key=value]`
writes a box file that `shards.write_captions --boxes` reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import numpy as np
import torch
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
from tqdm import tqdm

from model.config import load_config

from .caption_inputs import encode_probs, iter_img2dataset, iter_tsv, open_image
from .skips import SkipLog


@dataclass
class DetectorConfig:
    backbone: str = "resnet50"  # torchvision ResNet name for the FPN backbone
    num_classes: int = 1601  # including background (Visual Genome: 1600 classes + background)
    weights: str | None = None  # local Faster R-CNN state dict; None = random init (tests only)
    min_size: int = 600  # torchvision's resize: shorter side
    max_size: int = 1000  # and longer-side cap
    score_threshold: float = 0.5  # VL-BERT keeps boxes scoring above this ...
    min_boxes: int = 10  # ... but at least this many (topping up below the threshold) ...
    max_boxes: int = 100  # ... and at most this many
    nms_threshold: float = 0.5  # per-class NMS IoU
    batch_size: int = 4
    device: str = "cpu"


def select_boxes(scores: torch.Tensor, score_threshold: float, min_boxes: int, max_boxes: int) -> torch.Tensor:
    """Indices of the boxes VL-BERT keeps, best first. `scores` need not be sorted."""
    order = torch.argsort(scores, descending=True, stable=True)
    n_confident = int((scores > score_threshold).sum())
    n_keep = min(max_boxes, max(min_boxes, n_confident), scores.numel())
    return order[:n_keep]


class RegionDetector:
    def __init__(self, cfg: DetectorConfig):
        self.cfg = cfg
        backbone = resnet_fpn_backbone(backbone_name=cfg.backbone, weights=None, trainable_layers=0)
        # Score threshold 0 and room for max_boxes: the VL-BERT rule is applied afterwards, so boxes
        # below 0.5 are still there to top up with.
        self.model = FasterRCNN(backbone, num_classes=cfg.num_classes, min_size=cfg.min_size,
                                max_size=cfg.max_size, box_score_thresh=0.0, box_nms_thresh=cfg.nms_threshold,
                                box_detections_per_img=cfg.max_boxes)
        if cfg.weights:
            state = torch.load(cfg.weights, map_location="cpu", weights_only=True)
            for wrapper in ("model", "state_dict"):
                if isinstance(state, dict) and wrapper in state and isinstance(state[wrapper], dict):
                    state = state[wrapper]
            try:
                self.model.load_state_dict(state)
            except RuntimeError as e:
                raise ValueError(f"{cfg.weights}: does not match a Faster R-CNN {cfg.backbone}-FPN with "
                                 f"{cfg.num_classes} classes: {str(e).splitlines()[0]}") from None
        self.model.eval().to(cfg.device)

    @torch.inference_mode()
    def __call__(self, images: list[torch.Tensor]) -> list[dict[str, np.ndarray]]:
        """images: uint8 [3, H, W] tensors. Returns per image boxes [N,4] (original pixels),
        classes [N], scores [N], class_probs [N, C] float16."""
        m = self.model
        original_sizes = [tuple(im.shape[-2:]) for im in images]
        batch = [im.to(self.cfg.device, torch.float32) / 255.0 for im in images]
        image_list, _ = m.transform(batch)
        features = m.backbone(image_list.tensors)
        proposals, _ = m.rpn(image_list, features)
        detections, _ = m.roi_heads(features, proposals, image_list.image_sizes)
        kept = []
        for det in detections:
            idx = select_boxes(det["scores"], self.cfg.score_threshold, self.cfg.min_boxes, self.cfg.max_boxes)
            kept.append({k: v[idx] for k, v in det.items()})
        # Full class distributions of the kept boxes, from the same box head.
        roi_feats = m.roi_heads.box_roi_pool(features, [k["boxes"] for k in kept], image_list.image_sizes)
        class_logits, _ = m.roi_heads.box_predictor(m.roi_heads.box_head(roi_feats))
        probs = class_logits.float().softmax(-1).split([len(k["boxes"]) for k in kept])
        kept = m.transform.postprocess(kept, image_list.image_sizes, original_sizes)
        return [{"boxes": k["boxes"].float().cpu().numpy(), "classes": k["labels"].cpu().numpy(),
                 "scores": k["scores"].float().cpu().numpy(), "class_probs": p.half().cpu().numpy()}
                for k, p in zip(kept, probs, strict=False)]


def pil_to_tensor(image) -> torch.Tensor:
    arr = np.array(image.convert("RGB"))
    return torch.from_numpy(arr).permute(2, 0, 1).contiguous()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Overrides: DetectorConfig fields as key=value, e.g. num_classes=91")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--tsv", help="CC-style TSV: caption<TAB>image (path relative to --image-root)")
    src.add_argument("--img2dataset", help="img2dataset tar shards (glob or brace pattern)")
    p.add_argument("--image-root", help="folder the TSV's image paths are relative to (default: TSV's folder)")
    p.add_argument("--config", help="DetectorConfig YAML")
    p.add_argument("--out", required=True, help="box file to write (JSON lines)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    cfg = load_config(DetectorConfig, args.config, args.overrides)
    detector = RegionDetector(cfg)
    records = iter_tsv(args.tsv, args.image_root) if args.tsv else iter_img2dataset(args.img2dataset)
    skips = SkipLog("images")
    with open(args.out, "w") as out:
        for key, _rec, _image, det in tqdm(detect_records(records, detector, skips), desc="detect", unit="img"):
            skips.ok()
            out.write(json.dumps({"image": key, "boxes": det["boxes"].round(2).tolist(),
                                  "classes": det["classes"].tolist(), "scores": det["scores"].round(4).tolist(),
                                  "class_probs_f16": encode_probs(det["class_probs"])}) + "\n")
    print(skips.summary().replace("written", "detected"), file=sys.stderr)
    return 0


def detect_records(records, detector: RegionDetector, skips: SkipLog):
    """Run the detector over caption records in batches; yields (key, record, PIL image, detections)."""
    pending = []

    def flush():
        dets = detector([pil_to_tensor(im) for _, _, im in pending])
        for (key, rec, im), det in zip(pending, dets, strict=False):
            yield key, rec, im, det
        pending.clear()

    for rec in records:
        if rec.error:
            skips.skip(rec.error, rec.where, rec.detail)
            continue
        try:
            image = open_image(rec.image_bytes).convert("RGB")
        except Exception as e:  # PIL raises many types for bad bytes
            skips.skip("undecodable image", rec.where, type(e).__name__)
            continue
        pending.append((rec.key, rec, image))
        if len(pending) >= detector.cfg.batch_size:
            yield from flush()
    if pending:
        yield from flush()


if __name__ == "__main__":
    sys.exit(main())
