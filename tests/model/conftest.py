import pytest
import torch

from model.config import model_config
from model.vl_bert import VLBertForPretraining, assemble_text


@pytest.fixture
def tiny_cfg():
    return model_config("tiny")


def make_batch(seed=0, b=2, n=4, h=64, w=96):
    """Text A (+B), uint8 images with different real sizes, boxes (one padded) in pixels."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(8, 99, (b, 6), generator=g)
    a_mask = torch.ones(b, 6, dtype=torch.bool)
    a_mask[1, 4:] = False
    ids, types, text_mask = assemble_text(a, a_mask, cls_id=3, sep_id=4)
    images = torch.randint(0, 256, (b, 3, h, w), dtype=torch.uint8, generator=g)
    sizes = torch.tensor([[h, w], [h - 14, w - 26]])
    boxes = torch.tensor([[[2., 3, 30, 40], [40, 8, 90, 60], [10, 30, 50, 62], [60, 2, 94, 20]],
                          [[0., 0, 20, 20], [25, 10, 60, 45], [5, 22, 30, 48], [0, 0, 0, 0]]])[:b, :n]
    box_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)[:b, :n]
    return dict(input_ids=ids, token_type_ids=types, text_mask=text_mask, images=images, image_sizes=sizes,
                boxes=boxes, box_mask=box_mask)


@pytest.fixture
def tiny_model(tiny_cfg):
    torch.manual_seed(0)
    model = VLBertForPretraining(tiny_cfg).eval()
    # open the visual gates, which start at zero, so tests see vision actually flow
    for ln in (model.vl_bert.embeddings.visual_ln_text, model.vl_bert.embeddings.visual_ln_object):
        torch.nn.init.ones_(ln.weight)
    return model
