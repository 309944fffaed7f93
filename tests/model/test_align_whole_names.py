"""`align_whole_names`: a name the tokenizer cuts into pieces ("he ##xa ##gon") aligns as the name. Checked by hand:
which positions an occurrence covers, what each piece is read as, and what a relation word's landmark becomes when no
piece of the name aligns by itself."""

import pytest
import torch

from model.config import model_config
from model.vl_bert import VLBert, VLBertForPretraining

from .conftest import make_batch
from .test_relation_alignment import WORDS_CFG, scene

# the star's name in three pieces ("st ##a ##r"); the scene's star region is given their mean as its class name
STAR = [46, 31, 47]
CFG = {**WORDS_CFG, "region_class_words": [[8], [9], [10], STAR, [13], [14], [15], [16], [17]],
       "relation_alignment_window": 3}
WHOLE = {**CFG, "align_whole_names": True}  # the option builds `name_pieces`' table


def test_name_pieces_marks_each_occurrence_of_a_multi_piece_name_by_hand():
    """Ids "[CLS] 46 31 47 7 46 31 9 46": occurrences only where all three pieces follow in order (from 1); the
    46 31 at 5 and the 46 at 8 are none; one-piece names (8, 9, ...) cover nothing."""
    emb = VLBert(model_config("tiny", updates=WHOLE)).embeddings
    ids = torch.tensor([[1, 46, 31, 47, 7, 46, 31, 9, 46], [1, 8, 9, 31, 47, 46, 31, 47, 2]])
    got = emb.name_pieces(ids)
    expected = torch.zeros(2, 9, 9, dtype=torch.bool)
    expected[0, 1, 1:4] = True
    expected[1, 5, 5:8] = True
    assert torch.equal(got, expected)
    one_piece = VLBert(model_config("tiny", updates={**WHOLE, "region_class_words": WORDS_CFG["region_class_words"]}))
    assert one_piece.embeddings.name_pieces(ids) is None
    assert VLBert(model_config("tiny", updates=CFG)).embeddings.name_pieces(ids) is None  # the option off


def test_each_piece_is_read_as_its_names_mean_by_hand():
    words = torch.arange(2 * 5 * 3, dtype=torch.float).view(2, 5, 3)
    pieces = torch.zeros(2, 5, 5, dtype=torch.bool)
    pieces[0, 1, 1:4] = True  # row 0: positions 1-3 one name
    emb = VLBert(model_config("tiny", updates=CFG)).embeddings
    got = emb.whole_name_words(words, pieces)
    expected = words.clone()
    expected[0, 1:4] = words[0, 1:4].mean(0)
    torch.testing.assert_close(got, expected)
    assert emb.whole_name_words(words, None) is words


def aligned_scene(emb):
    """scene()'s layout (a circle left of a star, a square above it; every region red) with the star's class name the
    mean of its three pieces, each piece orthonormal to the others and to every word used; a threshold at which a
    piece alone (cosine 1/sqrt(3) with the name) does not name and the whole name (cosine 1) does."""
    _, terms, candidates, _, boxes, valid = scene(emb)
    basis = torch.linalg.qr(torch.randn(32, 32, generator=torch.Generator().manual_seed(0)))[0]
    with torch.no_grad():
        emb.word_embeddings.weight[[46, 47]] = basis[14:16]  # scene() uses basis rows 0-13
    e = emb.word_embeddings.weight.detach()
    classes = terms[0].clone()
    classes[:, 2] = e[STAR].mean(0)
    return e, [classes[:1], terms[1][:1]], candidates[:1], boxes[:1], valid[:1]


def test_a_name_no_piece_of_which_names_aligns_whole_and_is_a_landmark():
    """"[M] right of red st ##a ##r" at threshold 0.6: no piece names by itself (mass < 0.5 each), so the run after
    "right" is "red" alone, every region alike, and "right" aligns to the star and the square (what is right of
    the circle), the star itself among them; read whole, each piece names the star (> 0.9), the run is
    "red st ##a ##r", the star, and "right" aligns to nothing: no region is right of the star."""
    emb = VLBert(model_config("tiny", updates={**WHOLE, "region_word_alignment": 0.6})).embeddings
    e, terms, candidates, boxes, valid = aligned_scene(emb)
    ids = torch.tensor([[40, 21, 41, 33, *STAR]])
    sentence = e[ids]
    relation = torch.tensor([[-1, 1, -1, -1, -1, -1, -1]])
    valid = torch.ones(1, 7, dtype=torch.bool)
    whole = emb.whole_name_words(sentence, emb.name_pieces(ids))
    with torch.no_grad():
        split_own = emb.alignment_weights(sentence, terms, candidates)
        whole_own = emb.alignment_weights(whole, terms, candidates)
        assert float(split_own[0, 4:].sum(-1).max()) < 0.5
        assert float(whole_own[0, 4:, 2].min()) > 0.9
        split_after, _ = emb.relation_anchors(split_own, candidates, valid, relation)
        whole_after, _ = emb.relation_anchors(whole_own, candidates, valid, relation)
        torch.testing.assert_close(split_after[0, 1, 1:], torch.full((3,), 1 / 3), atol=1e-3, rtol=0)
        assert float(whole_after[0, 1, 2]) > 0.99
        split = emb.alignment_weights(sentence, terms, candidates, relations=(relation, boxes, valid))
        got = emb.alignment_weights(whole, terms, candidates, relations=(relation, boxes, valid))
    assert float(split[0, 1, 2:].sum()) > 0.9  # right of the circle, from the anchor's third on it
    assert float(got[0, 1].sum()) < 0.01


def test_the_option_moves_only_the_text_and_only_with_a_split_name_in_the_model():
    """In the model: a batch with no split name embeds exactly as without the option; with "st ##a ##r" the text
    moves at the name's pieces, the regions do not (no region takes words here); gradients finite; no parameters."""
    torch.manual_seed(0)
    model = VLBertForPretraining(model_config("tiny", updates={**CFG, "align_whole_names": True}))
    plain = VLBertForPretraining(model_config("tiny", updates=CFG))
    plain.load_state_dict(model.state_dict())
    model.eval(), plain.eval()
    batch = make_batch()
    image = {k: batch[k] for k in ("images", "image_sizes", "boxes", "box_mask")}
    ids = batch["input_ids"].clone()
    ids[:, 1:4] = torch.tensor([20, 40, 9])  # "left [M] circle": one-piece names only
    args = (ids, batch["text_mask"], batch["token_type_ids"])
    with torch.no_grad():
        assert torch.equal(model.vl_bert.embed(*args, **image).x, plain.vl_bert.embed(*args, **image).x)
    ids[:, 4:7] = torch.tensor(STAR)
    args = (ids, batch["text_mask"], batch["token_type_ids"])
    with torch.no_grad():
        e, p = model.vl_bert.embed(*args, **image), plain.vl_bert.embed(*args, **image)
    t = ids.shape[1]
    moved = (e.x[:, :t] - p.x[:, :t]).abs().amax(-1)  # [B, T]
    assert float(moved[:, 4:7].amin()) > 0.0
    assert float(moved[:, :4].max()) == 0.0
    assert torch.equal(e.x[:, t:], p.x[:, t:])
    model.train()
    model.vl_bert(*args, **image).last_hidden_state.square().mean().backward()
    for name, param in model.named_parameters():
        assert param.grad is None or torch.isfinite(param.grad).all(), name


@pytest.mark.parametrize("value", [True, False])
def test_the_option_is_a_config_field(value):
    assert model_config("tiny", updates={**CFG, "align_whole_names": value}).align_whole_names is value
