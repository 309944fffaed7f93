"""`relation_between`: a word that names nothing, between two named objects, takes the relation names of the pair.
Checked by hand on a layout whose relations the demo world's own rule (`shards.shapes_world.relation`) decides, and
against a word-by-word reference written from the config's description."""

import torch

from model.config import model_config
from model.vl_bert import VLBert, VLBertForPretraining

from .conftest import make_batch
from .test_relation_alignment import RELATION_IDS, WORDS_CFG, scene, world_relation

CFG = {**WORDS_CFG, "relation_alignment_window": 3, "relation_between": True}


def between_words(emb):
    """The scene's layout (a circle left of a star, a square above the star) under two sentences: row 0
    "circle [M] of [M] star ." and row 1 "red square [M] star [M] ." (the square's run is "red square")."""
    _, terms, candidates, _, boxes, valid = scene(emb)
    e = emb.word_embeddings.weight.detach()
    circle, star, square, red = e[30], e[31], e[32], e[33]
    noise = [e[40 + i] for i in range(6)]
    rows = [[circle, noise[0], noise[1], noise[0], star, noise[4]],
            [red, square, noise[0], star, noise[0], noise[4]]]
    return torch.stack([torch.stack(r) for r in rows]), terms, candidates, boxes, valid


def reference_terms(emb, words, terms, candidates, boxes, valid):
    """One word at a time: an unnamed word with an object on each side (`relation_anchors`' distributions) adds
    sum_ij before_i after_j E[world relation of centre i to centre j]."""
    own = emb.alignment_weights(words, terms, candidates)
    unnamed = (own.sum(-1) <= 0.5) & valid
    after, before = emb.relation_anchors(own, candidates, valid, torch.where(unnamed, 0, -1))
    table = emb.name_embeddings("relation").detach()
    b, t, r = own.shape
    out = torch.zeros(b, t, table.shape[1])
    for row in range(b):
        centres = [((float(x1) + float(x2)) / 2, (float(y1) + float(y2)) / 2) for x1, y1, x2, y2 in boxes[row]]
        for word in range(t):
            for i in range(r):
                for j in range(r):
                    if centres[i] != centres[j]:
                        out[row, word] += before[row, word, i] * after[row, word, j] * \
                            table[world_relation(centres[i], centres[j])]
    return out


def test_the_words_between_two_objects_take_their_relation_by_hand():
    """Row 0: the masked word and "of" between the circle and the star hold "left" (the circle is left of the star),
    every other word nothing; row 1: the word between the red square and the star holds "above", the one after the
    star nothing (no object after it). Equal to the word-by-word reference."""
    emb = VLBert(model_config("tiny", updates=CFG)).embeddings
    words, terms, candidates, boxes, valid = between_words(emb)
    with torch.no_grad():
        got = emb.relation_between_terms(words, terms, candidates, valid, boxes)
        expected = reference_terms(emb, words, terms, candidates, boxes, valid)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    left, above = emb.word_embeddings.weight[20].detach(), emb.word_embeddings.weight[22].detach()
    for row, word, name in ((0, 1, left), (0, 2, left), (0, 3, left), (1, 2, above)):
        assert float(torch.cosine_similarity(got[row, word], name, 0)) > 0.99, (row, word)
    for row, word in ((0, 0), (0, 4), (0, 5), (1, 0), (1, 1), (1, 3), (1, 4), (1, 5)):
        assert float(got[row, word].abs().max()) == 0.0, (row, word)


def test_a_relation_word_takes_what_the_boxes_say_against_it():
    """"circle left of star" and "circle above star" (the circle is left of the star): the true "left" carries
    nothing, the false "above" carries "left"; the unnamed "of" after either still carries "left" whole."""
    emb = VLBert(model_config("tiny", updates=CFG)).embeddings
    _, terms, candidates, _, boxes, valid = scene(emb)
    e = emb.word_embeddings.weight.detach()
    circle, star, of = e[30], e[31], e[41]
    words = torch.stack([torch.stack([circle, e[20], of, star, e[44], e[45]]),
                         torch.stack([circle, e[22], of, star, e[44], e[45]])])
    relation = torch.tensor([[-1, 0, -1, -1, -1, -1], [-1, 2, -1, -1, -1, -1]])
    with torch.no_grad():
        got = emb.relation_between_terms(words, terms, candidates, valid, boxes, relation)
        full = emb.relation_between_terms(words, terms, candidates, valid, boxes)
    left = e[20]
    assert float(got[0, 1].abs().max()) < 1e-3 * float(full[0, 1].norm())  # the boxes agree: nothing
    assert float(torch.cosine_similarity(got[1, 1], left, 0)) > 0.99  # they say "left" against "above"
    torch.testing.assert_close(got[:, 2], full[:, 2])
    assert float(torch.cosine_similarity(got[0, 2], left, 0)) > 0.99


def test_a_name_beyond_the_window_is_reached_with_relation_between_window():
    """"circle above of [2 unnamed pieces] star": the star is 4 pieces from "above" (a name whose first piece does
    not name, as "he ##xa ##gon"), 3 from "of". With the window of 3, "of" carries "left" and "above" nothing, as a
    true relation word would; with relation_between_window 4, "above" carries "left", the boxes against it, and "of"
    is unchanged. The reference reads the wider window too."""
    e = None
    got = {}
    for window in (0, 4):
        emb = VLBert(model_config("tiny", updates={**CFG, "relation_between_window": window})).embeddings
        _, terms, candidates, _, boxes, valid = scene(emb)
        e = emb.word_embeddings.weight.detach()
        words = torch.stack([torch.stack([e[30], e[22], e[41], e[42], e[43], e[31]])] * 2)
        relation = torch.tensor([[-1, 2, -1, -1, -1, -1]] * 2)
        with torch.no_grad():
            got[window] = emb.relation_between_terms(words, terms, candidates, valid, boxes, relation)
    left = e[20]
    assert float(got[0][0, 1].abs().max()) == 0.0
    assert float(torch.cosine_similarity(got[4][0, 1], left, 0)) > 0.99
    for window in (0, 4):
        assert float(torch.cosine_similarity(got[window][0, 2], left, 0)) > 0.99
    torch.testing.assert_close(got[0][:, 2], got[4][:, 2])
    bad = {**CFG, "relation_between_window": -1}
    try:
        VLBert(model_config("tiny", updates=bad))
    except ValueError as error:
        assert "relation_between_window" in str(error)
    else:
        raise AssertionError("a negative window was accepted")


def test_the_image_ablated_layout_gives_nothing_and_the_model_moves_only_its_words():
    """Every region the whole image (the control's layout): zeros. In the model, a batch embeds as the model without
    the option plus the terms at the text positions, the regions bit for bit; every gradient finite."""
    emb = VLBert(model_config("tiny", updates=CFG)).embeddings
    words, terms, candidates, boxes, valid = between_words(emb)
    whole = boxes[:, :1].expand_as(boxes)
    with torch.no_grad():
        assert float(emb.relation_between_terms(words, terms, candidates, valid, whole).abs().max()) == 0.0
    torch.manual_seed(0)
    # the random detector's class distributions are near uniform: a class word's cosine with every region's names is
    # ~1/3 (orthonormal word embeddings), an unused word's 0; a threshold between names the class words only
    cfg = {**CFG, "region_word_alignment": 0.2}
    model = VLBertForPretraining(model_config("tiny", updates=cfg))
    used = [*range(8, 18), 20, 21, 22, 23, *range(40, 46)]
    with torch.no_grad():
        model.vl_bert.embeddings.word_embeddings.weight[used] = \
            torch.linalg.qr(torch.randn(32, 32, generator=torch.Generator().manual_seed(0)))[0][:len(used)]
    plain = VLBertForPretraining(model_config("tiny", updates={**cfg, "relation_between": False}))
    plain.load_state_dict(model.state_dict())  # no parameters of its own
    model.eval(), plain.eval()
    batch = make_batch()
    image = {k: batch[k] for k in ("images", "image_sizes", "boxes", "box_mask")}
    # class names (ids 8-17) on both sides of unnamed words, so some word sits between two objects
    ids = batch["input_ids"].clone()
    ids[:, 1:6] = torch.tensor([8, 40, 41, 9, 42])
    ids[1, 2] = 21  # a relation word ("right") between them: its own name left out
    args = (ids, batch["text_mask"], batch["token_type_ids"])
    with torch.no_grad():
        e, p = model.vl_bert.embed(*args, **image), plain.vl_bert.embed(*args, **image)
        t = ids.shape[1]
        assert torch.equal(e.x[:, t:], p.x[:, t:])
        vb = model.vl_bert.embeddings
        real = batch["text_mask"] & (ids != model.cfg.cls_token_id) & (ids != model.cfg.sep_token_id)
        boxes = model.vl_bert.region_features(**image)[1]
        named = ids.unsqueeze(-1) == torch.tensor([i[0] for i in RELATION_IDS])
        relation = torch.where(named.any(-1), named.long().argmax(-1), -1)
        terms = vb.relation_between_terms(vb.word_embeddings(ids), e.region_terms, e.candidates, real, boxes,
                                          relation)
    assert float(terms.abs().max()) > 0  # the batch does exercise the option
    torch.testing.assert_close(e.x[:, :t] - p.x[:, :t], terms, atol=1e-5, rtol=1e-5)
    model.train()
    model.vl_bert(*args, **image).last_hidden_state.square().mean().backward()
    for name, param in model.named_parameters():
        assert param.grad is None or torch.isfinite(param.grad).all(), name


def test_without_the_relation_window_the_option_reads_nothing():
    """A task config sets it for any backbone: one that does not align relation words embeds as without it."""
    torch.manual_seed(0)
    cfg = {**CFG, "relation_alignment_window": 0}
    model = VLBertForPretraining(model_config("tiny", updates=cfg))
    plain = VLBertForPretraining(model_config("tiny", updates={**cfg, "relation_between": False}))
    plain.load_state_dict(model.state_dict())
    model.eval(), plain.eval()
    batch = make_batch()
    args = (batch["input_ids"], batch["text_mask"], batch["token_type_ids"])
    image = {k: batch[k] for k in ("images", "image_sizes", "boxes", "box_mask")}
    with torch.no_grad():
        assert torch.equal(model.vl_bert.embed(*args, **image).x, plain.vl_bert.embed(*args, **image).x)
