"""Decoding for BERT-gen: greedy, beam search and sampling, batched, stopping at the end token.

Incremental by default: X is encoded once and each step appends one token through cached keys/values
(beams reorder the cache). `cached=False` runs the paper's procedure instead, re-encoding
`X y_<t [MASK]` from scratch every step; both compute the same distributions, so they produce the
same sequences and scores (tested) and differ only in cost (bench/decoding.py).

Diverse beam search (Vijayakumar et al., AAAI 2018: `beam_groups` > 1): the beams are split into groups that
advance one after another at each step, each group's candidates penalised by `diversity_penalty` times the number
of earlier groups' beams that chose the same token at that step (Hamming diversity). As in the paper the penalty
only ranks candidates: a beam's score stays its model log-probability, so no penalty from an earlier step carries
into later ones (transformers' removed group beam search added it to the running score). Finished beams extend by
padding, which no group is penalised for. `num_return` sequences per input: each group's best (diverse beam
search) or the top beams (plain beam search), best first.

Scores are the model's log P(Y | X) (natural log) of the returned tokens; constraints (minimum
length, n-gram blocking, top-k/top-p) only remove candidates. They are transformers' logits processors
(`LogitsProcessorList`): its temperature, top-k and top-p warpers, and its min-length and n-gram rules
re-implemented as cheap tensor ops, each tested equal to the library's processor. So every option means what it
means in `model.generate` of the transformers library.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from model.bert_gen import BertGen, GenInput, select_input


@dataclass
class DecodeConfig:
    method: str = "beam"  # greedy | beam | sample
    max_length: int = 20  # target tokens, the end token included
    min_length: int = 1  # the end token is blocked before this many tokens
    beam_size: int = 3
    beam_groups: int = 1  # > 1: diverse beam search, beam_size / beam_groups beams per group
    diversity_penalty: float = 0.0  # per earlier group's beam that chose the same token at the same step
    num_return: int = 1  # sequences per input (beam: <= beam_size, or <= beam_groups with groups)
    length_penalty: float = 1.0  # beams ranked by sum log p / length ** length_penalty
    no_repeat_ngram_size: int = 0  # 0 = off
    temperature: float = 1.0  # sampling (> 0)
    top_k: int = 0  # sampling: keep the k most likely (0 = all)
    top_p: float = 1.0  # sampling: nucleus mass
    cached: bool = True  # False: re-encode the whole sequence every step (the paper's procedure)
    seed: int = 0  # sampling


@dataclass
class Generated:
    tokens: torch.Tensor  # [B * num_return, T] padded with pad_id after the end token; input i's rows together
    scores: torch.Tensor  # [B * num_return] log P(tokens | X)
    lengths: torch.Tensor  # [B * num_return] tokens up to and including the end token


class _Cached:
    def __init__(self, model: BertGen, inp: GenInput, max_length: int):
        self.model, self.state = model, model.start(inp, max_length)

    def __call__(self, history: torch.Tensor) -> torch.Tensor:
        last = history[:, -1] if history.shape[1] else None
        logp, self.state = self.model.step(self.state, last)
        return logp

    def select(self, index: torch.Tensor) -> None:
        self.state = self.state.select(index)


class _Naive:
    def __init__(self, model: BertGen, inp: GenInput):
        self.model, self.inp, self.packed = model, inp, model.packed_decoder()  # the same head as _Cached's

    def __call__(self, history: torch.Tensor) -> torch.Tensor:
        return self.model.naive_step(self.inp, history, self.packed)

    def select(self, index: torch.Tensor) -> None:
        self.inp = select_input(self.inp, index)


class NoRepeatNGram(LogitsProcessor):
    """transformers' `NoRepeatNGramLogitsProcessor` rule (a token that would complete an n-gram already in the
    sequence gets -inf), as one batched tensor op: the library's builds a dict per hypothesis in Python from
    `.tolist()` every step, a host sync per generated token and a loop over beams. Tested equal to it."""

    def __init__(self, ngram_size: int):
        self.n = ngram_size

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        n = self.n
        if n <= 0 or input_ids.shape[1] < n:
            return scores
        windows = input_ids.unfold(1, n, 1)  # [B, t - n + 1, n]
        prefix = input_ids[:, input_ids.shape[1] - (n - 1):]
        match = (windows[:, :, : n - 1] == prefix.unsqueeze(1)).all(-1)  # [B, W]
        banned = torch.zeros_like(scores, dtype=torch.int32).scatter_add_(1, windows[:, :, -1], match.int())
        return scores.masked_fill(banned > 0, float("-inf"))


class MinLength(LogitsProcessor):
    """transformers' `MinLengthLogitsProcessor` rule (the end token gets -inf while the sequence is shorter than
    `min_length`) without its per-step cost: the library's clones the [B, V] scores and builds an isin mask over
    the vocabulary every step (2-3 ms a step at 24 beams x 30k words on the CPU, ~10x this). Tested equal to it."""

    def __init__(self, min_length: int, end_id: int):
        self.min_length, self.end_id = min_length, end_id

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[-1] >= self.min_length:
            return scores
        scores = scores.clone()
        scores[:, self.end_id] = float("-inf")
        return scores


def constraints(cfg: DecodeConfig, end_id: int) -> LogitsProcessorList:
    """What removes candidates from every method's next-token log-probabilities, given the tokens generated so
    far (transformers' `input_ids`; our sequences carry no prompt, so `min_length` counts the target's tokens,
    the end token included)."""
    out = LogitsProcessorList()
    if cfg.min_length > 1:  # the end token may not be token number < min_length
        out.append(MinLength(cfg.min_length - 1, end_id))
    if cfg.no_repeat_ngram_size > 0:
        out.append(NoRepeatNGram(cfg.no_repeat_ngram_size))
    return out


def warpers(cfg: DecodeConfig) -> LogitsProcessorList:
    """Sampling's reshaping of the constrained distribution: temperature, then top-k, then top-p (nucleus)."""
    out = LogitsProcessorList()
    if cfg.temperature <= 0:
        raise ValueError(f"decode.temperature: {cfg.temperature} is not > 0")
    if cfg.temperature != 1.0:
        out.append(TemperatureLogitsWarper(cfg.temperature))
    if cfg.top_k > 0:
        out.append(TopKLogitsWarper(cfg.top_k))
    if cfg.top_p < 1.0:
        out.append(TopPLogitsWarper(cfg.top_p))
    return out


def check(cfg: DecodeConfig) -> None:
    """Say which `decode.*` field is wrong before any model runs."""
    if cfg.method not in ("greedy", "beam", "sample"):
        raise ValueError(f"decode.method: '{cfg.method}' is not greedy, beam or sample")
    if cfg.beam_groups < 1 or cfg.beam_size % cfg.beam_groups:
        raise ValueError(f"decode.beam_groups: {cfg.beam_groups} does not divide decode.beam_size {cfg.beam_size}")
    most = 1 if cfg.method != "beam" else cfg.beam_groups if cfg.beam_groups > 1 else cfg.beam_size
    if not 1 <= cfg.num_return <= most:
        raise ValueError(f"decode.num_return: {cfg.num_return} is not in 1..{most} for method {cfg.method} with "
                         f"beam_size {cfg.beam_size} and beam_groups {cfg.beam_groups}")


@torch.no_grad()
def generate(model: BertGen, inp: GenInput, cfg: DecodeConfig, *, end_id: int, pad_id: int = 0) -> Generated:
    check(cfg)
    stepper = _Cached(model, inp, cfg.max_length) if cfg.cached else _Naive(model, inp)
    if cfg.method == "beam" and cfg.beam_size > 1:
        return beam_search(stepper, inp.mask.shape[0], cfg, end_id, pad_id, inp.mask.device)
    return _one_path(stepper, inp.mask.shape[0], cfg, end_id, pad_id, inp.mask.device)


def _one_path(stepper, bsz: int, cfg: DecodeConfig, end_id: int, pad_id: int, dev) -> Generated:
    history = torch.zeros(bsz, 0, dtype=torch.long, device=dev)
    score = torch.zeros(bsz, device=dev)
    length = torch.zeros(bsz, dtype=torch.long, device=dev)
    done = torch.zeros(bsz, dtype=torch.bool, device=dev)
    gen = torch.Generator(device=dev).manual_seed(cfg.seed) if cfg.method == "sample" else None
    constrain, warp = constraints(cfg, end_id), warpers(cfg) if cfg.method == "sample" else None
    for _ in range(cfg.max_length):
        logp = stepper(history)
        allowed = constrain(history, logp)
        if warp is not None:
            token = torch.multinomial(warp(history, allowed).softmax(-1), 1, generator=gen).squeeze(1)
        else:
            token = allowed.argmax(-1)
        score = score + torch.where(done, 0.0, logp.gather(1, token.unsqueeze(1)).squeeze(1))
        length = length + (~done).long()
        token = torch.where(done, pad_id, token)
        history = torch.cat([history, token.unsqueeze(1)], 1)
        done = done | (token == end_id)
        if bool(done.all()):  # one sync per generated token, not per training step
            break
    return Generated(history, score, length)


def beam_search(stepper, bsz: int, cfg: DecodeConfig, end_id: int, pad_id: int, dev) -> Generated:
    """Beam search over `stepper` (called with the [rows, t] tokens so far, it returns the next token's [rows, V]
    log-probabilities; `select(index)` reorders its rows); diverse when `cfg.beam_groups` > 1. Row layout: input
    i, group g, beam j at i * k + g * k / G + j."""
    k, groups = cfg.beam_size, cfg.beam_groups
    kg = k // groups
    stepper.select(torch.arange(bsz, device=dev).repeat_interleave(k))
    beam_score = torch.zeros(bsz, groups, kg, device=dev)
    beam_score[:, :, 1:] = float("-inf")  # each group's kg identical beams at first: expand only one
    history = torch.zeros(bsz * k, 0, dtype=torch.long, device=dev)
    length = torch.zeros(bsz * k, dtype=torch.long, device=dev)
    done = torch.zeros(bsz * k, dtype=torch.bool, device=dev)
    group_base = (torch.arange(bsz, device=dev) * k).view(bsz, 1, 1) + \
        (torch.arange(groups, device=dev) * kg).view(1, groups, 1)  # [B, G, 1]: each group's first row
    alpha, lam = cfg.length_penalty, cfg.diversity_penalty
    constrain = constraints(cfg, end_id)
    for _ in range(cfg.max_length):
        logp = constrain(history, stepper(history))
        vocab = logp.shape[1]
        finished_row = torch.full_like(logp[:1], float("-inf"))
        finished_row[0, pad_id] = 0.0  # a finished beam only extends by padding, at no cost
        logp = torch.where(done.unsqueeze(1), finished_row, logp).view(bsz, groups, kg, vocab)
        cand = beam_score.unsqueeze(-1) + logp  # [B, G, kg, V]
        new_len = (length + (~done).long()).clamp(min=1).float().view(bsz, groups, kg, 1)
        ranked = cand / new_len ** alpha
        used = torch.zeros(bsz, vocab, device=dev)  # tokens earlier groups chose at this step
        picks = []
        for g in range(groups):  # groups are sequential by definition; the beams and words within one are not
            rank_g = ranked[:, g] - lam * used.unsqueeze(1) if g else ranked[:, g]
            idx = rank_g.reshape(bsz, kg * vocab).topk(kg, -1).indices  # [B, kg]
            picks.append(idx)
            if groups > 1:
                token_g = idx % vocab
                used.scatter_add_(1, token_g, (token_g != pad_id).float())
        idx = torch.stack(picks, 1)  # [B, G, kg]
        beam_score = cand.reshape(bsz, groups, kg * vocab).gather(2, idx)
        origin = (group_base + idx // vocab).view(-1)
        token = (idx % vocab).view(-1)
        was_done = done.index_select(0, origin)
        length = length.index_select(0, origin) + (~was_done).long()
        history = torch.cat([history.index_select(0, origin), token.unsqueeze(1)], 1)
        done = was_done | (token == end_id)
        stepper.select(origin)
        if bool(done.all()):
            break
    final = (beam_score.view(-1) / length.clamp(min=1).float() ** alpha).view(bsz, groups, kg)
    if groups > 1:  # each group's best, then the best of those first
        best_in_group = final.argmax(-1, keepdim=True)  # [B, G, 1]
        rows = (group_base + best_in_group).view(bsz, groups)
        order = final.gather(2, best_in_group).view(bsz, groups).argsort(-1, descending=True)
        rows = rows.gather(1, order)[:, : cfg.num_return]
    elif cfg.num_return == 1:
        rows = group_base.view(bsz, 1) + final.view(bsz, k).argmax(-1, keepdim=True)
    else:
        rows = group_base.view(bsz, 1) + final.view(bsz, k).topk(cfg.num_return, -1).indices
    rows = rows.reshape(-1)
    return Generated(history.index_select(0, rows), beam_score.view(-1).index_select(0, rows),
                     length.index_select(0, rows))
