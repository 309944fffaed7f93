"""Precomputed region features: the feature shards (pretrain/features.py), reading them, pretraining and
the cross-modal diagnostic on a model that reads them (`region_input: features`)."""

import io
import json
import tarfile

import numpy as np
import pytest
import torch

from diagnostics.ablation import feature_extractor
from diagnostics.conditions import Ablator, evaluate
from diagnostics.data import PhraseData
from model.boxes import normalise
from model.config import model_config
from model.export import load_config_dir, save_pretrained
from model.fast_rcnn import FastRCNN
from model.vl_bert import VLBertForPretraining
from pretrain.features import write_features
from pretrain.masking import MaskingConfig, PretrainMasker
from pretrain.tasks import LossConfig, VLBertPretraining
from shards.caption_inputs import expand_paths
from shards.collate import collate_captions
from shards.decode import CaptionDecoder
from shards.reader import StreamConfig
from shards.region_features import FeatureExtractor
from shards.tokenizer import load_tokenizer

IDS = {"vocab_size": 30522, "cls_token_id": 101, "sep_token_id": 102, "mask_token_id": 103}


def _extractor_cfg(tmp_path):
    """The tiny config's ResNet-18 Fast R-CNN, seeded, saved as a weights file (an extractor needs one)."""
    cfg = model_config("tiny", updates={"fast_rcnn": {"roi_output_size": 4}}).fast_rcnn
    torch.manual_seed(0)
    path = tmp_path / "fast_rcnn.pt"
    torch.save(FastRCNN(cfg).state_dict(), path)
    cfg.weights = str(path)
    return cfg


def _records(paths):
    for path in paths:
        with tarfile.open(path) as tar:
            members = {}
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                members.setdefault(key, {"__key__": key})[ext] = tar.extractfile(m).read()
            yield from members.values()


@pytest.fixture(scope="module")
def feature_shards(demo_corpus, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("features")
    fr = _extractor_cfg(tmp)
    data = StreamConfig(short_side=64, long_side=96, max_regions=3)
    inputs = expand_paths(str(demo_corpus / "shards/captions-train/*.tar"))
    # batch 1: an image's features then do not depend on how far its batch pads it
    manifest = write_features(inputs, tmp / "out", FeatureExtractor(fr), CaptionDecoder(data), batch_size=1,
                              samples_per_shard=16, meta={"extractor": fr.weights})
    return inputs, tmp / "out", manifest, fr, data


def test_feature_shards_hold_the_extractors_features_of_the_kept_boxes(feature_shards):
    inputs, out, manifest, fr, data = feature_shards
    originals = {r["__key__"]: r for r in _records(inputs)}
    written = list(_records(sorted(out.glob("*.tar"))))
    assert manifest["total"] == len(written) == len(originals) and len(manifest["shards"]) > 1
    assert manifest["features"] == {"extractor": fr.weights, "feature_size": 512}
    model = FastRCNN(fr).eval()
    decode = CaptionDecoder(data)
    truncated = 0
    for rec in written:
        original = decode(originals[rec["__key__"]])
        sample = decode(rec)
        n = len(original["boxes"])
        truncated += len(json.loads(originals[rec["__key__"]]["json"])["boxes"]) > n
        assert sample["region_features"].shape == (n, 512) and len(sample["boxes"]) == n
        one = collate_captions([original])  # padded to the size divisibility, as the reader pads it
        with torch.no_grad():  # the detector on this one image and its kept boxes
            direct = model(one["images"], one["image_sizes"], one["boxes"], one["box_mask"])["appearance"][0, 1:]
        assert torch.allclose(sample["region_features"], direct, rtol=2e-3, atol=2e-3)  # stored as float16
        # boxes in the original image's pixels, normalised by its size, are the resized boxes normalised
        hw = torch.tensor([sample["image_hw"]])
        resized_hw = torch.tensor([original["image"].shape[1:]])
        assert torch.allclose(normalise(sample["boxes"][None], hw), normalise(original["boxes"][None], resized_hw),
                              atol=0.02)
        assert torch.equal(sample["classes"], original["classes"]) and torch.equal(sample["input_ids"],
                                                                                   original["input_ids"])
        assert torch.equal(sample["class_probs"], original["class_probs"])
        assert sample["attribute_probs"] is not None and torch.equal(sample["attribute_probs"],
                                                                     original["attribute_probs"])
    assert truncated  # some images had more than max_regions boxes: the kept ones were stored


def test_bad_feature_members_and_mixed_batches_are_errors(feature_shards):
    _, out, _, _, data = feature_shards
    rec = next(iter(_records(sorted(out.glob("*.tar")))))
    buf = io.BytesIO()
    np.save(buf, np.zeros((7, 512), np.float16))
    with pytest.raises(ValueError, match=r"shape \[7, 512\], the JSON has \d+ boxes"):
        CaptionDecoder(data)({**rec, "feats.npy": buf.getvalue()})
    with_features = CaptionDecoder(data)(rec)
    with_image = dict(with_features, image=torch.zeros(3, 8, 8, dtype=torch.uint8))
    del with_image["region_features"], with_image["image_hw"]
    with pytest.raises(ValueError, match="mixes samples with images and samples with precomputed features"):
        collate_captions([with_features, with_image])
    model = VLBertForPretraining(model_config("tiny", updates={**IDS, "region_input": "features"}))
    b = collate_captions([with_features])
    with pytest.raises(ValueError, match="region features are 512-d, the model's precomputed_feature_size is 24"):
        model(b["input_ids"], b["attention_mask"], boxes=b["boxes"], box_mask=b["box_mask"],
              region_features=b["region_features"], image_hw=b["image_hw"])


def test_a_features_model_has_no_detector_and_its_export_keeps_the_extractor(tmp_path):
    fr = _extractor_cfg(tmp_path)
    cfg = model_config("tiny", updates={**IDS, "region_input": "features", "precomputed_feature_size": 512,
                                        "fast_rcnn": {"roi_output_size": 4, "weights": fr.weights}})
    model = VLBertForPretraining(cfg)
    assert model.vl_bert.fast_rcnn is None and not any("fast_rcnn" in k for k in model.state_dict())
    save_pretrained(model.state_dict(), cfg, tmp_path / "features")
    assert load_config_dir(tmp_path / "features").fast_rcnn.weights == fr.weights
    assert isinstance(feature_extractor(model).model, FastRCNN)
    pixels = model_config("tiny", updates={**IDS, "fast_rcnn": {"roi_output_size": 4, "weights": fr.weights}})
    save_pretrained(VLBertForPretraining(pixels).state_dict(), pixels, tmp_path / "pixels")
    assert load_config_dir(tmp_path / "pixels").fast_rcnn.weights is None  # its weights are in the export
    assert feature_extractor(VLBertForPretraining(pixels)) is None
    with pytest.raises(ValueError, match="region_input: 'boxes' is not 'pixels' or 'features'"):
        VLBertForPretraining(model_config("tiny", updates={"region_input": "boxes"}))


def _features_batch(feature_shards, n=4):
    _, out, _, _, data = feature_shards
    decode = CaptionDecoder(data)
    samples = [decode(r) for r, _ in zip(_records(sorted(out.glob("*.tar"))), range(n), strict=False)]
    b = collate_captions(samples)
    b["index"] = 0
    return b


def _masker(**kw):
    return PretrainMasker(MaskingConfig(mrc_probability=0.5, mrc_zero_fraction=1.0, **kw), load_tokenizer(None),
                          cls_id=101, sep_id=102, mask_id=103, num_classes=9, seed=0)


def test_pretraining_step_on_features_ignores_what_masked_regions_hold(feature_shards):
    batch = _masker()({"caption": _features_batch(feature_shards), "index": 0})
    c = batch["caption"]
    assert "images" not in c and c["region_features"].shape[-1] == 512 and c["masked_regions"].any()
    torch.manual_seed(0)
    cfg = model_config("tiny", updates={**IDS, "region_input": "features", "precomputed_feature_size": 512})
    module = VLBertPretraining(VLBertForPretraining(cfg), LossConfig()).eval()
    with torch.no_grad():
        loss, metrics = module(batch)
        assert torch.isfinite(loss) and {"loss/mlm_caption", "loss/mrc"} <= set(metrics)
        out = module.model(c["input_ids"], c["text_mask"], c["token_type_ids"], boxes=c["boxes"],
                           box_mask=c["box_mask"], masked_regions=c["masked_regions"],
                           region_features=c["region_features"], image_hw=c["image_hw"])
        # what a masked region's features hold cannot reach the model (nor the whole-image mean)
        noisy = c["region_features"] + 5 * torch.randn_like(c["region_features"]) * c["masked_regions"][..., None]
        again = module.model(c["input_ids"], c["text_mask"], c["token_type_ids"], boxes=c["boxes"],
                             box_mask=c["box_mask"], masked_regions=c["masked_regions"], region_features=noisy,
                             image_hw=c["image_hw"])
    assert torch.allclose(out.last_hidden_state, again.last_hidden_state, atol=1e-5)
    ablated = _masker(ablate_image=True)({"caption": _features_batch(feature_shards), "index": 0})["caption"]
    assert not ablated["region_features"].any() and torch.equal(ablated["boxes"], c["boxes"])


def test_diagnostic_runs_a_features_model_on_its_extractors_features(demo_corpus, tmp_path):
    from tests.diagnostics.test_ablation import _demo_cfg

    fr = _extractor_cfg(tmp_path)
    cfg = model_config("tiny", updates={**IDS, "region_input": "features", "precomputed_feature_size": 512,
                                        "visual_ln_init": 1.0,  # the visual terms open, so features count
                                        "fast_rcnn": {"roi_output_size": 4, "weights": fr.weights}})
    torch.manual_seed(0)
    model = VLBertForPretraining(cfg).eval()
    extractor = feature_extractor(model)
    data = PhraseData(_demo_cfg(demo_corpus, max_examples=10), load_tokenizer(None), 9, extractor)
    plain = PhraseData(_demo_cfg(demo_corpus, max_examples=10), load_tokenizer(None), 9)
    for b, p in zip(data.batches(), plain.batches(), strict=True):
        assert "images" not in b and torch.equal(b["image_hw"], p["image_sizes"])
        with torch.no_grad():
            direct = FastRCNN(fr).eval()(p["images"], p["image_sizes"], p["boxes"], p["box_mask"])["appearance"]
        valid = p["box_mask"]
        assert torch.allclose(b["region_features"][valid], direct[:, 1:][valid], atol=1e-4)
    values = evaluate(Ablator(model), data, sweep=[0.5], progress=False)
    for k in ("v4l/none", "v4l/object", "v4l/all", "l4v_kl/none"):
        assert np.isfinite(values[k]).any(), k
    assert not np.allclose(values["v4l/none"], values["v4l/all"])  # the features reach the model
