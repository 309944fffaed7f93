"""The Fast R-CNN bench's peer is the same network as ours, built from torchvision's parts alone: its features
equal ours (so the timing compares like with like), at both feature strides and box conventions."""

import pytest
import torch

from bench.fast_rcnn_step import TorchvisionC4
from model.config import FastRCNNConfig
from model.fast_rcnn import FastRCNN


@pytest.mark.parametrize("stride,convention", [(16, "continuous"), (8, "continuous"), (16, "inclusive")])
def test_torchvision_peer_computes_our_features(stride, convention):
    torch.manual_seed(0)
    ours = FastRCNN(FastRCNNConfig(backbone="resnet18", num_classes=5, num_attributes=0, roi_output_size=4,
                                   feature_stride=stride, box_convention=convention)).eval()
    for m in ours.modules():  # non-trivial frozen statistics, so a skipped BatchNorm would show
        if hasattr(m, "running_var") and m.running_var is not None:
            m.running_var.uniform_(0.5, 2.0)
            m.running_mean.uniform_(-0.2, 0.2)
    peer = TorchvisionC4(ours).eval()
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (2, 3, 64, 96), dtype=torch.uint8, generator=g)
    sizes = torch.tensor([[64, 96], [48, 80]])  # the second image is padded on the canvas
    boxes = torch.tensor([[[2.0, 3, 40, 30], [10, 10, 90, 60]], [[0.0, 0, 20, 20], [30, 5, 79, 47]]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    with torch.no_grad():
        mine = ours(images, sizes, boxes, mask)["appearance"].flatten(0, 1)
        theirs = peer(images, sizes, boxes, mask)
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
        # the test can fail: read as unpadded, the second image's features differ
        other = peer(images, torch.tensor([[64, 96], [64, 96]]), boxes, mask)
        torch.testing.assert_close(mine[:3], other[:3], rtol=1e-4, atol=1e-4)
        assert not torch.allclose(mine[3:], other[3:], rtol=1e-4, atol=1e-4)
