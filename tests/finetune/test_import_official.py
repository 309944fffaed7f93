"""The official task checkpoint import. A state dict with the official VQA module's names and shapes (the
released models ran on precomputed features: `obj_downsample` is all of their Fast R-CNN) gives a VQAModel
whose answer logits equal a hand-written reference of the official forward (`vqa/modules/resnet_vlbert_for_vqa.py`:
`prepare_text_from_qa` with a one-[MASK] answer, `FastRCNN` with IMAGE_FEAT_PRECOMPUTED, the whole image as
box 0 with the boxes' mean feature as `vqa/data/datasets/vqa.py` adds it, `final_mlp` of CLASSIFIER_TYPE
'mlm' at the [MASK]) to 1e-5. The same for RefCOCO+ end to end (`refcoco/modules/resnet_vlbert_for_refcoco.py`:
`[CLS] expression [SEP]`, every word with the whole image's obj_rep, `final_mlp` = MVRC transform + linear on
each region's output), reusing the pretraining import's reference of the official Fast R-CNN. And for VCR
(`vcr/modules/resnet_vlbert_for_vcr.py`: TimeDistributed over the 4 candidates, each region's res5 map times its
14x14 segmentation before the pool, words naming an object with its obj_rep, the others with the whole
image's, `final_mlp` "1fc" on the pooler's output). The directories written load as finetuned models."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from finetune.common import load_task_model
from finetune.import_official import VCR_CATEGORIES, import_official_task, load_official_task
from finetune.refcoco import RefTask
from finetune.vcr import VCRTask
from finetune.vqa import VQATask
from tests.model.test_import_official import (
    HEADS,
    H,
    batch,
    coordinate_embeddings,
    layer_norm,
    official_obj_reps,
    official_sequence,
    official_state,
    save,
)

FEAT, ANSWERS, VOCAB = 24, 5, 120  # VOCAB holds BERT's [CLS] 101, [SEP] 102, [MASK] 103
CLS, SEP, MASK = 101, 102, 103


def official_vqa_state(visual_size: int = H, seed: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    body = {k.removeprefix("module."): v for k, v in official_state(visual_size, seed).items()}
    keep = ("vlbert.", "object_linguistic_embeddings.")
    sd = {k: v for k, v in body.items() if k.startswith(keep) and not k.startswith(("vlbert.mlm_head.",
                                                                                     "vlbert.mvrc_head."))}
    sd["vlbert.word_embeddings.weight"] = torch.randn(VOCAB, H, generator=g) * 0.5
    # no CNN: obj_downsample reads the 2048-d coordinate embedding and the precomputed feature
    sd["image_feature_extractor.obj_downsample.1.weight"] = torch.randn(visual_size, 2048 + FEAT, generator=g) * 0.03
    sd["image_feature_extractor.obj_downsample.1.bias"] = torch.randn(visual_size, generator=g) * 0.1
    sd["final_mlp.0.dense.weight"] = torch.randn(H, H, generator=g) * 0.2
    sd["final_mlp.0.dense.bias"] = torch.randn(H, generator=g) * 0.1
    sd["final_mlp.0.LayerNorm.weight"] = 1 + torch.randn(H, generator=g) * 0.1
    sd["final_mlp.0.LayerNorm.bias"] = torch.randn(H, generator=g) * 0.1
    sd["final_mlp.2.weight"] = torch.randn(ANSWERS, H, generator=g) * 0.3
    sd["final_mlp.2.bias"] = torch.randn(ANSWERS, generator=g) * 0.1
    return {"module." + k: v for k, v in sd.items()}


def official_vqa_logits(sd, question, feats, boxes, hw):
    """One question: [CLS] q [SEP] [MASK] [SEP] (segments 0 then 1), words with the whole image's obj_rep,
    objects = whole image + boxes with the object embedding, final_mlp on the [MASK]'s hidden state."""
    h, w = hw
    all_boxes = torch.cat([torch.tensor([[0.0, 0.0, w - 1.0, h - 1.0]]), boxes.double()])
    all_feats = torch.cat([feats.double().mean(0, keepdim=True), feats.double()])
    coords = coordinate_embeddings(torch.cat([all_boxes, torch.tensor([[w, h]] * len(all_boxes)).double()], 1),
                                   256).view(len(all_boxes), -1)
    d = "image_feature_extractor.obj_downsample.1."
    obj = F.relu(torch.cat([coords, all_feats], 1) @ sd[d + "weight"].double().T + sd[d + "bias"].double())
    ids = torch.tensor([CLS, *question, SEP, MASK, SEP])
    types = torch.tensor([0] * (len(question) + 2) + [1, 1])
    hidden = official_sequence(sd, ids, obj[:1], obj, torch.zeros(len(obj), dtype=torch.bool), text_types=types)
    hm = hidden[len(question) + 2]
    t = F.gelu(hm @ sd["final_mlp.0.dense.weight"].double().T + sd["final_mlp.0.dense.bias"].double())
    t = layer_norm(t, sd, "final_mlp.0.LayerNorm")
    return t @ sd["final_mlp.2.weight"].double().T + sd["final_mlp.2.bias"].double()


def answers_file(tmp_path, n=ANSWERS):
    path = tmp_path / "answers_vqa.txt"
    path.write_text("".join(f"answer {i}\n" for i in range(n)))
    return path


def vqa_batch(model, seed=5):
    g = torch.Generator().manual_seed(seed)
    questions = [[7, 30, 44, 9, 60], [12, 50, 3]]
    a_ids = torch.tensor([q + [0] * (5 - len(q)) for q in questions])
    a_mask = torch.tensor([[True] * len(q) + [False] * (5 - len(q)) for q in questions])
    hw = torch.tensor([[240.0, 320.0], [200.0, 280.0]])
    boxes = torch.tensor([[[4, 6, 40, 50], [30, 10, 90, 60], [50, 20, 70, 40]],
                          [[2, 3, 30, 30], [20, 25, 75, 50], [0, 0, 0, 0]]], dtype=torch.float64)
    box_mask = torch.tensor([[True, True, True], [True, True, False]])
    feats = torch.rand(2, 3, FEAT, generator=g, dtype=torch.float64) * 3  # post-ReLU pooled features: >= 0
    batch = {"a_ids": a_ids, "a_mask": a_mask, "b_ids": torch.full((2, 1), MASK),
             "b_mask": torch.ones(2, 1, dtype=torch.bool), "boxes": boxes, "box_mask": box_mask}
    # precomputed features enter as visual_input (appearance, boxes), as a RegionFeatureCache's batches do
    batch["appearance"], batch["boxes_norm"], _ = model.vl_bert.region_features(
        region_features=feats, image_hw=hw, boxes=boxes, box_mask=box_mask)
    return batch, questions, feats, hw


@pytest.mark.parametrize("visual_size", [H, 48])
def test_official_vqa_matches_official_forward(tmp_path, visual_size):
    sd = official_vqa_state(visual_size)
    model, answers, _ = load_official_task(save(tmp_path, sd), "vqa", answers_file(tmp_path), num_attention_heads=HEADS)
    assert model.vl_bert.fast_rcnn is None and model.vl_bert.cfg.region_input == "features"
    assert answers == [f"answer {i}" for i in range(ANSWERS)]
    model = model.double().eval()
    clean = {k.removeprefix("module."): v for k, v in sd.items()}
    batch, questions, feats, hw = vqa_batch(model)
    with torch.no_grad():
        ours = model.logits(batch)
        for b, q in enumerate(questions):
            n = int(batch["box_mask"][b].sum())
            ref = official_vqa_logits(clean, q, feats[b, :n], batch["boxes"][b, :n], hw[b].tolist())
            torch.testing.assert_close(ours[b], ref, atol=1e-5, rtol=0)


def test_official_vqa_directory_loads_as_a_finetuned_model(tmp_path):
    sd = official_vqa_state()
    out = import_official_task(save(tmp_path, sd), "vqa", tmp_path / "vqa", answers_file(tmp_path),
                               num_attention_heads=HEADS)
    task = json.loads((out / "task.json").read_text())
    assert task["answers"][2] == "answer 2" and task["region_input"] == "features"
    loaded, info = load_task_model(out, VQATask.rebuild)  # strict: every tensor has its place
    ref, _, untouched = load_official_task(save(tmp_path, sd), "vqa", answers_file(tmp_path), num_attention_heads=HEADS)
    # not in a VQA checkpoint, drawn afresh at each initialisation; nothing the VQA forward reads
    assert sorted(untouched) == ["vl_bert.embeddings.roi_mask_embedding",
                                 "vl_bert.embeddings.text_only_visual_embedding",
                                 "vl_bert.pooler.dense.bias", "vl_bert.pooler.dense.weight"]
    for k, v in ref.state_dict().items():
        if k not in untouched:
            torch.testing.assert_close(loaded.state_dict()[k], v.float(), atol=0, rtol=0)
    model = loaded.double()
    batch, *_ = vqa_batch(model)
    with torch.no_grad():
        torch.testing.assert_close(model.logits(batch), ref.double().logits(batch), atol=1e-9, rtol=0)


def test_official_vqa_errors_name_what_is_wrong(tmp_path):
    sd = official_vqa_state()
    with pytest.raises(ValueError, match="answers_vqa.txt: 4 answers, the checkpoint's classifier has 5"):
        load_official_task(save(tmp_path, sd), "vqa", answers_file(tmp_path, 4), num_attention_heads=HEADS)
    two_fc = {k: v for k, v in sd.items() if not k.startswith("module.final_mlp.")}
    two_fc["module.final_mlp.1.weight"], two_fc["module.final_mlp.1.bias"] = torch.zeros(64, H), torch.zeros(64)
    two_fc["module.final_mlp.4.weight"], two_fc["module.final_mlp.4.bias"] = torch.zeros(5, 64), torch.zeros(5)
    with pytest.raises(ValueError, match="'2fc'.*final_mlp.1.weight"):
        load_official_task(save(tmp_path, two_fc), "vqa", answers_file(tmp_path), num_attention_heads=HEADS)
    body = {k: v for k, v in sd.items() if not k.startswith("module.final_mlp.")}
    with pytest.raises(ValueError, match="not a task checkpoint"):
        load_official_task(save(tmp_path, body), "vqa", answers_file(tmp_path), num_attention_heads=HEADS)
    with pytest.raises(ValueError, match="needs its answer vocabulary"):
        load_official_task(save(tmp_path, sd), "vqa", num_attention_heads=HEADS)
    with pytest.raises(ValueError, match="'gqa' is not one of"):
        load_official_task(save(tmp_path, sd), "gqa", num_attention_heads=HEADS)


# --- RefCOCO+ -------------------------------------------------------------------------------------------------

def official_task_body(seed: int) -> tuple[dict[str, torch.Tensor], torch.Generator]:
    """An end-to-end task checkpoint's body (no pretraining heads, no mask or text-only embeddings), words up to
    BERT's special ids, and the generator to draw its head from."""
    g = torch.Generator().manual_seed(seed)
    body = {k.removeprefix("module."): v for k, v in official_state(H, seed).items()}
    drop = ("vlbert.mlm_head.", "vlbert.mvrc_head.", "object_mask_word_embedding.", "aux_text_visual_embedding.")
    sd = {k: v for k, v in body.items() if not k.startswith(drop)}
    sd["vlbert.word_embeddings.weight"] = torch.randn(VOCAB, H, generator=g) * 0.5
    return sd, g


def official_refcoco_state(seed: int = 4) -> dict[str, torch.Tensor]:
    sd, g = official_task_body(seed)
    sd["final_mlp.0.dense.weight"] = torch.randn(H, H, generator=g) * 0.2
    sd["final_mlp.0.dense.bias"] = torch.randn(H, generator=g) * 0.1
    sd["final_mlp.2.weight"] = torch.randn(1, H, generator=g) * 0.3
    sd["final_mlp.2.bias"] = torch.randn(1, generator=g) * 0.1
    return {"module." + k: v for k, v in sd.items()}


def test_official_refcoco_matches_official_forward(tmp_path):
    sd = official_refcoco_state()
    model, answers, untouched = load_official_task(save(tmp_path, sd), "refcoco", num_attention_heads=HEADS)
    assert answers is None and model.vl_bert.cfg.region_input == "pixels"
    model = model.double().eval()
    sizes, images, boxes, box_mask, _, _, _ = batch()
    expressions = [[7, 30, 44, 9], [12, 50]]
    a_ids = torch.tensor([e + [0] * (4 - len(e)) for e in expressions])
    a_mask = torch.tensor([[True] * len(e) + [False] * (4 - len(e)) for e in expressions])
    ours_batch = {"a_ids": a_ids, "a_mask": a_mask, "images": images, "image_sizes": torch.tensor(sizes),
                  "boxes": boxes, "box_mask": box_mask}
    clean = {k.removeprefix("module."): v for k, v in sd.items()}
    with torch.no_grad():
        ours = model.logits(ours_batch)
        reps = official_obj_reps(clean, images, sizes, boxes, torch.zeros_like(box_mask))
        for b, e in enumerate(expressions):
            n = int(box_mask[b].sum())
            ids = torch.tensor([CLS, *e, SEP])
            hidden = official_sequence(clean, ids, reps[b][:1], reps[b][: n + 1],
                                       torch.zeros(n + 1, dtype=torch.bool))
            regions = hidden[len(ids): len(ids) + n + 1]
            dense_w, dense_b = clean["final_mlp.0.dense.weight"].double(), clean["final_mlp.0.dense.bias"].double()
            t = F.gelu(regions @ dense_w.T + dense_b)
            ref = (t @ clean["final_mlp.2.weight"].double().T + clean["final_mlp.2.bias"].double()).squeeze(-1)
            # the official model scores the whole image too (ref[0]); ours the candidate regions
            torch.testing.assert_close(ours[b, :n], ref[1:], atol=1e-5, rtol=0)
            assert torch.isinf(ours[b, n:]).all()
    out = import_official_task(save(tmp_path, sd), "refcoco", tmp_path / "refcoco", num_attention_heads=HEADS)
    loaded, info = load_task_model(out, RefTask.rebuild)
    assert info["head"] == "mvrc"
    for k, v in model.state_dict().items():
        if k not in untouched:
            torch.testing.assert_close(loaded.state_dict()[k].double(), v, atol=0, rtol=0)


def test_refcoco_mvrc_head_starts_from_the_pretrained_mrc_transform():
    """head=mvrc in finetuning: the scorer's transform is the pretrained MRC head's (as the official
    PARTIAL_PRETRAIN_PREFIX_CHANGES map it), and a saved task's info rebuilds the same head."""
    from finetune.refcoco import RefConfig
    from model.config import model_config
    from model.vl_bert import VLBertForPretraining

    pretrained = VLBertForPretraining(model_config("tiny", updates={"region_input": "features"}))
    model, info = RefTask.build_module(pretrained, RefConfig(head="mvrc"), None)
    mrc = pretrained.masked_roi_classification.transform.state_dict()
    assert set(model.scorer[0].state_dict()) == set(mrc)
    for k, v in mrc.items():
        assert torch.equal(model.scorer[0].state_dict()[k], v)
    rebuilt = RefTask.rebuild(pretrained.vl_bert, info)
    assert [type(m) for m in rebuilt.scorer] == [type(m) for m in model.scorer]
    with pytest.raises(ValueError, match="head: 'x' is not mlp or mvrc"):
        RefTask.build_module(pretrained, RefConfig(head="x"), None)


# --- VCR ------------------------------------------------------------------------------------------------------

def official_vcr_state(seed: int = 6) -> dict[str, torch.Tensor]:
    """The official VCR module's names: the body under TimeDistributed (`vlbert._module.`) with its pooler, one
    object linguistic embedding, final_mlp "1fc" (Dropout, Linear to 1), cnn_loss_reg (MVRC transform, Dropout,
    Linear over the 81 classes)."""
    sd, g = official_task_body(seed)
    sd["vlbert.pooler.dense.weight"] = torch.randn(H, H, generator=g) * 0.3
    sd["vlbert.pooler.dense.bias"] = torch.randn(H, generator=g) * 0.1
    sd["final_mlp.1.weight"] = torch.randn(1, H, generator=g) * 0.5
    sd["final_mlp.1.bias"] = torch.randn(1, generator=g) * 0.1
    sd["cnn_loss_reg.0.dense.weight"] = torch.randn(H, H, generator=g) * 0.2
    sd["cnn_loss_reg.0.dense.bias"] = torch.randn(H, generator=g) * 0.1
    sd["cnn_loss_reg.2.weight"] = torch.randn(len(VCR_CATEGORIES), H, generator=g) * 0.2
    sd["cnn_loss_reg.2.bias"] = torch.randn(len(VCR_CATEGORIES), generator=g) * 0.1
    return {"module." + ("vlbert._module." + k.removeprefix("vlbert.") if k.startswith("vlbert.") else k): v
            for k, v in sd.items()}


# two questions on the two images of `batch()`: word ids, and the object each word names (-1: none)
VCR_QUESTIONS = [([7, 30, 44, 9], [-1, 0, -1, 2]), ([12, 50, 3], [1, -1, -1])]
VCR_ANSWERS = [[([20, 21], [-1, 1]), ([22], [-1]), ([23, 24, 25], [0, -1, 2]), ([26], [1])],
               [([27, 28], [0, -1]), ([29], [1]), ([31, 32], [-1, -1]), ([33, 34, 35], [-1, 0, 1])]]


def vcr_batch(seed=8):
    sizes, images, boxes, box_mask, _, _, _ = batch()
    g = torch.Generator().manual_seed(seed)
    segms = (torch.rand(2, 3, 14, 14, generator=g) < 0.6).float() * box_mask[:, :, None, None]

    def pad(rows, fill):
        width = max(len(r) for r in rows)
        return torch.tensor([r + [fill] * (width - len(r)) for r in rows]), \
            torch.tensor([[True] * len(r) + [False] * (width - len(r)) for r in rows])

    questions = [q for q in VCR_QUESTIONS for _ in range(4)]  # 4 sequences per question, as VCRSet.batch
    answers = [a for per_question in VCR_ANSWERS for a in per_question]
    a_ids, a_mask = pad([q[0] for q in questions], 0)
    b_ids, b_mask = pad([a[0] for a in answers], 0)
    return {"a_ids": a_ids, "a_mask": a_mask, "a_region": pad([q[1] for q in questions], -1)[0],
            "b_ids": b_ids, "b_mask": b_mask, "b_region": pad([a[1] for a in answers], -1)[0],
            "images": images, "image_sizes": torch.tensor(sizes), "boxes": boxes, "box_mask": box_mask,
            "region_masks": segms}, sizes, segms


def official_vcr_logits(sd, images, sizes, boxes, box_mask, segms):
    """[2, 4]: prepare_text_from_qa's `[CLS] q [SEP] a [SEP]` (segment 1 from the answer through its [SEP]),
    text_tags 0 (the whole image, box 0) for words naming nothing and for [CLS]/[SEP], object o's tag o + 1;
    the 1 + N objects with the one object linguistic embedding; final_mlp on tanh(pooler(h[CLS]))."""
    reps = official_obj_reps(sd, images, sizes, boxes, torch.zeros_like(box_mask), segms)
    out = torch.zeros(2, 4, dtype=torch.float64)
    for b, (q, q_tags) in enumerate(VCR_QUESTIONS):
        n = int(box_mask[b].sum())
        for k, (a, a_tags) in enumerate(VCR_ANSWERS[b]):
            ids = torch.tensor([CLS, *q, SEP, *a, SEP])
            tags = torch.tensor([0, *[t + 1 for t in q_tags], 0, *[t + 1 for t in a_tags], 0])
            types = torch.tensor([0] * (len(q) + 2) + [1] * (len(a) + 1))
            hidden = official_sequence(sd, ids, reps[b][tags], reps[b][: n + 1],
                                       torch.zeros(n + 1, dtype=torch.bool), text_types=types)
            pooled = torch.tanh(hidden[0] @ sd["vlbert.pooler.dense.weight"].double().T
                                + sd["vlbert.pooler.dense.bias"].double())
            out[b, k] = (pooled @ sd["final_mlp.1.weight"].double().T + sd["final_mlp.1.bias"].double())[0]
    return out


def test_official_vcr_matches_official_forward(tmp_path):
    sd = official_vcr_state()
    model, answers, untouched = load_official_task(save(tmp_path, sd), "vcr", num_attention_heads=HEADS)
    assert answers is None and model.settings["head"] == "pooler" and model.settings["candidate_loss"] == "sigmoid"
    model = model.double().eval()
    ours_batch, sizes, segms = vcr_batch()
    clean = {("vlbert." + k.removeprefix("module.vlbert._module.") if k.startswith("module.vlbert._module.")
              else k.removeprefix("module.")): v for k, v in sd.items()}
    with torch.no_grad():
        ours, _ = model.run(ours_batch)
        ref = official_vcr_logits(clean, ours_batch["images"], sizes, ours_batch["boxes"], ours_batch["box_mask"],
                                  segms)
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
        # the masks count: without them the scores move
        unmasked, _ = model.run({k: v for k, v in ours_batch.items() if k != "region_masks"})
        assert (unmasked - ours).abs().max() > 1e-3
    # the training-only object classifier is the MRC head over VCR's 81 classes, its transform without LayerNorm
    assert torch.equal(model.roi_classifier.weight.float(), clean["cnn_loss_reg.2.weight"])
    assert torch.equal(model.roi_transform.dense.weight.float(), clean["cnn_loss_reg.0.dense.weight"])
    assert isinstance(model.roi_transform.LayerNorm, torch.nn.Identity)
    out = import_official_task(save(tmp_path, sd), "vcr", tmp_path / "vcr", num_attention_heads=HEADS)
    loaded, info = load_task_model(out, VCRTask.rebuild)  # strict: every tensor has its place
    assert info["object_classes"] == VCR_CATEGORIES and info["data"]["segmentation_masks"] is True
    for k, v in model.state_dict().items():
        if k not in untouched:
            torch.testing.assert_close(loaded.state_dict()[k].double(), v, atol=0, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(loaded.double().run(ours_batch)[0], ours, atol=1e-9, rtol=0)


def test_official_vcr_two_fc_head_is_refused_by_name(tmp_path):
    sd = {k: v for k, v in official_vcr_state().items() if not k.startswith("module.final_mlp.")}
    sd["module.final_mlp.1.weight"], sd["module.final_mlp.1.bias"] = torch.zeros(64, H), torch.zeros(64)
    sd["module.final_mlp.4.weight"], sd["module.final_mlp.4.bias"] = torch.zeros(1, 64), torch.zeros(1)
    with pytest.raises(ValueError, match="not the official vcr head.*'1fc'.*final_mlp.4.weight"):
        load_official_task(save(tmp_path, sd), "vcr", num_attention_heads=HEADS)
