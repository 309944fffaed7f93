"""`relation_alignment_window`: a relation word ("left") aligns to the regions in that relation to the object named
beside it. Checked against a word-by-word reference written from the config's description, with the demo world's own
relation rule (`shards.shapes_world.relation`) deciding which box is left of which."""

import math
from types import SimpleNamespace

import pytest
import torch

from model.config import model_config
from model.vl_bert import RELATIONS, VLBert, VLBertForPretraining
from shards import shapes_world

from .conftest import make_batch

RELATION_IDS = [[20], [21], [22], [23]]  # left, right, above, below
WORDS_CFG = {"region_class_words": [[8], [9], [10], [12], [13], [14], [15], [16], [17]],
             "region_word_alignment": 0.5, "pair_relation_words": RELATION_IDS}


def world_relation(a, b) -> int:
    """The shapes world's relation of centre a to centre b, as an index of RELATIONS."""
    said = shapes_world.relation(SimpleNamespace(centre=a), SimpleNamespace(centre=b))
    return {"left of": 0, "right of": 1, "above": 2, "below": 3}[said]


def reference_weights(emb, words, terms, candidates, relation, boxes, valid, window, landmark_first=False):
    """alignment_weights with relations, one word, side and region at a time: the relation word's own scores, then
    what the unnamed run on the far side of its object takes of it (with `landmark_first`, the object before a
    relation word counts only where no object after it does)."""
    cfg = emb.cfg
    own = emb.alignment_weights(words, terms, candidates).detach()  # the names-only weights: test_vl_bert.py's
    names = emb.name_embeddings("relation").float().detach()
    b, t, r = own.shape
    scale, threshold = cfg.region_word_alignment_scale, cfg.region_word_alignment
    out = torch.zeros_like(own)
    for row in range(b):
        mass = [float(own[row, s].sum()) for s in range(t)]
        naming = [mass[s] > 0.5 and bool(valid[row, s]) for s in range(t)]
        centres = [((float(x1) + float(x2)) / 2, (float(y1) + float(y2)) / 2) for x1, y1, x2, y2 in boxes[row]]
        side_scores = {}  # (word, step) -> [R] scores from the object on that side (step 1: after the word)
        for word in range(t):
            if relation[row, word] < 0 or not valid[row, word]:
                continue
            for step in (1, -1):
                scores = [-math.inf] * r
                side_scores[word, step] = scores
                near = [s for s in range(word + step, word + step * (window + 1), step) if 0 <= s < t and naming[s]]
                if not near:
                    continue
                run, s = [], near[0]
                while 0 <= s < t and naming[s]:
                    run.append(s)
                    s += step
                log_p = sum(mass[u] * (own[row, u] / mass[u]).clamp(min=1e-6).log() for u in run)
                anchor = torch.where(candidates[row], log_p, torch.tensor(-math.inf)).softmax(0)
                for region in range(r):
                    if not candidates[row, region]:
                        continue
                    counts = torch.zeros(len(RELATIONS))
                    for j in range(r):
                        if centres[j] == centres[region]:
                            continue
                        # after the word: "[region] left of [j]"; before it: "[j] left of [region]"
                        k = world_relation(centres[region], centres[j]) if step == 1 else \
                            world_relation(centres[j], centres[region])
                        counts[k] += anchor[j]
                    if float(counts.sum()) > 1e-6:
                        scores[region] = float(torch.cosine_similarity(words[row, word].float(), counts @ names, 0))
            if landmark_first and step == -1 and any(v > -math.inf for v in side_scores[word, 1]):
                side_scores[word, -1] = [-math.inf] * r
        for word in range(t):
            scores = []
            for region in range(r):
                cos = max(float(torch.cosine_similarity(words[row, word], part[row, region], 0)) for part in terms)
                scores.append(cos if candidates[row, region] else -math.inf)
                for step in (1, -1):
                    if (word, step) in side_scores:
                        scores[region] = max(scores[region], side_scores[word, step][region])
            weights = (torch.tensor([*scores, threshold]) * scale).softmax(0)[:-1]
            # the far side's unnamed run: words before a relation word take its object after, and the reverse
            share = torch.zeros(r)
            unnamed = not naming[word] and bool(valid[row, word])
            for q in range(t):
                if unnamed and (q, 1) in side_scores and 0 < abs(q - word) <= 2 * window + 1 and \
                        not any(naming[u] for u in range(min(q, word) + 1, max(q, word))):
                    far = side_scores[q, 1 if word < q else -1]
                    share += (torch.tensor([*far, threshold]) * scale).softmax(0)[:-1]
            share = share / max(1.0, float(share.sum()))
            out[row, word] = weights + (1 - weights.sum()) * share
    return out


def scene(emb):
    """Two rows over one layout: a circle left of a star, a square above the star (normalised boxes; element 0 the
    whole image, no candidate). Row 0: "[M] [M] left of a star"; row 1: "circle left of [M] [M] ." (names from
    the word table, so the relation names are the live embeddings)."""
    # the words used get orthonormal embeddings (a word's cosine with another's name is 0 unless it is that name),
    # whatever the model's random init drew
    used = [20, 21, 22, 23, 30, 31, 32, 33, *range(40, 46)]
    basis = torch.linalg.qr(torch.randn(32, 32, generator=torch.Generator().manual_seed(0)))[0]
    with torch.no_grad():
        emb.word_embeddings.weight[used] = basis[: len(used)]
    e = emb.word_embeddings.weight.detach()
    circle, star, square, red = e[30], e[31], e[32], e[33]
    classes = torch.stack([torch.zeros(32), circle, star, square]).expand(2, 4, 32).clone()
    attributes = torch.stack([torch.zeros(32), red, red, red]).expand(2, 4, 32).clone()
    boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.1, 0.4, 0.3, 0.6], [0.5, 0.4, 0.7, 0.6], [0.55, 0.0, 0.75, 0.2]])
    boxes = boxes.expand(2, 4, 4).clone()
    candidates = torch.tensor([[False, True, True, True]] * 2)
    noise = [e[40 + i] for i in range(6)]  # words that name nothing ([MASK], "of", "a", ".")
    rows = [[noise[0], noise[1], e[20], noise[2], noise[3], star],
            [circle, e[20], noise[2], noise[0], noise[1], noise[4]]]
    words = torch.stack([torch.stack(r) for r in rows])
    relation = torch.tensor([[-1, -1, 0, -1, -1, -1], [-1, 0, -1, -1, -1, -1]])
    valid = torch.ones(2, 6, dtype=torch.bool)
    return words, [classes, attributes], candidates, relation, boxes, valid


def test_relation_words_align_to_the_regions_in_their_relation_by_hand():
    """Row 0's "left" (the star after it) aligns to the circle, the one region left of the star, and so do the
    unnamed words before it (the masked phrase), not those between it and the star; row 1's "left" (the circle
    before it) aligns to the star and the square, the regions the circle is left of, and so do the unnamed words
    after it; named words keep their own weights; the whole computation equals the word-by-word reference."""
    emb = VLBert(model_config("tiny", updates={**WORDS_CFG, "relation_alignment_window": 3})).embeddings
    words, terms, candidates, relation, boxes, valid = scene(emb)
    with torch.no_grad():
        own = emb.alignment_weights(words, terms, candidates)
        got = emb.alignment_weights(words, terms, candidates, relations=(relation, boxes, valid))
    expected = reference_weights(emb, words, terms, candidates, relation, boxes, valid, window=3)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert float(own[0, 2].sum()) < 0.2 and float(got[0, 2, 1]) > 0.9  # "left" of the star: the circle
    assert float(got[1, 1, 2] + got[1, 1, 3]) > 0.9 and float(got[1, 1, 1]) < 0.05  # what the circle is left of
    assert float(got[0, :2, 1].amin()) > 0.9  # "[M] [M] left of a star": the masked words take the circle
    assert float((got[1, 2:, 2] + got[1, 2:, 3]).amin()) > 0.9  # "circle left [M] [M] ...": the star and square
    for row, word in ((0, 3), (0, 4), (0, 5), (1, 0)):  # "of a" on the star's side, the star, the circle
        torch.testing.assert_close(got[row, word], own[row, word], rtol=0, atol=0)
    # a window that does not reach the star (three words away) gives row 0's "left" nothing of its own
    short = VLBert(model_config("tiny", updates={**WORDS_CFG, "relation_alignment_window": 2})).embeddings
    short.load_state_dict(emb.state_dict())
    near = short.alignment_weights(words, terms, candidates, relations=(relation, boxes, valid))
    torch.testing.assert_close(near[0], own[0], rtol=0, atol=0)
    torch.testing.assert_close(near, reference_weights(short, words, terms, candidates, relation, boxes, valid, 2),
                               atol=1e-5, rtol=1e-5)


def test_landmark_first_reads_a_relation_word_against_the_object_after_it():
    """"circle left of a star": with the better of both sides "left" aligns to the circle (left of the star) and to
    the star and the square (what the circle is left of); with `relation_alignment_landmark_first` to the circle
    alone; where one side names nothing (the scene's rows) the two agree bit for bit; the word-by-word reference."""
    with torch.random.fork_rng():  # the file's other tests draw their models from the global stream as before
        _check_landmark_first()


def _check_landmark_first():
    both = VLBert(model_config("tiny", updates={**WORDS_CFG, "relation_alignment_window": 3})).embeddings
    first = VLBert(model_config("tiny", updates={**WORDS_CFG, "relation_alignment_window": 3,
                                                 "relation_alignment_landmark_first": True})).embeddings
    words, terms, candidates, relation, boxes, valid = scene(both)
    first.load_state_dict(both.state_dict())
    e = both.word_embeddings.weight.detach()
    with torch.no_grad():
        one_side = [emb.alignment_weights(words, terms, candidates, relations=(relation, boxes, valid))
                    for emb in (both, first)]
        torch.testing.assert_close(one_side[1], one_side[0], rtol=0, atol=0)
        sentence = torch.stack([e[30], e[20], e[40], e[31], e[41], e[42]]).unsqueeze(0)  # circle left of a star
        row = (relation[1:].clone().fill_(-1).index_fill_(1, torch.tensor([1]), 0), boxes[:1], valid[:1])
        t = [c[:1] for c in terms]
        got_both = both.alignment_weights(sentence, t, candidates[:1], relations=row)
        got = first.alignment_weights(sentence, t, candidates[:1], relations=row)
    assert float(got_both[0, 1, 2] + got_both[0, 1, 3]) > 0.5
    assert float(got[0, 1, 1]) > 0.9 and float(got[0, 1, 2] + got[0, 1, 3]) < 0.05
    torch.testing.assert_close(got, reference_weights(first, sentence, t, candidates[:1], *row[:2], row[2], 3, True),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_both, reference_weights(both, sentence, t, candidates[:1], *row[:2], row[2], 3),
                               atol=1e-5, rtol=1e-5)


def test_an_anchor_is_a_run_of_naming_words_and_their_product():
    """"left of red star and square ." with a window of 5, which reaches "square": the object after "left" is the run
    "red star" (the star, which both name), not a compromise with the square the next run names; with the star's own
    name masked it is every red region."""
    emb = VLBert(model_config("tiny", updates={**WORDS_CFG, "relation_alignment_window": 5})).embeddings
    words, terms, candidates, relation, boxes, valid = scene(emb)
    e = emb.word_embeddings.weight.detach()
    red, star, square, nothing = e[33], e[31], e[32], e[40]
    sentence = torch.stack([nothing, e[20], nothing, red, star, nothing, square, nothing]).unsqueeze(0)
    relation = torch.tensor([[-1, 0, -1, -1, -1, -1, -1, -1]])
    valid = torch.ones(1, 8, dtype=torch.bool)
    terms, candidates, boxes = [terms[0][:1], terms[1][:1]], candidates[:1], boxes[:1]
    weights = emb.alignment_weights(sentence, terms, candidates)
    after, before = emb.relation_anchors(weights, candidates, valid, relation)
    assert float(after[0, 1, 2]) > 0.99 and float(before[0, 1].sum()) == 0.0  # the star; nothing before "left"
    assert float(after[0].sum()) == pytest.approx(1.0)  # only the relation word has an anchor
    masked = sentence.clone()
    masked[0, 4] = nothing  # "left of a red [MASK] and ...": the run is "red" alone
    after, _ = emb.relation_anchors(emb.alignment_weights(masked, terms, candidates), candidates, valid, relation)
    torch.testing.assert_close(after[0, 1, 1:], torch.full((3,), 1 / 3), atol=1e-3, rtol=0)
    got = emb.alignment_weights(sentence, terms, candidates, relations=(relation, boxes, valid))
    torch.testing.assert_close(got, reference_weights(emb, sentence, terms, candidates, relation, boxes, valid, 5),
                               atol=1e-5, rtol=1e-5)
    # "[M] square [M] left of red star": the run of unnamed words before "left" ends at "square", so the first
    # word, beyond it, takes nothing of the relation (the second takes the circle, left of the star)
    broken = torch.stack([nothing, square, nothing, e[20], nothing, red, star, nothing]).unsqueeze(0)
    relation = torch.tensor([[-1, -1, -1, 0, -1, -1, -1, -1]])
    own = emb.alignment_weights(broken, terms, candidates)
    got = emb.alignment_weights(broken, terms, candidates, relations=(relation, boxes, valid))
    torch.testing.assert_close(got[0, 0], own[0, 0], rtol=0, atol=0)
    assert float(got[0, 2, 1]) > 0.9
    torch.testing.assert_close(got, reference_weights(emb, broken, terms, candidates, relation, boxes, valid, 5),
                               atol=1e-5, rtol=1e-5)


def test_regions_in_one_place_give_nothing_and_the_model_is_unchanged_where_no_relation_word_aligns():
    """The image-ablated control's layout (every region the whole image): no relation, the weights are the
    names-only ones bit for bit; in the model, a batch without relation words embeds exactly as the model without
    the option, one with them moves only the text by (W_rel - W) @ names, and every parameter's gradient is
    finite."""
    cfg = {**WORDS_CFG, "alignment_neighbours": 2, "alignment_neighbour_combine": "product"}
    emb = VLBert(model_config("tiny", updates={**cfg, "relation_alignment_window": 3})).embeddings
    words, terms, candidates, relation, boxes, valid = scene(emb)
    whole = boxes[:, :1].expand_as(boxes)
    got = emb.alignment_weights(words, terms, candidates, valid, relations=(relation, whole, valid))
    assert torch.equal(got, emb.alignment_weights(words, terms, candidates, valid))
    torch.manual_seed(0)
    model = VLBertForPretraining(model_config("tiny", updates={**cfg, "relation_alignment_window": 3}))
    plain = VLBertForPretraining(model_config("tiny", updates=cfg))
    plain.load_state_dict(model.state_dict())  # no parameters of its own
    model.eval(), plain.eval()
    batch = make_batch()
    image = {k: batch[k] for k in ("images", "image_sizes", "boxes", "box_mask")}
    for ids, moves in ((batch["input_ids"].clamp(max=19), False),
                       (batch["input_ids"].clone().index_put_((torch.tensor([0, 1]), torch.tensor([2, 3])),
                                                             torch.tensor([20, 23])), True)):
        args = (ids, batch["text_mask"], batch["token_type_ids"])
        with torch.no_grad():
            e, p = model.vl_bert.embed(*args, **image), plain.vl_bert.embed(*args, **image)
        t = ids.shape[1]
        assert torch.equal(e.x[:, t:], p.x[:, t:])
        if not moves:
            assert torch.equal(e.x, p.x)
            continue
        vb = model.vl_bert.embeddings
        named = ids.unsqueeze(-1) == torch.tensor([i[0] for i in RELATION_IDS])
        relation = torch.where(named.any(-1), named.long().argmax(-1), -1)
        with torch.no_grad():
            words = vb.word_embeddings(ids)
            boxes = model.vl_bert.region_features(**image)[1]
            w_rel = vb.alignment_weights(words, e.region_terms, e.candidates, batch["text_mask"],
                                         (relation, boxes, batch["text_mask"]))
            w = vb.alignment_weights(words, e.region_terms, e.candidates, batch["text_mask"])
        torch.testing.assert_close(e.x[:, :t] - p.x[:, :t], (w_rel - w) @ sum(e.region_terms), atol=1e-5, rtol=1e-5)
    model.train()
    out = model.vl_bert(*args, **image)
    out.last_hidden_state.square().mean().backward()
    for name, param in model.named_parameters():
        assert param.grad is None or torch.isfinite(param.grad).all(), name


def test_relation_alignment_needs_its_names_and_the_alignment():
    with pytest.raises(ValueError, match="relation_alignment_window"):
        VLBert(model_config("tiny", updates={**WORDS_CFG, "pair_relation_words": None,
                                             "relation_alignment_window": 3}))
    with pytest.raises(ValueError, match="relation_alignment_window"):
        VLBert(model_config("tiny", updates={**WORDS_CFG, "region_word_alignment": None,
                                             "relation_alignment_window": 3}))
    with pytest.raises(ValueError, match="one word-piece"):
        VLBert(model_config("tiny", updates={**WORDS_CFG, "pair_relation_words": [[20], [21, 22], [22], [23]],
                                             "relation_alignment_window": 3}))
    with pytest.raises(ValueError, match="relation_alignment_window"):
        VLBert(model_config("tiny", updates={**WORDS_CFG, "relation_alignment_window": -1}))


def test_the_far_side_takes_the_relation_in_the_share_the_neighbours_leave():
    """With neighbours (k = 1, "sum"): W1 = R + (1 - sum R) * N(R), N the neighbours' weights of R, the names-only
    weights with the relation words' scores; then W = W1 + (1 - sum W1) * reach. Written out from those formulas:
    a masked word next to a named one keeps its neighbours' reading, the reach fills what they leave."""
    emb = VLBert(model_config("tiny", updates={**WORDS_CFG, "relation_alignment_window": 3,
                                               "alignment_neighbours": 1})).embeddings
    words, terms, candidates, relation, boxes, valid = scene(emb)
    cfg = emb.cfg
    with torch.no_grad():
        got = emb.alignment_weights(words, terms, candidates, valid, (relation, boxes, valid))
        own = emb.alignment_weights(words, terms, candidates)
        w = torch.nn.functional.normalize(words.float(), dim=-1)
        after, before = emb.relation_scores(w, own, candidates, relation, boxes, valid)
        names = torch.stack([w @ torch.nn.functional.normalize(p, dim=-1).transpose(1, 2) for p in terms]).amax(0)
        score = torch.maximum(names.masked_fill(~candidates.unsqueeze(1), -math.inf), torch.maximum(after, before))
        none = torch.full((*score.shape[:2], 1), cfg.region_word_alignment)
        rel = (torch.cat([score, none], -1) * cfg.region_word_alignment_scale).softmax(-1)[..., :-1]
        reach = emb.relation_reach(after, before, none, (own.sum(-1) <= 0.5) & valid, relation)
    expected = torch.zeros_like(got)
    for row in range(2):
        for t in range(6):
            near = sum((rel[row, s] for s in (t - 1, t + 1) if 0 <= s < 6), torch.zeros(4))
            w1 = rel[row, t] + (1 - rel[row, t].sum()) * near / max(1.0, float(near.sum()))
            expected[row, t] = w1 + (1 - w1.sum()) * reach[row, t]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # row 0's word 1 sits beside "left": its neighbour gives it the circle, the reach finds little share left
    assert float(got[0, 1, 1]) > 0.9 and float(reach[0, 0, 1]) > 0.9


def embedding_backwards(loss: torch.Tensor, weight: torch.Tensor) -> int:
    """How many embedding lookups of `weight` the backward of `loss` runs (each writes a dense [vocab, hidden]
    gradient)."""
    seen, stack, count = set(), [loss.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__.startswith("EmbeddingBackward"):
            count += any(getattr(n, "variable", None) is weight for n, _ in node.next_functions if n is not None)
        stack += [n for n, _ in node.next_functions]
    return count


def test_the_names_ride_on_the_words_lookup():
    """With class, attribute, size and relation names, a forward with an image looks the vocabulary up once (one
    dense gradient, where a lookup per name table made five); the same sequence, bit for bit, as the names looked up
    apart, and the same word-embedding gradient to rounding."""
    cfg = model_config("tiny", updates={**WORDS_CFG, "relation_alignment_window": 3, "alignment_neighbours": 2,
                                        "region_attribute_words": [[30], [31], [32, 33]],
                                        "region_size_words": [[40], [41]],
                                        "fast_rcnn": {"num_attributes": 3, "num_sizes": 2}})
    torch.manual_seed(0)
    model = VLBertForPretraining(cfg).eval()
    emb = model.vl_bert.embeddings
    batch = make_batch()
    batch["input_ids"][0, 2], batch["input_ids"][1, 3] = 20, 23  # relation words, so their names are read too
    weight = emb.word_embeddings.weight
    ids = torch.tensor([[5, 8, 31, 40]])
    words, names = emb.words_and_names(ids)
    assert torch.equal(words, emb.word_embeddings(ids))
    assert sorted(names) == ["attribute", "class", "relation", "size"]
    for kind, table in names.items():
        assert torch.equal(table, emb.name_embeddings(kind))
    # the hand value: "large red" style two-piece name = the weighted sum of its pieces' rows
    w = emb.region_attribute_word_weights[2]
    assert torch.allclose(names["attribute"][2], w[0] * weight[32] + w[1] * weight[33])

    def forward(apart: bool):
        if apart:  # every name table from its own lookup, as before
            original = emb.words_and_names
            emb.words_and_names = lambda i: (emb.word_embeddings(i), None)
        try:
            out = model.vl_bert(batch["input_ids"], batch["text_mask"], batch["token_type_ids"],
                                **{k: batch[k] for k in ("images", "image_sizes", "boxes", "box_mask")})
        finally:
            if apart:
                emb.words_and_names = original
        return out.last_hidden_state.square().sum()

    shared, apart = forward(False), forward(True)
    assert torch.equal(shared, apart)
    assert embedding_backwards(shared, weight) == 1
    assert embedding_backwards(apart, weight) == 5
    grads = [torch.autograd.grad(loss, weight)[0] for loss in (shared, apart)]
    assert torch.allclose(grads[0], grads[1], rtol=1e-5, atol=1e-6)
