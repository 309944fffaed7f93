"""Pretraining heads and the [CLS] pooler. Names follow transformers' BertForPreTraining
(`cls.predictions.*`, `pooler.dense`) so BERT checkpoints load by name."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import VLBertConfig


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, cfg: VLBertConfig, norm: bool = True):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        # the official MVRC head has no LayerNorm (VLBertConfig.mrc_head_norm)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) if norm else nn.Identity()

    @torch.no_grad()
    def init_identity(self) -> None:
        """dense = I, bias 0, LayerNorm (if any) 1/0: the transform starts close to passing its input on."""
        self.dense.weight.copy_(torch.eye(self.dense.weight.shape[0], dtype=self.dense.weight.dtype))
        self.dense.bias.zero_()
        if isinstance(self.LayerNorm, nn.LayerNorm):
            self.LayerNorm.weight.fill_(1.0)
            self.LayerNorm.bias.zero_()

    def forward(self, x):
        return self.LayerNorm(F.gelu(self.dense(x)))


def _onednn_op(name: str):
    """One of oneDNN's CPU ops (those inductor lowers linears to), or None if this build lacks it.

    These are torch's private ops (`torch.ops.mkldnn._linear_pointwise`, `_reorder_linear_weight`), measured
    and tested on torch 2.14.1 (the CUDA wheel's CPU path); any torch may drop or change them, so a build
    without them, or a call they refuse, falls back to the public products below, silently and for good."""
    if not torch.backends.mkldnn.is_available():
        return None
    return getattr(torch.ops.mkldnn, name, None)


_ONEDNN = {"linear": _onednn_op("_linear_pointwise"), "reorder": _onednn_op("_reorder_linear_weight")}


def _onednn_call(name: str, *args):
    """The private op's result, or None (and the op never tried again) if it is missing or refuses the call."""
    op = _ONEDNN[name]
    if op is None:
        return None
    try:
        return op(*args)
    except (RuntimeError, TypeError, NotImplementedError):
        _ONEDNN[name] = None
        return None


def _onednn_usable(*tensors: torch.Tensor) -> bool:
    """oneDNN's fp32 inner product applies: CPU, fp32, no autocast (which would run the product in
    bf16) and no autograd (it has no derivative)."""
    return _ONEDNN["linear"] is not None and torch.backends.mkldnn.enabled \
        and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) \
        and not torch.is_autocast_enabled("cpu") \
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def pack_for_inference(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight` [V, H] reordered once into oneDNN's blocked layout, for many no-grad products with it (a
    decode's steps): 4.2 against 6-7 ms per 32 x 384 step at 30k words, for an 18 ms reorder. A copy:
    valid while the weight does not change. None where `vocabulary_logits` would not use it."""
    if _ONEDNN["reorder"] is None or not _onednn_usable(weight):
        return None
    return _onednn_call("reorder", weight.detach().contiguous(), None)


def vocabulary_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                      packed: torch.Tensor | None = None) -> torch.Tensor:
    """hidden [..., H] @ weight[V, H]^T + bias[V], for the few rows a decoding step or the masked positions
    give. On GPUs `F.linear`. On CPU, MKL's [n, H] x [V, H]^T is slow for small n, so:
    - without autograd (decoding, evaluation), oneDNN's inner product, on `packed` (`pack_for_inference`
      of `weight`) if given: up to 2.7x faster than the MKL products below at 1-136 rows, and never
      slower (32 x 384: 6.8 against 11.8 ms), and packed weights 1.5x faster again;
    - in training, (weight @ hidden^T)^T, which MKL runs 1.4-2.3x faster than hidden @ weight^T
      (136 x 768: 40 against 61 ms), and whose gradients autograd knows."""
    if weight.device.type != "cpu":
        return F.linear(hidden, weight, bias)
    flat = hidden.reshape(-1, hidden.shape[-1])
    logits = None
    if _onednn_usable(flat, weight, bias):
        w = packed if packed is not None else weight.contiguous()
        logits = _onednn_call("linear", flat.contiguous(), w, bias, "none", [], "")
    if logits is None:
        if packed is not None and packed.is_mkldnn:
            weight = weight.contiguous()  # the packed copy is oneDNN's alone
        logits = torch.addmm(bias.unsqueeze(1), weight, flat.T).T.contiguous()  # bias inside the GEMM
    return logits.view(*hidden.shape[:-1], weight.shape[0])


class MaskedLanguageModelingHead(nn.Module):
    """transform + LayerNorm + decoder tied to the word embeddings + bias."""

    def __init__(self, cfg: VLBertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(cfg)
        self.decoder = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    @torch.no_grad()
    def init_as_readout(self) -> None:
        """For a BERT checkpoint without an MLM head (all-MiniLM-L6-v2): the transform starts as the identity
        (dense = I, bias 0; LayerNorm 1/0) and the output bias at 0, so the head starts by naming the word
        whose tied embedding the output state is nearest to. A pretrained encoder's output still carries its
        input word (the packaged MiniLM's: read out this way, 0.70 of caption words, cross-entropy 3.9 against
        ln 30522 = 10.3 for a random head), so what attention copies into a [MASK] position is readable from
        the first step instead of after the head has learnt a vocabulary readout from scratch."""
        self.transform.init_identity()
        self.bias.zero_()

    def forward(self, hidden: torch.Tensor, packed: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [..., hidden] (pass only the masked positions: logits over 30k words are costly).
        packed: `pack_for_inference(self.decoder.weight)`, for a decoder's repeated no-grad steps."""
        return vocabulary_logits(self.transform(hidden), self.decoder.weight, self.bias, packed)


class MaskedRoIClassificationHead(nn.Module):
    """Predicts a masked region's object class from its output feature (class count from config)."""

    def __init__(self, cfg: VLBertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(cfg, norm=cfg.mrc_head_norm)
        self.classifier = nn.Linear(cfg.hidden_size, cfg.fast_rcnn.num_classes)
        if cfg.mrc_attributes and not cfg.fast_rcnn.num_attributes:
            raise ValueError("model.mrc_attributes needs the Fast R-CNN's attribute head (fast_rcnn.num_attributes)")
        self.attribute_classifier = nn.Linear(cfg.hidden_size, cfg.fast_rcnn.num_attributes) \
            if cfg.mrc_attributes else None

    @torch.no_grad()
    def init_as_readout(self, class_names: torch.Tensor) -> None:
        """The transform as the identity and each class's weight row as its name's word embedding
        (class_names [classes, hidden], e.g. `VLBertEmbeddings.name_embeddings("class")`), bias 0: a region
        whose output state carries a class's name, from its own region word embedding or copied from the
        caption, is classified as that class from the first step (the MLM head's readout, for classes)."""
        self.transform.init_identity()
        self.classifier.weight.copy_(class_names.to(self.classifier.weight.dtype))
        self.classifier.bias.zero_()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.transform(hidden))

    def attributes(self, hidden: torch.Tensor) -> torch.Tensor:
        """Attribute logits [..., num_attributes] of the regions' output features (`model.mrc_attributes`)."""
        if self.attribute_classifier is None:
            raise ValueError("this masked RoI head has no attribute classifier: set model.mrc_attributes")
        return self.attribute_classifier(self.transform(hidden))


class BertPooler(nn.Module):
    def __init__(self, cfg: VLBertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(cls_hidden))
