"""Pretraining's configuration: `PretrainConfig` (what `python -m pretrain.run --config` reads) and the
held-out data settings of the diagnostics it runs. Apart from the modules that use them, so that the feature
extractor's command line (`pretrain.features`), the diagnostics and the entry point read one config without
importing one another."""

from __future__ import annotations

from dataclasses import dataclass, field

from model.config import model_config
from model.hf_import import config_from_hf
from shards.reader import StreamConfig
from shards.tokenizer import bert_source_dir

from .engine import EngineConfig, OptimConfig
from .masking import MaskingConfig
from .tasks import LossConfig


@dataclass
class HeldOutConfig:
    """Held-out images with sentences in Flickr30k Entities' format, as the diagnostics read them."""
    flickr_root: str = "data/demo/raw/flickr30k_entities"  # Sentences/, Annotations/, <split>.txt
    split: str = "val"
    images: str = "data/demo/raw/images"  # <image_id>.jpg
    boxes: str = "data/demo/raw/flickr30k_entities/boxes_val.jsonl"  # regions, keyed <image_id>.jpg
    short_side: int = 128  # image resizing as the model was trained (the paper's setting: 600 / 1000)
    long_side: int = 192
    max_regions: int = 100  # highest-scoring regions kept per image
    seed: int = 0
    bootstrap: int = 2000  # resamples of images for the clustered intervals (0 = t-intervals over examples)
    # what an ablated region or whole image becomes: "training", the average of the model's own pretraining
    # features (its appearance standardisers keep it; a model without them falls back to the next, and says
    # so), or "evaluation", the average over these held-out images (the cross-modal ablation paper's choice).
    # Both keep the input in distribution for a model pretrained on images like these; only "training" does
    # for the image-ablated control (docs/ABLATION.md, session 19)
    ablation_fill: str = "training"


@dataclass
class DiagnosticConfig(HeldOutConfig):
    class_names: str | None = "data/demo/raw/class_names.json"  # detector classes, for gold labels
    tau: float = 0.5  # IoT threshold of Object ablation and of co-masking around the MRC target
    sweep: list = field(default_factory=lambda: [0.1, 0.3, 0.5, 0.7, 0.9])  # taus of the Figure 3 sweep
    max_words: int = 100  # word-pieces per sentence; longer sentences are skipped and counted
    batch_size: int = 16
    max_examples: int | None = None  # a seeded random subset of the examples (None = all)
    # which of the phrase's words are masked and scored: "all" (the paper), or "colour" (only its colour
    # words; phrases without one are left out and counted): in the shapes world those come only from the image
    phrase_words: str = "all"



@dataclass
class GroundingConfig(HeldOutConfig):
    max_images: int | None = None  # the first N images of the split (None = all)



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
    # engine.eval_every steps (None = off); see pretrain/ablation.py
    diagnostic: DiagnosticConfig | None = None
    # held-out grounding measurements (pretrain/grounding.py): masked-word accuracy per word category with
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
    # the MLM head's transform when `bert` has none (the packaged MiniLM): "random" (BERT's init) or "readout"
    # (identity: the head starts by naming the word nearest the output state; MaskedLanguageModelingHead.
    # init_as_readout; with region_words the MRC head too, its classes read out by their names' embeddings).
    # A checkpoint that has an MLM head loads it either way.
    mlm_head_init: str = "random"
    # the detector warm-up's config (DetectorConfig YAML): at the end, the exported Fast R-CNN's held-out object
    # and attribute accuracy next to the warm-up's (detector drift; printed, eval.jsonl, TensorBoard); None = off
    detector_drift: str | None = None



def build_model_config(cfg: PretrainConfig):
    """The VLBertConfig a PretrainConfig describes: the `bert` checkpoint's sizes (or the preset's), then
    `model` on top; the image-ablated control (`masking.ablate_image`) reads no boxes unless `model` says."""
    updates = cfg.model
    if cfg.masking.ablate_image and "region_geometry" not in updates:
        updates = {**updates, "region_geometry": "whole_image"}
    if cfg.bert:
        return config_from_hf(bert_source_dir(cfg.bert), cfg.model_preset, updates=updates)
    return model_config(cfg.model_preset, updates=updates)
