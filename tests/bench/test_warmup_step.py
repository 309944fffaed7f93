"""bench.warmup_step's accounting of what a warm-up batch pays for, by hand."""

import torch

from bench.warmup_step import real_fractions
from model.fast_rcnn import real_rois


def test_real_fractions_by_hand():
    """Two images padded to 64 x 64: one 64 x 32 (2,048 real pixels), one 32 x 32 (1,024), so 3,072 of 8,192; boxes
    padded to 3 per image with 3 and 1 real, each image's whole-image box real: (4 + 2) of 8 RoIs, or of the 6 that
    `roi_index` names."""
    batch = {"images": torch.zeros(2, 3, 64, 64, dtype=torch.uint8), "image_sizes": torch.tensor([[64, 32], [32, 32]]),
             "box_mask": torch.tensor([[True, True, True], [True, False, False]])}
    pixels, rois = real_fractions([batch])
    assert pixels == 3072 / 8192 and rois == 6 / 8
    batch["roi_index"] = real_rois(batch["box_mask"])  # res5 on those alone
    assert real_fractions([batch]) == (3072 / 8192, 1.0)
