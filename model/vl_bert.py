"""VL-BERT (Su et al., ICLR 2020, section 3.2): one Transformer over words and image regions.

Sequence: `[CLS] words(A) [SEP] (words(B) [SEP]) | [IMG](whole image) [IMG] x regions | [END]`.
Each element's embedding = token + visual feature + segment (A, B, C) + position:
- words (and [CLS]/[SEP]/[END]) take the whole-image region's visual feature (or, per word, an
  object's, for VCR-style references); text-only samples take one learnable visual embedding;
- regions take their own: FC(appearance ++ sine/cosine geometry); their token is [IMG], or a learned
  RoI-[MASK] embedding when the region is masked; all regions share one position. Optionally an
  unmasked region's token adds its region word embedding: the detector's class and attribute
  distributions (computed from its appearance), and its size distribution (from its box), weighting
  the word embeddings of their names.
The visual terms go through LayerNorms whose gain starts at zero, as in the official code, so a
freshly loaded BERT computes exactly what it computed as a text model and vision is learned in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .boxes import normalise, with_whole_image
from .config import VLBertConfig
from .dropout import Dropout
from .encoder import BertEncoder, KVCache
from .fast_rcnn import FastRCNN, grey_of
from .heads import BertPooler, MaskedLanguageModelingHead, MaskedRoIClassificationHead

SEGMENT_A, SEGMENT_B, SEGMENT_C = 0, 1, 2
# the embedding's optional paths that start at zero, so that a model with one switched on computes what it did without
# it: a finetune may switch one on over an export trained without it (`model.export.load_pretrained`)
ZERO_STARTED = ("geometry_layer_projection", "aligned_geometry_projection", "pair_geometry_projection",
                "pair_geometry_value_projection")


def geometry_embedding(boxes: torch.Tensor, dim: int, wave_length: float = 1000.0) -> torch.Tensor:
    """Relation Networks' sine/cosine embedding of normalised (x1/W, y1/H, x2/W, y2/H) -> [..., dim]."""
    if dim % 8:
        raise ValueError(f"geometry_size must be a multiple of 8, got {dim}")
    k = dim // 8
    freqs = wave_length ** (torch.arange(k, device=boxes.device, dtype=torch.float32) / k)
    angles = (boxes.float() * 100.0).unsqueeze(-1) / freqs  # [..., 4, k]
    return torch.cat([angles.sin(), angles.cos()], -1).flatten(-2)  # [..., 4 * 2k]


def element_angles(boxes: torch.Tensor, frequencies: int) -> torch.Tensor:
    """[B, L, 4] normalised (x1, y1, x2, y2) of a sequence's elements -> [B, L, 4, frequencies]: the centre (cx, cy)
    in image units and (log w, log h) / 8, each at angles pi / 2 * 2^k, k < frequencies. Their differences are a
    pair's relative geometry (`pair_geometry`); the lowest frequency keeps the sign: sin(pi / 2 * dx) > 0 exactly when
    dx > 0, for any |dx| < 2."""
    b = boxes.float()
    size = (b[..., 2:] - b[..., :2]).clamp(min=1e-3)  # a degenerate box: ratios stay finite (|log| <= 6.9)
    coords = torch.cat([(b[..., :2] + b[..., 2:]) / 2, size.log() / 8], -1)
    scales = (torch.pi / 2) * 2.0 ** torch.arange(frequencies, device=b.device, dtype=torch.float32)
    return coords.unsqueeze(-1) * scales


def pair_geometry(boxes: torch.Tensor, frequencies: int) -> torch.Tensor:
    """[B, L, 4] normalised boxes -> [B, L, L, 8 * frequencies]: for each query element i and key element j the
    sines, then the cosines, of j's `element_angles` minus i's, per coordinate: the embedding of (cx_j - cx_i,
    cy_j - cy_i, log w_j / w_i / 8, log h_j / h_i / 8)."""
    angles = element_angles(boxes, frequencies)
    diff = angles.unsqueeze(1) - angles.unsqueeze(2)  # [B, Lq, Lk, 4, frequencies]: key minus query
    return torch.cat([diff.sin(), diff.cos()], -1).flatten(-2)


RELATIONS = ("left", "right", "above", "below")  # `pair_relation_words`' order
NAME_KINDS = ("class", "attribute", "size", "relation")  # the name tables (`VLBertEmbeddings.name_embeddings`)


def pair_relations(boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, N, 4] normalised (x1, y1, x2, y2) -> the relation of each region i to each region j [B, N, N] (an index of
    `RELATIONS`: the dominant axis of i's centre minus j's, ties to x) and whether it has one [B, N, N] (centres
    apart; so never i to itself)."""
    centre = (boxes[..., :2] + boxes[..., 2:]).float() / 2
    d = centre.unsqueeze(2) - centre.unsqueeze(1)  # [B, N, N, 2]: i minus j
    dx, dy = d[..., 0], d[..., 1]
    horizontal = dx.abs() >= dy.abs()
    index = torch.where(horizontal, (dx >= 0).long(), 2 + (dy >= 0).long())
    return index, (dx != 0) | (dy != 0)


def pair_relation_holds(boxes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, N(i), N(j), 4]: 1 where region i stands in relation k to region j (`pair_relations`), 0 elsewhere and for
    regions that share a centre."""
    index, apart = pair_relations(boxes)
    return F.one_hot(index, len(RELATIONS)).to(dtype) * apart.unsqueeze(-1).to(dtype)


def assemble_text(a_ids: torch.Tensor, a_mask: torch.Tensor, b_ids: torch.Tensor | None = None,
                  b_mask: torch.Tensor | None = None, *, cls_id: int, sep_id: int, pad_id: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Word ids of sentences A (and B), right-padded -> `[CLS] A [SEP] (B [SEP])`, right-padded.

    Returns input_ids [B, T], token_type_ids [B, T] (A = 0, B = 1) and text_mask [B, T]. Tensor ops
    only: each token is scattered to its place.
    """
    bsz, ta = a_ids.shape
    dev = a_ids.device
    la = a_mask.sum(1)
    tb = b_ids.shape[1] if b_ids is not None else 0
    lb = b_mask.sum(1) if b_ids is not None else torch.zeros_like(la)
    total = 2 + ta + (tb + 1 if b_ids is not None else 0)
    ids = torch.full((bsz, total + 1), pad_id, dtype=torch.long, device=dev)  # last column: a dump
    types = torch.zeros((bsz, total + 1), dtype=torch.long, device=dev)
    dump = torch.full_like(a_ids, total)
    ids[:, 0] = cls_id
    ids.scatter_(1, torch.where(a_mask, 1 + torch.arange(ta, device=dev), dump), a_ids)
    ids.scatter_(1, (1 + la).unsqueeze(1), sep_id)
    length = 2 + la
    if b_ids is not None:
        pos_b = 2 + la.unsqueeze(1) + torch.arange(tb, device=dev)
        ids.scatter_(1, torch.where(b_mask, pos_b, torch.full_like(b_ids, total)), b_ids)
        types.scatter_(1, torch.where(b_mask, pos_b, torch.full_like(b_ids, total)), SEGMENT_B)
        ids.scatter_(1, (2 + la + lb).unsqueeze(1), sep_id)
        types.scatter_(1, (2 + la + lb).unsqueeze(1), SEGMENT_B)
        length = length + lb + 1
    mask = torch.arange(total + 1, device=dev) < length.unsqueeze(1)
    width = int(length.max()) if bsz else 0
    return ids[:, :width], types[:, :width], mask[:, :width]


def word_table(names: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Word-piece ids per name [K, P] (padded with 0) and their weights [K, P] (1/pieces, 0 on padding)."""
    if not names or any(not isinstance(n, (list, tuple)) or not n or
                        any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in n) for n in names):
        raise ValueError("region words: expected a non-empty list of word-piece id lists (one per name), "
                         f"got {str(names)[:80]}")
    width = max(len(n) for n in names)
    ids = torch.tensor([list(n) + [0] * (width - len(n)) for n in names], dtype=torch.long)
    weights = torch.tensor([[1.0 / len(n)] * len(n) + [0.0] * (width - len(n)) for n in names])
    return ids, weights


def real_positions(text_mask: torch.Tensor, box_mask: torch.Tensor | None = None) -> int:
    """The encoder positions of a batch that are not padding: the words, and with an image the whole-image
    element, the regions and [END] (`VLBert.forward`'s sequence). Count it where the batch is on the host
    (the data loader) and pass it as `real_positions`, so the encoder skips padding without a sync."""
    real = int(text_mask.sum())
    if box_mask is not None:
        real += int(box_mask.sum()) + 2 * box_mask.shape[0]
    return real


class AppearanceStandardiser(nn.Module):
    """Per-channel standardisation of appearance features by running statistics of the real elements
    (a fixed-size data standardisation, not batch norm: the statistics are detached and the same in
    training and evaluation, so 4-image demo batches do not make them noisy). In training each batch
    updates them first (the first batch sets them), then they standardise it. Masked sums rather than
    boolean indexing, and a tensor flag for the first batch, so no host sync."""

    # A channel whose statistics vary less than this never varied in the data they came from (the image-ablated
    # control's grey images leave a third of the channels so, up to float rounding). Its training inputs reached
    # the model as less than 3e-4 (std < 1e-6 over sqrt(eps)); an input that makes it vary (a real image at
    # evaluation) would be amplified 316-fold into something nothing learnt. It contributes 0 instead
    # (docs/ABLATION.md, session 18: the control's vision-for-language leak). No model trained on images has one.
    CONSTANT_VAR = 1e-12

    def __init__(self, size: int, momentum: float = 0.05, eps: float = 1e-5):
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.register_buffer("running_mean", torch.zeros(size))
        self.register_buffer("running_var", torch.ones(size))
        self.register_buffer("initialised", torch.zeros((), dtype=torch.bool))

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """x [B, R, F]; valid [B, R] bool."""
        if self.training:
            with torch.no_grad():
                w = valid.unsqueeze(-1).to(torch.float32)
                real = w.sum()
                count = real.clamp(min=2.0)
                xf = x.detach().float()
                mean = (xf * w).sum((0, 1)) / count  # [F]
                var = (((xf - mean) ** 2) * w).sum((0, 1)) / (count - 1)
                step = torch.where(self.initialised, self.momentum, 1.0)
                # a batch with no real element (no image had a box) says nothing: the statistics stay
                step = torch.where(real > 0, step, 0.0)
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), step)
                self.running_var.lerp_(var.to(self.running_var.dtype), step)
                self.initialised.logical_or_(real > 0)
        mean, var = self.running_mean.float(), self.running_var.float()
        scale = torch.where(var < self.CONSTANT_VAR, 0.0, (var + self.eps).rsqrt())
        return ((x.float() - mean) * scale).to(x.dtype)


class VLBertEmbeddings(nn.Module):
    def __init__(self, cfg: VLBertConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.word_embeddings = nn.Embedding(cfg.vocab_size, h, padding_idx=cfg.pad_token_id)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, h)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, h)
        self.LayerNorm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout_prob)
        self.roi_mask_embedding = nn.Parameter(torch.zeros(h))  # replaces [IMG] for masked regions
        if cfg.visual_tokens not in ("vocab", "learned"):
            raise ValueError(f"visual_tokens: '{cfg.visual_tokens}' is not 'vocab' or 'learned'")
        if cfg.geometry_boxes not in ("corners", "center_size"):
            raise ValueError(f"geometry_boxes: '{cfg.geometry_boxes}' is not 'corners' or 'center_size'")
        if cfg.visual_tokens == "learned":  # the official object linguistic embedding and end embedding
            self.object_token_embedding = nn.Parameter(torch.zeros(h))
            self.end_token_embedding = nn.Parameter(torch.zeros(h))
        if cfg.visual_embedding == "vlbert":
            self.visual_feature_embedding: nn.Module = nn.Identity()  # set by VLBert once F is known
            self.appearance_standardiser: AppearanceStandardiser | None = None
            self.whole_image_standardiser: AppearanceStandardiser | None = None
            self.text_only_visual_embedding = nn.Parameter(torch.zeros(cfg.visual_size))
            self.visual_projection_text = nn.Linear(cfg.visual_size, h)
            self.visual_projection_object = nn.Linear(cfg.visual_size, h)
            self.visual_ln_text = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
            self.visual_ln_object = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
            if cfg.geometry_layers:
                self.geometry_layer_projection = nn.Linear(cfg.geometry_size, h)
            if cfg.aligned_geometry:
                self.aligned_geometry_projection = nn.Linear(cfg.geometry_size, h)
            if cfg.pair_geometry_bias:  # one bias per layer and head
                self.pair_geometry_projection = nn.Linear(8 * cfg.pair_geometry_frequencies,
                                                          cfg.num_hidden_layers * cfg.num_attention_heads)
            for name, value in self.config_buffers().items():
                self.register_buffer(name, value, persistent=False)
        elif cfg.visual_embedding == "linear":
            # BERT-gen: the only visual parameters are one Linear(F + 4 box coordinates -> hidden)
            self.visual_linear = nn.Linear(cfg.precomputed_feature_size + 4, h)
        else:
            raise ValueError(f"visual_embedding: '{cfg.visual_embedding}' is not 'vlbert' or 'linear'")

    def config_buffers(self) -> dict[str, torch.Tensor]:
        """The buffers that follow from the config alone (the region word tables), not saved with the weights:
        built here at construction, and again by a loader that builds the model without running it (transformers'
        `from_pretrained` on the meta device)."""
        cfg, out = self.cfg, {}
        if cfg.visual_embedding != "vlbert":
            return out
        for kind, names in (("class", cfg.region_class_words), ("attribute", cfg.region_attribute_words),
                            ("size", cfg.region_size_words), ("relation", cfg.pair_relation_words)):
            if names is not None:
                field_name = "pair_relation_words" if kind == "relation" else f"region_{kind}_words"
                if kind == "relation" and (not isinstance(names, (list, tuple)) or len(names) != len(RELATIONS)):
                    raise ValueError(f"pair_relation_words: expected {len(RELATIONS)} word-piece id lists, the names "
                                     f"of {', '.join(RELATIONS)}; got {str(names)[:80]}")
                ids, weights = word_table(names)
                top = max(i for name in names for i in name)  # from the config: the tables may be on meta
                if top >= cfg.vocab_size:
                    raise ValueError(f"{field_name}: word id {top} is outside the vocabulary ({cfg.vocab_size})")
                out[f"region_{kind}_word_ids"], out[f"region_{kind}_word_weights"] = ids, weights
        split = [n for names in (cfg.region_class_words, cfg.region_attribute_words, cfg.region_size_words)
                 if names is not None for n in names if len(n) > 1]
        if cfg.align_whole_names and split:  # `name_pieces`' table: the names of two or more pieces, once
            ids, weights = word_table(split)
            out["whole_name_ids"], out["whole_name_pieces"] = ids, weights > 0
        return out

    def build_visual_feature_embedding(self, appearance_size: int) -> None:
        cfg = self.cfg
        # the whole-image element and the regions are standardised apart: pooled with the regions, the
        # whole image's feature (one element per image, mostly background) varies across images by a
        # fraction of the region spread and every word would get nearly the same visual term (cosine 0.99)
        self.appearance_standardiser = AppearanceStandardiser(appearance_size) if cfg.standardise_appearance else None
        self.whole_image_standardiser = AppearanceStandardiser(appearance_size) if cfg.standardise_appearance else None
        self.visual_feature_embedding = nn.Sequential(
            Dropout(cfg.visual_dropout), nn.Linear(appearance_size + cfg.geometry_size, cfg.visual_size),
            nn.ReLU())

    def visual_features(self, appearance: torch.Tensor, boxes_normalised: torch.Tensor,
                        valid: torch.Tensor | None = None) -> torch.Tensor:
        """FC(appearance ++ geometry): [B, R, F], [B, R, 4] -> [B, R, visual_size]. valid [B, R]: the real
        elements (for the standardiser's statistics; default all)."""
        if self.appearance_standardiser is not None:
            if valid is None:
                valid = torch.ones(appearance.shape[:2], dtype=torch.bool, device=appearance.device)
            appearance = torch.cat([self.whole_image_standardiser(appearance[:, :1], valid[:, :1]),
                                    self.appearance_standardiser(appearance[:, 1:], valid[:, 1:])], 1)
        geometry = self.geometry(boxes_normalised).to(appearance.dtype)
        return self.visual_feature_embedding(torch.cat([appearance, geometry], -1))

    def geometry(self, boxes_normalised: torch.Tensor) -> torch.Tensor:
        """The sine/cosine geometry embedding of [B, R, 4] normalised corners, in the config's box encoding."""
        if self.cfg.geometry_boxes == "center_size":
            corner1, corner2 = boxes_normalised[..., :2], boxes_normalised[..., 2:]
            boxes_normalised = torch.cat([(corner1 + corner2) / 2, corner2 - corner1], -1)
        return geometry_embedding(boxes_normalised, self.cfg.geometry_size)

    def name_embeddings(self, kind: str, names: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """[K, hidden]: each class (attribute, size, relation) name's word embedding, the mean of its pieces', read
        from the live word-embedding matrix (so it trains with, and stays tied to, the words); names: the tables
        `words_and_names` already looked up, taken as they are."""
        if names is not None:
            return names[kind]
        ids = getattr(self, f"region_{kind}_word_ids")
        return self.weighted_names(kind, self.word_embeddings(ids))

    def weighted_names(self, kind: str, pieces: torch.Tensor) -> torch.Tensor:
        """[K, P, hidden] rows of a name table's pieces -> [K, hidden], each name the weighted sum of its pieces."""
        weights = getattr(self, f"region_{kind}_word_weights")
        return (pieces * weights.unsqueeze(-1).to(self.word_embeddings.weight.dtype)).sum(1)

    def words_and_names(self, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """ids' word embeddings [*ids.shape, hidden] and every name table the config has (`name_embeddings`), in one
        lookup: the backward of each lookup writes a dense [vocab, hidden] gradient that autograd then adds to the
        others (47 MB for BERT's vocabulary); with a lookup per name table those were ~10% of the demo's step."""
        kinds = [k for k in NAME_KINDS if getattr(self, f"region_{k}_word_ids", None) is not None]
        tables = [getattr(self, f"region_{k}_word_ids") for k in kinds]
        rows = self.word_embeddings(torch.cat([ids.flatten()] + [t.flatten() for t in tables]))
        words, *pieces = rows.split([ids.numel()] + [t.numel() for t in tables])
        names = {k: self.weighted_names(k, p.view(*t.shape, -1)) for k, t, p in zip(kinds, tables, pieces)}
        return words.view(*ids.shape, -1), names

    def region_word_terms(self, class_logits: torch.Tensor | None, attribute_logits: torch.Tensor | None,
                          size_logits: torch.Tensor | None = None,
                          names: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
        """sum_c p(c) E[name_c] over the foreground classes, and the same over attributes and sizes: each
        [B, R, hidden]. names: as `name_embeddings`."""
        terms = []
        if class_logits is not None:
            probs = class_logits[..., 1:].float().softmax(-1)  # a box is an object: background is no name
            terms.append(probs.to(class_logits.dtype) @ self.name_embeddings("class", names)[1:])
        for kind, logits in (("attribute", attribute_logits), ("size", size_logits)):
            if logits is not None:
                terms.append(logits.float().softmax(-1).to(logits.dtype) @ self.name_embeddings(kind, names))
        return terms

    def relation_name_terms(self, boxes: torch.Tensor, box_mask: torch.Tensor, word_region_index: torch.Tensor,
                            token_type_ids: torch.Tensor, names: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """[B, T, hidden]: each referring word's relation names (`pair_relation_words`, `pair_relation_partners`) from
        the regions' boxes [B, N, 4] (normalised), box_mask [B, N] and word_region_index [B, T] (-1: no region);
        zeros for the other words. A pair whose centres coincide has no relation."""
        index, apart = pair_relations(boxes)  # [B, N, N]
        refers = word_region_index >= 0
        region = word_region_index.clamp(min=0)
        b, t = region.shape
        n = index.shape[1]
        if self.cfg.pair_relation_partners == "referred":
            # every region a word refers to, itself and regions at its centre left out; the mean over the regions
            referred = (torch.zeros(box_mask.shape, dtype=torch.long, device=boxes.device).scatter_add_(
                1, region, refers.long()) > 0) & box_mask  # [B, N]: a sum, as scatter's overwrite has no order
            weight = (apart & referred.unsqueeze(1)).to(torch.float32)  # [B, N(i), N(j)]
            counts = torch.zeros(b, n, len(RELATIONS), device=boxes.device).scatter_add_(2, index, weight)
            counts = counts / weight.sum(-1, keepdim=True).clamp(min=1.0)
            counts = counts.gather(1, region.unsqueeze(-1).expand(b, t, len(RELATIONS))) * refers.unsqueeze(-1)
        else:  # next_mention: the first later word of the same segment that refers to another region
            rows = region.unsqueeze(-1).expand(b, t, n)
            cols = region.unsqueeze(1).expand(b, t, t)
            pair_index = index.gather(1, rows).gather(2, cols)  # [B, T, T]: word t's region to word t''s region
            pair_apart = apart.gather(1, rows).gather(2, cols)
            later = torch.ones(t, t, dtype=torch.bool, device=boxes.device).triu(1)
            partner = later & refers.unsqueeze(1) & refers.unsqueeze(2) & \
                (token_type_ids.unsqueeze(1) == token_type_ids.unsqueeze(2)) & (cols != region.unsqueeze(-1))
            first = partner & (partner.long().cumsum(-1) == 1)  # at most one per word
            counts = torch.zeros(b, t, len(RELATIONS), device=boxes.device).scatter_add_(
                2, pair_index, (first & pair_apart).to(torch.float32))
        table = self.name_embeddings("relation", names)
        return counts.to(table.dtype) @ table

    def aligned_region_words(self, words: torch.Tensor, terms: list[torch.Tensor], candidates: torch.Tensor,
                             geometry: torch.Tensor | None = None, valid: torch.Tensor | None = None,
                             relations: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                             names: dict[str, torch.Tensor] | None = None,
                             with_weights: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Each word's share of the region words of the regions its own embedding names: [B, T, hidden]; with
        geometry [B, R, hidden] (`aligned_geometry`), of those regions' geometry terms too, with the same weights
        (`alignment_weights`' [B, T, R]; returned beside it with `with_weights`).

        score(t, r) = max over the parts (class, attribute, size) of cos(E[word t], part of region r); weights =
        softmax over the candidate regions and one "no region" option scored at the threshold, all times
        the scale. So "circle" takes the circle region's "red", "red" the red region's "circle", and a word
        that names nothing ("of", [MASK]) takes nothing. No parameters: the alignment is read off the word
        embeddings and the detector's distributions (Oscar's object tags as anchors, applied by name)."""
        content = sum(terms) if geometry is None else sum(terms) + geometry
        weights = self.alignment_weights(words, terms, candidates, valid, relations, names)
        out = (weights.to(words.dtype) @ content).to(words.dtype)
        return (out, weights) if with_weights else out

    @staticmethod
    def region_aligned_words(weights: torch.Tensor, words: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """[B, R, hidden]: each region's sum of the real words' embeddings `words` [B, T, hidden], each times its
        alignment weight on the region (weights [B, T, R]; real [B, T]), the alignment read from the regions'
        side (`region_aligned_words`). A batched matmul, no loop over words or regions."""
        shared = weights * real.unsqueeze(-1).to(weights.dtype)
        return (shared.transpose(1, 2).to(words.dtype) @ words).to(words.dtype)

    def alignment_weights(self, words: torch.Tensor, terms: list[torch.Tensor], candidates: torch.Tensor,
                          valid: torch.Tensor | None = None,
                          relations: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                          names: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """[B, T, R]: each word's weight on each region in `aligned_region_words` (a row sums to 1 minus its
        "no region" weight). With `alignment_neighbours` k and valid [B, T] (the real words), a word then adds,
        times its own "no region" weight, the sum of the weights of the valid words within k of it, scaled to
        sum to at most 1; with `alignment_neighbour_combine` "product", the product of the valid neighbours'
        normalised weights, each raised to the mass it names with, renormalised over the candidates and scaled
        by that mass summed (at most 1). relations (`relation_alignment_window`): (relation [B, T], the index in
        `RELATIONS` of the relation name each word is, -1 for the others; the regions' normalised boxes [B, R, 4];
        the real words [B, T]): a relation word's score on a region is also `relation_scores`' (the larger counts),
        before the neighbours share it, and after them the unnamed words on the far side of its object take it in
        the share left (`relation_reach`)."""
        cfg = self.cfg
        w = F.normalize(words.float(), dim=-1)  # [B, T, h]
        score = torch.stack([w @ F.normalize(part.float(), dim=-1).transpose(1, 2) for part in terms]).amax(0)
        score = score.masked_fill(~candidates.unsqueeze(1), float("-inf"))  # [B, T, R]
        none = score.new_full((*score.shape[:2], 1), cfg.region_word_alignment)
        weights = (torch.cat([score, none], -1) * cfg.region_word_alignment_scale).softmax(-1)[..., :-1]
        reach = None
        if relations is not None:
            relation, boxes, real = relations
            after, before = self.relation_scores(w, weights, candidates, relation, boxes, real, names)
            if cfg.relation_alignment_landmark_first:  # the object before only where none after names one
                before = before.masked_fill(torch.isfinite(after).any(-1, keepdim=True), float("-inf"))
            unnamed = weights.sum(-1) <= 0.5  # [B, T]: the words that name no region by themselves
            score = torch.maximum(score, torch.maximum(after, before))
            weights = (torch.cat([score, none], -1) * cfg.region_word_alignment_scale).softmax(-1)[..., :-1]
            # taken last, in the share the neighbours leave: where a word's neighbours name its object ("a small
            # blue [MASK] left of ..."), their product is the sharper reading; the reach fills a whole masked phrase
            reach = self.relation_reach(after, before, none, unnamed & real, relation)
        # each share is taken in what the word's alignment so far leaves: its own, then its neighbours', then the reach
        if cfg.alignment_neighbours and valid is not None:
            weights = weights + (1.0 - weights.sum(-1, keepdim=True)) * self.neighbour_share(weights, candidates, valid)
        if reach is not None:
            weights = weights + (1.0 - weights.sum(-1, keepdim=True)) * reach
        return weights

    def neighbour_share(self, weights: torch.Tensor, candidates: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """[B, T, R]: what each word takes of the valid words within `alignment_neighbours` of it
        (`alignment_weights`), summed or as a product by `alignment_neighbour_combine`, at most 1 in all."""
        cfg = self.cfg
        k = cfg.alignment_neighbours
        t = weights.shape[1]
        source = F.pad(weights * valid.unsqueeze(-1).to(weights.dtype), (0, 0, k, k))  # [B, T + 2k, R]
        offsets = [o for o in range(-k, k + 1) if o]  # 2k shifted views, no token loop
        if cfg.alignment_neighbour_combine == "sum":
            near = sum(source[:, k + o:k + o + t] for o in offsets)
            near = near / near.sum(-1, keepdim=True).clamp(min=1.0)
        else:  # product: each neighbour's region distribution p_s, raised to the mass m_s it names with
            mass = source.sum(-1, keepdim=True)  # [B, T + 2k, 1]
            log_p = (source / mass.clamp(min=1e-12)).clamp(min=1e-6).log()
            views = [(mass[:, k + o:k + o + t], log_p[:, k + o:k + o + t]) for o in offsets]
            log_near = sum(m * lp for m, lp in views).masked_fill(~candidates.unsqueeze(1), float("-inf"))
            any_region = candidates.any(-1)[:, None, None]  # a row without regions takes none (and no NaN)
            near = torch.where(any_region, log_near.masked_fill(~any_region, 0.0).softmax(-1), 0.0)
            near = near * sum(m for m, _ in views).clamp(max=1.0)
        return near

    def name_pieces(self, input_ids: torch.Tensor) -> torch.Tensor | None:
        """[B, T(start), T(piece)] bool (`align_whole_names`): True where an occurrence of a name of two or more
        word-pieces in the class, attribute or size tables starts at the first position and covers the second (each
        name matched against every position of input_ids [B, T] through P shifted views, P the table's width; the
        table built once from the config, `config_buffers`); None where the option is off or no such name exists."""
        ids = getattr(self, "whole_name_ids", None)  # [K, P]
        if ids is None:
            return None
        used, width = self.whole_name_pieces, ids.shape[1]  # [K, P]: each name's real pieces
        t = input_ids.shape[1]
        shifted = F.pad(input_ids, (0, width - 1), value=-1).unfold(1, width, 1)  # [B, T, P]: ids from each position
        match = ((shifted.unsqueeze(2) == ids) | ~used).all(-1)  # [B, T, K]
        length = torch.where(match, used.sum(-1), 0).amax(-1)  # [B, T]: the longest name starting there (0: none)
        position = torch.arange(t, device=input_ids.device)
        offset = position.unsqueeze(0) - position.unsqueeze(1)  # [T(start), T(piece)]: piece - start
        return (offset >= 0) & (offset < length.unsqueeze(-1))

    @staticmethod
    def whole_name_words(words: torch.Tensor, pieces: torch.Tensor | None) -> torch.Tensor:
        """words [B, T, hidden] with each piece of a `name_pieces` occurrence (pieces [B, T, T]) replaced by the
        mean of the occurrence's pieces (a piece in two occurrences: the mean of their means); the others as
        they are. Batched matmuls, no loop over words."""
        if pieces is None:
            return words
        cover = pieces.to(words.dtype)  # [B, T(start), T(piece)]
        means = (cover @ words) / cover.sum(-1, keepdim=True).clamp(min=1.0)  # [B, T(start), hidden]
        count = cover.sum(1).unsqueeze(-1)  # [B, T(piece), 1]: the occurrences covering each piece
        return torch.where(count > 0, (cover.transpose(1, 2) @ means) / count.clamp(min=1.0), words)

    def relation_anchors(self, weights: torch.Tensor, candidates: torch.Tensor, real: torch.Tensor,
                         relation: torch.Tensor, window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The object named beside each relation word, as a distribution over the regions, on each side: [B, T, R]
        after it and [B, T, R] before it (rows of zeros where none).

        weights [B, T, R]: each word's own alignment by name. A word names when it aligns with mass > 1/2; the
        object on a side is the run of consecutive naming words nearest the relation word on that side, whose
        first word lies within `relation_alignment_window` pieces of it, and its regions those all of the run's
        words name: the product of their normalised distributions, each raised to its mass (as
        `alignment_neighbour_combine` "product"). A run, not a window: "left of a small blue star and a red circle"
        takes the star, not a compromise of the star and the circle. relation [B, T]: >= 0 at the words whose objects
        are wanted (the relation words; `relation_between_terms` asks for the unnamed ones). window: pieces, the
        config's `relation_alignment_window` if None. Tensor ops over [B, T, T], no token loop."""
        window = self.cfg.relation_alignment_window if window is None else window
        b, t, r = weights.shape
        mass = weights.sum(-1)  # [B, T]
        naming = (mass > 0.5) & real
        starts = naming & ~F.pad(naming, (1, 0))[:, :-1]
        run = torch.where(naming, starts.long().cumsum(1), 0)  # [B, T]: each naming word's run, 0 for the others
        position = torch.arange(t, device=weights.device)
        offset = position.unsqueeze(0) - position.unsqueeze(1)  # [T(t), T(s)]: s - t
        log_p = (weights / mass.unsqueeze(-1).clamp(min=1e-12)).clamp(min=1e-6).log()  # [B, T, R]
        is_relation = (relation >= 0) & real
        out = []
        for side in (1, -1):  # after the relation word, then before it
            near = (offset * side > 0) & (offset * side <= window)  # [T, T]
            reach = naming.unsqueeze(1) & near  # [B, T, T]: naming words within reach of each word
            # the nearest of them: the first after it, the last before it
            distance = torch.where(reach, (offset * side).expand(b, t, t), t + 1)
            nearest = distance.argmin(-1)  # [B, T]
            found = reach.any(-1) & is_relation
            anchor_run = torch.where(found, run.gather(1, nearest), -1)  # [B, T]
            side_of = (offset * side > 0).unsqueeze(0)
            members = (run.unsqueeze(1) == anchor_run.unsqueeze(-1)) & naming.unsqueeze(1) & side_of  # [B, T, T]
            log_anchor = (members.to(log_p.dtype) * mass.unsqueeze(1)) @ log_p  # [B, T, R]
            log_anchor = log_anchor.masked_fill(~candidates.unsqueeze(1), float("-inf"))
            # a row with no object (or no candidates) is filled before the softmax: no NaN, forward or backward
            some = found.unsqueeze(-1) & candidates.any(-1)[:, None, None]
            out.append(torch.where(some, log_anchor.masked_fill(~some, 0.0).softmax(-1), 0.0))
        return out[0], out[1]

    def relation_between_terms(self, words: torch.Tensor, terms: list[torch.Tensor], candidates: torch.Tensor,
                               real: torch.Tensor, boxes: torch.Tensor, relation: torch.Tensor | None = None,
                               names: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """[B, T, hidden] (`relation_between`): each real word (real [B, T]) that names no region by its own embedding
        (words [B, T, hidden]), with an object named before it and one after it (`relation_anchors`' runs, as for a
        relation word), adds sum_k c_k E[relation name k], c_k = sum_ij before_i after_j [region i is k of region j]
        over the regions' boxes [B, R, 4] (`pair_relations`: the dominant axis of the centres' offset); zeros for
        every other word and for regions that share a centre. A relation word (relation [B, T]: its index in
        `RELATIONS`, -1 for the others) takes the other names only: what the boxes say against it, nothing where
        they agree. Tensor ops, no loop over words or regions."""
        weights = self.alignment_weights(words, terms, candidates)  # by names alone: which words name an object
        unnamed = (weights.sum(-1) <= 0.5) & real
        after, before = self.relation_anchors(weights, candidates, real, torch.where(unnamed, 0, -1),
                                              self.cfg.relation_between_window or None)
        holds = pair_relation_holds(boxes, after.dtype)  # [B, R(i), R(j), 4]: i's relation to j
        counts = torch.einsum("bti,btj,bijk->btk", before, after, holds)  # [B, T, 4]
        if relation is not None:
            # "is the square left of the cross?": with the full c a true "left" carries 2 E[left] and a false one
            # E[left] + E[right], which no direction of the input tells apart (both project alike on the names' sum;
            # a session-92 VQA finetune left these questions at chance though the term was right on 64 of 67); with
            # its own name out, a true one carries nothing and a false one the name the boxes show
            own = F.one_hot(relation.clamp(min=0), len(RELATIONS)).bool() & (relation >= 0).unsqueeze(-1)
            counts = counts.masked_fill(own, 0.0)
        table = self.name_embeddings("relation", names)
        return counts.to(table.dtype) @ table

    def relation_scores(self, w: torch.Tensor, weights: torch.Tensor, candidates: torch.Tensor,
                        relation: torch.Tensor, boxes: torch.Tensor, real: torch.Tensor,
                        names: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T, R] twice, from the object after the word and from the object before it: a relation word's alignment
        score on each region from the relation the region stands in to the object named beside the word
        (`relation_anchors`), -inf where it has none (every other word, a word with no object on that side, a region
        in no relation to it).

        The region's relation part is sum_k c_k E[relation name k], c_k the anchor's weight on the regions j for
        which "region k-relation j" holds (the object after the word: "[region] left of [j]") or "j k-relation
        region" holds (the object before it: "[j] left of [region]"), from the boxes' centres (`pair_relations`);
        its score is the cosine of the word's embedding w [B, T, h] (unit) with that part, as a region's name parts
        are scored (`alignment_weights`)."""
        after, before = self.relation_anchors(weights, candidates, real, relation)  # [B, T, R] each
        holds = pair_relation_holds(boxes, after.dtype)  # [B, R(i), R(j), 4]: i's relation to j
        table = self.name_embeddings("relation", names).float()  # [4, h]
        gram = table @ table.T  # [4, 4]
        along = w @ table.T  # [B, T, 4]: the word's unit embedding on each name
        sides = []
        for counts in (torch.einsum("btj,bijk->btik", after, holds), torch.einsum("btj,bjik->btik", before, holds)):
            # |sum_k c_k E_k|, kept off 0 (the square root's gradient there is infinite, and times 0 NaN)
            norm = torch.einsum("btik,kl,btil->bti", counts, gram, counts).clamp(min=1e-24).sqrt()
            cosine = torch.einsum("btik,btk->bti", counts, along) / norm
            sides.append(cosine.masked_fill(counts.sum(-1) <= 1e-6, float("-inf")))  # [B, T, R]
        keep = (relation >= 0).unsqueeze(-1) & candidates.unsqueeze(1)
        return sides[0].masked_fill(~keep, float("-inf")), sides[1].masked_fill(~keep, float("-inf"))

    def relation_reach(self, after: torch.Tensor, before: torch.Tensor, none: torch.Tensor, unnamed: torch.Tensor,
                       relation: torch.Tensor) -> torch.Tensor:
        """[B, T, R]: what the unnamed words beside a relation word take of it. The phrase a relation word relates
        to its named object lies on the other side: "[a small blue triangle] left of a large red star", "a small
        blue triangle left of [a large red star]". Each word of the run of unnamed words (a masked phrase, "of",
        "it") that starts at the relation word on the side away from the object, up to 2 * window + 1 pieces, takes
        the relation word's alignment from that object alone (after: `relation_scores`' first side, before: its
        second; softmax against the "no region" option as the word's own), summed over such relation words and
        scaled to at most 1, in the share its own alignment leaves; so the whole masked phrase holds the names of
        the regions in that relation, where `alignment_neighbours` reaches its nearest pieces only."""
        cfg = self.cfg
        b, t, _ = after.shape
        position = torch.arange(t, device=after.device)
        offset = position.unsqueeze(1) - position.unsqueeze(0)  # [T(word), T(relation word)]: word minus relation
        reach = 2 * cfg.relation_alignment_window + 1
        # the number of named words ([CLS], [SEP] and padding count: a run stops there) up to each position: with the
        # word unnamed (required below) and the relation word too (it names no region), their difference counts the
        # named words between the two
        named = torch.cumsum((~unnamed).long(), 1)  # [B, T]
        between = (named.unsqueeze(2) - named.unsqueeze(1)).abs()  # [B, T(word), T(relation word)]
        share = 0.0
        for side, scores in ((-1, after), (1, before)):  # the words before a relation word take its object after
            run = (offset * side > 0) & (offset * side <= reach)  # [T, T]
            run = run.unsqueeze(0) & unnamed.unsqueeze(2) & (between == 0) & (relation >= 0).unsqueeze(1)
            taken = (torch.cat([scores, none.expand(b, t, 1)], -1) * cfg.region_word_alignment_scale).softmax(-1)
            share = share + run.to(taken.dtype) @ taken[..., :-1]  # [B, T(word), R]
        return share / share.sum(-1, keepdim=True).clamp(min=1.0)

    def text_visual_term(self, visual: torch.Tensor) -> torch.Tensor:
        return self.visual_ln_text(self.visual_projection_text(visual))

    def object_visual_term(self, visual: torch.Tensor) -> torch.Tensor:
        return self.visual_ln_object(self.visual_projection_object(visual))

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.LayerNorm(x))


@dataclass
class VLBertEmbedded:
    """`VLBert.embed`: the sequence's summed embeddings before the embedding LayerNorm, and what a word placed after
    it takes (a decoder's words are VL-BERT words: the same visual term and region-word alignment)."""
    x: torch.Tensor  # [B, L, hidden]
    mask: torch.Tensor  # [B, L] real elements
    n_regions: int  # whole image + boxes (0 without an image)
    region_logits: torch.Tensor | None
    text_len: torch.Tensor  # [B, 1] real text elements (the regions' shared position)
    word_visual: torch.Tensor  # [B, 1, hidden] every word's visual term (the whole image's, or text-only's)
    region_terms: list[torch.Tensor] | None  # region word terms [B, 1+N, hidden] when words align to them
    candidates: torch.Tensor | None  # [B, 1+N] the regions a word may align to
    region_attribute_logits: torch.Tensor | None = None  # the Fast R-CNN's attribute logits, detached, if asked
    layer_input: torch.Tensor | None = None  # [B, L, hidden] added before every layer after the first (geometry_layers)
    layer_bias: torch.Tensor | None = None  # [layers, B, heads, L, L] added to each layer's logits (pair_geometry_bias)
    pair_angles: torch.Tensor | None = None  # [B, L, 4, F] each element's `element_angles` (pair_geometry_values)


@dataclass
class VLBertOutput:
    last_hidden_state: torch.Tensor  # [B, L, hidden], L = T + (1 + N + 1 with an image)
    attention_mask: torch.Tensor  # [B, L] bool
    text_length: int  # T: elements [0, T) are the text part
    num_regions: int  # 1 + N visual elements follow (element T is the whole image), then [END]
    pooler: nn.Module  # the pooled [CLS] is computed when asked for: pretraining has no loss on it
    region_class_logits: torch.Tensor | None = None  # Fast R-CNN's object logits [B, 1+N, classes] if asked
    hidden_states: list[torch.Tensor] | None = None
    attentions: list[torch.Tensor] | None = None
    cache: KVCache | None = None
    region_attribute_logits: torch.Tensor | None = None  # the Fast R-CNN's attribute logits, detached, if asked

    @property
    def pooled(self) -> torch.Tensor:  # [B, hidden] tanh(W [CLS])
        return self.pooler(self.last_hidden_state[:, 0])

    @property
    def text_hidden(self) -> torch.Tensor:  # [B, T, hidden]: [CLS], words, [SEP]s
        return self.last_hidden_state[:, : self.text_length]

    @property
    def region_hidden(self) -> torch.Tensor:  # [B, 1+N, hidden]: whole image, then the regions
        return self.last_hidden_state[:, self.text_length: self.text_length + self.num_regions]


class VLBert(nn.Module):
    def __init__(self, cfg: VLBertConfig, with_fast_rcnn: bool = True):
        super().__init__()
        self.cfg = cfg
        self.embeddings = VLBertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg)
        if cfg.region_input not in ("pixels", "features"):
            raise ValueError(f"region_input: '{cfg.region_input}' is not 'pixels' or 'features'")
        if cfg.region_geometry not in ("boxes", "whole_image"):
            raise ValueError(f"region_geometry: '{cfg.region_geometry}' is not 'boxes' or 'whole_image'")
        if cfg.geometry_layers and cfg.visual_embedding != "vlbert":
            raise ValueError("geometry_layers carries VL-BERT's geometry embedding: visual_embedding must be 'vlbert'")
        if (cfg.pair_geometry_bias or cfg.pair_geometry_values) and cfg.visual_embedding != "vlbert":
            raise ValueError("pair_geometry_bias / pair_geometry_values read VL-BERT's sequence of boxes: "
                             "visual_embedding must be 'vlbert'")
        if cfg.pair_relation_partners not in ("referred", "next_mention"):
            raise ValueError(f"pair_relation_partners: '{cfg.pair_relation_partners}' is not 'referred' or "
                             "'next_mention'")
        if cfg.pair_relation_words is not None and cfg.visual_embedding != "vlbert":
            raise ValueError("pair_relation_words names the relations of VL-BERT's referred regions: visual_embedding "
                             "must be 'vlbert'")
        if cfg.aligned_geometry and (cfg.visual_embedding != "vlbert" or cfg.region_word_alignment is None):
            raise ValueError("aligned_geometry gives aligned words their regions' geometry: set region_word_alignment "
                             "(and visual_embedding 'vlbert')")
        if cfg.alignment_neighbours < 0 or (cfg.alignment_neighbours and cfg.region_word_alignment is None):
            raise ValueError(f"alignment_neighbours: {cfg.alignment_neighbours} shares the aligned words' regions with "
                             "their neighbours: a count >= 0, and > 0 needs region_word_alignment")
        if cfg.relation_alignment_window < 0 or (cfg.relation_alignment_window and (
                cfg.region_word_alignment is None or cfg.pair_relation_words is None)):
            raise ValueError(f"relation_alignment_window: {cfg.relation_alignment_window} aligns relation words to the "
                             "regions in that relation: a count >= 0, and > 0 needs region_word_alignment and "
                             "pair_relation_words (pretraining: relation_names)")
        if cfg.relation_between_window < 0:
            raise ValueError(f"relation_between_window: {cfg.relation_between_window} is a count of word-pieces, "
                             ">= 0 (0: relation_alignment_window's)")
        if cfg.relation_alignment_window and any(len(name) != 1 for name in cfg.pair_relation_words):
            raise ValueError("relation_alignment_window: each relation name must be one word-piece (the word that "
                             f"aligns); pair_relation_words is {cfg.pair_relation_words}")
        if cfg.alignment_neighbour_combine not in ("sum", "product"):
            raise ValueError(f"alignment_neighbour_combine: '{cfg.alignment_neighbour_combine}' is not 'sum' or "
                             "'product'")
        end_to_end = with_fast_rcnn and cfg.visual_embedding == "vlbert" and cfg.region_input == "pixels"
        self.fast_rcnn = FastRCNN(cfg.fast_rcnn) if end_to_end else None
        self.region_words = cfg.visual_embedding == "vlbert" and any(
            names is not None for names in (cfg.region_class_words, cfg.region_attribute_words, cfg.region_size_words))
        if self.fast_rcnn is not None and self.fast_rcnn.attribute_classifier is not None and \
                cfg.region_attribute_words is None:
            # carried, not trained: nothing reads it in pretraining, but it says what the trained features still
            # tell about attributes (detector drift)
            self.fast_rcnn.attribute_classifier.requires_grad_(False)
        if self.fast_rcnn is not None and self.fast_rcnn.size_classifier is not None and cfg.region_size_words is None:
            self.fast_rcnn.size_classifier.requires_grad_(False)  # the same: carried for drift, read by nothing
        if cfg.region_word_alignment is not None and not self.region_words:
            raise ValueError("region_word_alignment aligns words to region word embeddings: set region_class_words "
                             "/ region_attribute_words / region_size_words (pretraining: region_words) too")
        if self.region_words:
            if cfg.region_input != "pixels":
                raise ValueError("region_class_words / region_attribute_words / region_size_words need the end-to-end "
                                 "Fast R-CNN (region_input: pixels): its classifiers compute the region word "
                                 "distributions")
            if cfg.region_class_words is not None and len(cfg.region_class_words) != cfg.fast_rcnn.num_classes:
                raise ValueError(f"region_class_words names {len(cfg.region_class_words)} classes, "
                                 f"fast_rcnn.num_classes is {cfg.fast_rcnn.num_classes}")
            if cfg.region_attribute_words is not None and \
                    len(cfg.region_attribute_words) != cfg.fast_rcnn.num_attributes:
                raise ValueError(f"region_attribute_words names {len(cfg.region_attribute_words)} attributes, "
                                 f"fast_rcnn.num_attributes is {cfg.fast_rcnn.num_attributes}")
            if cfg.region_size_words is not None and len(cfg.region_size_words) != cfg.fast_rcnn.num_sizes:
                raise ValueError(f"region_size_words names {len(cfg.region_size_words)} sizes, "
                                 f"fast_rcnn.num_sizes is {cfg.fast_rcnn.num_sizes}")
        if cfg.visual_embedding == "vlbert":
            appearance = self.fast_rcnn.feature_size if self.fast_rcnn is not None else cfg.precomputed_feature_size
            self.embeddings.build_visual_feature_embedding(appearance)
        for name, child in self.named_children():
            if name != "fast_rcnn":  # the Fast R-CNN initialises itself (and loads its weights file)
                child.apply(self._init_weights)
        if cfg.visual_embedding == "vlbert":
            nn.init.constant_(self.embeddings.visual_ln_text.weight, cfg.visual_ln_init)
            nn.init.constant_(self.embeddings.visual_ln_object.weight, cfg.visual_ln_init if cfg.visual_ln_init_object
                              is None else cfg.visual_ln_init_object)
            for name in ZERO_STARTED:  # zero: start as without
                for owner in (self.embeddings, self.encoder):
                    path = getattr(owner, name, None)
                    for linear in ([] if path is None else path if isinstance(path, nn.ModuleList) else [path]):
                        nn.init.zeros_(linear.weight)
                        nn.init.zeros_(linear.bias)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.cfg.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, VLBertEmbeddings):
            nn.init.normal_(module.roi_mask_embedding, std=std)
            for name in ("object_token_embedding", "end_token_embedding"):
                if hasattr(module, name):
                    nn.init.normal_(getattr(module, name), std=std)
            if hasattr(module, "text_only_visual_embedding"):
                nn.init.normal_(module.text_only_visual_embedding, std=std)

    # -- the visual input ----------------------------------------------------------------------------

    def ablated_image(self, images: torch.Tensor) -> torch.Tensor:
        """What an image-ablated model (`image_ablated`) reads of `images`: the grey the masker trained it on
        (`masking.ablate_image`: the pixel mean, rounded to the images' integer levels), same shape and sizes."""
        # from the config, not the pixel_mean buffer, which a bf16 engine casts
        grey = grey_of(self.cfg.fast_rcnn.pixel_mean)
        return grey.to(device=images.device, dtype=images.dtype).expand_as(images).clone()

    def region_features(self, *, images=None, image_sizes=None, boxes=None, box_mask=None, masked_regions=None,
                        region_features=None, image_hw=None, class_logits: bool = False, region_masks=None,
                        roi_index=None):
        """Appearance [B, 1+N, F], normalised boxes [B, 1+N, 4] and object logits, from pixels (end to
        end) or from precomputed [B, N, F] features. Element 0 is the whole image: in precomputed mode
        its appearance is the mean of the unmasked regions' features, and masked regions are zeroed.
        images / region_features may hold B/K rows for B rows of boxes: rows k*(B/K) + i share image i.
        region_masks [B, N, S, S]: instance masks weighting each region's res5 map (`FastRCNN.forward`).
        roi_index: `real_rois` of the box mask of the images' rows (the first B/K): the Fast R-CNN's res5 then runs on
        the real boxes alone and the padded ones' appearance is 0 (`FastRCNN.forward`); end to end only.
        An image-ablated model (`image_ablated`) reads grey images and zero features here, whatever it is given."""
        if masked_regions is None:
            masked_regions = torch.zeros_like(box_mask)
        if self.cfg.image_ablated:
            if images is not None:
                images = self.ablated_image(images)
            if region_features is not None:
                region_features = torch.zeros_like(region_features)
        if roi_index is not None and region_features is not None:
            raise ValueError("roi_index names the Fast R-CNN's RoIs to compute: precomputed features have none")
        rows = (images if region_features is None else region_features).shape[0]
        views = box_mask.shape[0] // rows
        if views * rows != box_mask.shape[0]:
            raise ValueError(f"{box_mask.shape[0]} rows of boxes for {rows} images: each image serves the same "
                             "number of rows")
        if views > 1:
            # several texts per image (pretraining's word views; a VCR question's answers): the detector runs once
            # per image, and rows k*rows + i take image i's features. The rows of one image share its boxes and
            # zeroed regions: the first `rows` rows define them.
            appearance, boxes_norm, logits = self.region_features(
                images=images, image_sizes=image_sizes, boxes=boxes[:rows], box_mask=box_mask[:rows],
                masked_regions=masked_regions[:rows], region_features=region_features, image_hw=image_hw,
                class_logits=class_logits, region_masks=None if region_masks is None else region_masks[:rows],
                roi_index=roi_index)
            return (appearance.repeat(views, 1, 1), boxes_norm.repeat(views, 1, 1),
                    None if logits is None else logits.repeat(views, 1, 1))
        inclusive = self.cfg.fast_rcnn.box_convention == "inclusive"
        if self.cfg.region_geometry == "whole_image":
            whole_box = with_whole_image(boxes[:, :0], image_sizes if region_features is None else image_hw,
                                         inclusive=inclusive)
            boxes = whole_box.expand_as(boxes)
        if region_features is None:
            if self.fast_rcnn is None:
                raise ValueError("this VLBert has no Fast R-CNN: pass region_features (precomputed mode)")
            out = self.fast_rcnn(images, image_sizes, boxes, box_mask, masked_regions, class_logits=class_logits,
                                 region_masks=region_masks, roi_index=roi_index)
            hw = image_sizes
            appearance, all_boxes, logits = out["appearance"], out["boxes"], out.get("class_logits")
        else:
            if image_hw is None:
                raise ValueError("precomputed region features need image_hw [B, 2] to normalise the boxes")
            if region_masks is not None:
                raise ValueError("region_masks weight the Fast R-CNN's res5 maps: precomputed features have none")
            if region_features.shape[-1] != self.cfg.precomputed_feature_size:
                raise ValueError(f"region features are {region_features.shape[-1]}-d, the model's "
                                 f"precomputed_feature_size is {self.cfg.precomputed_feature_size}")
            hw = image_hw
            keep = (box_mask & ~masked_regions).unsqueeze(-1)
            feats = region_features.masked_fill(~keep, 0.0)
            whole = feats.sum(1, keepdim=True) / keep.sum(1, keepdim=True).clamp(min=1)
            appearance = torch.cat([whole, feats], 1)
            # the whole image's box in the boxes' own convention, as the Fast R-CNN path adds it
            all_boxes = with_whole_image(boxes, hw, inclusive=inclusive)
            logits = None
        return appearance, normalise(all_boxes, hw), logits

    # -- forward -------------------------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, text_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                *, images: torch.Tensor | None = None, image_sizes: torch.Tensor | None = None,
                boxes: torch.Tensor | None = None, box_mask: torch.Tensor | None = None,
                masked_regions: torch.Tensor | None = None, region_features: torch.Tensor | None = None,
                image_hw: torch.Tensor | None = None, word_region_index: torch.Tensor | None = None,
                visual_input: tuple[torch.Tensor, torch.Tensor] | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                output_class_logits: bool = False, real_positions: int | None = None,
                aligned_words: torch.Tensor | None = None, output_attribute_logits: bool = False,
                neighbour_words: torch.Tensor | None = None, roi_index: torch.Tensor | None = None) -> VLBertOutput:
        """input_ids/text_mask/token_type_ids [B, T]: the text part, `[CLS] A [SEP] (B [SEP])` (see
        `assemble_text`). With an image: boxes [B, N, 4] in pixels, box_mask [B, N], masked_regions
        [B, N], and either images uint8 [B, 3, H, W] + image_sizes [B, 2] (h, w) for the end-to-end
        Fast R-CNN, or region_features [B, N, F] + image_hw [B, 2]; images (region_features) may hold B/K
        rows, each shared by the K text rows k*(B/K) + i (see `region_features`). word_region_index [B, T]: the
        region whose feature a word takes as its visual term (-1 = the whole image). visual_input:
        (appearance [B, 1+N, F], normalised boxes [B, 1+N, 4]) as `region_features` returns them, to
        feed edited visual inputs (the cross-modal ablation diagnostic); boxes/box_mask still given.
        real_positions: `real_positions(text_mask, box_mask)`, counted where the batch is on the host: the
        encoder then skips padded positions (their hidden states are zero). output_class_logits: the
        Fast R-CNN's object logits as `region_class_logits` (end to end only); output_attribute_logits: its
        attribute logits of the regions' appearance, detached (targets), as `region_attribute_logits`.
        aligned_words [B] bool: the rows whose words take the region words they align to
        (`region_word_alignment`; None = every row); the others' words take none, their region tokens still carry
        their names (pretraining's `masking.alignment_drop`). neighbour_words [B] bool: the rows whose words take
        their neighbours' aligned regions (`alignment_neighbours`; None = every row; `masking.neighbour_drop`).
        roi_index: `model.fast_rcnn.real_rois` of the images' box mask, built where the batch is: the Fast R-CNN
        computes the real boxes alone (`region_features`; pretraining's masker adds it)."""
        e = self.embed(input_ids, text_mask, token_type_ids, images=images, image_sizes=image_sizes, boxes=boxes,
                       box_mask=box_mask, masked_regions=masked_regions, region_features=region_features,
                       image_hw=image_hw, word_region_index=word_region_index, visual_input=visual_input,
                       output_class_logits=output_class_logits, aligned_words=aligned_words,
                       output_attribute_logits=output_attribute_logits, neighbour_words=neighbour_words,
                       roi_index=roi_index)
        encoded = self.encoder(self.embeddings.finish(e.x), e.mask, output_hidden_states=output_hidden_states,
                               output_attentions=output_attentions, real_positions=real_positions,
                               layer_input=e.layer_input, layer_bias=e.layer_bias, pair_angles=e.pair_angles)
        return VLBertOutput(encoded.last_hidden_state, e.mask, input_ids.shape[1], e.n_regions, self.pooler,
                            e.region_logits, encoded.hidden_states, encoded.attentions,
                            region_attribute_logits=e.region_attribute_logits)

    def embed(self, input_ids: torch.Tensor, text_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None,
              *, images: torch.Tensor | None = None, image_sizes: torch.Tensor | None = None,
              boxes: torch.Tensor | None = None, box_mask: torch.Tensor | None = None,
              masked_regions: torch.Tensor | None = None, region_features: torch.Tensor | None = None,
              image_hw: torch.Tensor | None = None, word_region_index: torch.Tensor | None = None,
              visual_input: tuple[torch.Tensor, torch.Tensor] | None = None, output_class_logits: bool = False,
              aligned_words: torch.Tensor | None = None, output_attribute_logits: bool = False,
              neighbour_words: torch.Tensor | None = None, roi_index: torch.Tensor | None = None) -> VLBertEmbedded:
        """`forward`'s sequence before the encoder (its arguments, same meaning), with what a word appended
        after it would take (a decoder's words: `VLBertGen`)."""
        cfg, emb = self.cfg, self.embeddings
        bsz, t = input_ids.shape
        dev = input_ids.device
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(t, device=dev).expand(bsz, t)
        has_image = boxes is not None
        ids = input_ids
        if has_image:  # [IMG] per region and [END] in the same lookup: one dense gradient of the vocabulary
            n_visual = boxes.shape[1] + 1
            ids = torch.cat([input_ids, input_ids.new_full((bsz, n_visual), cfg.img_token_id),
                             input_ids.new_full((bsz, 1), cfg.end_token_id)], 1)
        names = None
        if has_image and self.region_words:  # the name tables ride on the same lookup: one dense gradient still
            words, names = emb.words_and_names(ids)
        else:
            words = emb.word_embeddings(ids)
        text = words[:, :t] + emb.position_embeddings(positions) + \
            emb.token_type_embeddings(token_type_ids)  # [B, T, hidden]
        region_logits = attribute_logits = layer_input = layer_bias = pair_angles = None
        if cfg.visual_embedding == "linear":
            raise ValueError("visual_embedding='linear' (BERT-gen) builds its own sequence: use embed_regions_linear")
        learned = cfg.visual_tokens == "learned"
        segment_c = emb.token_type_embeddings.weight[SEGMENT_C]
        text_len = text_mask.sum(1, keepdim=True)  # [B, 1]: regions share the position after the text
        # the official [END]: a learned embedding with no visual term, ending text-only samples too
        learned_end = emb.end_token_embedding + emb.position_embeddings(text_len + 1) + segment_c if learned else None
        if not has_image:
            term = emb.text_visual_term(emb.text_only_visual_embedding)  # [hidden], shared by every word
            # added as [hidden]: through the [B, 1, hidden] view autograd sums its gradient in another order, and
            # that rounding alone moved the quick start's figures (visible MRC 0.636 -> 0.548; docs/ABLATION.md)
            text = text + term
            word_visual, terms, candidates = term.expand(bsz, 1, -1), None, None  # one shape, as the image's
            x, mask, n_regions = text, text_mask, 0
            if learned:
                x = torch.cat([text, learned_end], 1)
                mask = torch.cat([text_mask, torch.ones_like(text_mask[:, :1])], 1)
        else:
            if masked_regions is None:
                masked_regions = torch.zeros_like(box_mask)
            if visual_input is not None:
                appearance, boxes_norm = visual_input
            else:
                appearance, boxes_norm, region_logits = self.region_features(
                    images=images, image_sizes=image_sizes, boxes=boxes, box_mask=box_mask,
                    masked_regions=masked_regions, region_features=region_features, image_hw=image_hw,
                    class_logits=output_class_logits, roi_index=roi_index)
            # an edited visual_input (the diagnostics' fp32 averages, stored features) meets weights that DeepSpeed's
            # bf16/fp16 mode cast: once here, for the visual embedding and the region-word classifiers alike
            appearance = appearance.to(emb.visual_feature_embedding[1].weight.dtype)
            if output_attribute_logits:
                if self.fast_rcnn is None or self.fast_rcnn.attribute_classifier is None:
                    raise ValueError("attribute logits need the Fast R-CNN with its attribute head")
                with torch.no_grad():
                    attribute_logits = self.fast_rcnn.attribute_classifier(appearance)
            if cfg.region_geometry == "whole_image":  # an edited visual_input keeps no layout either
                boxes_norm = boxes_norm[:, :1].expand_as(boxes_norm)
            # the whole-image element exists with no box at all (an image where nothing was detected): built
            # from the batch size, not from box_mask[:, :1], which is empty then
            whole = box_mask.new_ones(bsz, 1)
            real = torch.cat([whole, box_mask], 1)  # [B, 1+N]: whole image + boxes
            visual = emb.visual_features(appearance, boxes_norm, real)  # [B, 1+N, visual_size]
            # the paths that carry the box past the visual feature embedding: its sine/cosine embedding once for both
            geometry = emb.geometry(boxes_norm).to(words.dtype) if cfg.geometry_layers or cfg.aligned_geometry \
                else None
            whole_image_term = emb.text_visual_term(visual[:, :1])  # [B, 1, hidden], once per sample
            # each word's element of the visual sequence (0, the whole image, for a word that refers to no region)
            word_element = None if word_region_index is None else (word_region_index + 1).clamp(min=0).unsqueeze(-1)
            if word_element is None:
                text = text + whole_image_term  # every word takes it: broadcast, not T projections
            else:
                text = text + emb.text_visual_term(visual.gather(1, word_element.expand(bsz, t, visual.shape[-1])))
            if cfg.pair_relation_words is not None and word_element is not None:
                text = text + emb.relation_name_terms(boxes_norm[:, 1:], box_mask, word_region_index,
                                                      token_type_ids, names).to(text.dtype)
            n_regions = visual.shape[1]
            if n_regions != n_visual:
                raise ValueError(f"{n_regions - 1} region features for {n_visual - 1} boxes")
            is_masked = torch.cat([~whole, masked_regions & box_mask], 1)
            token = emb.object_token_embedding.expand_as(words[:, t:-1]) if learned else \
                words[:, t:-1]  # [B, 1+N, hidden]: [IMG]
            word_visual, terms, candidates = whole_image_term, None, None
            if self.region_words:
                if self.fast_rcnn is None:
                    raise ValueError("region word embeddings need the Fast R-CNN's classifiers: load the model "
                                     "with its Fast R-CNN")
                # from the appearance the sequence is built of (so an edited visual_input edits these too);
                # the whole image is no object and a masked region shows nothing: both keep [IMG] alone
                detector = self.fast_rcnn
                terms = emb.region_word_terms(
                    detector.object_classifier(appearance) if cfg.region_class_words is not None else None,
                    detector.attribute_classifier(appearance) if cfg.region_attribute_words is not None else None,
                    detector.size_logits(boxes_norm) if cfg.region_size_words is not None else None, names)
                is_object = torch.cat([~whole, box_mask], 1)
                token = token + sum(terms) * is_object.unsqueeze(-1).to(words.dtype)
                if cfg.region_word_alignment is not None:  # a masked region names nothing: no word aligns to it
                    candidates = is_object & ~is_masked
                    if aligned_words is not None:  # a row without candidates gives every word "no region"
                        candidates = candidates & aligned_words.unsqueeze(1)
                    where = emb.aligned_geometry_projection(geometry) if cfg.aligned_geometry else None
                    near = text_mask if neighbour_words is None else text_mask & neighbour_words.unsqueeze(1)
                    relations = None
                    words_only = text_mask & (input_ids != cfg.cls_token_id) & (input_ids != cfg.sep_token_id)
                    if cfg.relation_alignment_window:  # each word's relation name, by its (one-piece) id
                        named = input_ids.unsqueeze(-1) == emb.region_relation_word_ids[:, 0]  # [B, T, 4]
                        relation = torch.where(named.any(-1), named.long().argmax(-1), -1)
                        relations = (relation, boxes_norm, words_only)
                    # the weights come back from aligned_region_words, not computed ahead of it for the regions'
                    # side: that is another order of the same sums, which rounds the gradients differently and
                    # alone moves the quick start's figures (docs/ABLATION.md, session 73)
                    sentence = words[:, :t]
                    # what the alignment reads each word as: a multi-piece name's pieces as the whole name
                    reading = emb.whole_name_words(sentence, emb.name_pieces(input_ids)) if cfg.align_whole_names \
                        else sentence
                    aligned, weights = emb.aligned_region_words(reading, terms, candidates, where, near, relations,
                                                                names, with_weights=True)
                    text = text + aligned
                    if cfg.relation_between and relations is not None:
                        text = text + emb.relation_between_terms(reading, terms, candidates, words_only, boxes_norm,
                                                                 relations[0], names).to(text.dtype)
                    if cfg.region_aligned_words:
                        token = token + emb.region_aligned_words(weights, sentence, words_only)
                else:
                    terms = None
            token = torch.where(is_masked.unsqueeze(-1), emb.roi_mask_embedding, token)
            region_pos = emb.position_embeddings(text_len).expand(bsz, n_regions, -1)
            regions = token + emb.object_visual_term(visual) + region_pos + segment_c
            end = learned_end if learned else \
                words[:, -1:] + emb.position_embeddings(text_len + 1) + segment_c + whole_image_term  # [B, 1, hidden]
            x = torch.cat([text, regions, end], 1)
            ones = torch.ones_like(text_mask[:, :1])
            mask = torch.cat([text_mask, ones, box_mask, ones], 1)
            if cfg.geometry_layers:
                where = emb.geometry_layer_projection(geometry)  # [B, 1+N, hidden]
                words_where = torch.zeros_like(text)
                if word_element is not None:  # a word that refers to a region carries its box as its region does
                    refers = (word_region_index >= 0).unsqueeze(-1).to(where.dtype)
                    words_where = where.gather(1, word_element.expand(bsz, t, where.shape[-1])) * refers
                layer_input = torch.cat([words_where, where, torch.zeros_like(end)], 1)
            if cfg.pair_geometry_bias or cfg.pair_geometry_values:
                # each element's box: a referring word its region's, every other word and [END] the whole image's
                text_boxes = boxes_norm[:, :1].expand(bsz, t, 4) if word_element is None else \
                    boxes_norm.gather(1, word_element.expand(bsz, t, 4))
                element_boxes = torch.cat([text_boxes, boxes_norm, boxes_norm[:, :1]], 1)  # [B, L, 4]
            if cfg.pair_geometry_values:
                pair_angles = element_angles(element_boxes, cfg.pair_geometry_frequencies)
            if cfg.pair_geometry_bias:
                pair = emb.pair_geometry_projection(
                    pair_geometry(element_boxes, cfg.pair_geometry_frequencies).to(words.dtype))  # [B, L, L, n*H]
                size = x.shape[1]
                layer_bias = pair.view(bsz, size, size, cfg.num_hidden_layers, cfg.num_attention_heads) \
                    .permute(3, 0, 4, 1, 2).contiguous()
        return VLBertEmbedded(x, mask, n_regions, region_logits, text_len, word_visual, terms, candidates,
                              attribute_logits, layer_input, layer_bias, pair_angles)

    def encode(self, embeddings: torch.Tensor, mask: torch.Tensor, *, past: KVCache | None = None,
               use_cache: bool = False, output_hidden_states: bool = False, output_attentions: bool = False):
        """The encoder on summed embeddings (before the embedding LayerNorm) of new positions.

        For decoders: with `past` (the cache of earlier positions) and a mask [B, L_new, L_past + L_new],
        new positions attend to cached keys/values without re-encoding them."""
        return self.encoder(self.embeddings.finish(embeddings), mask, past=past, use_cache=use_cache,
                            output_hidden_states=output_hidden_states, output_attentions=output_attentions)

    def embed_regions_linear(self, region_features: torch.Tensor, boxes_normalised: torch.Tensor) -> torch.Tensor:
        """BERT-gen's image tokens: Linear(features ++ 4 normalised box coordinates) -> [B, N, hidden]."""
        boxes = boxes_normalised.to(region_features.dtype)
        return self.embeddings.visual_linear(torch.cat([region_features, boxes], -1))


class VLBertForPretraining(nn.Module):
    """VL-BERT with the MLM head (decoder tied to the word embeddings) and the masked RoI
    classification head. Heads take only the positions they score."""

    def __init__(self, cfg: VLBertConfig, with_fast_rcnn: bool = True):
        super().__init__()
        self.cfg = cfg
        self.vl_bert = VLBert(cfg, with_fast_rcnn)
        self.mlm_head = MaskedLanguageModelingHead(cfg, self.vl_bert.embeddings.word_embeddings)
        self.masked_roi_classification = MaskedRoIClassificationHead(cfg)
        for module in (self.mlm_head, self.masked_roi_classification):
            module.apply(self.vl_bert._init_weights)
        self.mlm_head.decoder.weight = self.vl_bert.embeddings.word_embeddings.weight  # re-tie after init

    def forward(self, *args, **kwargs) -> VLBertOutput:
        return self.vl_bert(*args, **kwargs)
