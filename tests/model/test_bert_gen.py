"""BERT-gen: the attention rule by hand, training = inference exactness, cached = naive decoding; BERT-gen on
VL-BERT's own input: its X is VL-BERT's sequence, its question words VL-BERT's words."""

import pytest
import torch

from finetune.generate import (
    DecodeConfig,
    MinLength,
    NoRepeatNGram,
    beam_search,
    check,
    constraints,
    generate,
    warpers,
)
from model.bert_gen import INPUT, PSEUDO_MASK, TARGET, BertGen, VLBertGen, attention_rule, select_input
from model.config import model_config

END = 4  # the tiny preset's [SEP]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = model_config("tiny", overrides=["visual_embedding=linear", "hidden_dropout_prob=0",
                                          "attention_probs_dropout_prob=0"])
    m = BertGen(cfg).eval()
    with torch.no_grad():  # a sharper output distribution than the 0.02-std init, so decodes differ
        m.model.mlm_head.bias.normal_(0, 2.0)
    return m


def batch(with_text=True, with_image=True):
    g = torch.Generator().manual_seed(1)
    out = {}
    if with_text:
        ids = torch.randint(10, 99, (3, 5), generator=g)
        mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
        out.update(text_ids=ids, text_mask=mask)
    if with_image:
        out.update(features=torch.randn(3, 4, 24, generator=g), boxes=torch.rand(3, 4, 4, generator=g),
                   region_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool))
    return out


def test_attention_rule_matches_hand_written_mask():
    # X = x1 x2(pad) | y1 y2 | m1 m2
    kind = torch.tensor([[INPUT, INPUT, TARGET, TARGET, PSEUDO_MASK, PSEUDO_MASK]])
    time = torch.tensor([[0, 0, 1, 2, 1, 2]])
    real = torch.tensor([[1, 0, 1, 1, 1, 1]], dtype=torch.bool)
    expected = torch.tensor([
        # x1 x2 y1 y2 m1 m2
        [1, 0, 0, 0, 0, 0],  # x1: inputs only
        [1, 0, 0, 0, 0, 0],  # x2 (padding row): inputs only
        [1, 0, 1, 0, 0, 0],  # y1: X, y1
        [1, 0, 1, 1, 0, 0],  # y2: X, y1, y2
        [1, 0, 0, 0, 1, 0],  # m1: X and itself
        [1, 0, 1, 0, 0, 1],  # m2: X, y1 and itself
    ], dtype=torch.bool)
    assert torch.equal(attention_rule(kind, time, kind, time, real)[0], expected)


def test_image_tokens_take_bert_positions_1_to_n(model):
    b = batch(with_text=False)
    inp = model.embed_input(**b)
    emb = model.bert.embeddings
    i, r = 1, 2  # sample 1, region 2 -> sequence element 3, position 3
    expected = model.bert.embed_regions_linear(b["features"][i, r], b["boxes"][i, r]) + \
        emb.position_embeddings.weight[r + 1] + emb.token_type_embeddings.weight[0]
    torch.testing.assert_close(inp.embeddings[i, r + 1], expected)
    assert inp.length.tolist() == [6, 5, 3]  # [CLS] + real regions + [SEP]


@pytest.fixture(scope="module")
def vl_model():
    """An end-to-end VL-BERT (its Fast R-CNN names regions, words align to them) as BERT-gen. The alignment's
    threshold is below any cosine: every word takes region words, so they are in every comparison."""
    torch.manual_seed(0)
    cfg = model_config("tiny", updates={"region_class_words": [[8], [9], [10, 11], [12], [13], [14], [15], [16], [17]],
                                        "region_word_alignment": -1.0, "precomputed_feature_size": 512,
                                        "hidden_dropout_prob": 0, "attention_probs_dropout_prob": 0,
                                        "visual_dropout": 0, "visual_ln_init": 1.0})
    m = VLBertGen(cfg).eval()
    with torch.no_grad():
        m.model.mlm_head.bias.normal_(0, 2.0)
    return m


def vl_batch(with_text=True):
    """`batch`'s regions as 512-d features of the ResNet-18 detector, with each image's size."""
    g = torch.Generator().manual_seed(2)
    out = batch(with_text=with_text)
    out["features"] = torch.randn(3, 4, 512, generator=g).relu()
    out["image_hw"] = torch.tensor([[80, 100], [64, 64], [120, 90]])
    return out


def training_equals_decoding(model, b):
    targets = torch.tensor([[11, 12, 13, END], [21, 22, END, 0], [31, END, 0, 0]])
    tmask = targets != 0
    with torch.no_grad():
        inp = model.embed_input(**b)
        trained = model.sequence_log_probs(inp, targets, tmask)
        state, total, last = model.start(inp, max_length=targets.shape[1]), torch.zeros(3), None
        room = state.cache[0].keys.shape[2]
        for t in range(targets.shape[1]):
            logp, state = model.step(state, last)
            last = targets[:, t]
            total += logp.gather(1, last.unsqueeze(1)).squeeze(1) * tmask[:, t]
            naive = model.naive_step(inp, targets[:, :t])
            torch.testing.assert_close(naive, logp, atol=1e-5, rtol=0)
        assert state.cache[0].keys.shape[2] == room  # sized for max_length: never regrown
    torch.testing.assert_close(trained, total, atol=1e-5, rtol=0)


@pytest.mark.parametrize("modes", [(True, False), (False, True), (True, True)])
def test_training_pass_equals_incremental_decoding(model, modes):
    training_equals_decoding(model, batch(*modes))


@pytest.mark.parametrize("with_text", [False, True])
def test_vl_bert_input_training_pass_equals_incremental_decoding(vl_model, with_text):
    training_equals_decoding(vl_model, vl_batch(with_text))
    with torch.no_grad():  # beams reorder the words' context (whole-image term, region words) with the cache
        inp = vl_model.embed_input(**vl_batch(with_text))
        cfg = dict(method="beam", max_length=6, beam_size=3, no_repeat_ngram_size=2)
        fast = generate(vl_model, inp, DecodeConfig(**cfg, cached=True), end_id=END)
        slow = generate(vl_model, inp, DecodeConfig(**cfg, cached=False), end_id=END)
    assert torch.equal(fast.tokens, slow.tokens)


def test_vl_bert_input_is_vl_berts_own_sequence(vl_model):
    """X alone, encoded, is VL-BERT's forward on `[CLS] caption [SEP]` and the same regions (pixel boxes, the whole
    image added); y_1 sits two positions after the text ([IMG] regions share one, [END] the next); a question word
    embeds as the same word would in the caption, up to the position (segment A, the whole image's visual term, the
    region words it aligns to)."""
    from model.vl_bert import assemble_text

    cfg, bert = vl_model.cfg, vl_model.bert
    b = vl_batch()
    ids, types, tmask = assemble_text(b["text_ids"], b["text_mask"], cls_id=cfg.cls_token_id, sep_id=cfg.sep_token_id)
    pixels = b["boxes"] * torch.tensor([[100, 80, 100, 80]], dtype=torch.float)[None].repeat(3, 1, 1)
    pixels[1] = b["boxes"][1] * 64
    pixels[2] = b["boxes"][2] * torch.tensor([90, 120, 90, 120])
    with torch.no_grad():
        inp = vl_model.embed_input(**b)
        ours = bert.encode(inp.embeddings, inp.mask).last_hidden_state
        theirs = bert(ids, tmask, types, boxes=pixels, box_mask=b["region_mask"], region_features=b["features"],
                      image_hw=b["image_hw"])
    real = theirs.attention_mask
    assert torch.equal(inp.mask, real)
    torch.testing.assert_close(ours[real], theirs.last_hidden_state[real], atol=1e-5, rtol=1e-5)
    assert inp.length.tolist() == (b["text_mask"].sum(1) + 2 + 2).tolist()  # [CLS] [SEP], then regions and [END]
    assert (inp.regions.start, inp.regions.stop) == (ids.shape[1] + 1, ids.shape[1] + 1 + 4)
    # word 8 names class 1: it aligns to the regions the detector calls so
    emb = bert.embeddings
    word = torch.tensor([8])
    caption = torch.tensor([[8, 20, 21], [8, 0, 0], [8, 30, 0]])
    cids, ctypes, cmask = assemble_text(caption, caption != 0, cls_id=cfg.cls_token_id, sep_id=cfg.sep_token_id)
    with torch.no_grad():
        as_caption = bert.embed(cids, cmask, ctypes, boxes=pixels, box_mask=b["region_mask"],
                                region_features=b["features"], image_hw=b["image_hw"]).x[:, 1]
        img = {k: b[k] for k in ("features", "boxes", "region_mask", "image_hw")}
        ctx = vl_model.embed_input(**img).context
        pos = torch.full((3, 1), 9)
        as_question = vl_model.embed_target(word.expand(3, 1), pos, ctx)[:, 0]
        aligned = emb.aligned_region_words(emb.word_embeddings(word.expand(3, 1)), ctx.region_terms, ctx.candidates)
    torch.testing.assert_close(as_question - emb.position_embeddings.weight[9],
                               as_caption - emb.position_embeddings.weight[1], atol=1e-5, rtol=1e-5)
    names = sum(ctx.region_terms)[:, 1:].norm(dim=-1).mean()
    assert (aligned[:, 0].norm(dim=-1) > 0.3 * names).all()  # the alignment is part of what was compared


@pytest.mark.parametrize("method", ["greedy", "beam", "sample"])
def test_cached_and_naive_decoding_agree(model, method):
    cfg = dict(method=method, max_length=8, min_length=3, beam_size=3, length_penalty=0.7,
               no_repeat_ngram_size=2, top_k=20, top_p=0.9, temperature=0.8)
    with torch.no_grad():
        inp = model.embed_input(**batch())
        fast = generate(model, inp, DecodeConfig(**cfg, cached=True), end_id=END)
        slow = generate(model, inp, DecodeConfig(**cfg, cached=False), end_id=END)
        assert torch.equal(fast.tokens, slow.tokens)
        torch.testing.assert_close(fast.scores, slow.scores, atol=1e-5, rtol=0)
        assert (fast.lengths >= 3).all()
        # the reported score is the model's own log P(Y | X) of the returned sequence
        tmask = torch.arange(fast.tokens.shape[1]) < fast.lengths.unsqueeze(1)
        again = model.sequence_log_probs(inp, fast.tokens, tmask)
        torch.testing.assert_close(again, fast.scores, atol=1e-5, rtol=0)


def test_beam_search_beats_or_matches_greedy(model):
    with torch.no_grad():
        inp = model.embed_input(**batch())
        greedy = generate(model, inp, DecodeConfig(method="greedy", max_length=6), end_id=END)
        beam = generate(model, inp, DecodeConfig(method="beam", beam_size=5, max_length=6, length_penalty=0.0),
                        end_id=END)
    assert (beam.scores >= greedy.scores - 1e-5).all()


def test_ngram_blocking_and_nucleus_by_hand():
    history = torch.tensor([[5, 6, 7, 5]])  # bigram (5, 6) seen: after 5, token 6 is banned
    out = NoRepeatNGram(2)(history, torch.zeros(1, 10))
    assert torch.isinf(out[0, 6]) and torch.isfinite(out[0, [0, 1, 2, 3, 4, 5, 7, 8, 9]]).all()
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(warpers(DecodeConfig(top_p=0.7))(history, logits))
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 < 0.7 <= 0.8
    assert torch.isfinite(warpers(DecodeConfig(top_k=3))(history, logits)).sum() == 3
    # min_length counts target tokens, the end token included: with min_length 3 the end token is banned as
    # token 1 and 2 (histories of 0 and 1 tokens), allowed as token 3
    cons = constraints(DecodeConfig(min_length=3), end_id=END)
    for t, banned in ((0, True), (1, True), (2, False)):
        out = cons(torch.full((1, t), 7), torch.zeros(1, 10))
        assert bool(torch.isinf(out[0, END])) == banned and torch.isfinite(out[0, :END]).all()


def test_ngram_blocking_and_min_length_equal_the_transformers_processors():
    """Our batched n-gram and min-length rules against transformers' NoRepeatNGramLogitsProcessor (its Python
    reference) and MinLengthLogitsProcessor."""
    from transformers import MinLengthLogitsProcessor, NoRepeatNGramLogitsProcessor

    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 4):
        for t in range(0, 12):
            history = torch.randint(0, 6, (8, t), generator=g)  # a small vocabulary: many repeats
            scores = torch.randn(8, 6, generator=g)
            want = NoRepeatNGramLogitsProcessor(n)(history, scores.clone())
            assert torch.equal(NoRepeatNGram(n)(history, scores), want), (n, t)
            want = MinLengthLogitsProcessor(n + 2, eos_token_id=END)(history, scores)
            assert torch.equal(MinLength(n + 2, END)(history, scores), want), (n, t)


class _Table:
    """A stepper whose next-token log-probabilities depend only on the step: hand-checkable beams."""

    def __init__(self, rows: list[list[float]]):
        self.logp = torch.log(torch.tensor(rows))

    def __call__(self, history):
        return self.logp[history.shape[1]].expand(history.shape[0], -1).clone()

    def select(self, index):
        pass


def test_diverse_beam_search_by_hand():
    # vocabulary: 0 pad, 1 end, 2 "a", 3 "b"; two steps, then the end token is certain
    table = _Table([[1e-9, 0.1, 0.6, 0.3], [1e-9, 0.1, 0.5, 0.4], [1e-9, 1.0, 1e-9, 1e-9]])
    cfg = DecodeConfig(beam_size=2, beam_groups=2, num_return=2, max_length=3, length_penalty=0.0)
    same = beam_search(table, 1, cfg, end_id=1, pad_id=0, dev="cpu")
    assert same.tokens.tolist() == [[2, 2, 1], [2, 2, 1]]  # no penalty: both groups find "a a"
    # a penalty of 1 per earlier group's beam: group 1 ranks "a" at log 0.6 - 1 < log 0.3, so takes "b", then
    # at step 2 "a" at log 0.5 - 1 < log 0.4: "b b", scored by the model alone, log(0.3 * 0.4 * 1)
    div = beam_search(table, 1, DecodeConfig(**{**cfg.__dict__, "diversity_penalty": 1.0}), 1, 0, "cpu")
    assert div.tokens.tolist() == [[2, 2, 1], [3, 3, 1]]
    torch.testing.assert_close(div.scores, torch.log(torch.tensor([0.6 * 0.5, 0.3 * 0.4])))
    # plain beam search returns its top beams: "a a" (0.30), "a b" (0.24)
    top = beam_search(table, 1, DecodeConfig(beam_size=2, num_return=2, max_length=3, length_penalty=0.0), 1, 0,
                      "cpu")
    assert top.tokens.tolist() == [[2, 2, 1], [2, 3, 1]]


def _reference_diverse_beam(model, inp, cfg, end):
    """Vijayakumar et al.'s algorithm as written, one input and one hypothesis at a time (no batching, no cache):
    for each step, groups in order, every live hypothesis' every next token ranked by its length-normalised log P
    minus the penalty for each earlier group's pick of that token at this step; a finished hypothesis carries
    over unchanged."""
    kg = cfg.beam_size // cfg.beam_groups
    out = []
    for i in range(inp.mask.shape[0]):
        one = select_input(inp, torch.tensor([i]))
        groups = [[([], 0.0, False)] for _ in range(cfg.beam_groups)]
        for _ in range(cfg.max_length):
            picked = []
            for g in range(cfg.beam_groups):
                cands = []
                for toks, score, fin in groups[g]:
                    if fin:
                        cands.append((score / max(len(toks), 1) ** cfg.length_penalty, toks, score, True, None))
                        continue
                    logp = model.naive_step(one, torch.tensor([toks], dtype=torch.long))[0]
                    for v in range(logp.shape[0]):
                        s = score + float(logp[v])
                        ranked = s / (len(toks) + 1) ** cfg.length_penalty - cfg.diversity_penalty * picked.count(v)
                        cands.append((ranked, toks + [v], s, v == end, v))
                cands.sort(key=lambda c: -c[0])
                groups[g] = [(t, s, f) for _, t, s, f, _ in cands[:kg]]
                picked += [v for *_, v in cands[:kg] if v is not None]
            if all(f for grp in groups for *_, f in grp):
                break
        bests = [max(grp, key=lambda h: h[1] / max(len(h[0]), 1) ** cfg.length_penalty) for grp in groups]
        bests.sort(key=lambda h: -h[1] / max(len(h[0]), 1) ** cfg.length_penalty)
        out += bests[: cfg.num_return]
    return out


def test_diverse_beam_search_equals_the_papers_algorithm(model):
    cfg = DecodeConfig(beam_size=4, beam_groups=2, diversity_penalty=2.0, num_return=2, max_length=5,
                       length_penalty=0.7)
    with torch.no_grad():
        inp = model.embed_input(**batch())
        got = generate(model, inp, cfg, end_id=END)
        want = _reference_diverse_beam(model, inp, cfg, END)
    for row, (toks, score, _) in enumerate(want):
        assert got.tokens[row, : int(got.lengths[row])].tolist() == toks, row
        assert abs(float(got.scores[row]) - score) < 1e-4
    # the penalty is what makes the groups differ: without it every group finds the same best sequence
    same = generate(model, inp, DecodeConfig(**{**cfg.__dict__, "diversity_penalty": 0.0}), end_id=END)
    assert torch.equal(same.tokens[0::2], same.tokens[1::2])
    plain = generate(model, inp, DecodeConfig(beam_size=2, max_length=5, length_penalty=0.7), end_id=END)
    assert torch.equal(same.tokens[0::2], plain.tokens)


def test_decode_fields_are_checked():
    for bad, field in ((dict(beam_size=4, beam_groups=3), "beam_groups"), (dict(num_return=2, method="greedy"),
                       "num_return"), (dict(beam_size=4, beam_groups=2, num_return=3), "num_return")):
        with pytest.raises(ValueError, match=field):
            check(DecodeConfig(**bad))
