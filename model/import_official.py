"""Import an official VL-BERT pretraining checkpoint (jackroos/VL-BERT, e.g. `vl-bert_base_e2e.model`) as an
export directory of ours (`model.export`), which the trainers, `Predictor` and transformers load.

    python -m model.import_official --checkpoint vl-bert_base_e2e.model --out runs/official_base \\
        [--tokenizer DIR_WITH_vocab.txt] [--heads 12]

or `import_official(checkpoint, out)` from Python. Every tensor of the checkpoint lands in one place of ours
or the import stops with an error naming the keys it cannot place; nothing is dropped silently (the few
copies and counters the official module keeps twice are checked and named below).

What the official code computes (read from its `common/visual_linguistic_bert.py`, `common/fast_rcnn.py`,
`common/backbone/resnet/resnet.py`, `pretrain/modules/resnet_vlbert_for_pretraining*.py`) and where our
model is told to compute the same (`official_config`):
- images: BGR, 0-255 minus PIXEL_MEANS (std 1). Ours read RGB: conv1's input channels are reversed here and
  the means written in RGB order, which is the same arithmetic.
- the ResNet-101 C4 backbone strides in its 1x1 convs (IMAGE_STRIDE_IN_1x1) and res5 is dilated
  (IMAGE_C5_DILATED: stride 1, dilation 2, a 14x14 RoI pooled over 14x14): `fast_rcnn.stride_in_1x1`,
  `fast_rcnn.res5_dilation: 2`. Batch norm is frozen (eval statistics): ours is FrozenBatchNorm.
- boxes are inclusive pixel indices (the whole image is (0, 0, w-1, h-1)) and RoIAlign is maskrcnn-benchmark's
  legacy kernel, sampling ratio 1, no half-pixel offset: `fast_rcnn.box_convention: inclusive`,
  `roi_sampling_ratio: 1`.
- `obj_downsample` = Dropout, Linear(coordinate embedding ++ appearance), ReLU: ours is the same module with
  its input halves in the other order (appearance ++ geometry), so the weight's column blocks swap. The
  coordinate embedding encodes (x centre, y centre, w, h): `geometry_boxes: center_size`.
- `visual_1x1_text/object` exist only where visual_size differs from hidden_size; otherwise the identity,
  which ours, always having the projection, is given.
- a region's token is `object_linguistic_embeddings` (a masked one's `object_mask_word_embedding`), [END] is
  `end_embedding` with no visual term, and text-only samples take `aux_text_visual_embedding` and end with
  [END] too: `visual_tokens: learned`.
- the MVRC head is dense + GELU + classifier, without LayerNorm: `mrc_head_norm: false`.

Checkpoints of precomputed features (IMAGE_FEAT_PRECOMPUTED, e.g. `vl-bert-base-prec.model`: no CNN, only
`obj_downsample`) import as `region_input: features`. The VQA, RefCOCO+ and VCR task checkpoints import with
`python -m finetune.import_official` (their heads are finetune's). Not supported (an error names them): the
relationship head, IMAGE_SEMANTIC class embeddings, frozen word embeddings with special rows, `visual_ln:
false` scales.
"""

from __future__ import annotations

import argparse
import pickle
import re
from pathlib import Path

import torch

from .config import VLBertConfig, model_config
from .export import PRETRAINING_ARCHITECTURE, image_preprocessing, save_pretrained
from .vl_bert import VLBertForPretraining

# the official configs' PIXEL_MEANS (BGR, 0-255) and scales
OFFICIAL_PIXEL_MEANS_BGR = (102.9801, 115.9465, 122.7717)
OFFICIAL_SCALES = (600, 1000)
BOX_CONVENTION = "xyxy, pixels of the resized image, 0-based, x2/y2 inclusive (the last pixel in)"
RESNET_DEPTH = {6: 50, 23: 101, 36: 152}  # res4 blocks -> depth
OFFICIAL_GEOMETRY = 4 * 2 * 256  # common/utils/bbox.py coordinate_embeddings(..., 256): sin and cos of 4 values
FRCNN, VLBERT = "image_feature_extractor.", "vlbert."
# counters and copies the official module keeps that carry nothing of their own
BN_COUNTER = re.compile(r".*\.num_batches_tracked$")


def read_official_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """The state dict of an official checkpoint (a torch pickle `{'epoch', 'state_dict', 'optimizer'}`),
    read with torch's restricted unpickler (weights_only), without DataParallel's `module.` prefix."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: checkpoint not found")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"{path}: the restricted unpickler refuses this file (it holds more than tensors and "
                         f"plain containers): {str(e).splitlines()[0]}") from None
    state = obj.get("state_dict", obj) if isinstance(obj, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: expected a state dict (or a dict with 'state_dict'), got {type(obj).__name__}")
    return {k.removeprefix("module."): v for k, v in state.items()}


def official_config(state: dict[str, torch.Tensor], *, num_attention_heads: int | None = None,
                    stride_in_1x1: bool = True, c5_dilated: bool = True,
                    pixel_means_bgr: tuple[float, float, float] = OFFICIAL_PIXEL_MEANS_BGR) -> VLBertConfig:
    """Our config for an official state dict: sizes read from the tensors' shapes; what shapes do not tell
    (attention heads: hidden/64 unless given; the stride and dilation of the ResNet, the pixel means) from
    the official configs' values unless given."""
    def shape(key: str) -> tuple[int, ...]:
        if key not in state:
            raise ValueError(f"not an official VL-BERT pretraining state dict: no '{key}'")
        return tuple(state[key].shape)

    vocab, hidden = shape(VLBERT + "word_embeddings.weight")
    layers = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"vlbert\.encoder\.layer\.(\d+)\.", k)))
    visual_size, downsample_in = shape(FRCNN + "obj_downsample.1.weight")
    precomputed = not any(k.startswith(FRCNN + "backbone.") for k in state)
    if precomputed:  # IMAGE_FEAT_PRECOMPUTED (the official VQA): no CNN, the boxes carry their features
        res4, appearance = 23, downsample_in - OFFICIAL_GEOMETRY
        if appearance <= 0:
            raise ValueError(f"obj_downsample takes {downsample_in} inputs: not the {OFFICIAL_GEOMETRY}-d coordinate "
                             "embedding plus a feature")
    else:
        res4 = 1 + max(int(m.group(1)) for k in state
                       if (m := re.match(r"image_feature_extractor\.backbone\.layer3\.(\d+)\.", k)))
        if res4 not in RESNET_DEPTH or FRCNN + "backbone.layer1.0.conv3.weight" not in state:
            raise ValueError(f"the official backbone has {res4} res4 blocks: not a Bottleneck ResNet-50/101/152")
        appearance = shape(FRCNN + "roi_head_feature_extractor.2.conv3.weight")[0]
    classes = shape(VLBERT + "mvrc_head.region_cls_pred.weight")[0] if \
        VLBERT + "mvrc_head.region_cls_pred.weight" in state else 1601
    mean_rgb = tuple(m / 255 for m in reversed(pixel_means_bgr))
    return model_config("base", updates=dict(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=num_attention_heads or hidden // 64,
        intermediate_size=shape(VLBERT + "encoder.layer.0.intermediate.dense.weight")[0],
        max_position_embeddings=shape(VLBERT + "position_embeddings.weight")[0],
        type_vocab_size=shape(VLBERT + "token_type_embeddings.weight")[0],
        visual_size=visual_size, geometry_size=downsample_in - appearance,
        visual_tokens="learned", geometry_boxes="center_size", mrc_head_norm=False,
        region_input="features" if precomputed else "pixels", precomputed_feature_size=appearance,
        fast_rcnn=dict(backbone=f"resnet{RESNET_DEPTH[res4]}", num_classes=classes, norm="frozen",
                       stride_in_1x1=stride_in_1x1, res5_dilation=2 if c5_dilated else 1,
                       box_convention="inclusive", roi_sampling_ratio=1, roi_output_size=14, feature_stride=16,
                       freeze_stem=True, freeze_res2=True,  # IMAGE_FROZEN_BACKBONE_STAGES: [1, 2]
                       pixel_mean=mean_rgb, pixel_std=(1 / 255,) * 3)))


def convert_official_state(state: dict[str, torch.Tensor], cfg: VLBertConfig,
                           own: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Official names and layouts -> ours (`own`: our model's state dict, for the shapes and the identity
    projections). Raises naming every official key left without a place, and every shape that differs."""
    out: dict[str, torch.Tensor] = {}
    unmapped: list[str] = []
    emb, det = "vl_bert.embeddings.", "vl_bert.fast_rcnn."
    direct = {
        "object_linguistic_embeddings.weight": emb + "object_token_embedding",
        "object_mask_word_embedding.weight": emb + "roi_mask_embedding",
        "aux_text_visual_embedding.weight": emb + "text_only_visual_embedding",
        VLBERT + "end_embedding.weight": emb + "end_token_embedding",
        VLBERT + "word_embeddings.weight": emb + "word_embeddings.weight",
        VLBERT + "position_embeddings.weight": emb + "position_embeddings.weight",
        VLBERT + "token_type_embeddings.weight": emb + "token_type_embeddings.weight",
        VLBERT + "embedding_LayerNorm.weight": emb + "LayerNorm.weight",
        VLBERT + "embedding_LayerNorm.bias": emb + "LayerNorm.bias",
        VLBERT + "mlm_head.predictions.bias": "mlm_head.bias",
        FRCNN + "obj_downsample.1.bias": emb + "visual_feature_embedding.1.bias",
    }
    prefixes = [
        (VLBERT + "encoder.", "vl_bert.encoder."),
        (VLBERT + "pooler.", "vl_bert.pooler."),
        (VLBERT + "visual_ln_text.", emb + "visual_ln_text."),
        (VLBERT + "visual_ln_object.", emb + "visual_ln_object."),
        (VLBERT + "visual_1x1_text.", emb + "visual_projection_text."),
        (VLBERT + "visual_1x1_object.", emb + "visual_projection_object."),
        (VLBERT + "mlm_head.predictions.transform.", "mlm_head.transform."),
        (VLBERT + "mvrc_head.transform.", "masked_roi_classification.transform."),
        (VLBERT + "mvrc_head.region_cls_pred.", "masked_roi_classification.classifier."),
        (FRCNN + "backbone.", det + "backbone."),
        (FRCNN + "roi_head_feature_extractor.", det + "box_head."),
    ]
    for key, value in state.items():
        if BN_COUNTER.match(key):
            continue  # batch norm's step counter: frozen statistics have no use for it
        if key.startswith(FRCNN + "head.0."):  # the official head Sequential holds res5 a second time
            twin = FRCNN + "roi_head_feature_extractor." + key.removeprefix(FRCNN + "head.0.")
            if twin not in state or not torch.equal(state[twin], value):
                raise ValueError(f"'{key}' differs from its twin '{twin}': res5 would be ambiguous")
            continue
        if key == VLBERT + "mlm_head.predictions.decoder.weight":  # tied to the word embeddings
            if not torch.equal(value, state[VLBERT + "word_embeddings.weight"]):
                raise ValueError(f"'{key}' is not tied to the word embeddings: our MLM decoder is")
            continue
        if key == "object_mask_visual_embedding.weight":  # masks features, not pixels; zero-initialised
            if value.abs().max() > 0:
                raise ValueError(f"'{key}' is not zero: this model masks region features (MASK_RAW_PIXELS "
                                 "false), ours zero the pixels")
            continue
        if key in direct:
            target = direct[key]
            value = value.reshape(own[target].shape) if target in own and value.numel() == own[target].numel() \
                else value
        elif key == FRCNN + "obj_downsample.1.weight":
            target = emb + "visual_feature_embedding.1.weight"
            coords = cfg.geometry_size  # official input: coordinate embedding first, then the appearance
            value = torch.cat([value[:, coords:], value[:, :coords]], 1)
        else:
            for theirs, ours in prefixes:
                if key.startswith(theirs):
                    target = ours + key.removeprefix(theirs)
                    break
            else:
                unmapped.append(key)
                continue
        if key == FRCNN + "backbone.conv1.weight":
            value = value.flip(1)  # BGR input channels -> RGB
        out[target] = value
    if unmapped:
        task = " (a task head: VQA, RefCOCO+ and VCR checkpoints import with `python -m finetune.import_official`)" \
            if any(k.startswith(("final_mlp.", "cnn_loss_reg.")) for k in unmapped) else ""
        raise ValueError(f"{len(unmapped)} official keys have no place in our model (the relationship head and "
                         f"IMAGE_SEMANTIC are not supported){task}: {unmapped[:8]}")
    for name in ("text", "object"):  # visual_size == hidden_size: the official model has no 1x1 there
        weight = f"{emb}visual_projection_{name}.weight"
        if weight not in out:
            if own[weight].shape[0] != own[weight].shape[1]:
                raise ValueError(f"the official checkpoint has no visual_1x1_{name} but visual_size "
                                 f"{own[weight].shape[1]} != hidden_size {own[weight].shape[0]}")
            out[weight] = torch.eye(own[weight].shape[0])
            out[f"{emb}visual_projection_{name}.bias"] = torch.zeros(own[weight].shape[0])
    wrong = [f"{k}: {list(v.shape)} for {list(own[k].shape)}" for k, v in out.items()
             if k in own and own[k].shape != v.shape]
    unknown = [k for k in out if k not in own]
    if wrong or unknown:
        raise ValueError(f"official tensors do not fit our model: {(wrong + unknown)[:6]}")
    return out


def load_official(checkpoint: str | Path, **config_options) -> tuple[VLBertForPretraining, list[str]]:
    """Our VLBertForPretraining computing what the official checkpoint computes, and the names of our
    parameters the checkpoint does not have (kept at their initialisation; the Fast R-CNN's object classifier,
    which the official pretraining does not train, for one)."""
    state = read_official_checkpoint(checkpoint)
    cfg = official_config(state, **config_options)
    model = VLBertForPretraining(cfg)
    own = model.state_dict()
    mapped = convert_official_state(state, cfg, own)
    model.load_state_dict(mapped, strict=False)
    untouched = [k for k in own if k not in mapped and k != "mlm_head.decoder.weight"]
    return model, untouched


def import_official(checkpoint: str | Path, out: str | Path, tokenizer_dir: str | Path | None = None,
                    **config_options) -> Path:
    """Write the checkpoint as an export directory; returns it."""
    model, untouched = load_official(checkpoint, **config_options)
    return write_export(model, untouched, checkpoint, out, tokenizer_dir)


def official_image_preprocessing(cfg: VLBertConfig) -> dict:
    """The official SCALES (600, 1000), no size divisibility, its pixel means and box convention."""
    image = image_preprocessing(OFFICIAL_SCALES[0], OFFICIAL_SCALES[1], 1, cfg)
    image["box_convention"] = BOX_CONVENTION
    return image


def write_export(model: VLBertForPretraining, untouched: list[str], checkpoint: str | Path, out: str | Path,
                 tokenizer_dir: str | Path | None = None) -> Path:
    image = official_image_preprocessing(model.cfg)
    return save_pretrained(model.state_dict(), model.cfg, out, tokenizer_dir, image=image,
                           source={"official_checkpoint": Path(checkpoint).name,
                                   "not_in_checkpoint": ",".join(untouched)},
                           architecture=PRETRAINING_ARCHITECTURE)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="official .model file (a torch pickle)")
    ap.add_argument("--out", required=True, help="export directory to write")
    ap.add_argument("--tokenizer", help="directory with the BERT vocab.txt the official model used (copied)")
    ap.add_argument("--heads", type=int, help="attention heads (default hidden/64: 12 base, 16 large)")
    ap.add_argument("--no-stride-in-1x1", action="store_true", help="the ResNet strides in its 3x3 convs")
    ap.add_argument("--no-c5-dilated", action="store_true", help="res5 strides (IMAGE_C5_DILATED false)")
    args = ap.parse_args(argv)
    model, untouched = load_official(args.checkpoint, num_attention_heads=args.heads,
                                     stride_in_1x1=not args.no_stride_in_1x1, c5_dilated=not args.no_c5_dilated)
    path = write_export(model, untouched, args.checkpoint, args.out, args.tokenizer)
    print(f"wrote {path}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters; not in the "
          f"checkpoint (initialised): {untouched or 'none'}")


if __name__ == "__main__":
    main()
