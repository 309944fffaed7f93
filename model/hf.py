"""Our models in the transformers convention: an export directory (`config.json` + `model.safetensors` +
tokenizer files) loads with `VLBertForPreTrainingHF.from_pretrained(dir)` and saves with `save_pretrained`,
so transformers' tooling (Auto classes, `device_map`, `torch_dtype`, the hub layout) works on it.

    from model.hf import VLBertForPreTrainingHF
    model = VLBertForPreTrainingHF.from_pretrained("runs/demo/export")
    out = model(input_ids, text_mask, token_type_ids, images=..., image_sizes=..., boxes=..., box_mask=...)

The modules are `model.vl_bert.VLBertForPretraining`'s own (same names, same state dict), so a directory
`model.export.save_pretrained` wrote and one this class wrote are the same thing; `model.export` stays the
loader the trainers use and reads both."""

from __future__ import annotations

import dataclasses

import torch
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel

from .config import VLBertConfig, from_dict
from .export import MODEL_TYPE, PRETRAINING_ARCHITECTURE, VL_BERT_FIELDS, exported_model_fields
from .vl_bert import VLBertForPretraining, VLBertOutput


class VLBertHFConfig(PretrainedConfig):
    """`VLBertConfig`'s fields at the top level (as BERT's config.json has hidden_size, num_hidden_layers,
    ...), plus `image_preprocessing`: how the images the model was trained on were prepared (resize sides,
    size divisibility, pixel mean/std, box convention)."""

    model_type = MODEL_TYPE

    def __init__(self, image_preprocessing: dict | None = None, **kwargs):
        own = {k: kwargs.pop(k) for k in list(kwargs) if k in VL_BERT_FIELDS}
        for key, value in dataclasses.asdict(from_dict(VLBertConfig, own, "config.json")).items():
            setattr(self, key, value)
        self.image_preprocessing = image_preprocessing
        # the MLM decoder is the word embeddings (VL-BERT's tie): an export stores it once
        kwargs.setdefault("tie_word_embeddings", True)
        # PretrainedConfig keeps pad_token_id itself (VLBertConfig's, taken above)
        super().__init__(pad_token_id=self.pad_token_id, **kwargs)

    @classmethod
    def from_vl_bert(cls, cfg: VLBertConfig, image_preprocessing: dict | None = None) -> VLBertHFConfig:
        return cls(image_preprocessing=image_preprocessing, **dataclasses.asdict(cfg))

    def vl_bert_config(self) -> VLBertConfig:
        """The model this config describes, as an export: its detector comes with the weights."""
        return from_dict(VLBertConfig, exported_model_fields(self.to_dict()), "config.json")


class VLBertForPreTrainingHF(PreTrainedModel):
    """VL-BERT with its pretraining heads (MLM tied to the word embeddings, masked RoI classification)
    as a transformers `PreTrainedModel`. `forward` is `VLBert.forward`; `mlm_head` and
    `masked_roi_classification` score the positions a caller picks, as in pretraining."""

    config_class = VLBertHFConfig
    base_model_prefix = "vl_bert"
    main_input_name = "input_ids"
    _tied_weights_keys = {"mlm_head.decoder.weight": "vl_bert.embeddings.word_embeddings.weight"}

    def __init__(self, config: VLBertHFConfig):
        super().__init__(config)
        inner = VLBertForPretraining(config.vl_bert_config())
        self.vl_bert = inner.vl_bert
        self.mlm_head = inner.mlm_head
        self.masked_roi_classification = inner.masked_roi_classification
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        # Parameters are VLBertForPretraining's own init (the visual LayerNorm gains, the RoI-mask embedding),
        # which transformers' generic scheme would undo, or the file's. What transformers' loader (which builds on
        # the meta device) must fill is the buffers the file does not hold: they follow from the config.
        if hasattr(module, "config_buffers"):
            with torch.no_grad():
                for name, value in module.config_buffers().items():
                    getattr(module, name).copy_(value)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.vl_bert.embeddings.word_embeddings

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.mlm_head.decoder

    def forward(self, *args, **kwargs) -> VLBertOutput:
        return self.vl_bert(*args, **kwargs)


AutoConfig.register(MODEL_TYPE, VLBertHFConfig, exist_ok=True)
AutoModel.register(VLBertHFConfig, VLBertForPreTrainingHF, exist_ok=True)
assert VLBertForPreTrainingHF.__name__ == PRETRAINING_ARCHITECTURE  # the name exports write in config.json
