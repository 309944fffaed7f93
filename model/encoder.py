"""BERT's Transformer layers (post-LayerNorm, GELU) on `F.scaled_dot_product_attention`.

Masks: a padding mask [B, L] (True = a real element) or a full mask [B, Lq, Lk] (True = may attend),
which BERT-gen's sequence-to-sequence attention needs. Keys and values can be cached per layer, so a
decoder extends a sequence by a few positions without re-encoding it. Parameter names follow
transformers' BertModel, so its checkpoints load by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config import VLBertConfig
from .dropout import Dropout, dropout, dropout_add


@dataclass(frozen=True)
class KVBuffer:
    """One layer's keys and values in preallocated storage [B, heads, capacity, head_dim], of which the
    first `length` positions are valid. A decoder appends in place, where a plain (keys, values) past is
    concatenated: copying the whole cache at every step, in every layer, was most of a cached decoding
    step. Buffers derived from one another share storage, so only the newest may be extended."""

    keys: torch.Tensor
    values: torch.Tensor
    length: int

    @classmethod
    def holding(cls, keys: torch.Tensor, values: torch.Tensor, spare: int) -> KVBuffer:
        """A buffer with `keys`/`values` [B, heads, L, head_dim] and room for `spare` more positions."""
        b, h, n, d = keys.shape
        buf = cls(keys.new_empty(b, h, n + spare, d), values.new_empty(b, h, n + spare, d), 0)
        return buf.extend(keys, values)

    def extend(self, keys: torch.Tensor, values: torch.Tensor) -> KVBuffer:
        end = self.length + keys.shape[2]
        k_buf, v_buf = self.keys, self.values
        if end > k_buf.shape[2]:  # grow geometrically, so appending stays amortised O(new positions)
            spare = max(end, 2 * k_buf.shape[2]) - self.length
            return KVBuffer.holding(*self.kv, spare).extend(keys, values)
        k_buf[:, :, self.length: end] = keys
        v_buf[:, :, self.length: end] = values
        return KVBuffer(k_buf, v_buf, end)

    @property
    def kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]

    def truncate(self, length: int) -> KVBuffer:
        return KVBuffer(self.keys, self.values, length)

    def index_select(self, index: torch.Tensor) -> KVBuffer:
        """Rows `index` of the batch (beam reordering), in new storage."""
        return KVBuffer(self.keys.index_select(0, index), self.values.index_select(0, index), self.length)


# per layer: (keys, values) [B, heads, L_past, head_dim], or a KVBuffer to append to in place
KVCache = list[tuple[torch.Tensor, torch.Tensor] | KVBuffer]


@dataclass(frozen=True)
class Packing:
    """Where the real positions of a padded [B, L] batch are, for running the layers on those alone:
    every linear layer, LayerNorm, GELU and dropout then skips the padding (a third of the positions
    of unbucketed pretraining batches). Only attention needs the [B, heads, L, head_dim] layout: the
    projections are scattered straight into it (where the padded path copies them into it anyway) and
    its output is gathered back."""

    batch: torch.Tensor  # [n] sample of each real position
    position: torch.Tensor  # [n] its place in the sequence
    index: torch.Tensor  # [n] batch * L + position
    shape: tuple[int, int]  # (B, L)

    @classmethod
    def of(cls, mask: torch.Tensor, real: int) -> Packing:
        """mask [B, L] with `real` True elements. The count comes from the host (`real_positions`), so
        finding them needs no device-to-host sync (`nonzero_static`); it must be exact."""
        b, l = mask.shape
        index = torch.nonzero_static(mask.reshape(-1), size=real).squeeze(1)
        return cls(torch.div(index, l, rounding_mode="floor"), index.remainder(l), index, (b, l))

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[B, L, ...] -> [n, ...]."""
        return x.flatten(0, 1).index_select(0, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """[n, ...] -> [B, L, ...], zeros at padded positions."""
        b, l = self.shape
        return x.new_zeros(b * l, *x.shape[1:]).index_copy(0, self.index, x).view(b, l, *x.shape[1:])

    def to_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """[n, heads * head_dim] -> contiguous [B, heads, L, head_dim], zeros at padded positions."""
        b, l = self.shape
        out = x.new_zeros(b, heads, l, x.shape[1] // heads)
        out.permute(0, 2, 1, 3)[self.batch, self.position] = x.view(x.shape[0], heads, -1)
        return out

    def from_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, heads, L, head_dim] -> [n, heads * head_dim]."""
        return x.permute(0, 2, 1, 3)[self.batch, self.position].flatten(1)


def attention_bias(mask: torch.Tensor | None, q_len: int) -> torch.Tensor | None:
    """Boolean [B, L] or [B, Lq, Lk] -> [B, 1, Lq|1, Lk] for SDPA (True = attend)."""
    if mask is None:
        return None
    if mask.dim() == 2:
        return mask[:, None, None, :]
    if mask.dim() == 3:
        return mask[:, None, :, :]
    raise ValueError(f"attention mask must be [B, L] or [B, Lq, Lk], got {list(mask.shape)}")


def relative_geometry(summed: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """The attention-weighted sums of the keys' sine/cosine features [B, heads, L, C * 2F] (per coordinate F sines,
    then F cosines of the key's angles) and each query's own angles [B, L, C, F] -> the same sums of the pair
    features, sin and cos of (key angle - query angle) in that layout: sin(a - b) = sin a cos b - cos a sin b,
    cos(a - b) = cos a cos b + sin a sin b, with the query's b outside the sum over keys."""
    b, h, n, _ = summed.shape
    c, f = angles.shape[-2:]
    key_sin, key_cos = summed.view(b, h, n, c, 2, f).unbind(-2)
    sin_q, cos_q = angles.sin().unsqueeze(1).to(summed.dtype), angles.cos().unsqueeze(1).to(summed.dtype)
    return torch.cat([key_sin * cos_q - key_cos * sin_q, key_cos * cos_q + key_sin * sin_q], -1).flatten(-2)


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: VLBertConfig):
        super().__init__()
        self.heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout_p = cfg.attention_probs_dropout_prob

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, l, _ = x.shape
        return x.view(b, l, self.heads, self.head_dim).transpose(1, 2)  # [B, heads, L, head_dim]

    def forward(self, x, bias, past: tuple[torch.Tensor, torch.Tensor] | KVBuffer | None = None,
                want_probs: bool = False, geometry: tuple[torch.Tensor, nn.Module] | None = None):
        """geometry: (each element's angles [B, L, C, F], the layer's Linear(heads * C * 2F -> hidden)): the
        relative geometry of what each element attends to, added to its output (`pair_geometry_values`)."""
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        kv = (k, v)
        if geometry is not None and past is not None:
            raise ValueError("pair geometry values need the whole sequence: no cache")
        if isinstance(past, KVBuffer):
            kv = past.extend(k, v)
            k, v = kv.kv
        elif past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
            kv = (k, v)
        out, probs = self._attend(q, k, self._with_geometry(v, geometry), bias, want_probs)
        out, relative = self._split_geometry(out, geometry)
        b, _, l, _ = out.shape
        out = out.transpose(1, 2).reshape(b, l, -1)
        if relative is not None:
            out = out + geometry[1](relative.transpose(1, 2).flatten(2))
        return out, kv, probs

    def packed(self, x: torch.Tensor, bias: torch.Tensor, rows: Packing,
               geometry: tuple[torch.Tensor, nn.Module] | None = None) -> torch.Tensor:
        """`forward` on the real positions only: x [n, hidden] -> [n, hidden]."""
        q, k, v = (rows.to_heads(proj(x), self.heads) for proj in (self.query, self.key, self.value))
        out, _ = self._attend(q, k, self._with_geometry(v, geometry), bias)
        out, relative = self._split_geometry(out, geometry)
        out = rows.from_heads(out)
        return out if relative is None else out + geometry[1](rows.from_heads(relative))

    def _with_geometry(self, v: torch.Tensor, geometry) -> torch.Tensor:
        """The keys' own sines and cosines appended to every head's values: one SDPA call sums them with the
        attention's weights, where the pair features themselves would be [B, L, L, C * 2F]."""
        if geometry is None:
            return v
        angles = geometry[0]
        own = torch.cat([angles.sin(), angles.cos()], -1).flatten(-2).to(v.dtype)  # [B, L, C * 2F]
        return torch.cat([v, own.unsqueeze(1).expand(-1, self.heads, -1, -1)], -1)

    def _split_geometry(self, out: torch.Tensor, geometry):
        if geometry is None:
            return out, None
        return out[..., :self.head_dim], relative_geometry(out[..., self.head_dim:], geometry[0])

    def _attend(self, q, k, v, bias, want_probs: bool = False):
        """[B, heads, Lq|Lk, head_dim] -> (attention output [B, heads, Lq, head_dim], probabilities or None)."""
        p = self.dropout_p if self.training else 0.0
        # SDPA's CPU kernel has no dropout: with it, SDPA runs its math path, which samples the attention
        # dropout with bernoulli_ and scales both q and k; this path does the same math with the cheap
        # sampling. It is also the analysis path, as SDPA does not return the attention map.
        if want_probs or (p > 0.0 and q.device.type == "cpu"):
            scores = (q * self.head_dim ** -0.5) @ k.transpose(-1, -2)
            if bias is not None:
                scores = scores + bias if bias.is_floating_point() else \
                    scores.masked_fill(~bias, torch.finfo(scores.dtype).min)
            probs = scores.softmax(-1)
            return dropout(probs, p) @ v, (probs if want_probs else None)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p), None


class BertOutput(nn.Module):
    """Dense -> dropout -> + residual -> LayerNorm: after attention (BERT's `attention.output`, from
    hidden_size) and after the feed-forward (`output`, from intermediate_size); HF parameter names."""

    def __init__(self, cfg: VLBertConfig, in_size: int):
        super().__init__()
        self.dense = nn.Linear(in_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout_prob)

    def forward(self, h, residual):
        return self.LayerNorm(dropout_add(self.dense(h), residual, self.dropout.p, self.training))


class BertAttention(nn.Module):
    def __init__(self, cfg: VLBertConfig):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertOutput(cfg, cfg.hidden_size)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: VLBertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x):
        return F.gelu(self.dense(x))  # exact (erf) GELU, as BERT


class BertLayer(nn.Module):
    """Eq. 1-4 of the VL-BERT paper: attention, residual + LayerNorm, feed-forward, residual + LayerNorm."""

    def __init__(self, cfg: VLBertConfig):
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutput(cfg, cfg.intermediate_size)

    def forward(self, x, bias, past=None, want_probs: bool = False, geometry=None):
        attended, kv, probs = self.attention.self(x, bias, past, want_probs, geometry)
        h = self.attention.output(attended, x)
        return self.output(self.intermediate(h), h), kv, probs

    def packed(self, x: torch.Tensor, bias: torch.Tensor, rows: Packing, geometry=None) -> torch.Tensor:
        """The layer on the real positions only: x [n, hidden] -> [n, hidden]."""
        h = self.attention.output(self.attention.self.packed(x, bias, rows, geometry), x)
        return self.output(self.intermediate(h), h)


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # [B, L, hidden]
    hidden_states: list[torch.Tensor] | None = None  # embeddings + every layer, on request
    attentions: list[torch.Tensor] | None = None  # [B, heads, Lq, Lk] per layer, on request
    cache: KVCache | None = None  # keys/values of every layer (past + these positions), on request


class BertEncoder(nn.Module):
    def __init__(self, cfg: VLBertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))
        if cfg.pair_geometry_values:  # per layer: every head's relative geometry -> hidden (zero at the start)
            features = cfg.num_attention_heads * 8 * cfg.pair_geometry_frequencies
            self.pair_geometry_value_projection = nn.ModuleList(
                nn.Linear(features, cfg.hidden_size) for _ in range(cfg.num_hidden_layers))
        self.gradient_checkpointing = cfg.gradient_checkpointing

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, past: KVCache | None = None,
                use_cache: bool = False, output_hidden_states: bool = False,
                output_attentions: bool = False, real_positions: int | None = None,
                layer_input: torch.Tensor | None = None, layer_bias: torch.Tensor | None = None,
                pair_angles: torch.Tensor | None = None) -> EncoderOutput:
        """x [B, L, hidden]; mask [B, L_total] or [B, L, L_total] with L_total = L_past + L.

        layer_input [B, L, hidden]: added to the input of every layer after the first (the model's
        `geometry_layers`: the regions' positions; zero elsewhere).

        layer_bias [layers, B, heads, L, L]: added to each layer's attention logits, where the mask lets it attend
        (the model's `pair_geometry_bias`); needs a [B, L] mask and no cache.

        pair_angles [B, L, C, F]: each element's box angles (`model.vl_bert.element_angles`), for the layers'
        relative geometry values (`pair_geometry_values`; no cache).

        real_positions: the number of True elements of a [B, L] padding mask, counted on the host. With
        it, the layers run on the real positions only (`Packing`); the output is zero at padded ones.
        Ignored with a cache, per-layer outputs or a [B, Lq, Lk] mask."""
        bias = attention_bias(mask, x.shape[1])
        biases = [bias] * len(self.layer)
        if layer_bias is not None:
            if past is not None or mask is None or mask.dim() != 2:
                raise ValueError("layer_bias needs a [B, L] mask and no cache")
            # one additive mask per layer, SDPA's float attn_mask: the padding's -inf-like floor, the bias elsewhere
            floor = torch.finfo(layer_bias.dtype).min
            biases = [b.masked_fill(~bias, floor) for b in layer_bias]
        geometry = [None] * len(self.layer)
        if pair_angles is not None:
            geometry = [(pair_angles, proj) for proj in self.pair_geometry_value_projection]
        if real_positions is not None and mask is not None and mask.dim() == 2 and past is None \
                and not (use_cache or output_hidden_states or output_attentions):
            return EncoderOutput(self._packed(x, biases, Packing.of(mask, real_positions), layer_input, geometry))
        hidden = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        cache = [] if use_cache else None
        for i, layer in enumerate(self.layer):
            layer_past = past[i] if past is not None else None
            if layer_input is not None and i > 0:
                x = x + layer_input
            if self.gradient_checkpointing and self.training and not use_cache and not output_attentions:
                x, kv, probs = checkpoint(layer, x, biases[i], layer_past, False, geometry[i], use_reentrant=False)
            else:
                x, kv, probs = layer(x, biases[i], layer_past, output_attentions, geometry[i])
            if hidden is not None:
                hidden.append(x)
            if attentions is not None:
                attentions.append(probs)
            if cache is not None:
                cache.append(kv)
        return EncoderOutput(x, hidden, attentions, cache)

    def _packed(self, x: torch.Tensor, biases: list[torch.Tensor], rows: Packing,
                layer_input: torch.Tensor | None = None, geometry: list | None = None) -> torch.Tensor:
        h = rows.pack(x)
        geometry = geometry or [None] * len(self.layer)
        added = rows.pack(layer_input) if layer_input is not None else None
        for i, layer in enumerate(self.layer):
            if added is not None and i > 0:
                h = h + added
            if self.gradient_checkpointing and self.training:
                h = checkpoint(layer.packed, h, biases[i], rows, geometry[i], use_reentrant=False)
            else:
                h = layer.packed(h, biases[i], rows, geometry[i])
        return rows.unpack(h)
