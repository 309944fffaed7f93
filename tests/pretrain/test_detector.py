"""The supervised Fast R-CNN warm-up (pretrain/detector.py) and the COCO reader it shares."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw
from torchvision.ops import roi_align

from model.boxes import scale_features
from model.config import FastRCNNConfig, load_config
from model.fast_rcnn import FastRCNN, real_rois, size_classifier
from pretrain.detector import BoxSet, DetectorConfig, DetectorWarmup, drift, evaluate, export_state, fit_size_classifier
from shards.coco import CocoFormatError, read_instances, read_vocabularies
from shards.seeding import torch_generator
from tests.toy_engine import one_process_env
from train.loaders import EpochLoader

ROOT = Path(__file__).resolve().parents[2]
TINY = FastRCNNConfig(backbone="resnet18", num_classes=3, freeze_stem=False, freeze_res2=False, roi_output_size=4)


def write_coco(tmp_path: Path, annotations: list[dict], sizes: bool = False) -> Path:
    """Two 64x64 images: a red square (category 1) and a blue circle (category 2); with `sizes`, a size
    vocabulary (small, big)."""
    for name, colour in (("a.jpg", "red"), ("b.jpg", "blue")):
        im = Image.new("RGB", (64, 64), "white")
        ImageDraw.Draw(im).rectangle([8, 8, 40, 40], fill=colour)
        im.save(tmp_path / name)
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 64},
                   {"id": 2, "file_name": "b.jpg", "width": 64, "height": 64}],
        "annotations": annotations,
        "categories": [{"id": 1, "name": "square"}, {"id": 2, "name": "circle"}],
        "attributes": [{"id": 1, "name": "red"}, {"id": 2, "name": "blue"}, {"id": 3, "name": "large"}],
        **({"sizes": [{"id": 1, "name": "small"}, {"id": 2, "name": "big"}]} if sizes else {})}))
    return path


ANNS = [{"id": 10, "image_id": 1, "bbox": [8, 8, 32, 32], "category_id": 1, "attribute_ids": [1, 3]},
        {"id": 11, "image_id": 1, "bbox": [0, 0, 64, 64], "category_id": 2, "iscrowd": 1},
        {"id": 20, "image_id": 2, "bbox": [8, 8, 32, 32], "category_id": 2, "attribute_ids": [2]}]


def test_coco_reader_keeps_attributes_and_crowd(tmp_path):
    path = write_coco(tmp_path, ANNS)
    images, anns, by_image = read_instances(path)
    assert anns[10] == {"image_id": 1, "box": [8.0, 8.0, 40.0, 40.0], "category_id": 1, "attribute_ids": [1, 3],
                        "size_id": 0, "iscrowd": 0}
    assert anns[11]["iscrowd"] == 1 and by_image == {1: [10, 11], 2: [20]}
    assert read_vocabularies(path) == ({1: "square", 2: "circle"}, {1: "red", 2: "blue", 3: "large"}, {})
    sized = write_coco(tmp_path, [dict(ANNS[0], size_id=2)], sizes=True)
    assert read_instances(sized)[1][10]["size_id"] == 2
    assert read_vocabularies(sized)[2] == {1: "small", 2: "big"}
    bad = dict(ANNS[0], bbox=[1, 2])
    with pytest.raises(CocoFormatError, match=r"annotations\[0\]"):
        read_instances(write_coco(tmp_path, [bad]))


def test_box_set_labels_multi_hot_and_skips(tmp_path):
    cfg = DetectorConfig(image_root=str(tmp_path), short_side=32, long_side=32)
    data = BoxSet(str(write_coco(tmp_path, ANNS)), cfg, num_classes=3, num_attributes=3)
    assert len(data) == 2 and data.skips.reasons == {"crowd": 1}
    batch = data.batch([0, 1])
    assert batch["labels"].tolist() == [[1], [2]]
    assert batch["attributes"].tolist() == [[[1, 0, 1]], [[0, 1, 0]]]
    assert torch.allclose(batch["boxes"][0, 0], torch.tensor([4.0, 4.0, 20.0, 20.0]))  # 64 -> 32 px
    with pytest.raises(ValueError, match="annotation 20: category_id 2 is outside 1..1"):
        BoxSet(str(write_coco(tmp_path, ANNS)), cfg, num_classes=2, num_attributes=3)
    with pytest.raises(ValueError, match=r"annotation 10: attribute_ids \[3\]"):
        BoxSet(str(write_coco(tmp_path, ANNS)), cfg, num_classes=3, num_attributes=2)
    # sizes: 1-based ids in the file, 0-based targets in the batch, -1 for none; boxes normalised by the
    # original image's size (64 px) whatever the resize
    sized = [dict(ANNS[0], size_id=2), dict(ANNS[2], bbox=[0, 16, 16, 32])]
    data = BoxSet(str(write_coco(tmp_path, sized, sizes=True)), cfg, num_classes=3, num_attributes=3, num_sizes=2)
    assert data.batch([0, 1])["sizes"].tolist() == [[1], [-1]]
    boxes, sizes = data.size_annotations()
    assert boxes.tolist() == [[0.125, 0.125, 0.625, 0.625]] and sizes.tolist() == [1]
    with pytest.raises(ValueError, match="annotation 10: size_id 2 is not among the file's 1 sizes"):
        BoxSet(str(write_coco(tmp_path, sized, sizes=True)), cfg, num_classes=3, num_attributes=3, num_sizes=1)


def test_size_head_fit_separates_sizes_by_the_larger_side():
    """Sizes as the demo defines them (the larger normalised side in three intervals, any image aspect):
    fitted on one draw of boxes, the head names every box of another draw; the fit's standardisation is
    folded into the head, which reads raw scale features."""
    def draw(seed, n=600):
        g = torch.Generator().manual_seed(seed)
        sizes = torch.randint(0, 3, (n,), generator=g)
        lo, hi = torch.tensor([0.13, 0.23, 0.36])[sizes], torch.tensor([0.19, 0.30, 0.45])[sizes]
        side = lo + (hi - lo) * torch.rand(n, generator=g)  # over the shorter image side
        aspect = 1 + torch.rand(n, generator=g)  # longer over shorter image side
        wide = torch.rand(n, generator=g) < 0.5
        w = torch.where(wide, side / aspect, side)  # a square object: its normalised width and height
        h = torch.where(wide, side, side / aspect)
        x, y = (1 - w) * torch.rand(n, generator=g), (1 - h) * torch.rand(n, generator=g)
        return torch.stack([x, y, x + w, y + h], -1), sizes

    head = size_classifier(3)
    boxes, sizes = draw(0)
    assert fit_size_classifier(head, boxes, sizes) == 1.0
    held_boxes, held_sizes = draw(1)
    with torch.no_grad():
        assert (head(scale_features(held_boxes)).argmax(-1) == held_sizes).float().mean() >= 0.99
    again = size_classifier(3)
    fit_size_classifier(again, boxes, sizes)  # seeded: the same boxes give the same head
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), again.state_dict().values()))
    with pytest.raises(ValueError, match="no sized box"):
        fit_size_classifier(head, boxes[:0], sizes[:0])


def test_warmup_learns_and_exports_loadable_weights(tmp_path):
    torch.manual_seed(0)
    cfg = DetectorConfig(image_root=str(tmp_path), short_side=64, long_side=64)
    data = BoxSet(str(write_coco(tmp_path, ANNS)), cfg, num_classes=3, num_attributes=3)
    module = DetectorWarmup(TINY, num_attributes=3, attribute_weight=0.5)
    batch = data.batch([0, 1])
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    first = None
    for _ in range(30):
        loss, metrics = module(batch)
        first = first if first is not None else float(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss) < 0.5 * first and float(metrics["acc/object"]) == 1.0
    # exported weights load through FastRCNN's own loader and compute the same features
    path = tmp_path / "fast_rcnn.pt"
    torch.save(export_state(module.state_dict()), path)
    loaded = FastRCNN(FastRCNNConfig(**{**TINY.__dict__, "weights": str(path), "num_attributes": 3})).eval()
    module.eval()
    args = (batch["images"], batch["image_sizes"], batch["boxes"], batch["box_mask"])
    with torch.no_grad():
        assert torch.allclose(loaded(*args, class_logits=True)["class_logits"],
                              module.fast_rcnn(*args, class_logits=True)["class_logits"], atol=1e-6)
        # the attribute head is the Fast R-CNN's own and travels with it (region word embeddings read it)
        appearance = loaded(*args)["appearance"]
        assert torch.allclose(loaded.attribute_classifier(appearance)[:, 1:], module.logits(batch)[1], atol=1e-6)
    # a detector without an attribute head loads the same file; one of another width is refused by name
    FastRCNN(FastRCNNConfig(**{**TINY.__dict__, "weights": str(path)}))
    with pytest.raises(ValueError, match="has 3 attributes, fast_rcnn.num_attributes is 5"):
        FastRCNN(FastRCNNConfig(**{**TINY.__dict__, "weights": str(path), "num_attributes": 5}))


def test_evaluate_counts_by_hand(tmp_path, monkeypatch):
    cfg = DetectorConfig(image_root=str(tmp_path), short_side=32, long_side=32)
    data = BoxSet(str(write_coco(tmp_path, ANNS)), cfg, num_classes=3, num_attributes=3)
    module = DetectorWarmup(TINY, num_attributes=3, attribute_weight=0.5)
    # image a: background scores highest but "square" beats "circle" among objects -> right; top attribute
    # "large" is one of a's. image b: says square (wrong); top attribute "red" is not b's.
    cls = torch.tensor([[[9.0, 2.0, 1.0]], [[0.0, 3.0, 1.0]]])
    att = torch.tensor([[[0.0, 0.0, 5.0]], [[5.0, 0.0, 0.0]]])
    monkeypatch.setattr(module, "logits", lambda batch: (cls[: len(batch["labels"])], att[: len(batch["labels"])],
                                                         None))
    m = evaluate(module, data, batch_size=2, device="cpu")
    assert m["regions"] == 2 and m["object_accuracy"] == 0.5 and m["attribute_accuracy"] == 0.5
    assert m["object_majority_baseline"] == 0.5 and m["attribute_majority_baseline"] == 0.5
    assert "size_accuracy" not in m
    # sizes: a's box is "big" (index 1) and scored so; b has none and is not counted
    sized = [dict(ANNS[0], size_id=2), ANNS[2]]
    data = BoxSet(str(write_coco(tmp_path, sized, sizes=True)), cfg, num_classes=3, num_attributes=3, num_sizes=2)
    module.num_sizes = 2
    size = torch.tensor([[[0.0, 1.0]], [[1.0, 0.0]]])
    monkeypatch.setattr(module, "logits", lambda batch: (cls, att, size))
    m = evaluate(module, data, batch_size=2, device="cpu")
    assert m["size_regions"] == 1 and m["size_accuracy"] == 1.0 and m["size_majority_baseline"] == 1.0


def test_command_line_writes_weights_and_val_metrics(tmp_path):
    sizes = {10: 2, 20: 1}  # a's square is big, b's small
    path = write_coco(tmp_path, [dict(a, size_id=sizes[a["id"]]) for a in ANNS if not a.get("iscrowd")], sizes=True)
    env = one_process_env()
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "pretrain.detector", f"train={path}", f"val={path}", f"image_root={tmp_path}",
           "fast_rcnn.backbone=resnet18", "fast_rcnn.num_classes=3", "fast_rcnn.roi_output_size=4",
           "short_side=32", "long_side=32", "batch_size=2", "epochs=3", f"engine.run_dir={run}",
           "engine.progress=false", "engine.zero_stage=2", "engine.log_every=1"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((run / "metrics_val.json").read_text())
    assert metrics["regions"] == 2 and metrics["attribute_regions"] == 2
    # the two boxes are the same: one of the two sizes is right, and the head's fit says which it learnt
    assert metrics["size_regions"] == 2 and metrics["size_accuracy"] == 0.5 == metrics["size_majority_baseline"]
    FastRCNN(FastRCNNConfig(**{**TINY.__dict__, "weights": str(run / "fast_rcnn.pt")}))  # loads (ZeRO-2 export)
    # the size head travels with the weights (fitted after the CNN's steps), and loads by its width only
    sized = FastRCNN(FastRCNNConfig(**{**TINY.__dict__, "weights": str(run / "fast_rcnn.pt"), "num_sizes": 2}))
    assert torch.equal(sized.size_classifier[2].weight,
                       torch.load(run / "fast_rcnn.pt", weights_only=True)["size_classifier.2.weight"])
    with pytest.raises(ValueError, match="has 2 sizes, fast_rcnn.num_sizes is 3"):
        FastRCNN(FastRCNNConfig(**{**TINY.__dict__, "weights": str(run / "fast_rcnn.pt"), "num_sizes": 3}))
    # the vocabulary beside the weights names the classifiers' outputs in order (pretraining's region_words)
    assert json.loads((run / "fast_rcnn.vocab.json").read_text()) == {
        "classes": ["__background__", "square", "circle"], "attributes": ["red", "blue", "large"],
        "sizes": ["small", "big"]}
    # detector drift: the warm-up's exported weights, loaded as frozen batch norm as pretraining loads them,
    # give back the figures the warm-up measured on its own batch-norm module
    cfg = load_config(DetectorConfig, None, cmd[3:6] + [f"engine.run_dir={run}", "fast_rcnn.backbone=resnet18",
                                                         "fast_rcnn.num_classes=3", "fast_rcnn.roi_output_size=4",
                                                         "short_side=32", "long_side=32"])
    state = {k: v for k, v in torch.load(run / "fast_rcnn.pt", weights_only=True).items()
             if not k.endswith("num_batches_tracked")}
    result = drift(state, cfg)
    for key in ("object_accuracy", "attribute_accuracy", "size_accuracy", "regions"):
        assert result["after"][key] == metrics[key] == result["warm_up"][key]


def test_roi_index_computes_the_real_boxes_alone():
    """`roi_index` (real_rois of the box mask): res5 runs on the whole-image boxes and the real boxes only. Their
    appearance is the full forward's (frozen norms), the padded rows' is 0; with batch norm in training mode res5's
    statistics are those of the real crops alone, checked against res5 run by hand on torchvision's RoIAlign of
    exactly those boxes."""
    torch.manual_seed(0)
    cfg = FastRCNNConfig(**{**TINY.__dict__, "norm": "batch"})
    model = FastRCNN(cfg)
    images = torch.randint(0, 255, (2, 3, 64, 64), dtype=torch.uint8)
    sizes = torch.tensor([[64, 64], [64, 48]])
    boxes = torch.tensor([[[4.0, 4.0, 30.0, 30.0], [10.0, 20.0, 60.0, 50.0], [0.0, 0.0, 16.0, 16.0]],
                          [[8.0, 8.0, 40.0, 24.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    index = real_rois(mask)
    assert index.tolist() == [0, 1, 2, 3, 4, 5]  # image 0: whole + 3; image 1: whole + 1 (rows 4, 5 of 4..7)
    model.eval()
    with torch.no_grad():
        full = model(images, sizes, boxes, mask)["appearance"]
        part = model(images, sizes, boxes, mask, roi_index=index)["appearance"]
    real = torch.cat([torch.ones(2, 1, dtype=torch.bool), mask], 1)
    torch.testing.assert_close(part[real], full[real], atol=1e-5, rtol=1e-5)
    assert (part[~real] == 0).all()
    model.train()
    torch.manual_seed(1)
    out = model(images, sizes, boxes, mask, roi_index=index)["appearance"]
    x = model.normalise(images, sizes)
    features = model.backbone(x)
    whole = torch.tensor([[0.0, 0.0, 64.0, 64.0], [0.0, 0.0, 48.0, 64.0]])
    rois = torch.cat([torch.tensor([[0.0], [0.0], [0.0], [0.0], [1.0], [1.0]]),
                      torch.cat([whole[:1], boxes[0], whole[1:], boxes[1, :1]])], 1)
    crops = roi_align(features, rois, cfg.roi_output_size, spatial_scale=1 / cfg.feature_stride, aligned=True)
    expected = model.box_head(crops).mean((2, 3))
    torch.testing.assert_close(out[real], expected, atol=1e-4, rtol=1e-4)
    padded = model(images, sizes, boxes, mask)["appearance"]  # the padding's crops in res5's batch statistics
    assert (padded[real] - expected).abs().max() > 1e-2


def test_aspect_groups_give_every_step_one_orientation_split_across_ranks():
    """EpochLoader's groups: each global batch (both ranks' micro-batches of one step) holds one orientation, the
    ranks split it without overlap, an epoch has sum(floor(n_g / 4)) steps, and a resumed loader goes on where it
    stopped. Without groups each rank reads its stride of the permutation, as before."""
    class Data:
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def batch(self, idx):
            return {"idx": torch.tensor(idx)}

    groups = [i % 3 == 0 for i in range(23)]  # 8 of one orientation, 15 of the other
    loaders = [EpochLoader(Data(23), 2, seed=3, rank=r, world=2, groups=groups) for r in (0, 1)]
    assert loaders[0].batches_per_epoch == 8 // 4 + 15 // 4 == 5
    its = [iter(loader) for loader in loaders]
    seen = []
    for _ in range(5):
        a, b = (next(it)["idx"].tolist() for it in its)
        assert len(a) == len(b) == 2 and not set(a) & set(b)
        assert len({groups[i] for i in a + b}) == 1
        seen += a + b
    assert len(set(seen)) == 20  # one epoch: 20 distinct items, the 3 left over dropped
    assert loaders[0].epoch == 0
    next(its[0])  # the next epoch's first batch
    assert loaders[0].epoch == 1 and loaders[0].position == 1
    resumed = EpochLoader(Data(23), 2, seed=3, rank=0, world=2, groups=groups)
    resumed.load_state_dict({"epoch": 0, "position": 3})
    again = EpochLoader(Data(23), 2, seed=3, rank=0, world=2, groups=groups)
    it = iter(again)
    for _ in range(3):
        next(it)
    assert next(iter(resumed))["idx"].tolist() == next(it)["idx"].tolist()
    plain = EpochLoader(Data(23), 2, seed=3, rank=1, world=2)
    perm = torch.randperm(23, generator=torch_generator(3, "epoch order", 0)).tolist()
    it = iter(plain)
    assert [next(it)["idx"].tolist() for _ in range(5)] == [perm[1::2][2 * k: 2 * k + 2] for k in range(5)]
    with pytest.raises(ValueError, match="22 group keys for 23 items"):
        EpochLoader(Data(23), 2, seed=3, groups=groups[:22])
