"""The Fast R-CNN that turns pixels and boxes into region features, trained end to end with VL-BERT.

A torchvision ResNet split as in Faster R-CNN C4: stem..layer3 is the backbone (stride 16, or 8 with
`feature_stride`), RoIAlign (14x14, scale 1/stride, aligned) crops each box plus one box covering the
whole image, and layer4 is the box head, average-pooled into the appearance feature (2048-d for
ResNet-50/101). BatchNorm is frozen (`FrozenBatchNorm2d`); the stem can be frozen; everything else trains.

Masked RoI classification hides a region from the whole model by zeroing its pixels *before* the
backbone runs, on the normalised image (so a masked pixel is the mean colour), as the official code
does. The zeroing covers every pixel the box touches, so no feature of any region, nor of the
whole-image box, can see what was inside.

Weights (`FastRCNNConfig.weights`), a local state dict, either:
- a torchvision ResNet (`conv1.*`, `bn1.*`, `layer1..4.*`, `fc.*`): `conv1/bn1/layer1..3` -> `backbone.*`,
  `layer4` -> `box_head.*`, `fc` dropped (ImageNet classes are not object classes);
- a torchvision Faster R-CNN (`backbone.body.<same names>`), the FPN/RPN/ROI-head keys being dropped;
- our own export of this module (`backbone.*`, `box_head.*`, `object_classifier.*`, `attribute_classifier.*`,
  `size_classifier.*`).

With `region_masks` (an instance mask per box, in the box's frame, as the official VCR model reads its
objects' segmentations), each region's res5 map is multiplied by its mask before the average pool, so the
feature describes the object and not the rest of its box.

Beside the object (and attribute) classifiers on the region feature, an optional size classifier reads the
box's geometry (`model.boxes.scale_features`): RoIAlign resamples every box to the same grid, so the
region feature does not say how large the object is.
"""

from __future__ import annotations

import os

import torch
import torchvision
from torch import nn
from torchvision.models.resnet import Bottleneck
from torchvision.ops import FrozenBatchNorm2d, roi_align

from .boxes import scale_features, with_whole_image
from .config import FastRCNNConfig


def grey_of(pixel_mean) -> torch.Tensor:
    """uint8 [1, 3, 1, 1]: the pixel mean, 0 after the detector's normalisation (up to uint8 rounding)."""
    return (torch.as_tensor(pixel_mean, dtype=torch.float32) * 255).round().to(torch.uint8).view(1, 3, 1, 1)


def pixel_mask(boxes: torch.Tensor, masked: torch.Tensor, image_sizes: torch.Tensor, height: int, width: int
               ) -> torch.Tensor:
    """[B, H, W] bool: True where a pixel lies in any masked box, or in the padding outside the image.

    A box covers every pixel it touches (floor of x1/y1 to ceil of x2/y2). Built with a 2-D
    difference array and two cumulative sums, so it costs O(B*H*W) whatever the number of boxes.
    boxes [B, N, 4] x1,y1,x2,y2 pixels; masked [B, N] bool; image_sizes [B, 2] (h, w).
    """
    b, n = masked.shape
    dev = boxes.device
    x1 = boxes[..., 0].floor().clamp(0, width).long()
    y1 = boxes[..., 1].floor().clamp(0, height).long()
    x2 = boxes[..., 2].ceil().clamp(0, width).long()
    y2 = boxes[..., 3].ceil().clamp(0, height).long()
    weight = masked.to(torch.int32)
    diff = torch.zeros(b, height + 1, width + 1, dtype=torch.int32, device=dev)
    batch = torch.arange(b, device=dev).unsqueeze(1).expand(b, n)
    for ys, xs, sign in ((y1, x1, 1), (y1, x2, -1), (y2, x1, -1), (y2, x2, 1)):
        diff.index_put_((batch, ys, xs), sign * weight, accumulate=True)
    covered = diff.cumsum(1).cumsum(2)[:, :height, :width] > 0
    rows = torch.arange(height, device=dev).view(1, height, 1)
    cols = torch.arange(width, device=dev).view(1, 1, width)
    outside = (rows >= image_sizes[:, 0].view(b, 1, 1)) | (cols >= image_sizes[:, 1].view(b, 1, 1))
    return covered | outside


def real_rois(box_mask: torch.Tensor) -> torch.Tensor:
    """box_mask [B, N] -> the flat indices, into FastRCNN's B * (1+N) RoIs (each image's whole-image box first),
    of the whole-image boxes and the real boxes: `FastRCNN.forward`'s `roi_index`. Data-dependent in length, so
    built where the batch is (on the host), not in the step."""
    real = torch.cat([box_mask.new_ones(box_mask.shape[0], 1), box_mask], 1).flatten()
    return real.nonzero().squeeze(1)


def size_classifier(num_sizes: int) -> nn.Sequential:
    """The size head over `scale_features` of a box: a small MLP, as a size is an interval of the larger
    normalised side, which no linear function of (w, h) is."""
    return nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, num_sizes))


class FrozenBN(FrozenBatchNorm2d):
    """torchvision's FrozenBatchNorm2d, computed in the input's dtype: DeepSpeed's bf16/fp16 casts
    parameters but leaves these statistics buffers fp32, which would promote every activation back to
    fp32 in front of a half-precision convolution."""

    folded = False  # set by `fold_frozen_norms`: the convolution before it applies it

    def scale_shift(self) -> tuple[torch.Tensor, torch.Tensor]:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        return scale, self.bias - self.running_mean * scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.folded:
            return x
        scale, bias = self.scale_shift()
        return x * scale.to(x.dtype).view(1, -1, 1, 1) + bias.to(x.dtype).view(1, -1, 1, 1)


class FoldedConv2d(nn.Conv2d):
    """A bias-free convolution followed by a FrozenBN, computed as one convolution: W x scale with the shift as
    its bias (a weight-sized product per step instead of two passes over the activations). The norm keeps its
    buffers where they were (same state dict); the convolution holds it unregistered."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale, shift = self.norm.scale_shift()
        weight = self.weight * scale.to(self.weight.dtype).view(-1, 1, 1, 1)
        return self._conv_forward(x, weight, shift.to(weight.dtype))


def fold_frozen_norms(resnet: nn.Module) -> int:
    """Fold every FrozenBN of a torchvision ResNet into the bias-free convolution it follows (stem, blocks,
    downsample branches). Returns how many were folded."""
    pairs = [(resnet, "conv1", "bn1")]
    for layer in (resnet.layer1, resnet.layer2, resnet.layer3, resnet.layer4):
        for block in layer:
            pairs += [(block, f"conv{i}", f"bn{i}") for i in (1, 2, 3) if hasattr(block, f"conv{i}")]
            if block.downsample is not None:
                pairs.append((block.downsample, "0", "1"))
    for parent, conv_name, norm_name in pairs:
        conv, norm = getattr(parent, conv_name), getattr(parent, norm_name)
        if not isinstance(norm, FrozenBN) or conv.bias is not None:
            raise ValueError(f"fold_frozen_norms: {conv_name} -> {norm_name} is not a bias-free conv and a FrozenBN")
        conv.__class__ = FoldedConv2d  # same parameters and buffers: only the forward changes
        object.__setattr__(conv, "norm", norm)  # not a submodule: the norm stays where its weights load
        norm.folded = True
    return len(pairs)


def _resnet(name: str, norm: str = "frozen") -> nn.Module:
    if not hasattr(torchvision.models, name) or not name.startswith("resnet"):
        raise ValueError(f"fast_rcnn.backbone: '{name}' is not a torchvision ResNet (resnet18/34/50/101/152)")
    if norm not in ("frozen", "batch"):
        raise ValueError(f"fast_rcnn.norm: '{norm}' is not frozen or batch")
    return getattr(torchvision.models, name)(weights=None, norm_layer=FrozenBN if norm == "frozen" else nn.BatchNorm2d)


class FastRCNN(nn.Module):
    def __init__(self, cfg: FastRCNNConfig):
        super().__init__()
        self.cfg = cfg
        resnet = _resnet(cfg.backbone, cfg.norm)
        if cfg.fold_frozen_norms:
            if cfg.norm != "frozen":
                raise ValueError("fast_rcnn.fold_frozen_norms needs fast_rcnn.norm: frozen (a trained norm "
                                 "cannot be folded)")
            fold_frozen_norms(resnet)
        if cfg.feature_stride not in (8, 16):
            raise ValueError(f"fast_rcnn.feature_stride: {cfg.feature_stride} is not 8 or 16")
        if cfg.res5_dilation not in (1, 2):
            raise ValueError(f"fast_rcnn.res5_dilation: {cfg.res5_dilation} is not 1 or 2")
        if cfg.box_convention not in ("continuous", "inclusive"):
            raise ValueError(f"fast_rcnn.box_convention: '{cfg.box_convention}' is not continuous or inclusive")
        if cfg.roi_sampling_ratio < 0:
            raise ValueError(f"fast_rcnn.roi_sampling_ratio: {cfg.roi_sampling_ratio} is negative")
        if (cfg.stride_in_1x1 or cfg.res5_dilation != 1) and not isinstance(resnet.layer4[0], Bottleneck):
            raise ValueError(f"fast_rcnn.stride_in_1x1 / res5_dilation: {cfg.backbone} has no Bottleneck blocks "
                             "(resnet50/101/152 have)")
        if cfg.stride_in_1x1:  # the same weights, strided one conv earlier
            for layer in (resnet.layer2, resnet.layer3, resnet.layer4):
                if layer[0].conv2.stride == (2, 2):
                    layer[0].conv1.stride, layer[0].conv2.stride = (2, 2), (1, 1)
        if cfg.res5_dilation == 2:
            for i, block in enumerate(resnet.layer4):
                block.conv2.dilation, block.conv2.padding = (2, 2), (2, 2)
                if i == 0:
                    block.conv1.stride, block.conv2.stride = (1, 1), (1, 1)
                    block.downsample[0].stride = (1, 1)
        if cfg.feature_stride == 8:
            # no dilation: res4 sees a smaller context, which small objects do not miss, and torchvision's
            # BasicBlock (ResNet-18/34) has none; strides are not weights, so any C4 checkpoint still loads
            for module in resnet.layer3[0].modules():
                if isinstance(module, nn.Conv2d) and module.stride == (2, 2):
                    module.stride = (1, 1)
        self.backbone = nn.Sequential()  # names follow torchvision's so weights map one to one
        for name in ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3"):
            self.backbone.add_module(name, getattr(resnet, name))
        self.box_head = resnet.layer4  # res5, run per region
        self.feature_size = resnet.fc.in_features  # 2048 for ResNet-50/101, 512 for 18/34
        self.object_classifier = nn.Linear(self.feature_size, cfg.num_classes)
        self.attribute_classifier = nn.Linear(self.feature_size, cfg.num_attributes) if cfg.num_attributes else None
        self.size_classifier = None
        if cfg.num_sizes:
            # drawn on a forked generator, so every other module's random init is what it is without it
            with torch.random.fork_rng(devices=[]):
                self.size_classifier = size_classifier(cfg.num_sizes)
        for name, value in self.config_buffers().items():
            self.register_buffer(name, value, persistent=False)
        nn.init.normal_(self.object_classifier.weight, std=0.01)
        nn.init.zeros_(self.object_classifier.bias)
        if self.attribute_classifier is not None:
            nn.init.normal_(self.attribute_classifier.weight, std=0.01)
            nn.init.zeros_(self.attribute_classifier.bias)
        if cfg.weights:
            self.load_weights(cfg.weights)
        if cfg.freeze_stem:
            for p in self.backbone.conv1.parameters():
                p.requires_grad_(False)
        frozen = [cfg.freeze_res2, cfg.freeze_res3, cfg.freeze_res4]  # detectron's FREEZE_AT: 2 in the official configs
        for layer, freeze in zip((self.backbone.layer1, self.backbone.layer2, self.backbone.layer3), frozen):
            if freeze:
                for p in layer.parameters():
                    p.requires_grad_(False)

    def config_buffers(self) -> dict[str, torch.Tensor]:
        """The buffers that follow from the config alone, not saved with the weights (see
        `VLBertEmbeddings.config_buffers`)."""
        return {"pixel_mean": torch.tensor(self.cfg.pixel_mean).view(1, 3, 1, 1) * 255,
                "pixel_std": torch.tensor(self.cfg.pixel_std).view(1, 3, 1, 1) * 255}

    def load_weights(self, path: str) -> None:
        if not os.path.exists(path):
            raise FileNotFoundError(f"fast_rcnn.weights: {path} not found (the demo's comes from `python -m "
                                    f"pretrain.detector --config launch/configs/detector_demo.yaml`)")
        state = torch.load(path, map_location="cpu", weights_only=True)
        for wrapper in ("model", "state_dict"):
            if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
                state = state[wrapper]
        mapped = {}
        for key, value in state.items():
            key = key.removeprefix("backbone.body.")
            if key.startswith(("backbone.", "box_head.", "object_classifier.", "attribute_classifier.",
                               "size_classifier.")):
                mapped[key] = value
            elif key.startswith("layer4."):
                mapped["box_head." + key.removeprefix("layer4.")] = value
            elif key.startswith(("conv1.", "bn1.", "layer1.", "layer2.", "layer3.")):
                mapped["backbone." + key] = value
        own = self.state_dict()
        # batch norm's step counter means nothing to frozen statistics (a "batch" warm-up loaded as "frozen")
        mapped = {k: v for k, v in mapped.items() if not k.endswith("num_batches_tracked") or k in own}
        heads = ("object_classifier.", "attribute_classifier.", "size_classifier.")  # the warm-up's; a plain ResNet
        # has none
        missing = [k for k in own if k not in mapped and not k.startswith(heads)]
        if missing:
            raise ValueError(f"{path}: not a {self.cfg.backbone} state dict; missing e.g. {missing[:3]}")
        if self.attribute_classifier is not None and "attribute_classifier.weight" in mapped \
                and mapped["attribute_classifier.weight"].shape[0] != self.cfg.num_attributes:
            raise ValueError(f"{path}: its attribute classifier has {mapped['attribute_classifier.weight'].shape[0]} "
                             f"attributes, fast_rcnn.num_attributes is {self.cfg.num_attributes}")
        if self.size_classifier is not None and "size_classifier.2.weight" in mapped \
                and mapped["size_classifier.2.weight"].shape[0] != self.cfg.num_sizes:
            raise ValueError(f"{path}: its size classifier has {mapped['size_classifier.2.weight'].shape[0]} sizes, "
                             f"fast_rcnn.num_sizes is {self.cfg.num_sizes}")
        for key, value in mapped.items():
            if key in own and own[key].shape != value.shape:
                raise ValueError(f"{path}: '{key}' has shape {list(value.shape)}, {self.cfg.backbone} needs "
                                 f"{list(own[key].shape)}")
        self.load_state_dict(mapped, strict=False)

    def size_logits(self, boxes_normalised: torch.Tensor) -> torch.Tensor:
        """[..., 4] boxes over the image's (w, h, w, h) -> [..., num_sizes]."""
        weight = self.size_classifier[0].weight
        return self.size_classifier(scale_features(boxes_normalised).to(weight.dtype))

    def normalise(self, images: torch.Tensor, image_sizes: torch.Tensor, boxes: torch.Tensor | None = None,
                  masked: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 [B, 3, H, W] -> normalised float, masked boxes and padding set to 0 (the mean colour)."""
        x = (images.float() - self.pixel_mean) / self.pixel_std
        b, _, h, w = x.shape
        if boxes is None:
            boxes = x.new_zeros(b, 0, 4)
            masked = torch.zeros(b, 0, dtype=torch.bool, device=x.device)
        if self.cfg.box_convention == "inclusive":  # x2, y2 are the last pixels in: the box covers them
            boxes = boxes + boxes.new_tensor([0.0, 0.0, 1.0, 1.0])
        hide = pixel_mask(boxes, masked, image_sizes, h, w)
        return x.masked_fill(hide.unsqueeze(1), 0.0)

    def forward(self, images: torch.Tensor, image_sizes: torch.Tensor, boxes: torch.Tensor, box_mask: torch.Tensor,
                masked_regions: torch.Tensor | None = None, class_logits: bool = False,
                region_masks: torch.Tensor | None = None, roi_index: torch.Tensor | None = None
                ) -> dict[str, torch.Tensor]:
        """images uint8 [B, 3, H, W]; image_sizes [B, 2] (h, w); boxes [B, N, 4] pixels; box_mask [B, N];
        masked_regions [B, N] bool (pixels zeroed before the backbone); region_masks [B, N, S, S] (S: res5's
        output side, 7 for a 14x14 RoI, 14 with res5_dilation 2): each box's instance mask in its own frame,
        weighting its res5 map before the pool (the whole-image element keeps all of its map).

        Returns appearance [B, 1+N, F] (element 0: the whole-image box), boxes [B, 1+N, 4] and, with
        `class_logits` (the detector warm-up; pretraining has no loss on them, so it does not pay for
        them), class_logits [B, 1+N, num_classes]. Padded boxes are computed but meaningless, unless
        `roi_index` (`real_rois(box_mask)`, built on the host by the loader: indexing by it does not make a GPU wait)
        names the rows of [B * (1+N)] to compute: res5 then runs on those alone (the demo warm-up's batches are 38%
        padding), the other rows' appearance is 0, and a training-mode norm in res5 sees no padding.
        """
        b, n = box_mask.shape
        if masked_regions is None:
            masked_regions = torch.zeros_like(box_mask)
        # the backbone runs in the configured layout; the reader's batches are channels-last already, and
        # a conversion is cheapest on uint8 pixels (the elementwise ops after it keep the layout)
        layout = torch.channels_last if self.cfg.channels_last else torch.contiguous_format
        x = self.normalise(images.contiguous(memory_format=layout), image_sizes, boxes, masked_regions & box_mask)
        # DeepSpeed bf16/fp16 casts the weights, not the inputs; under autocast the weights stay fp32
        x = x.to(self.object_classifier.weight.dtype).contiguous(memory_format=layout)
        features = self.backbone(x)  # [B, C4, H/stride, W/stride]
        inclusive = self.cfg.box_convention == "inclusive"
        all_boxes = with_whole_image(boxes, image_sizes, inclusive=inclusive)  # [B, 1+N, 4]
        index = torch.arange(b, device=boxes.device, dtype=boxes.dtype).view(b, 1, 1).expand(b, n + 1, 1)
        # RoIAlign in fp32, as torchvision's autocast rule does: bf16 box corners would be off by up to
        # 4 px at 1000 px, and the CPU kernel has no bf16 version
        rois = torch.cat([index, all_boxes], -1).reshape(-1, 5).float()
        if roi_index is not None:
            rois = rois.index_select(0, roi_index)
        crops = roi_align(features.float(), rois, self.cfg.roi_output_size, spatial_scale=1 / self.cfg.feature_stride,
                          sampling_ratio=self.cfg.roi_sampling_ratio, aligned=not inclusive
                          ).to(features.dtype)  # [B*(1+N) or the indexed rows, C4, 14, 14]
        res5 = self.box_head(crops)  # [rows, F, S, S]
        if region_masks is not None:
            side = res5.shape[-1]
            if tuple(region_masks.shape) != (b, n, side, side):
                raise ValueError(f"region_masks {list(region_masks.shape)}: expected [{b}, {n}, {side}, {side}] "
                                 f"(res5's output side is {side} here)")
            whole = region_masks.new_ones(b, 1, side, side)
            weights = torch.cat([whole, region_masks], 1).reshape(-1, 1, side, side)
            if roi_index is not None:
                weights = weights.index_select(0, roi_index)
            res5 = res5 * weights.to(res5.dtype)
        pooled = res5.mean((2, 3))  # [rows, F]
        if roi_index is not None:
            pooled = pooled.new_zeros(b * (n + 1), pooled.shape[1]).index_copy(0, roi_index, pooled)
        appearance = pooled.view(b, n + 1, -1)  # [B, 1+N, F]
        out = {"appearance": appearance, "boxes": all_boxes}
        if class_logits:
            out["class_logits"] = self.object_classifier(appearance)
        return out
