import pytest
import torch
import torchvision
from torchvision.ops import roi_align

from model.config import FastRCNNConfig
from model.fast_rcnn import FastRCNN


def test_loads_a_torchvision_resnet_state_dict(tmp_path):
    torch.manual_seed(0)
    resnet = torchvision.models.resnet18(weights=None)
    torch.save(resnet.state_dict(), tmp_path / "r18.pth")
    frcnn = FastRCNN(FastRCNNConfig(backbone="resnet18", num_classes=5, weights=str(tmp_path / "r18.pth")))
    assert torch.equal(frcnn.backbone.layer3[1].conv2.weight, resnet.layer3[1].conv2.weight)
    assert torch.equal(frcnn.box_head[0].conv1.weight, resnet.layer4[0].conv1.weight)  # layer4 -> box head
    assert torch.equal(frcnn.backbone.bn1.running_var, resnet.bn1.running_var)
    with pytest.raises(ValueError, match="r18.pth"):
        FastRCNN(FastRCNNConfig(backbone="resnet50", weights=str(tmp_path / "r18.pth")))


def test_loads_a_faster_rcnn_state_dict(tmp_path):
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    torch.manual_seed(0)
    body = resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=5)
    state = {f"backbone.{k}": v for k, v in body.state_dict().items()}
    state["roi_heads.box_predictor.cls_score.weight"] = torch.zeros(5, 1024)  # dropped
    torch.save({"model": state}, tmp_path / "frcnn.pth")
    frcnn = FastRCNN(FastRCNNConfig(backbone="resnet18", num_classes=5, weights=str(tmp_path / "frcnn.pth")))
    assert torch.equal(frcnn.backbone.layer2[0].conv1.weight, body.body.layer2[0].conv1.weight)


def test_region_features_are_res5_on_roialign_crops():
    """Against torchvision's ops directly: stride-16 C4 features, RoIAlign 14x14 aligned, res5, mean."""
    torch.manual_seed(0)
    frcnn = FastRCNN(FastRCNNConfig(backbone="resnet18", num_classes=5)).eval()
    images = torch.randint(0, 256, (1, 3, 64, 80), dtype=torch.uint8)
    sizes = torch.tensor([[64, 80]])
    boxes = torch.tensor([[[8.0, 4.0, 40.0, 50.0]]])
    with torch.no_grad():
        out = frcnn(images, sizes, boxes, torch.ones(1, 1, dtype=torch.bool))
        x = (images.float() / 255 - torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)) / \
            torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
        c4 = frcnn.backbone(x)
        assert c4.shape[-2:] == (4, 5)  # stride 16
        rois = torch.tensor([[0, 0, 0, 80, 64], [0, 8.0, 4.0, 40.0, 50.0]])
        crops = roi_align(c4, rois, 14, spatial_scale=1 / 16, sampling_ratio=0, aligned=True)
        expected = frcnn.box_head(crops).mean((2, 3))
    torch.testing.assert_close(out["appearance"][0], expected, atol=1e-4, rtol=1e-4)
    assert out["appearance"].shape == (1, 2, 512)
    assert out["boxes"][0, 0].tolist() == [0, 0, 80, 64]  # the whole-image box comes first


def test_region_masks_weight_each_regions_res5_map_before_the_pool():
    """The official VCR's segmentation-masked pooling: mean over (res5 map x the box's instance mask); the
    whole-image element keeps its whole map, and all-ones masks change nothing."""
    torch.manual_seed(0)
    frcnn = FastRCNN(FastRCNNConfig(backbone="resnet18", num_classes=5)).eval()
    images = torch.randint(0, 256, (1, 3, 64, 80), dtype=torch.uint8)
    sizes, box_mask = torch.tensor([[64, 80]]), torch.ones(1, 2, dtype=torch.bool)
    boxes = torch.tensor([[[8.0, 4.0, 40.0, 50.0], [30.0, 20.0, 70.0, 60.0]]])
    masks = torch.zeros(1, 2, 7, 7)  # res5 halves the 14x14 RoI
    masks[0, 0, 2:5, 1:6] = 1
    masks[0, 1, :, 3] = 1
    seen = []
    hook = frcnn.box_head.register_forward_hook(lambda module, args, out: seen.append(out.detach()))
    with torch.no_grad():
        plain = frcnn(images, sizes, boxes, box_mask)["appearance"]
        masked = frcnn(images, sizes, boxes, box_mask, region_masks=masks)["appearance"]
        ones = frcnn(images, sizes, boxes, box_mask, region_masks=torch.ones(1, 2, 7, 7))["appearance"]
    hook.remove()
    res5 = seen[1]  # [1 + 2, 512, 7, 7]: whole image, then the boxes
    torch.testing.assert_close(masked[0, 0], res5[0].mean((1, 2)))
    for k in range(2):
        torch.testing.assert_close(masked[0, k + 1], (res5[k + 1] * masks[0, k]).mean((1, 2)))
    torch.testing.assert_close(ones, plain)
    with pytest.raises(ValueError, match=r"region_masks \[1, 2, 14, 14\]: expected \[1, 2, 7, 7\]"):
        frcnn(images, sizes, boxes, box_mask, region_masks=torch.ones(1, 2, 14, 14))


def test_feature_stride_8_is_res4_without_its_downsampling():
    """Same weights as stride 16; res4's first convolutions at stride 1 give what the stride-2 ones give at
    every other position, the C4 map is twice as fine, and RoIAlign samples it at scale 1/8."""
    torch.manual_seed(0)
    coarse = FastRCNN(FastRCNNConfig(backbone="resnet18", num_classes=5)).eval()
    fine = FastRCNN(FastRCNNConfig(backbone="resnet18", num_classes=5, feature_stride=8)).eval()
    fine.load_state_dict(coarse.state_dict())
    images = torch.randint(0, 256, (1, 3, 64, 80), dtype=torch.uint8)
    boxes = torch.tensor([[[8.0, 4.0, 40.0, 50.0]]])
    with torch.no_grad():
        x = fine.normalise(images, torch.tensor([[64, 80]]))
        c3 = fine.backbone[:-1](x)  # stem..res3, stride 8
        block = fine.backbone.layer3[0]
        torch.testing.assert_close(block.conv1(c3)[..., ::2, ::2], coarse.backbone.layer3[0].conv1(c3))
        torch.testing.assert_close(block.downsample(c3)[..., ::2, ::2], coarse.backbone.layer3[0].downsample(c3))
        c4 = fine.backbone(x)
        assert c4.shape[-2:] == (8, 10) and coarse.backbone(x).shape[-2:] == (4, 5)
        out = fine(images, torch.tensor([[64, 80]]), boxes, torch.ones(1, 1, dtype=torch.bool))
        rois = torch.tensor([[0, 0, 0, 80, 64], [0, 8.0, 4.0, 40.0, 50.0]])
        crops = roi_align(c4, rois, 14, spatial_scale=1 / 8, sampling_ratio=0, aligned=True)
    torch.testing.assert_close(out["appearance"][0], fine.box_head(crops).mean((2, 3)), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="feature_stride"):
        FastRCNN(FastRCNNConfig(backbone="resnet18", num_classes=5, feature_stride=4))


def test_a_batch_norm_warm_up_loads_as_frozen_statistics(tmp_path):
    """A from-scratch backbone trains with batch norm (norm: batch); its exported statistics and affine
    parameters load into the frozen-BN detector, which then computes what the warm-up's eval mode did."""
    torch.manual_seed(0)
    cfg = FastRCNNConfig(backbone="resnet18", num_classes=5, norm="batch", freeze_stem=False, freeze_res2=False)
    trained = FastRCNN(cfg).train()
    images = torch.randint(0, 256, (2, 3, 64, 96), dtype=torch.uint8)
    sizes = torch.tensor([[64, 96], [60, 80]])
    boxes = torch.tensor([[[8.0, 4.0, 40.0, 50.0], [30, 10, 90, 60]], [[0.0, 0, 30, 30], [10, 10, 70, 55]]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    for _ in range(3):  # moves the running statistics away from 0 / 1
        trained(images, sizes, boxes, mask)
    assert isinstance(trained.backbone.bn1, torch.nn.BatchNorm2d) and trained.backbone.bn1.weight.requires_grad
    trained.eval()
    torch.save(trained.state_dict(), tmp_path / "w.pt")
    frozen = FastRCNN(FastRCNNConfig(backbone="resnet18", num_classes=5, weights=str(tmp_path / "w.pt"))).eval()
    assert not isinstance(frozen.backbone.bn1, torch.nn.BatchNorm2d)
    with torch.no_grad():
        a = trained(images, sizes, boxes, mask)["appearance"]
        b = frozen(images, sizes, boxes, mask)["appearance"]
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="norm"):
        FastRCNN(FastRCNNConfig(backbone="resnet18", norm="group"))


@pytest.mark.parametrize("backbone", ["resnet18", "resnet50"])
def test_folded_frozen_norms_compute_the_same_network(backbone):
    """fold_frozen_norms: every FrozenBN (stem, blocks, downsample) applied inside the convolution before it; the
    same state dict, the same features and the same gradients up to float rounding (non-trivial statistics), the
    frozen stem still frozen, and in DeepSpeed's bf16 mode (module cast) still one dtype."""
    from dataclasses import replace

    from model.fast_rcnn import FoldedConv2d, FrozenBN

    cfg = FastRCNNConfig(backbone=backbone, num_classes=5, roi_output_size=4)
    torch.manual_seed(0)
    plain = FastRCNN(cfg)
    g = torch.Generator().manual_seed(1)
    for m in plain.modules():
        if isinstance(m, FrozenBN):
            m.running_var.uniform_(0.5, 2.0, generator=g)
            m.running_mean.normal_(generator=g)
            m.weight.uniform_(0.5, 1.5, generator=g)
            m.bias.normal_(generator=g)
    folded = FastRCNN(replace(cfg, fold_frozen_norms=True))
    folded.load_state_dict(plain.state_dict())
    assert list(folded.state_dict()) == list(plain.state_dict())
    norms = sum(isinstance(m, FrozenBN) for m in plain.modules())
    assert sum(isinstance(m, FoldedConv2d) for m in folded.modules()) == norms  # every norm: 20 (r18), 53 (r50)
    assert all(m.folded for m in folded.modules() if isinstance(m, FrozenBN))
    assert not folded.backbone.conv1.weight.requires_grad  # freeze_stem
    images = torch.randint(0, 256, (2, 3, 64, 96), dtype=torch.uint8, generator=g)
    sizes = torch.tensor([[64, 96], [60, 80]])
    boxes = torch.tensor([[[2.0, 3, 40, 50], [10, 10, 30, 30]], [[0, 0, 20, 20], [5, 5, 60, 50]]])
    box_mask = torch.ones(2, 2, dtype=torch.bool)
    outs = [m(images, sizes, boxes, box_mask)["appearance"] for m in (plain, folded)]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4 * float(outs[0].detach().abs().max()))
    for out in outs:
        out.square().mean().backward()
    for (name, p), q in zip(plain.named_parameters(), folded.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-3 * float(p.grad.abs().max()), msg=name)
    folded.to(torch.bfloat16)
    assert folded(images, sizes, boxes, box_mask)["appearance"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="fold_frozen_norms"):
        FastRCNN(replace(cfg, fold_frozen_norms=True, norm="batch"))
