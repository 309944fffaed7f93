"""GPU readiness, checked on CPU: a pretraining step in DeepSpeed's bf16 mode, no host syncs in the
step, and the transformer under torch.compile."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from model.config import FastRCNNConfig, model_config
from model.fast_rcnn import real_rois
from model.vl_bert import VLBertForPretraining
from pretrain.detector import DetectorWarmup
from pretrain.masking import MaskingConfig, PretrainMasker
from pretrain.tasks import LossConfig, VLBertPretraining, masked_roi_attribute_loss
from shards.tokenizer import load_tokenizer

from .test_masking import caption_batch


def tiny_module(**updates) -> VLBertPretraining:
    cfg = model_config("tiny", updates={"vocab_size": 30522, "cls_token_id": 101, "sep_token_id": 102,
                                        "mask_token_id": 103, "visual_ln_init": 1.0,
                                        "fast_rcnn": {"roi_output_size": 4}, **updates})
    torch.manual_seed(0)
    return VLBertPretraining(VLBertForPretraining(cfg), LossConfig())


def caption_words(tok) -> dict:
    batch = caption_batch(b=4, n=6)["caption"]
    words = tok(["a small red star above a blue circle", "two large green squares"] * 2, add_special_tokens=False,
                padding=True, return_tensors="pt")
    return {**batch, "input_ids": words["input_ids"], "attention_mask": words["attention_mask"].bool()}


def pretraining_batch(mrc: bool = True) -> dict:
    """What the data workers hand the step: masked captions with images and boxes, and text samples."""
    tok = load_tokenizer(None)
    batch = caption_batch(b=4, n=6)
    batch["caption"] = caption_words(tok)
    text = tok(["the keeper carried a lamp", "she painted the old door green"] * 2, add_special_tokens=False,
               padding=True, return_tensors="pt")
    batch["text"] = {"keys": ["t0", "t1", "t2", "t3"], "input_ids": text["input_ids"],
                     "attention_mask": text["attention_mask"].bool()}
    masker = PretrainMasker(MaskingConfig(mlm_probability=0.3, mrc_probability=0.3), tok, cls_id=101, sep_id=102,
                            mask_id=103, num_classes=9, mrc=mrc)
    return masker(batch)


def test_step_in_deepspeed_bf16_mode():
    """DeepSpeed's bf16 casts the module (not the inputs, no autocast): uint8 images, fp32 boxes and
    fp16 class distributions must all meet bf16 weights without a dtype error, and give finite gradients."""
    module = tiny_module().eval()  # no dropout: the two precisions see the same function
    batch = pretraining_batch()
    with torch.no_grad():
        ref, _ = module(batch)
    module.to(torch.bfloat16)
    loss, metrics = module(batch)
    loss.backward()
    loss = loss.detach()
    assert torch.isfinite(loss) and abs(float(loss) - float(ref)) < 0.05 * float(ref)
    for name, p in module.named_parameters():
        if p.requires_grad and p.grad is not None:
            assert p.grad.dtype == torch.bfloat16 and torch.isfinite(p.grad.float()).all(), name
    assert module.model.vl_bert.fast_rcnn.backbone.layer2[0].conv1.weight.grad.abs().sum() > 0  # res3: res2 is frozen


# aten ops that wait for the device: a Python scalar out of a tensor, or an output shape that depends
# on the data (boolean indexing goes through nonzero)
SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive",
           "is_nonzero", "equal", "allclose"}


class SyncCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        bool_index = name in ("index", "index_put", "index_put_", "_index_put_impl_") and any(
            t is not None and t.dtype == torch.bool for t in args[1])
        if name in SYNCING or bool_index or (name == "repeat_interleave" and "output_size" not in (kwargs or {})):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_step_has_no_host_sync():
    """Forward, loss, backward and the logged metrics of a pretraining step: no op that would make a
    GPU wait for the host. The counter is checked against an op that does sync."""
    module = tiny_module().train()
    batch = pretraining_batch()
    with SyncCounter() as counter:
        loss, metrics = module(batch)
        loss.backward()
    assert counter.seen == []
    with SyncCounter() as counter:
        float(loss)
        torch.ones(3)[torch.tensor([True, False, True])]
    assert len(counter.seen) == 2


def test_pretraining_step_computes_res5_on_the_real_boxes_alone():
    """The masker hands the step `roi_index` (real_rois of the images' box mask after its element budget, once for
    every word view): res5 runs on the whole-image boxes and the real boxes alone, and the step's loss, metrics and
    gradients are those of the same step computing every padded box (frozen norms: a padded box changes no real
    one). Precomputed features take no index."""
    tok = load_tokenizer(None)
    module = tiny_module().eval()  # no dropout, standardiser statistics fixed: the two steps see the same function
    captions = caption_words(tok)
    captions["box_mask"] = torch.tensor([[True] * 6, [True] * 3 + [False] * 3, [True] + [False] * 5, [True] * 6])
    masker = PretrainMasker(MaskingConfig(mlm_probability=0.3, mrc_probability=0.5, word_views=2), tok, cls_id=101,
                            sep_id=102, mask_id=103, num_classes=9)
    c = masker.caption(captions, torch.Generator().manual_seed(4))
    assert torch.equal(c["roi_index"], real_rois(c["box_mask"][:4]))
    assert c["roi_index"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 14, 15, 21, 22, 23, 24, 25, 26, 27]
    rows = []
    handle = module.model.vl_bert.fast_rcnn.box_head.register_forward_hook(lambda m, a, o: rows.append(a[0].shape[0]))
    runs = {}
    for name, batch in (("index", {"caption": c}), ("every box", {"caption": {k: v for k, v in c.items()
                                                                            if k != "roi_index"}})):
        module.zero_grad(set_to_none=True)
        loss, metrics = module(batch)
        loss.backward()
        runs[name] = loss.detach(), metrics, {n: p.grad.clone() for n, p in module.named_parameters()
                                              if p.grad is not None}
    handle.remove()
    assert rows == [4 + 16, 4 * 7]  # whole images + real boxes, then every box
    (loss, metrics, grads), (ref, ref_metrics, ref_grads) = runs["index"], runs["every box"]
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for key in ref_metrics:
        torch.testing.assert_close(metrics[key], ref_metrics[key], rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys() and any(n.startswith("model.vl_bert.fast_rcnn.") for n in grads)
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-4, atol=1e-6, msg=n)
    features = masker.caption({**{k: v for k, v in captions.items() if k not in ("images", "image_sizes")},
                               "region_features": torch.zeros(4, 6, 8), "image_hw": torch.full((4, 2), 128)},
                              torch.Generator().manual_seed(4))
    assert "roi_index" not in features


def test_detector_warmup_step_has_no_host_sync():
    """The warm-up's step with the loader's `roi_index` (res5 on the real boxes alone): indexing by a host-built
    index is no sync, where computing it in the step (a boolean mask's nonzero) would be one."""
    torch.manual_seed(0)
    module = DetectorWarmup(FastRCNNConfig(backbone="resnet18", num_classes=3, freeze_stem=False, freeze_res2=False,
                                           roi_output_size=4, norm="batch"), num_attributes=2, attribute_weight=0.5)
    mask = torch.tensor([[True, True], [True, False]])
    batch = {"images": torch.randint(0, 255, (2, 3, 64, 64), dtype=torch.uint8),
             "image_sizes": torch.tensor([[64, 64], [64, 64]]),
             "boxes": torch.tensor([[[4.0, 4.0, 30.0, 30.0], [10.0, 20.0, 60.0, 50.0]],
                                    [[8.0, 8.0, 40.0, 24.0], [0.0, 0.0, 0.0, 0.0]]]),
             "box_mask": mask, "labels": torch.tensor([[1, 2], [2, -100]]),
             "attributes": torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 0.0]]]),
             "roi_index": real_rois(mask)}
    with SyncCounter() as counter:
        loss, _ = module(batch)
        loss.backward()
    assert counter.seen == []
    with SyncCounter() as counter:
        real_rois(mask)  # why the loader builds it
    assert counter.seen == ["aten.nonzero.default"]


def test_compiled_transformer_matches_eager():
    module = tiny_module().eval()
    eager_module = tiny_module().eval()
    module.model.vl_bert.encoder.compile(dynamic=False)
    batch = pretraining_batch()
    with torch.no_grad():
        _, eager = eager_module(batch)
        _, compiled = module(batch)
    for key in ("loss/mlm_caption", "loss/mrc", "loss/mlm_text"):
        torch.testing.assert_close(compiled[key], eager[key], atol=1e-4, rtol=1e-4)
    assert module.model.vl_bert.encoder._compiled_call_impl is not None  # it really ran compiled


def test_a_step_without_mrc_is_the_mlm_losses_alone_and_leaves_the_mrc_head_untouched():
    """losses.mrc_weight: 0: the step computes no MRC head (no gradient, no metric) and its loss is the two MLM
    cross-entropies, recomputed here from the model's own outputs."""
    module = tiny_module().eval()
    module.losses = LossConfig(mrc_weight=0.0)
    batch = pretraining_batch(mrc=False)
    loss, metrics = module(batch)
    loss.backward()
    assert "loss/mrc" not in metrics and "acc/mrc" not in metrics
    assert all(p.grad is None for p in module.model.masked_roi_classification.parameters())
    expected = 0.0
    for part in ("caption", "text"):
        x = batch[part]
        visual = {"boxes": x["boxes"], "box_mask": x["box_mask"], "masked_regions": x["masked_regions"],
                  "images": x["images"], "image_sizes": x["image_sizes"]} if part == "caption" else {}
        with torch.no_grad():
            hidden = module.model(x["input_ids"], x["text_mask"], x["token_type_ids"], **visual).text_hidden
            logits = module.model.mlm_head(hidden.flatten(0, 1)[x["mlm_positions"]])
        expected += torch.nn.functional.cross_entropy(logits, x["mlm_labels"])
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-5)


def test_masked_roi_attribute_loss_by_hand():
    """Uniform head logits over 2 attributes cost ln 2 whatever the target; a confident head pays -log of its
    probability times the target's mass; an invisible row counts for nothing, and the count says so (none visible:
    means of 0 over a count of 0)."""
    target = torch.tensor([[0.25, 0.75], [0.25, 0.75], [5 / 6, 1 / 6]])
    head = torch.tensor([[0.0, 0.0], [0.0, 2.0], [9.0, -9.0]])
    loss, hits, n = masked_roi_attribute_loss(head, target, torch.tensor([True, True, False]))
    assert n.item() == 2
    assert [t.item() for t in masked_roi_attribute_loss(head, target, torch.zeros(3, dtype=torch.bool))] == [0, 0, 0]
    second = -(0.25 * torch.log(torch.tensor(1 / (1 + torch.e ** 2))) + 0.75 * torch.log(torch.tensor(
        torch.e ** 2 / (1 + torch.e ** 2))))
    torch.testing.assert_close(loss, (torch.log(torch.tensor(2.0)) + second) / 2)
    torch.testing.assert_close(hits, torch.tensor(0.5))  # row 0 ties (argmax 0, target 1), row 1 agrees


def test_mrc_attribute_target_is_the_detectors_colour_on_visible_regions_only():
    """losses.mrc_attribute_weight: the head's attribute logits at the chosen regions that kept their pixels,
    scored against the Fast R-CNN's attribute distribution of their appearance (recomputed here through
    `region_features` and torch's soft-label cross-entropy), added at its weight; the detector's own attribute
    head gets no gradient from it; no host sync."""
    tok = load_tokenizer(None)
    module = tiny_module(mrc_attributes=True, fast_rcnn={"roi_output_size": 4, "num_attributes": 3}).eval()
    module.losses = LossConfig(mrc_attribute_weight=0.5)
    batch = pretraining_batch()
    masker = PretrainMasker(MaskingConfig(mlm_probability=0.3, mrc_probability=0.6, mrc_zero_fraction=0.5), tok,
                            cls_id=101, sep_id=102, mask_id=103, num_classes=9)
    captions = caption_words(tok)  # pixels that differ, so the targets do
    captions["images"] = torch.randint(0, 256, captions["images"].shape, dtype=torch.uint8,
                                       generator=torch.Generator().manual_seed(1))
    batch["caption"] = masker.caption(captions, torch.Generator().manual_seed(3))
    with SyncCounter() as counter:
        loss, metrics = module(batch)
        loss.backward()
    assert counter.seen == []
    c = batch["caption"]
    visible = ~c["masked_regions"].flatten()[c["mrc_positions"]]
    assert 0 < int(visible.sum()) < visible.numel()  # both kinds present: the zeroed ones must not count
    vl = module.model.vl_bert
    with torch.no_grad():
        appearance, _, _ = vl.region_features(images=c["images"], image_sizes=c["image_sizes"], boxes=c["boxes"],
                                              box_mask=c["box_mask"], masked_regions=c["masked_regions"])
        target = vl.fast_rcnn.attribute_classifier(appearance[:, 1:]).flatten(0, 1)[c["mrc_positions"]].softmax(-1)
        out = module.model(c["input_ids"], c["text_mask"], c["token_type_ids"], boxes=c["boxes"],
                           box_mask=c["box_mask"], masked_regions=c["masked_regions"], images=c["images"],
                           image_sizes=c["image_sizes"])
        logits = module.model.masked_roi_classification.attributes(
            out.region_hidden[:, 1:].flatten(0, 1)[c["mrc_positions"]])
    expected = torch.nn.functional.cross_entropy(logits[visible], target[visible])
    torch.testing.assert_close(metrics["loss/mrc_attribute"], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss.detach(), metrics["loss/mlm_caption"] + metrics["loss/mrc"]
                               + metrics["loss/mlm_text"] + 0.5 * expected, rtol=1e-5, atol=1e-5)
    assert module.model.masked_roi_classification.attribute_classifier.weight.grad.abs().sum() > 0
    assert vl.fast_rcnn.attribute_classifier.weight.grad is None


def test_stored_attribute_targets_are_the_shards_distributions_of_the_visible_chosen_regions():
    """losses.mrc_attribute_targets: shards: the targets are the per-box attribute distributions the batch carries
    (a box file's attribute_probs), gathered at the chosen regions with their views, scored on the visible ones
    (torch's soft-label cross-entropy); the detector's attribute head is not run (no gradient reaches it either
    way) and nothing syncs. Without stored distributions the step refuses, naming the shards' member."""
    tok = load_tokenizer(None)
    module = tiny_module(mrc_attributes=True, fast_rcnn={"roi_output_size": 4, "num_attributes": 3}).eval()
    module.losses = LossConfig(mrc_attribute_weight=0.5, mrc_attribute_targets="shards")
    batch = pretraining_batch()
    masker = PretrainMasker(MaskingConfig(mlm_probability=0.3, mrc_probability=0.6, mrc_zero_fraction=0.5,
                                          word_views=2), tok, cls_id=101, sep_id=102, mask_id=103, num_classes=9)
    captions = caption_words(tok)
    with pytest.raises(ValueError, match="attrs.npy"):
        module({**batch, "caption": masker.caption(captions, torch.Generator().manual_seed(3))})
    stored = torch.softmax(torch.randn(4, 6, 3, generator=torch.Generator().manual_seed(5)), -1).half()
    batch["caption"] = masker.caption({**captions, "attribute_probs": stored}, torch.Generator().manual_seed(3))
    c = batch["caption"]
    chosen = c["mrc_positions"][: len(c["mrc_positions"]) // 2]  # the first view's, into [B * N]
    torch.testing.assert_close(c["mrc_attribute_probs"], stored.flatten(0, 1)[chosen].float().repeat(2, 1))
    called = []
    handle = module.model.vl_bert.fast_rcnn.attribute_classifier.register_forward_hook(lambda *a: called.append(1))
    with SyncCounter() as counter:
        loss, metrics = module(batch)
        loss.backward()
    handle.remove()
    assert counter.seen == [] and called == []
    visible = ~c["masked_regions"].flatten()[c["mrc_positions"]]
    assert 0 < int(visible.sum()) < visible.numel()
    with torch.no_grad():
        out = module.model(c["input_ids"], c["text_mask"], c["token_type_ids"], boxes=c["boxes"],
                           box_mask=c["box_mask"], masked_regions=c["masked_regions"], images=c["images"],
                           image_sizes=c["image_sizes"])
        logits = module.model.masked_roi_classification.attributes(
            out.region_hidden[:, 1:].flatten(0, 1)[c["mrc_positions"]])
    expected = torch.nn.functional.cross_entropy(logits[visible], c["mrc_attribute_probs"][visible])
    torch.testing.assert_close(metrics["loss/mrc_attribute"], expected, rtol=1e-5, atol=1e-6)
    assert metrics["loss/mrc_attribute#weight"].item() == metrics["acc/mrc_attribute#weight"].item() == visible.sum()
