import torch
from torchvision.ops import box_iou as tv_box_iou

from model.boxes import box_iot, box_iou, from_one_based_inclusive


def test_iou_against_torchvision_and_by_hand():
    a = torch.tensor([[0.0, 0, 10, 10], [5, 5, 15, 15], [20, 20, 30, 30]])
    b = torch.tensor([[0.0, 0, 10, 10], [0, 0, 5, 20]])
    torch.testing.assert_close(box_iou(a, b), tv_box_iou(a, b))
    assert abs(box_iou(a, b)[1, 0].item() - 25 / 175) < 1e-7  # 5x5 overlap of two 10x10 boxes


def test_iot_by_hand_and_batched():
    regions = torch.tensor([[0.0, 0, 10, 10], [0, 0, 2, 2]])
    target = torch.tensor([[5.0, 0, 15, 10]])  # area 100, overlaps region 0 by 5x10
    assert box_iot(regions, target).tolist() == [[0.5], [0.0]]
    batched = box_iot(regions.expand(3, 2, 4), target.expand(3, 1, 4))
    assert batched.shape == (3, 2, 1)


def test_flickr30k_corners():
    # xmin=1, xmax=10 covers pixels 1..10 (1-based) = 10 pixels = [0, 10) 0-based
    assert from_one_based_inclusive(torch.tensor([[1, 1, 10, 20]])).tolist() == [[0.0, 0.0, 10.0, 20.0]]
