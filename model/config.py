"""The one config loader: dataclasses filled from YAML files plus `key=value` overrides.

Unknown keys are errors naming the file (or override) and the key, so a typo in a config never
silently falls back to a default. A dataset's location has no default (`required()`): a config that does not name
it is an error naming the field, rather than a run on whatever data sits at a demo path.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    pass


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """Check and convert a YAML value to the field's declared type (YAML reads `2e-5` as a string), so a
    wrong type is an error naming the field here, not a failure deep in the reader or the engine."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, where) if len(inner) == 1 else value
    if tp is Any:
        return value
    if _is_dataclass_type(tp):
        return from_dict(tp, value, where)
    if value is None:
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got null")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float, str))):
        raise ConfigError(f"{where}: expected {'an integer' if tp is int else 'a number'}, got {value!r}")
    if tp is int:
        try:
            number = float(value) if isinstance(value, str) else value
            whole = int(number)
        except (ValueError, OverflowError):  # not a number, nan, inf
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
        if number != whole:  # 2.5 steps is a mistake, not 2 or 3 steps
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return whole
    if tp is float:
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{where}: expected float, got {value!r}") from None
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if origin is tuple or tp is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list of {len(args) or 'some'} values, got {value!r}")
        if args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{where}: expected {len(args)} values, got {len(value)}: {value!r}")
            return tuple(_coerce(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        return tuple(_coerce(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)) if args else tuple(value)
    if origin is list or tp is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_coerce(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)] if args else list(value)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    return value


def from_dict(cls: type[T], data: dict, where: str = "config") -> T:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping for {cls.__name__}, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise ConfigError(f"{where}: unknown key '{key}' for {cls.__name__}; known: {sorted(fields)}")
        kwargs[key] = _coerce(hints[key], value, f"{where}: {key}")
    return cls(**kwargs)


def required(factory: Any = None) -> Any:
    """A dataclass field the config must set (a dataset path; `factory=list` for a list of them): empty by default,
    refused by `load_config` while empty, so a library config never points at the demo's data unless a config
    says so."""
    if factory is not None:
        return field(default_factory=factory, metadata={"required": True})
    return field(default="", metadata={"required": True})


def unset_required(obj: Any, prefix: str = "") -> list[str]:
    """Dotted names of the `required()` fields still empty in `obj` and the dataclasses it holds."""
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.metadata.get("required") and value in ("", None, []):
            out.append(prefix + f.name)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += unset_required(value, f"{prefix}{f.name}.")
    return out


def _set_path(data: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for key in keys[:-1]:
        data = data.setdefault(key, {})
    data[keys[-1]] = value


def _apply_overrides(data: dict, overrides: list[str]) -> None:
    """`a.b=value` overrides into `data` in place (values parsed as YAML)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}': expected key=value")
        key, raw = item.split("=", 1)
        _set_path(data, key.strip(), yaml.safe_load(raw))


def load_config(cls: type[T], path: str | Path | None = None, overrides: typing.Iterable[str] = ()) -> T:
    """Build `cls` from an optional YAML file and `a.b=value` overrides (values parsed as YAML)."""
    data: dict = {}
    where = "defaults"
    if path is not None:
        where = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        data = loaded or {}
    overrides = list(overrides)
    _apply_overrides(data, overrides)
    if overrides:
        where = f"{where} + overrides"
    cfg = from_dict(cls, data, where)
    unset = unset_required(cfg)
    if unset:
        raise ConfigError(f"{where}: {', '.join(unset)} not set: a dataset's location has no default (the demo's "
                          f"are in launch/configs/*demo*.yaml)")
    return cfg


def to_dict(obj: Any) -> dict:
    return dataclasses.asdict(obj)


# --- the model's config ------------------------------------------------------------------------------

@dataclass
class FastRCNNConfig:
    backbone: str = "resnet101"  # torchvision ResNet: resnet18/34/50/101/152 (C4 split)
    num_classes: int = 1601  # object classes incl. background (Visual Genome: 1600 + background)
    # attribute classifier on the region feature (bottom-up attention's attribute head; Visual Genome: 400),
    # trained by the detector warm-up and exported with it; 0 = none
    num_attributes: int = 0
    # size classifier on the box's geometry (its width and height over the image's): RoIAlign resamples every box
    # to one grid, so the region feature cannot tell a large object from a small one. Trained by the detector
    # warm-up on annotated sizes (`sizes` of a COCO-format file) and exported with it; 0 = none
    num_sizes: int = 0
    weights: str | None = None  # local torchvision ResNet or Faster R-CNN state dict; None = random init
    freeze_stem: bool = True  # conv1 (+ its frozen BN) not trained, as in detectron's C4 models
    freeze_res2: bool = True  # res2 (layer1) not trained either: the official e2e configs' FREEZE_AT = 2
    # res3 (layer2) and res4 (layer3) not trained either: the RoI head (res5) alone learns end to end, and the step
    # runs no backward through the backbone (a CPU demo's deviation: FREEZE_AT = 4)
    freeze_res3: bool = False
    freeze_res4: bool = False
    # "frozen": FrozenBatchNorm (detectron's C4 models, fixed statistics); "batch": trainable batch norm, for a
    # backbone trained from scratch (the demo's detector warm-up: without normalisation a random ResNet learns
    # slowly). Both keep weight/bias/running_mean/running_var, so a "batch" warm-up loads as "frozen".
    norm: str = "frozen"
    # each frozen norm folded into the convolution before it (weight x scale, bias = shift): the same function,
    # without two elementwise passes over every activation (on an H200 elementwise kernels, most likely these,
    # took more time than the convolutions: docs/SCALING.md). Weights and checkpoints are unchanged; float
    # rounding moves slightly, so it is off by default (the demo's figures stay as measured).
    fold_frozen_norms: bool = False
    roi_output_size: int = 14  # RoIAlign output, before res5 halves it to 7x7
    # 16: C4 as in Faster R-CNN. 8: res4 keeps res3's resolution (its first block's stride 2 -> 1, the same
    # weights), for small objects: the demo's median object is ~32 px, 2 cells at stride 16 (docs/ABLATION.md)
    feature_stride: int = 16
    # Conventions of other C4 detectors, for imported weights (`model.import_official`; defaults: torchvision's).
    # stride_in_1x1: a strided Bottleneck strides in its first 1x1 conv, not its 3x3 (Caffe/detectron's MSRA
    # ResNets, the official VL-BERT). res5_dilation 2: res5 keeps stride 1 and dilates its 3x3 convs, so a 14x14
    # RoI stays 14x14 (the official IMAGE_C5_DILATED). box_convention "inclusive": box corners are pixel
    # indices (x2 is the last pixel in, detectron's legacy): the whole image is (0, 0, w-1, h-1) and RoIAlign
    # samples without the half-pixel offset (aligned=False). roi_sampling_ratio: RoIAlign samples per bin
    # side (0 = adaptive, torchvision's default; the official ROIAlign uses 1).
    stride_in_1x1: bool = False
    res5_dilation: int = 1
    box_convention: str = "continuous"
    roi_sampling_ratio: int = 0
    pixel_mean: tuple[float, float, float] = (0.485, 0.456, 0.406)  # images are normalised with these;
    pixel_std: tuple[float, float, float] = (0.229, 0.224, 0.225)  # masked pixels are 0 after it
    # NHWC convolutions: faster on GPUs with tensor cores, and with oneDNN on CPU (backbone forward + backward
    # on 4 images of 608 x 800, 2 cores: ResNet-18 -21%, ResNet-101 -4%); the reader's batches are NHWC
    channels_last: bool = True


@dataclass
class VLBertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 3  # segments A, B (BERT's two token types) and C (image regions)
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    cls_token_id: int = 101
    sep_token_id: int = 102
    mask_token_id: int = 103
    # [IMG] and [END] reuse unused WordPiece slots of BERT's uncased vocab ([unused0], [unused1]), so
    # the vocabulary and a loaded word-embedding matrix keep their size.
    img_token_id: int = 1
    end_token_id: int = 2
    # visual input
    visual_embedding: str = "vlbert"  # "vlbert": FC(appearance ++ geometry) + zero-gain LayerNorm;
    #                                   "linear": BERT-gen's single Linear(features ++ 4 box coords)
    visual_size: int = 2048  # width of the visual feature embedding before projecting to hidden
    geometry_size: int = 2048  # sine/cosine geometry embedding width (a multiple of 8)
    visual_dropout: float = 0.1
    visual_ln_init: float = 0.0  # initial LayerNorm gain of the visual terms: 0 = start as pure BERT
    # the regions' own visual term's initial gain (None = visual_ln_init). A region has no word content, so
    # its embedding can be its visual feature from the start; at a word-sized gain (0.05) the shared [IMG] +
    # position + segment parts dominate it and the layers read every region alike (docs/ABLATION.md)
    visual_ln_init_object: float | None = None
    # Standardise each appearance channel over the batch's real regions (running statistics at eval, as
    # batch norm without gain) before the visual feature embedding. A detector trained from scratch (the
    # demo) gives every region nearly the same feature (cosine ~0.96: a large shared positive component),
    # which the FC and LayerNorm pass on; standardised, regions differ by what they show. The whole-image
    # element has statistics of its own. Off = official.
    standardise_appearance: bool = False
    # Region word embeddings (end to end only): each unmasked region's token adds the word embeddings of the
    # detector's class names weighted by its class distribution, and of its attribute names weighted by its
    # attribute distribution, both computed from the region's appearance by the Fast R-CNN's classifiers.
    # The official code gives VCR's regions their class word's embedding (object linguistic embeddings); a
    # soft, detector-predicted version binds a caption's words to the regions they name through the BERT's
    # own word space (docs/ABLATION.md). Lists of word-piece ids per class id / attribute index (a name of
    # several pieces takes their mean); `pretrain.run` fills them from the detector's vocabulary file
    # (`region_words`). None = off (official pretraining).
    region_class_words: list | None = None
    region_attribute_words: list | None = None
    # the same for the size classifier's names (weighted by its distribution over the box geometry): a word
    # such as "large" binds to the regions of that size as "red" binds to the red ones
    region_size_words: list | None = None
    # Words take the region words of the regions they name: each word adds a softmax-weighted share of the
    # region word embeddings of the unmasked regions whose class or attribute name its own embedding is close
    # to (cosine), against a "no region" option at this cosine threshold (None = off). VL-BERT's words take
    # the visual feature of the region they refer to where references are given (VCR); this infers them from
    # the detector's names. See `VLBertEmbeddings.aligned_region_words`.
    region_word_alignment: float | None = None
    region_word_alignment_scale: float = 20.0  # softmax inverse temperature of that alignment
    # An aligned word also takes its regions' geometry embedding, through a Linear of its own (zero at the start),
    # with the same weights: as a VL-BERT word that refers to a region takes that region's visual feature, box
    # included. The names alone tell a word what its object is and nothing of where it is: on the demo the words
    # bind to their regions mostly through the alignment (colour 0.90 with it, 0.53 without it at evaluation), and
    # relation words (left of, on the left) stay at the text-only level (docs/ABLATION.md, session 55).
    aligned_geometry: bool = False
    # A word that names no region itself (a [MASK], "a", "of") takes the aligned region words of the words within
    # this many word-pieces of it, in the share it has left: the masked colour of "a [MASK] circle" then holds the
    # circle region's names in its own input, where with 0 (off) the model must first learn to carry them across
    # from "circle", the slow part of the binding (the perfect-vision probe, docs/ABLATION.md session 11). Sees the
    # next word: BERT-gen's target words take their own regions only (the next word is what they predict).
    alignment_neighbours: int = 0
    # How a word combines its neighbours' regions: "sum" (any region a neighbour names) or "product" (the regions
    # all its naming neighbours name, a product of their distributions: the masked shape of "a small red [MASK]"
    # then takes the small red object, not every small one and every red one; a neighbour that names nothing
    # counts for nothing). With k = 1 a shape word has one naming neighbour, and the two agree.
    alignment_neighbour_combine: str = "sum"
    # Relation words align too: a word that is one of the relation names (`pair_relation_words`: left, right, above,
    # below) aligns to the regions that stand in that relation to the object named beside it, as a name aligns to
    # the regions it names. The object is the run of consecutive naming words nearest the relation word on each side,
    # its first word within this many word-pieces (the regions all of them name, a product as
    # `alignment_neighbour_combine`); "left" in "[a small blue triangle] left of a large red star" then aligns to the
    # regions left of the large red star, and in "a small blue triangle left of [the masked phrase]" to those the
    # triangle is left of, the relation of two boxes being `pair_relation_words`' dominant axis of their centres'
    # offset. Through `alignment_neighbours` a whole masked phrase beside the relation word then holds the names of
    # the object the sentence means, where the names alone leave every object in view (docs/ABLATION.md, session 71:
    # relation words at the text-only level, whole phrases read at 0.1 of a perfect-vision reader). Regions whose
    # centres coincide have no relation (the image-ablated control, every region the whole image, gets nothing).
    # 0 = off; needs region_word_alignment and pair_relation_words, each name one word-piece.
    relation_alignment_window: int = 0
    # Which object a relation word is read against when both sides name one: False takes the better of the two (as
    # in a caption "a small blue triangle left of a large red star", where either may be masked); True takes the
    # object after it, the landmark of "A left of B", and the one before only where nothing after it names one (a
    # masked B). In RefCOCO+'s "the circle left of the blue star" both sides name, and the better-of-two also aligns
    # "left" to whatever is right of any circle: on session 73's export the look-alike circles took 0.16 of its weight
    # against the referent's 0.27, and 0.02 against 0.46 with the object after alone (docs/FINETUNE.md, session 75).
    relation_alignment_landmark_first: bool = False
    # The relation between two named objects, given to the words between them: a word that names no region, with an
    # object named on each side (the runs `relation_alignment_window` reads, its first word within that many pieces),
    # adds sum_k P(the object before stands in relation k to the object after) E[relation name k]. A masked relation
    # word in "a small blue triangle [MASK] of a large red star" then holds the name of the relation the boxes show,
    # as a masked colour holds its region's names (`alignment_neighbours`). A relation word takes the names other
    # than its own: in VQA's "is the triangle above the hexagon?" a true "above" then carries nothing and a false one
    # the relation the picture shows (with its own name in, true and false differ by no direction of the input).
    # Without it a held-out masked relation word read 0.55 with the image against 0.51 for the image-ablated
    # control, and VQA's spatial yes/no questions 54% in both Table 4 rows: no model here compared two boxes
    # (docs/FINETUNE.md, session 92). No parameters; the image-ablated control's regions share one centre and get
    # nothing. Reads the objects as relation_alignment_window does: a backbone without it has nothing to read (a task
    # config may set it for any backbone, as region_aligned_words).
    relation_between: bool = False
    # How many word-pieces from a word `relation_between` looks for the objects on either side (0: the
    # relation_alignment_window). A name cut into pieces names by its later pieces: in VQA's "is the triangle right of
    # the hexagon?" "he" aligns with 0.36 of its mass and "##xa" is the run's first naming piece, 4 pieces from
    # "right" where the window of 3 reaches "of" but not "right", whose term then says nothing, as a true relation
    # word's does (7 of data/demo's 83 spatial val questions, 3 of them answered wrong; docs/FINETUNE.md, session 93).
    relation_between_window: int = 0
    # A name the tokenizer cuts into pieces aligns as the name: each piece of an occurrence of a multi-piece name of
    # the class, attribute or size tables is scored against the regions by the mean of the occurrence's pieces, the
    # name tables' own embedding of it, not by its own. "hexagon" is "he ##xa ##gon", and no piece alone is the name:
    # in a RefCOCO+ model finetuned from the quick start's export, on data/demo's 30 val expressions with a hexagon
    # landmark, the pieces aligned with mass 0.03 / 0.18 / 0.17 and none named, so "the circle left of the blue
    # hexagon" read its landmark as the run "blue" alone, every blue region (docs/FINETUNE.md, session 94). Read from
    # the input ids and the config's name tables; no parameters; False = off (each piece by itself, as the quick
    # start pretrains).
    align_whole_names: bool = False
    # Regions take the words aligned to them, the alignment read the other way: each region's token adds the word
    # embeddings of the sentence's words (not [CLS] / [SEP]), each times that word's weight on the region. In "the
    # circle left of the blue star" the circle left of the star then holds "left" (the relation word's alignment) and
    # the circle the sentence does not mean holds "circle" alone: which region a sentence means, put where a
    # region-scoring head reads it. Finetuned RefCOCO+'s relational expressions without it stay at ~60 in both rows
    # where a reader of names and boxes gets 94 (docs/FINETUNE.md, session 75). No parameters; a model without
    # `region_word_alignment` has nothing to read (a task config may set it for any backbone); False = off (official).
    region_aligned_words: bool = False
    precomputed_feature_size: int = 2048  # F of precomputed [B, N, F] region features
    # "boxes": each region is its box. "whole_image": every region is read as the whole image (the Fast R-CNN
    # pools the whole image for it; its geometry embedding and size names are the whole image's), so the model
    # sees how many regions there are and nothing of where or how large: the image-ablated control's layout
    # (`masking.ablate_image` sets it), as grey pixels are its appearance. Boxes are image content: a control
    # that reads them names size words from them (docs/ABLATION.md, session 23).
    region_geometry: str = "boxes"
    # The image-ablated control's model (`masking.ablate_image` sets it): it reads no image. Every image it is
    # given becomes the grey it was trained on (the Fast R-CNN's pixel mean) and precomputed features zeros
    # (`VLBert.region_features`), so at evaluation a real image is not an input no training step showed; the
    # cross-modal diagnostic gives it that input in every visual condition (it has nothing to ablate). Fed real
    # images, a control trained on grey ones read them through channels its standardiser had learnt as near
    # constant (amplified ~200-fold) and through its region words: V4L all - none -0.067 bits [-0.081, -0.052]
    # (docs/ABLATION.md, sessions 63-64).
    image_ablated: bool = False
    # "pixels": the Fast R-CNN is part of the model and trained end to end (VL-BERT); "features": the
    # model reads region features a frozen Fast R-CNN wrote beforehand (`python -m pretrain.features`),
    # and `fast_rcnn` describes that extractor (its weights file is kept, so evaluation can rerun it)
    region_input: str = "pixels"
    fast_rcnn: FastRCNNConfig = field(default_factory=FastRCNNConfig)
    gradient_checkpointing: bool = False  # recompute each layer in backward: memory for compute
    # Conventions of the official VL-BERT code, for imported weights (`model.import_official`; defaults: ours).
    # visual_tokens "learned": a region's token is a learned embedding (the official object linguistic
    # embedding), not the [IMG] word, and [END] is a learned embedding with no visual term, ending text-only
    # samples too. geometry_boxes "center_size": the geometry embedding encodes (x centre, y centre, width,
    # height) / image size rather than the corners. mrc_head_norm false: the masked RoI head's transform has
    # no LayerNorm (the official MVRC head: dense + activation).
    visual_tokens: str = "vocab"
    geometry_boxes: str = "corners"
    # Each region's geometry embedding, through a Linear of its own (zero at the start: a loaded BERT stays exact),
    # is added to the region's hidden state before every layer after the first, as DETR adds its spatial encodings
    # at every layer. The official VL-BERT gives it once, in the visual feature embedding; on the demo a linear
    # probe reads a region's centre there (R^2 0.90) and not after the first layer (docs/ABLATION.md, session 54),
    # while a relation word needs two regions' positions where its words have been bound to them. A word that refers
    # to a region (`word_region_index`: VCR's object tags) takes the same term of its region, as it takes that
    # region's visual feature. False = official.
    geometry_layers: bool = False
    # Relation-aware attention (Relation Networks, Hu et al. 2018; the Object Relation Transformer, Herdade et al.
    # 2019): every layer's attention logit from element i to element j gets a bias per head, a Linear of its own
    # (zero at the start: a loaded export computes what it did) of the sine/cosine embedding of the pair's relative
    # box geometry (j's centre minus i's in image units, log width and height ratios). Each element has a box: a
    # region its own, a word that refers to a region (`word_region_index`) that region's, every other word and [END]
    # the whole image's. A comparison of two positions ("left of") is then a first-layer operation on the pair, where
    # `geometry_layers` leaves the subtraction to the layers (VCR's where half: unfitted on its training questions
    # in 4 epochs, docs/FINETUNE.md session 67). Costs a [layers, B, heads, L, L] bias. False = official.
    pair_geometry_bias: bool = False
    # Relative geometry in the values too (Shaw et al. 2018's relative representations on the value side): each
    # layer's attention output at element i adds, per head, a Linear of its own (zero at the start) of
    # sum_j attention_ij * pair_geometry_ij. Element i then holds the offset of what it attends to, a linear readout
    # of "left of" where the bias alone only moves where i looks. Computed without the [L, L] features: the keys'
    # own sines and cosines ride in SDPA's values and the angle-difference identities turn their weighted sums into
    # the relative ones at each query (`model.encoder.relative_geometry`). False = official.
    pair_geometry_values: bool = False
    pair_geometry_frequencies: int = 8  # sine/cosine frequencies per relative coordinate: 8 * this features
    # A relation-name channel: each word that refers to a region (`word_region_index`: VCR's object tags) adds the
    # word embedding of its region's spatial relation to a partner region (`pair_relation_partners`), as the region
    # word channel gives a region the embedding of its detector's colour name. A pair's relation
    # is the dominant axis of its centre offset in image units: region i is "left" of j when |dx| >= |dy| and
    # dx < 0, "right" when dx >= 0, else "above" (dy < 0) or "below"; regions with one centre have none (the
    # image-ablated control, whose regions are all the whole image, gets nothing). Four word-piece id lists, the
    # names of left, right, above and below in that order (a finetune fills them from `backbone.relation_names`).
    # The four candidate answers of a where question differ only in the relation word, and with geometry alone the
    # finetune does not leave chance on them (docs/FINETUNE.md, session 68: a plateau, the word and the offset each
    # cancelling over the candidates); the channel gives the answer's "right" a term to match in the first layer, as
    # "red" matches a region's name. None = off (official).
    pair_relation_words: list | None = None
    # Which relations a referring word carries: "referred", those of its region to every other region the sample's
    # words refer to (their mean; so in "[0] is left of [1]" the word [0] carries "left" and [1] "right", and the
    # inverse answer "right" matches [1] as the true one matches [0]); "next_mention", the one of its region to the
    # region of the first later word of its own segment (question, answer) that refers to another region, so a
    # sentence's relation is read from its first mention to the next as English orders "X is left of Y" and "where
    # is X compared to Y" ([0] carries "left", [1] nothing). On the demo's where questions alone (8 epochs from the
    # step-0 export) val reads 50.0 with "referred" (the axis right, the direction not) and 67.0 with "next_mention",
    # against 28.7 without the channel (docs/FINETUNE.md, session 69).
    pair_relation_partners: str = "next_mention"
    mrc_head_norm: bool = True
    # The masked RoI head also predicts each region's attributes (the Fast R-CNN's attribute distribution, e.g.
    # colour), as `MaskedRoIClassificationHead.attributes`: pretraining's `losses.mrc_attribute_weight` gives the
    # visual embedding an objective for what the object classes do not name (docs/FINETUNE.md, session 44)
    mrc_attributes: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


PRESETS: dict[str, dict] = {
    # tests: hidden 32, 2 layers, 4 heads, a 99-word vocab, ResNet-18 (as transformers' tiny tester)
    "tiny": dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                 max_position_embeddings=128, visual_size=48, geometry_size=32, precomputed_feature_size=24,
                 cls_token_id=3, sep_token_id=4, mask_token_id=5, img_token_id=6, end_token_id=7,
                 fast_rcnn=dict(backbone="resnet18", num_classes=9)),
    "base": dict(),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}


def model_config(preset: str = "base", path: str | Path | None = None, overrides: typing.Iterable[str] = (),
                 updates: dict | None = None) -> VLBertConfig:
    """A preset, then a YAML file (which may name its own `preset:`), then a nested dict of updates,
    then key=value overrides."""
    data: dict = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        preset = data.pop("preset", preset)
    if preset not in PRESETS:
        raise ConfigError(f"{path or 'model config'}: unknown preset '{preset}'; known: {sorted(PRESETS)}")
    merged = deep_merge(deep_merge(PRESETS[preset], data), updates or {})
    _apply_overrides(merged, list(overrides))
    return from_dict(VLBertConfig, merged, str(path) if path else f"preset {preset}")


def deep_merge(a: dict, b: dict) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in a.items()}
    for k, v in b.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
