"""The official VL-BERT import: a state dict with the official key names and shapes (tiny transformer, a
ResNet-50-shaped Fast R-CNN) lands where it should, and our model on it computes what a hand-written
reference of the official forward computes (its `common/fast_rcnn.py`, `common/backbone/resnet/resnet.py`,
`common/utils/bbox.py`, `common/visual_linguistic_bert.py`, `pretrain/modules/..._multitask.py`), to 1e-5.

The reference is written from the official code, not from ours: BGR pixels minus PIXEL_MEANS, Bottlenecks
striding in their 1x1 conv, a dilated res5, torchvision's roi_align without the half-pixel offset and one
sample per bin (maskrcnn-benchmark's legacy kernel), the centre/size coordinate embedding concatenated before
the appearance, packed sequences (text, objects at one position, [END]) and transformers' BertEncoder for
the official encoder (the same module pytorch_pretrained_bert had)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torchvision.ops import roi_align
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertEncoder as HFBertEncoder

from model.export import load_pretrained
from model.import_official import (
    OFFICIAL_PIXEL_MEANS_BGR,
    convert_official_state,
    import_official,
    load_official,
    official_config,
)

H, LAYERS, HEADS, FF, VOCAB, MAXPOS, CLASSES, APPEAR = 32, 2, 4, 37, 99, 64, 9, 2048
EPS = 1e-12


def official_state(visual_size: int = H, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under the official pretraining module's names (`module.` prefix, as DataParallel saved
    them)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.02, mean=0.0):
        return torch.randn(*shape, generator=g) * scale + mean

    sd: dict[str, torch.Tensor] = {}
    resnet = torchvision.models.resnet50(weights=None)
    for k, v in resnet.state_dict().items():
        if k.startswith("fc."):
            continue
        if k.endswith("running_mean"):
            v = rnd(*v.shape, scale=0.1)
        elif k.endswith("running_var"):
            v = torch.rand(*v.shape, generator=g) + 0.5
        elif k.endswith("bn3.weight") or k.endswith("downsample.1.weight"):
            v = rnd(*v.shape, scale=0.1, mean=0.3)  # keep 16 residual blocks from blowing up
        elif "bn" in k and k.endswith("weight"):
            v = rnd(*v.shape, scale=0.1, mean=1.0)
        elif k.endswith("bias"):
            v = rnd(*v.shape, scale=0.1)
        elif k.endswith("weight"):
            v = rnd(*v.shape, scale=math.sqrt(2 / (v.shape[1] * v[0, 0].numel())))
        if k.startswith("layer4."):
            rest = k.removeprefix("layer4.")
            sd["image_feature_extractor.roi_head_feature_extractor." + rest] = v
            sd["image_feature_extractor.head.0." + rest] = v.clone()
        else:
            sd["image_feature_extractor.backbone." + k] = v
    sd["image_feature_extractor.obj_downsample.1.weight"] = rnd(visual_size, 2048 + APPEAR, scale=0.03)
    sd["image_feature_extractor.obj_downsample.1.bias"] = rnd(visual_size, scale=0.1)
    for name in ("object_linguistic_embeddings", "object_mask_word_embedding", "aux_text_visual_embedding"):
        sd[f"{name}.weight"] = rnd(1, visual_size if name.startswith("aux") else H, scale=0.5)
    v = "vlbert."
    sd[v + "word_embeddings.weight"] = rnd(VOCAB, H, scale=0.5)
    sd[v + "end_embedding.weight"] = rnd(1, H, scale=0.5)
    sd[v + "position_embeddings.weight"] = rnd(MAXPOS, H, scale=0.5)
    sd[v + "token_type_embeddings.weight"] = rnd(3, H, scale=0.5)
    sd[v + "embedding_LayerNorm.weight"] = rnd(H, scale=0.1, mean=1.0)
    sd[v + "embedding_LayerNorm.bias"] = rnd(H, scale=0.1)
    if visual_size != H:
        for name in ("text", "object"):
            sd[f"{v}visual_1x1_{name}.weight"] = rnd(H, visual_size, scale=0.2)
            sd[f"{v}visual_1x1_{name}.bias"] = rnd(H, scale=0.1)
    for name in ("text", "object"):  # non-zero gains: the visual terms must count in the comparison
        sd[f"{v}visual_ln_{name}.weight"] = rnd(H, scale=0.2, mean=1.0)
        sd[f"{v}visual_ln_{name}.bias"] = rnd(H, scale=0.1)
    encoder = HFBertEncoder(BertConfig(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                       intermediate_size=FF))
    for k, t in encoder.state_dict().items():
        sd[v + "encoder." + k] = rnd(*t.shape, scale=0.1, mean=1.0 if "LayerNorm.weight" in k else 0.0) \
            if "LayerNorm" in k else rnd(*t.shape, scale=0.2)
    p = v + "mlm_head.predictions."
    sd[p + "transform.dense.weight"], sd[p + "transform.dense.bias"] = rnd(H, H, scale=0.2), rnd(H, scale=0.1)
    sd[p + "transform.LayerNorm.weight"], sd[p + "transform.LayerNorm.bias"] = rnd(H, mean=1.0), rnd(H)
    sd[p + "decoder.weight"] = sd[v + "word_embeddings.weight"]
    sd[p + "bias"] = rnd(VOCAB, scale=0.1)
    m = v + "mvrc_head."
    sd[m + "transform.dense.weight"], sd[m + "transform.dense.bias"] = rnd(H, H, scale=0.2), rnd(H, scale=0.1)
    sd[m + "region_cls_pred.weight"], sd[m + "region_cls_pred.bias"] = rnd(CLASSES, H, scale=0.2), rnd(CLASSES)
    return {"module." + k: t for k, t in sd.items()}


# --- the official forward, written from the official code ------------------------------------------------

def bn(x, sd, p):
    w, b, mean, var = (sd[p + s].double() for s in (".weight", ".bias", ".running_mean", ".running_var"))
    return (x - mean[:, None, None]) / torch.sqrt(var[:, None, None] + 1e-5) * w[:, None, None] + b[:, None, None]


def bottleneck(x, sd, p, stride, dilation):
    """common/backbone/resnet/resnet.py's Bottleneck with stride_in_1x1=True."""
    out = F.relu(bn(F.conv2d(x, sd[p + "conv1.weight"].double(), stride=stride), sd, p + "bn1"))
    out = F.relu(bn(F.conv2d(out, sd[p + "conv2.weight"].double(), padding=dilation, dilation=dilation),
                    sd, p + "bn2"))
    out = bn(F.conv2d(out, sd[p + "conv3.weight"].double()), sd, p + "bn3")
    if p + "downsample.0.weight" in sd:
        x = bn(F.conv2d(x, sd[p + "downsample.0.weight"].double(), stride=stride), sd, p + "downsample.1")
    return F.relu(out + x)


def coordinate_embeddings(boxes, dim):
    """common/utils/bbox.py: boxes [K, 6] (x1, y1, x2, y2, w_image, h_image) -> [K, 4, 2 dim]."""
    w, h = boxes[:, 4], boxes[:, 5]
    c = torch.stack([(boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2,
                     boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]], 1)
    pos = torch.stack([c[:, 0] / w * 100, c[:, 1] / h * 100, c[:, 2] / w * 100, c[:, 3] / h * 100], 1)
    dim_mat = 1000 ** (torch.arange(dim, dtype=boxes.dtype) / dim)
    angles = pos.view(-1, 4, 1) / dim_mat.view(1, 1, -1)
    return torch.cat([angles.sin(), angles.cos()], -1)


def official_obj_reps(sd, images_rgb, sizes, boxes, masked, segms=None):
    """obj_reps [B, 1+N, visual] of FastRCNN.forward (eval): whole image box first, as ADD_IMAGE_AS_A_BOX.
    images_rgb uint8 [B, 3, Hp, Wp] (padding beyond sizes), sizes [(h, w)], boxes [B, N, 4] inclusive.
    segms: per image [N, 14, 14] instance masks (VCR: the whole image's is all ones, as its dataset adds it),
    multiplied into res5's output before the pool."""
    mean = torch.tensor(OFFICIAL_PIXEL_MEANS_BGR, dtype=torch.float64)
    x = torch.zeros(images_rgb.shape, dtype=torch.float64)
    for b, (h, w) in enumerate(sizes):  # per image: to BGR 0-255, minus means, masked boxes zeroed; pad 0
        img = images_rgb[b, [2, 1, 0], :h, :w].double() - mean[:, None, None]
        for (x1, y1, x2, y2), m in zip(boxes[b].tolist(), masked[b].tolist()):
            if m:
                img[:, int(y1):int(y2) + 1, int(x1):int(x2) + 1] = 0
        x[b, :, :h, :w] = img
    p = "image_feature_extractor.backbone."
    x = F.max_pool2d(F.relu(bn(F.conv2d(x, sd[p + "conv1.weight"].double(), stride=2, padding=3), sd, p + "bn1")),
                     3, 2, 1)
    for layer, blocks, stride in (("layer1", 3, 1), ("layer2", 4, 2), ("layer3", 6, 2)):
        for i in range(blocks):
            x = bottleneck(x, sd, f"{p}{layer}.{i}.", stride if i == 0 else 1, 1)
    reps = []
    for b, (h, w) in enumerate(sizes):
        all_boxes = torch.cat([torch.tensor([[0.0, 0.0, w - 1.0, h - 1.0]]), boxes[b].double()])
        rois = torch.cat([torch.full((len(all_boxes), 1), float(b)), all_boxes], 1).double()
        crops = roi_align(x, rois, (14, 14), spatial_scale=1 / 16, sampling_ratio=1, aligned=False)
        for i in range(3):  # dilated res5: stride 1, dilation 2 throughout
            crops = bottleneck(crops, sd, f"image_feature_extractor.roi_head_feature_extractor.{i}.", 1, 2)
        if segms is not None:
            crops = crops * torch.cat([torch.ones(1, 14, 14), segms[b][: len(boxes[b])]]).double()[:, None]
        feats = crops.mean((2, 3))  # AvgPool2d(14)
        coords = coordinate_embeddings(torch.cat([all_boxes, torch.tensor([[w, h]] * len(all_boxes)).double()], 1),
                                       256).view(len(all_boxes), -1)
        lin_w = sd["image_feature_extractor.obj_downsample.1.weight"].double()
        reps.append(F.relu(torch.cat([coords, feats], 1) @ lin_w.T + sd["image_feature_extractor.obj_downsample.1.bias"]
                           .double()))
    return reps


def layer_norm(x, sd, p):
    return F.layer_norm(x, x.shape[-1:], sd[p + ".weight"].double(), sd[p + ".bias"].double(), EPS)


def visual(x, sd, kind):
    v = "vlbert."
    if f"{v}visual_1x1_{kind}.weight" in sd:
        x = x @ sd[f"{v}visual_1x1_{kind}.weight"].double().T + sd[f"{v}visual_1x1_{kind}.bias"].double()
    return layer_norm(x, sd, f"{v}visual_ln_{kind}")


def official_sequence(sd, ids, text_visual, objects=None, masked=None, text_types=None):
    """VisualLinguisticBert.embedding + encoder for one sample, packed (no padding): hidden [L, H].
    text_types: the words' segments (default all 0)."""
    v = "vlbert."
    we = sd[v + "word_embeddings.weight"].double()
    pos, types = sd[v + "position_embeddings.weight"].double(), sd[v + "token_type_embeddings.weight"].double()
    n_text = len(ids)
    segments = types[0] if text_types is None else types[text_types]
    text = we[ids] + visual(text_visual.expand(n_text, -1), sd, "text") + pos[:n_text] + segments
    parts = [text]
    if objects is not None:
        ling = sd["object_linguistic_embeddings.weight"].double().expand(len(objects), -1).clone()
        if masked.any():  # the VQA module has no mask embedding (nothing is masked in finetuning)
            ling[masked] = sd["object_mask_word_embedding.weight"].double()[0]
        parts.append(ling + visual(objects, sd, "object") + pos[n_text] + types[2])
    parts.append(sd[v + "end_embedding.weight"].double() + pos[n_text + 1] + types[2])
    x = layer_norm(torch.cat(parts), sd, v + "embedding_LayerNorm")
    enc = HFBertEncoder(BertConfig(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                   intermediate_size=FF, layer_norm_eps=EPS, attn_implementation="eager")).double()
    enc.load_state_dict({k.removeprefix(v + "encoder."): t for k, t in sd.items() if k.startswith(v + "encoder.")})
    return enc.eval()(x[None])[0][0]


def official_mlm(sd, hidden):
    p = "vlbert.mlm_head.predictions."
    t = F.gelu(hidden @ sd[p + "transform.dense.weight"].double().T + sd[p + "transform.dense.bias"].double())
    t = layer_norm(t, sd, p + "transform.LayerNorm")
    return t @ sd[p + "decoder.weight"].double().T + sd[p + "bias"].double()


def official_mvrc(sd, hidden):
    m = "vlbert.mvrc_head."
    t = F.gelu(hidden @ sd[m + "transform.dense.weight"].double().T + sd[m + "transform.dense.bias"].double())
    return t @ sd[m + "region_cls_pred.weight"].double().T + sd[m + "region_cls_pred.bias"].double()


# --- the tests --------------------------------------------------------------------------------------------

def save(tmp_path, sd):
    path = tmp_path / "vl-bert_tiny_e2e.model"
    torch.save({"epoch": 3, "state_dict": sd, "optimizer": {"state": {}, "param_groups": [{"lr": 1e-7}]}}, path)
    return path


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    # (h, w); the second is padded. The whole-image box spans more than 14 cells at stride 16, so RoIAlign's
    # adaptive sampling would take 2 samples per bin where the official kernel takes 1
    sizes = [(240, 320), (200, 280)]
    images = torch.randint(0, 256, (2, 3, 240, 320), generator=g, dtype=torch.uint8)
    boxes = torch.tensor([[[4, 6, 40, 50], [30, 10, 90, 60], [50, 20, 70, 40]],
                          [[2, 3, 30, 30], [20, 25, 75, 50], [0, 0, 0, 0]]], dtype=torch.float32)
    box_mask = torch.tensor([[True, True, True], [True, True, False]])
    masked = torch.tensor([[False, True, False], [True, False, False]])
    ids = torch.randint(8, VOCAB, (2, 7), generator=g)
    text_mask = torch.tensor([[True] * 7, [True] * 5 + [False] * 2])
    return sizes, images, boxes, box_mask, masked, ids, text_mask


@pytest.mark.parametrize("visual_size", [H, 48])
def test_import_matches_official_forward(tmp_path, visual_size):
    sd = official_state(visual_size)
    model, untouched = load_official(save(tmp_path, sd), num_attention_heads=HEADS)
    # what the official pretraining does not have: the detector's object classifier and the pooler
    assert sorted(untouched) == ["vl_bert.fast_rcnn.object_classifier.bias", "vl_bert.fast_rcnn.object_classifier"
                                 ".weight", "vl_bert.pooler.dense.bias", "vl_bert.pooler.dense.weight"]
    model = model.double().eval()
    sizes, images, boxes, box_mask, masked, ids, text_mask = batch()
    with torch.no_grad():
        out = model(ids, text_mask, images=images, image_sizes=torch.tensor(sizes), boxes=boxes, box_mask=box_mask,
                    masked_regions=masked)
        ours = out.last_hidden_state
        clean = {k.removeprefix("module."): v for k, v in sd.items()}
        reps = official_obj_reps(clean, images, sizes, boxes, masked)
        t = ids.shape[1]
        for b in range(2):
            n = int(box_mask[b].sum())
            length = int(text_mask[b].sum())
            ref = official_sequence(clean, ids[b, :length], reps[b][:1], reps[b][: n + 1],
                                    torch.cat([torch.tensor([False]), masked[b, :n]]))
            assert ref.shape[0] == length + n + 2
            torch.testing.assert_close(ours[b, :length], ref[:length], atol=1e-5, rtol=0)
            torch.testing.assert_close(ours[b, t: t + n + 1], ref[length: length + n + 1], atol=1e-5, rtol=0)
            torch.testing.assert_close(ours[b, -1], ref[-1], atol=1e-5, rtol=0)
            torch.testing.assert_close(model.mlm_head(ours[b, :length]), official_mlm(clean, ref[:length]),
                                       atol=1e-5, rtol=0)
            torch.testing.assert_close(model.masked_roi_classification(ours[b, t: t + n + 1]),
                                       official_mvrc(clean, ref[length: length + n + 1]), atol=1e-5, rtol=0)


def test_import_text_only_matches_official(tmp_path):
    sd = official_state()
    model, _ = load_official(save(tmp_path, sd), num_attention_heads=HEADS)
    model = model.double().eval()
    _, _, _, _, _, ids, text_mask = batch()
    clean = {k.removeprefix("module."): v for k, v in sd.items()}
    with torch.no_grad():
        ours = model(ids, text_mask).last_hidden_state
        for b in range(2):
            length = int(text_mask[b].sum())
            ref = official_sequence(clean, ids[b, :length], clean["aux_text_visual_embedding.weight"].double())
            torch.testing.assert_close(ours[b, :length], ref[:length], atol=1e-5, rtol=0)
            torch.testing.assert_close(ours[b, -1], ref[-1], atol=1e-5, rtol=0)


def test_every_tensor_lands_in_its_place(tmp_path):
    sd = {k.removeprefix("module."): v for k, v in official_state(48).items()}
    cfg = official_config(sd, num_attention_heads=HEADS)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size, cfg.visual_size,
            cfg.geometry_size, cfg.fast_rcnn.backbone, cfg.fast_rcnn.num_classes) == \
        (H, LAYERS, FF, VOCAB, 48, 2048, "resnet50", CLASSES)
    from model.vl_bert import VLBertForPretraining
    own = VLBertForPretraining(cfg).state_dict()
    out = convert_official_state(sd, cfg, own)
    e, f = "vl_bert.embeddings.", "vl_bert.fast_rcnn."
    assert torch.equal(out[e + "object_token_embedding"], sd["object_linguistic_embeddings.weight"][0])
    assert torch.equal(out[e + "roi_mask_embedding"], sd["object_mask_word_embedding.weight"][0])
    assert torch.equal(out[e + "end_token_embedding"], sd["vlbert.end_embedding.weight"][0])
    assert torch.equal(out[e + "visual_projection_text.weight"], sd["vlbert.visual_1x1_text.weight"])
    assert torch.equal(out[f + "backbone.conv1.weight"],
                       sd["image_feature_extractor.backbone.conv1.weight"][:, [2, 1, 0]])
    assert torch.equal(out[f + "box_head.1.conv2.weight"],
                       sd["image_feature_extractor.roi_head_feature_extractor.1.conv2.weight"])
    w = sd["image_feature_extractor.obj_downsample.1.weight"]
    assert torch.equal(out[e + "visual_feature_embedding.1.weight"], torch.cat([w[:, 2048:], w[:, :2048]], 1))
    assert torch.equal(out["masked_roi_classification.classifier.weight"],
                       sd["vlbert.mvrc_head.region_cls_pred.weight"])
    assert "mlm_head.decoder.weight" not in out  # tied


def test_unmapped_and_untied_keys_are_named(tmp_path):
    sd = official_state()
    sd["module.vlbert.relationsip_head.caption_image_relationship.weight"] = torch.zeros(2, H)
    with pytest.raises(ValueError, match="relationsip_head"):
        load_official(save(tmp_path, sd), num_attention_heads=HEADS)
    sd = official_state()
    decoder = "module.vlbert.mlm_head.predictions.decoder.weight"
    sd[decoder] = sd[decoder] + 1
    with pytest.raises(ValueError, match="not tied"):
        load_official(save(tmp_path, sd), num_attention_heads=HEADS)
    sd = official_state()
    sd["module.image_feature_extractor.head.0.0.conv1.weight"] = sd["module.image_feature_extractor.head.0.0.conv1"
                                                                    ".weight"] + 1
    with pytest.raises(ValueError, match="twin"):
        load_official(save(tmp_path, sd), num_attention_heads=HEADS)


def test_import_writes_a_loadable_export(tmp_path):
    sd = official_state()
    path = import_official(save(tmp_path, sd), tmp_path / "export", num_attention_heads=HEADS)
    model = load_pretrained(path)
    assert model.cfg.visual_tokens == "learned" and model.cfg.fast_rcnn.box_convention == "inclusive"
    assert model.image_preprocessing["pixel_mean"] == [122.7717, 115.9465, 102.9801]
    assert "inclusive" in model.image_preprocessing["box_convention"]
    ref, untouched = load_official(save(tmp_path, sd), num_attention_heads=HEADS)
    for k, v in ref.state_dict().items():  # the untouched ones are drawn afresh at each initialisation
        assert k in untouched or torch.equal(model.state_dict()[k], v), k


def test_refuses_a_pickle_with_code(tmp_path):
    path = tmp_path / "evil.model"
    torch.save({"state_dict": {}, "hook": torchvision.models.resnet18}, path)
    with pytest.raises(ValueError, match="restricted unpickler"):
        load_official(path)
