"""BERT-gen (Scialom et al., 2020): text generation with BERT's encoder and its own MLM head as the
decoder, conditioned on a caption, an image, or both.

Input X (segment A): `[CLS] txt [SEP]`, `[CLS] img_1..img_N [SEP]` or `[CLS] img_1..img_N [SEP] txt [SEP]`.
Image tokens are one Linear W(features ++ 4 normalised box coordinates) plus BERT's position embedding
of their place in the sequence, exactly like words. Target Y (segment B) = the question's word-pieces
then [SEP] as the end token.

Attention (section 3.2's "attention trick"): X sees X; y_t sees X and y_<=t; the element predicting
y_t is a [MASK] at y_t's position that sees X, y_<t and itself. Training computes every step at once,
teacher forcing with one pseudo-[MASK] per target position (UniLM's s2s-ft layout
`X y_1..y_T [MASK]_1..[MASK]_T`); the incremental decoder computes the same thing one step at a time
with cached keys/values, so the two agree to float rounding (tested).

Interior padding (padded regions, padded captions) is allowed: positions count only real elements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .config import VLBertConfig
from .encoder import KVBuffer
from .heads import pack_for_inference
from .vl_bert import SEGMENT_A, SEGMENT_B, VLBertForPretraining, assemble_text

INPUT, TARGET, PSEUDO_MASK = 0, 1, 2  # element kinds for the attention rule


def attention_rule(q_kind, q_time, k_kind, k_time, k_real) -> torch.Tensor:
    """Which key each query may see: [B, Lq] kinds/times against [B, Lk] kinds/times/real -> [B, Lq, Lk].

    Time t is the target index (1-based) of y_t and of the pseudo-[MASK] predicting it (0 for X)."""
    qk, qt = q_kind.unsqueeze(2), q_time.unsqueeze(2)
    kk, kt = k_kind.unsqueeze(1), k_time.unsqueeze(1)
    sees_target = (kk == TARGET) & (((qk == TARGET) & (kt <= qt)) | ((qk == PSEUDO_MASK) & (kt < qt)))
    sees_self_mask = (kk == PSEUDO_MASK) & (qk == PSEUDO_MASK) & (kt == qt)
    return k_real.unsqueeze(1) & ((kk == INPUT) | ((qk != INPUT) & (sees_target | sees_self_mask)))


@dataclass
class WordContext:
    """What each target word adds to its embedding under VL-BERT's own input (`VLBertGen`): the whole image's visual
    term, and its share of the region words it aligns to. BERT-gen's words add nothing (no context)."""
    visual: torch.Tensor  # [B, 1, hidden]
    region_terms: list[torch.Tensor] | None  # [B, R, hidden] each, when words align to regions
    candidates: torch.Tensor | None  # [B, R]

    def select(self, index: torch.Tensor) -> WordContext:
        terms = None if self.region_terms is None else [t.index_select(0, index) for t in self.region_terms]
        cands = None if self.candidates is None else self.candidates.index_select(0, index)
        return WordContext(self.visual.index_select(0, index), terms, cands)


@dataclass
class GenInput:
    """The encoded-input side of a batch: summed embeddings before the embedding LayerNorm."""
    embeddings: torch.Tensor  # [B, P, hidden]
    mask: torch.Tensor  # [B, P] real elements
    length: torch.Tensor  # [B] the position of y_1 (BERT-gen: the real elements)
    context: WordContext | None = None
    regions: slice = field(default_factory=lambda: slice(0, 0))  # the image's elements of X (attention views)
    words: slice = field(default_factory=lambda: slice(0, 0))  # the caption's word-pieces' elements (padded width)


class BertGen(nn.Module):
    def __init__(self, cfg: VLBertConfig):
        super().__init__()
        if cfg.visual_embedding != "linear":
            raise ValueError("BERT-gen maps regions with one linear layer: visual_embedding must be 'linear'")
        self.cfg = cfg
        self.model = VLBertForPretraining(cfg, with_fast_rcnn=False)  # BERT + its MLM head (tied decoder)

    @property
    def bert(self):
        return self.model.vl_bert

    def projection_parameters(self) -> list[str]:
        """Names of W, the cross-modal projection (the only parameters Step 2 trains)."""
        return [n for n, _ in self.named_parameters() if ".embeddings.visual_linear." in n]

    # -- inputs --------------------------------------------------------------------------------------

    def _tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.bert.embeddings.word_embeddings(ids)

    def embed_input(self, text_ids: torch.Tensor | None = None, text_mask: torch.Tensor | None = None,
                    features: torch.Tensor | None = None, boxes: torch.Tensor | None = None,
                    region_mask: torch.Tensor | None = None, image_hw: torch.Tensor | None = None) -> GenInput:
        """Caption word-pieces (no [CLS]/[SEP]) [B, M] + mask and/or region features [B, N, F] + normalised
        boxes [B, N, 4] + mask -> X = `[CLS] (img.. [SEP]) (txt.. [SEP])`. image_hw [B, 2]: unused (W reads the
        normalised boxes)."""
        cfg, emb = self.cfg, self.bert.embeddings
        if text_ids is None and features is None:
            raise ValueError("BERT-gen needs a caption, an image or both")
        ref = text_ids if text_ids is not None else region_mask
        bsz, dev = ref.shape[0], ref.device
        one = torch.ones(bsz, 1, dtype=torch.bool, device=dev)
        cls = self._tokens(torch.full((bsz, 1), cfg.cls_token_id, device=dev))
        sep = self._tokens(torch.full((bsz, 1), cfg.sep_token_id, device=dev))
        parts, masks = [cls], [one]
        regions = words = slice(0, 0)
        if features is not None:
            parts += [self.bert.embed_regions_linear(features, boxes), sep]
            masks += [region_mask, one]
            regions = slice(1, 1 + features.shape[1])
        if text_ids is not None:
            start = 1 if features is None else regions.stop + 1
            parts += [self._tokens(text_ids), sep]
            masks += [text_mask, one]
            words = slice(start, start + text_ids.shape[1])
        x = torch.cat([p.to(cls.dtype) for p in parts], 1)
        mask = torch.cat(masks, 1)
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)
        x = x + emb.position_embeddings(positions) + emb.token_type_embeddings.weight[SEGMENT_A]
        return GenInput(x, mask, mask.sum(1), regions=regions, words=words)

    def embed_target(self, ids: torch.Tensor, positions: torch.Tensor, context: WordContext | None = None
                     ) -> torch.Tensor:
        """Target word-pieces [B, t] at positions [B, t] -> [B, t, hidden]: segment B (BERT-gen has no context)."""
        emb = self.bert.embeddings
        return emb.word_embeddings(ids) + emb.position_embeddings(positions) + \
            emb.token_type_embeddings.weight[SEGMENT_B]

    # -- training: teacher forcing in one pass ------------------------------------------------------

    def teacher_forcing(self, inp: GenInput, target_ids: torch.Tensor, target_mask: torch.Tensor,
                        output_attentions: bool = False):
        """`X y_1..y_T [MASK]_1..[MASK]_T` -> (hidden states of the T pseudo-masks [B, T, hidden], encoder
        output). The pseudo-mask t sits at y_t's position."""
        bsz, t = target_ids.shape
        dev = target_ids.device
        steps = torch.arange(1, t + 1, device=dev).expand(bsz, t)
        positions = inp.length.unsqueeze(1) + steps - 1
        masks = torch.full_like(target_ids, self.cfg.mask_token_id)
        x = torch.cat([inp.embeddings, self.embed_target(target_ids, positions, inp.context),
                       self.embed_target(masks, positions, inp.context)], 1)
        p = inp.mask.shape[1]
        kind = torch.cat([torch.full_like(inp.mask, INPUT, dtype=torch.long), torch.full_like(steps, TARGET),
                          torch.full_like(steps, PSEUDO_MASK)], 1)
        time = torch.cat([torch.zeros_like(inp.mask, dtype=torch.long), steps, steps], 1)
        real = torch.cat([inp.mask, target_mask, target_mask], 1)
        mask = attention_rule(kind, time, kind, time, real)
        out = self.bert.encode(x, mask, output_attentions=output_attentions)
        return out.last_hidden_state[:, p + t:], out

    def sequence_log_probs(self, inp: GenInput, target_ids: torch.Tensor, target_mask: torch.Tensor
                           ) -> torch.Tensor:
        """log P(Y | X) per sequence [B] (natural log), from the one teacher-forcing pass."""
        hidden, _ = self.teacher_forcing(inp, target_ids, target_mask)
        logp = self.log_probs(hidden)
        token = logp.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)
        return (token * target_mask).sum(1)

    def loss(self, inp: GenInput, target_ids: torch.Tensor, target_mask: torch.Tensor,
             label_smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean cross-entropy over real target tokens (the MLM head only at those), and token accuracy."""
        hidden, _ = self.teacher_forcing(inp, target_ids, target_mask)
        logits = self.model.mlm_head(hidden[target_mask]).float()
        labels = target_ids[target_mask]
        loss = F.cross_entropy(logits, labels, label_smoothing=label_smoothing)
        return loss, (logits.argmax(-1) == labels).float().mean()

    # -- inference: one step at a time ---------------------------------------------------------------

    def packed_decoder(self) -> torch.Tensor | None:
        """The tied output projection laid out once for a decode's repeated products (`heads.pack_for_inference`);
        valid while the weights do not change, so per decode."""
        return pack_for_inference(self.model.mlm_head.decoder.weight)

    def log_probs(self, hidden: torch.Tensor, packed: torch.Tensor | None = None) -> torch.Tensor:
        """log P over the vocabulary from the MLM head: hidden [..., hidden] -> [..., vocab]."""
        return self.model.mlm_head(hidden, packed).float().log_softmax(-1)

    def start(self, inp: GenInput, max_length: int = 32) -> DecodeState:
        """Encode X once; its keys/values become the cache every step extends. It has room for `max_length`
        steps (y_<t and the pseudo-[MASK]_t), so a decode that long never copies it to grow."""
        out = self.bert.encode(inp.embeddings, inp.mask, use_cache=True)
        zeros = torch.zeros_like(inp.mask, dtype=torch.long)
        cache = [KVBuffer.holding(k, v, spare=max_length) for k, v in out.cache]
        return DecodeState(cache, zeros, zeros.clone(), inp.mask, inp.length, 0, self.packed_decoder(), inp.context)

    def step(self, state: DecodeState, last: torch.Tensor | None) -> tuple[torch.Tensor, DecodeState]:
        """Append y_{t-1} (`last` [B]; None at t = 1) and a pseudo-[MASK]_t; return log P(y_t | X, y_<t)
        [B, vocab] and the state with y_{t-1} cached. The pseudo-mask's keys/values are dropped: no later
        element may see it."""
        bsz, dev = state.key_mask.shape[0], state.key_mask.device
        t = state.steps + 1
        pos_mask = (state.length + t - 1).unsqueeze(1)
        mask_tok = torch.full((bsz, 1), self.cfg.mask_token_id, device=dev)
        if last is None:
            x = self.embed_target(mask_tok, pos_mask, state.context)
            q_kind = torch.full((bsz, 1), PSEUDO_MASK, device=dev)
            q_time = torch.full((bsz, 1), t, device=dev)
        else:
            x = torch.cat([self.embed_target(last.unsqueeze(1), pos_mask - 1, state.context),
                           self.embed_target(mask_tok, pos_mask, state.context)], 1)
            q_kind = torch.tensor([TARGET, PSEUDO_MASK], device=dev).expand(bsz, 2)
            q_time = torch.tensor([t - 1, t], device=dev).expand(bsz, 2)
        ones = torch.ones_like(q_kind, dtype=torch.bool)
        k_kind, k_time = torch.cat([state.kind, q_kind], 1), torch.cat([state.time, q_time], 1)
        mask = attention_rule(q_kind, q_time, k_kind, k_time, torch.cat([state.key_mask, ones], 1))
        out = self.bert.encode(x, mask, past=state.cache, use_cache=True)
        logp = self.log_probs(out.last_hidden_state[:, -1], state.packed)
        keep = -1  # everything but the pseudo-mask just appended (the next step writes over its slot)
        cache = [kv.truncate(kv.length - 1) for kv in out.cache]
        if last is None:
            new = DecodeState(cache, state.kind, state.time, state.key_mask, state.length, t, state.packed,
                              state.context)
        else:
            new = DecodeState(cache, k_kind[:, :keep], k_time[:, :keep], torch.cat([state.key_mask, ones[:, :1]], 1),
                              state.length, t, state.packed, state.context)
        return logp, new

    def naive_step(self, inp: GenInput, history: torch.Tensor, packed: torch.Tensor | None = None) -> torch.Tensor:
        """The paper's procedure: re-encode `X y_<t [MASK]` from scratch (same attention rule) and return
        log P(y_t | X, y_<t) [B, vocab]. history [B, t-1]; packed: `packed_decoder()`, as in `step`."""
        bsz, n = history.shape
        dev = history.device
        steps = torch.arange(1, n + 2, device=dev).expand(bsz, n + 1)
        positions = inp.length.unsqueeze(1) + steps - 1
        ids = torch.cat([history, torch.full((bsz, 1), self.cfg.mask_token_id, device=dev)], 1)
        x = torch.cat([inp.embeddings, self.embed_target(ids, positions, inp.context)], 1)
        kind = torch.cat([torch.full_like(inp.mask, INPUT, dtype=torch.long),
                          torch.full((bsz, n), TARGET, device=dev), torch.full((bsz, 1), PSEUDO_MASK, device=dev)], 1)
        time = torch.cat([torch.zeros_like(inp.mask, dtype=torch.long), steps], 1)
        real = torch.cat([inp.mask, torch.ones_like(ids, dtype=torch.bool)], 1)
        out = self.bert.encode(x, attention_rule(kind, time, kind, time, real))
        return self.log_probs(out.last_hidden_state[:, -1], packed)

    # -- analysis ------------------------------------------------------------------------------------

    def cls_states(self, inp: GenInput) -> torch.Tensor:
        """[CLS] at the embedding output and after every layer: [layers + 1, B, hidden] (for Xsim)."""
        out = self.bert.encode(inp.embeddings, inp.mask, output_hidden_states=True)
        return torch.stack([h[:, 0] for h in out.hidden_states])


class VLBertGen(BertGen):
    """BERT-gen on VL-BERT's own input. X is the pretrained model's sequence for the image (and caption),
    `[CLS] (caption) [SEP] [IMG](whole image) [IMG] x regions [END]`, built by `VLBert.embed` as in pretraining: the
    visual feature embedding, each region's region words (its detector's class and attribute names) and each
    word's aligned region words, where a model learned to read the image. BERT-gen's own X (a fresh Linear W over
    the features, no region words) keeps none of that. Y's words are VL-BERT words: segment A, positions after
    [END], the whole image's visual term and the region words they align to (a [MASK] aligns to none, as in the
    MLM). Attention and decoding as BERT-gen's (`attention_rule`). Regions are precomputed features of the model's
    own Fast R-CNN (`finetune.vqg_features`), which stays frozen: its classifiers name the regions."""

    def __init__(self, cfg: VLBertConfig):
        nn.Module.__init__(self)
        if cfg.visual_embedding != "vlbert" or cfg.region_input != "pixels":
            raise ValueError("VL-BERT's own input needs an end-to-end VL-BERT (visual_embedding 'vlbert', "
                             "region_input 'pixels'): its Fast R-CNN names the regions")
        # its decoding runs the encoder on cached prefixes, which carry no layer input, and its target words take
        # the aligned region words alone
        if cfg.geometry_layers or cfg.aligned_geometry or cfg.pair_geometry_bias or cfg.pair_geometry_values:
            raise ValueError("geometry_layers / aligned_geometry / pair_geometry_*: BERT-gen's VL-BERT input "
                             "carries no region geometry past the embeddings; generate from a model pretrained "
                             "without them")
        self.cfg = cfg
        self.model = VLBertForPretraining(cfg, with_fast_rcnn=True)
        self.model.vl_bert.fast_rcnn.requires_grad_(False)  # the features were computed by it, once

    def projection_parameters(self) -> list[str]:
        return []  # no W: regions enter through the pretrained visual embedding

    def embed_input(self, text_ids: torch.Tensor | None = None, text_mask: torch.Tensor | None = None,
                    features: torch.Tensor | None = None, boxes: torch.Tensor | None = None,
                    region_mask: torch.Tensor | None = None, image_hw: torch.Tensor | None = None) -> GenInput:
        """As `BertGen.embed_input`; image_hw [B, 2] (h, w) of each image, which the normalised boxes are
        scaled back by (VL-BERT adds the whole image's box in pixels)."""
        cfg = self.cfg
        if text_ids is None and features is None:
            raise ValueError("BERT-gen needs a caption, an image or both")
        ref = text_ids if text_ids is not None else region_mask
        bsz, dev = ref.shape[0], ref.device
        if text_ids is None:
            text_ids = torch.zeros(bsz, 0, dtype=torch.long, device=dev)
            text_mask = torch.zeros(bsz, 0, dtype=torch.bool, device=dev)
        ids, types, tmask = assemble_text(text_ids, text_mask, cls_id=cfg.cls_token_id, sep_id=cfg.sep_token_id,
                                          pad_id=cfg.pad_token_id)
        image = {}
        if features is not None:
            if image_hw is None:
                raise ValueError("VL-BERT's own input needs image_hw [B, 2] with the region features")
            pixels = boxes * image_hw.flip(-1).to(boxes.dtype).repeat(1, 2).unsqueeze(1)
            image = dict(boxes=pixels, box_mask=region_mask, region_features=features, image_hw=image_hw)
        e = self.bert.embed(ids, tmask, types, **image)
        t = ids.shape[1]
        # an [END] follows the image (and, with learned visual tokens, any text): y_1 comes after it
        ended = features is not None or cfg.visual_tokens == "learned"
        length = e.text_len.squeeze(1) + (2 if ended else 0)
        regions = slice(t + 1, t + e.n_regions) if features is not None else slice(0, 0)
        return GenInput(e.x, e.mask, length, WordContext(e.word_visual, e.region_terms, e.candidates), regions,
                        slice(1, 1 + text_ids.shape[1]))

    def embed_target(self, ids: torch.Tensor, positions: torch.Tensor, context: WordContext | None = None
                     ) -> torch.Tensor:
        emb = self.bert.embeddings
        words = emb.word_embeddings(ids)
        x = words + emb.position_embeddings(positions) + emb.token_type_embeddings.weight[SEGMENT_A] + context.visual
        if context.region_terms is not None:  # its own regions only (no alignment_neighbours): the next word is
            x = x + emb.aligned_region_words(words, context.region_terms, context.candidates)  # what it predicts
        return x


@dataclass
class DecodeState:
    cache: list[KVBuffer]  # per layer [B, heads, L, head_dim]: X and y_<t
    kind: torch.Tensor  # [B, L] kinds of the cached elements
    time: torch.Tensor  # [B, L]
    key_mask: torch.Tensor  # [B, L] real cached elements
    length: torch.Tensor  # [B] real input elements (y_1's position)
    steps: int  # tokens predicted so far
    packed: torch.Tensor | None = None  # the output projection laid out for this decode (`packed_decoder`)
    context: WordContext | None = None  # what every target word adds (`VLBertGen`)

    def select(self, index: torch.Tensor) -> DecodeState:
        """Rows `index` (beam reordering, or expanding each input to k beams)."""
        return DecodeState([kv.index_select(index) for kv in self.cache],
                           self.kind.index_select(0, index), self.time.index_select(0, index),
                           self.key_mask.index_select(0, index), self.length.index_select(0, index), self.steps,
                           self.packed, None if self.context is None else self.context.select(index))


def select_input(inp: GenInput, index: torch.Tensor) -> GenInput:
    return GenInput(inp.embeddings.index_select(0, index), inp.mask.index_select(0, index),
                    inp.length.index_select(0, index), None if inp.context is None else inp.context.select(index),
                    inp.regions, inp.words)
