"""bench.quickstart_step's accounting of the RoIs a pretraining batch pads to, by hand."""

import torch

from bench.quickstart_step import real_roi_fraction


def test_real_roi_fraction_counts_each_image_once_by_hand():
    """Two images in two word views (4 rows of boxes, the last 2 repeating the first), boxes padded to 3 with 3 and 1
    real, and each image's whole-image box: (4 + 2) real of 8 RoIs; the views' repeated rows are not counted again."""
    mask = torch.tensor([[True, True, True], [True, False, False]])
    batch = {"caption": {"images": torch.zeros(2, 3, 32, 32, dtype=torch.uint8), "image_sizes": torch.full((2, 2), 32),
                         "box_mask": mask.repeat(2, 1)}}
    assert real_roi_fraction([batch]) == 6 / 8
    assert real_roi_fraction([batch, batch]) == 6 / 8
