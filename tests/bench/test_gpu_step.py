"""bench.gpu_step's pieces on CPU: its synthetic collated batches go through the real masker into the real model at
the requested shapes, and its utilisation figures by hand."""

import pytest
import torch

from bench.gpu_step import collated_batch, summarise
from model.config import model_config
from model.vl_bert import VLBertForPretraining
from pretrain.masking import MaskingConfig, PretrainMasker
from pretrain.tasks import LossConfig, VLBertPretraining
from shards.tokenizer import load_tokenizer


def test_synthetic_batches_have_the_requested_shapes_and_train():
    tok = load_tokenizer(None)
    batch = collated_batch(3, tok, captions=2, texts=3, caption_tokens=5, text_tokens=9, regions=4, height=70,
                           width=100, num_classes=9)
    c = batch["caption"]
    assert c["images"].shape == (2, 3, 96, 128) and c["image_sizes"].tolist() == [[70, 100]] * 2  # padded to 32
    assert c["boxes"].shape == (2, 4, 4) and (c["boxes"][..., 2:] > c["boxes"][..., :2]).all()
    assert (c["boxes"][..., 2] <= 99).all() and (c["boxes"][..., 3] <= 69).all()
    assert batch["text"]["input_ids"].shape == (3, 9) and int(batch["caption"]["input_ids"].min()) >= 1999
    assert torch.equal(collated_batch(3, tok, captions=2, texts=3, caption_tokens=5, text_tokens=9, regions=4,
                                      height=70, width=100, num_classes=9)["caption"]["images"], c["images"])
    masked = PretrainMasker(MaskingConfig(), tok, cls_id=101, sep_id=102, mask_id=103, num_classes=9)(batch)
    assert masked["caption"]["input_ids"].shape == (2, 7)  # [CLS] 5 words [SEP]
    cfg = model_config("tiny", updates={"vocab_size": 30522, "fast_rcnn": {"roi_output_size": 4}})
    loss, _ = VLBertPretraining(VLBertForPretraining(cfg), LossConfig())(masked)
    loss.backward()
    assert torch.isfinite(loss)


def test_utilisation_by_hand():
    r = {"samples_per_step": 16, "flops_per_step": {"transformer": 2e12, "cnn": 6e12},
         "seconds_per_step": {"plain": [0.1, 0.2, 0.3], "cnn": [0.05, 0.06, 0.07], "peer": [0.09, 0.09, 0.09],
                              "ours": [0.4, 0.4, 0.4], "ours_zero0": [0.5, 0.25, 0.3],
                              "cnn_folded": [0.04, 0.05, 0.03]}}
    s = summarise(r, peak=1e15)
    assert s["mfu_plain"] == pytest.approx(8e12 / 0.2 / 1e15)
    assert s["mfu_cnn"] == pytest.approx(6e12 / 0.06 / 1e15)
    assert s["mfu_transformer"] == pytest.approx(2e12 / 0.14 / 1e15)
    assert s["cnn_ours_over_peer_speed"] == pytest.approx(0.09 / 0.06)
    assert s["ours_over_plain_speed"] == pytest.approx(0.5) and s["samples_per_s_plain"] == pytest.approx(80)
    assert s["ours_zero0_over_plain_speed"] == pytest.approx(0.2 / 0.3)
    assert s["cnn_folded_over_cnn_speed"] == pytest.approx(0.06 / 0.04)
