"""Pretraining's configuration: `PretrainConfig` (what `python -m pretrain.run --config` reads), apart from the
modules that use it, so that the feature extractor's command line (`pretrain.features`) and the entry point read
one config without importing one another. The diagnostics' settings are `diagnostics.config`'s."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from diagnostics.config import DiagnosticConfig, GroundingConfig
from model.config import model_config
from model.hf_import import config_from_hf
from shards.reader import StreamConfig
from shards.tokenizer import bert_source_dir
from train.engine import EngineConfig, OptimConfig

from .masking import MaskingConfig
from .tasks import LossConfig

DETECTOR_PREFIX = "fast_rcnn."  # the Fast R-CNN's parameters, as `optim.lr_multipliers` keys name them


@dataclass
class PretrainConfig:
    model_preset: str = "base"  # tiny | base | large: the model's sizes before `model` overrides
    model: dict = field(default_factory=dict)  # VLBertConfig overrides, e.g. {fast_rcnn: {backbone: resnet50}}
    bert: str | None = None  # local HF BERT directory to start from; "packaged" = all-MiniLM-L6-v2; None = random
    data: StreamConfig = field(default_factory=StreamConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    losses: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    # held-out Flickr30k-Entities-format data for the cross-modal ablation diagnostic, run every
    # engine.eval_every steps (None = off); see diagnostics/ablation.py
    diagnostic: DiagnosticConfig | None = None
    # and at the end, on the export: the diagnostic on this many held-out phrases (a seeded subset, as
    # diagnostic.max_examples; None = every phrase), with intervals from a bootstrap over images and the paired
    # differences (all - none), printed and written to <run_dir>/ablation/; 0 = off. About 0.3 s a phrase on 2 CPU
    # cores: off in the quick start, whose budget it would overrun
    final_ablation_examples: int | None = 0
    # held-out grounding measurements (diagnostics/grounding.py): masked-word accuracy per word category with
    # and without the image, MRC by visibility. A subset (`grounding_periodic_images`) every eval_every steps,
    # and the whole split on the export at the end, printed as a table (None = off)
    grounding: GroundingConfig | None = None
    grounding_periodic_images: int = 40
    # the detector's vocabulary (`fast_rcnn.vocab.json`, written by `python -m pretrain.detector` beside its
    # weights): its class, attribute and size names, tokenized into model.region_class_words /
    # region_attribute_words / region_size_words, turn on region word embeddings (model/vl_bert.py); None = off
    # (official)
    region_words: str | None = None
    # which of the vocabulary's groups (classes, attributes, sizes) become region words; a group the file does not
    # have is skipped
    region_word_groups: list[str] = field(default_factory=lambda: ["classes", "attributes", "sizes"])
    # the words for left, right, above and below in the tokenizer's language, tokenized into
    # model.pair_relation_words: the names `model.relation_alignment_window` aligns relation words by (and a
    # finetune's relation-name channel reads); None = none
    relation_names: list[str] | None = None
    # the MLM head's transform when `bert` has none (the packaged MiniLM): "random" (BERT's init) or "readout"
    # (identity: the head starts by naming the word nearest the output state; MaskedLanguageModelingHead.
    # init_as_readout; with region_words the MRC head too, its classes read out by their names' embeddings).
    # A checkpoint that has an MLM head loads it either way.
    mlm_head_init: str = "random"
    # the detector warm-up's config (DetectorConfig YAML): at the end, the exported Fast R-CNN's held-out object
    # and attribute accuracy next to the warm-up's (detector drift; printed, eval.jsonl, TensorBoard); None = off
    detector_drift: str | None = None



def build_optim_config(cfg: PretrainConfig) -> OptimConfig:
    """`cfg.optim`, with the image-ablated control's Fast R-CNN at `masking.ablate_image_cnn_lr` of the LR: first
    among the multipliers, so it wins over any the config sets for the detector or its parts."""
    rate = cfg.masking.ablate_image_cnn_lr
    if not cfg.masking.ablate_image or rate is None:
        return cfg.optim
    others = {k: v for k, v in cfg.optim.lr_multipliers.items() if k != DETECTOR_PREFIX}
    return replace(cfg.optim, lr_multipliers={DETECTOR_PREFIX: float(rate), **others})


def build_model_config(cfg: PretrainConfig):
    """The VLBertConfig a PretrainConfig describes: the `bert` checkpoint's sizes (or the preset's), then
    `model` on top; the image-ablated control (`masking.ablate_image`) reads no boxes unless `model` says;
    `masking.alignment_drop` needs the alignment it drops, `masking.neighbour_drop` the neighbours'."""
    updates = cfg.model
    if cfg.masking.ablate_image and "region_geometry" not in updates:
        updates = {**updates, "region_geometry": "whole_image"}
    if cfg.masking.ablate_image and "image_ablated" not in updates:
        updates = {**updates, "image_ablated": True}
    if cfg.bert:
        out = config_from_hf(bert_source_dir(cfg.bert), cfg.model_preset, updates=updates)
    else:
        out = model_config(cfg.model_preset, updates=updates)
    if cfg.masking.alignment_drop and out.region_word_alignment is None:
        raise ValueError("masking.alignment_drop drops the word-region alignment, which the model does not have: set "
                         "model.region_word_alignment (with region_words)")
    if cfg.masking.neighbour_drop and not out.alignment_neighbours:
        raise ValueError("masking.neighbour_drop drops the neighbours' aligned regions, which the model does not "
                         "take: set model.alignment_neighbours")
    return out
