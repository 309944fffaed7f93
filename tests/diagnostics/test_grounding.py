import numpy as np
import pytest
import torch

from diagnostics.categories import CATEGORIES, CHANCE, NAMED_BY_SPAN, REPORTED, span_naming_lengths, word_category
from diagnostics.statistics import clustered_bootstrap
from pretrain.detector import attribute_loss
from train.engine import param_groups


def test_clustered_bootstrap_resamples_whole_images():
    # two images: one with 3 right answers, one with 1 wrong. Resamples draw 2 images: {A,A} -> 1.0,
    # {B,B} -> 0.0, {A,B} or {B,A} -> 3/4 (the mean over examples, not over images)
    values = np.array([1.0, 1.0, 1.0, 0.0])
    clusters = np.array([0, 0, 0, 1])
    s = clustered_bootstrap(values, clusters, resamples=4000, seed=0)
    assert s["mean"] == pytest.approx(0.75) and s["n"] == 4 and s["clusters"] == 2
    assert s["ci95"] == [0.0, 1.0]  # both extremes have probability 1/4 > 2.5%
    draws = np.random.default_rng(0).integers(0, 2, size=(4000, 2))
    means = np.where(draws.sum(1) == 0, 1.0, np.where(draws.sum(1) == 2, 0.0, 0.75))
    assert np.mean(means) == pytest.approx(np.mean([1.0, 0.75, 0.75, 0.0]), abs=0.02)


def test_clustered_interval_is_wider_than_an_iid_one_for_correlated_examples():
    rng = np.random.default_rng(1)
    per_image = rng.random(50) < 0.5  # every example of an image is right or wrong together
    values = np.repeat(per_image.astype(float), 10)
    clusters = np.repeat(np.arange(50), 10)
    clustered = clustered_bootstrap(values, clusters, seed=0)
    iid = clustered_bootstrap(values, np.arange(500), seed=0)
    width = lambda s: s["ci95"][1] - s["ci95"][0]  # noqa: E731
    assert width(clustered) > 2.5 * width(iid)  # sqrt(10) ~ 3.2 in theory
    assert clustered_bootstrap(np.array([np.nan]), np.array([0]))["mean"] is None


def test_word_categories():
    words = "three shapes including a large Red hexagon left of a small covered star".split()
    cats = {w: word_category(words, i) for i, w in enumerate(words)}
    assert cats == {"three": "number", "shapes": None, "including": None, "a": None, "large": "size", "Red": "colour",
                    "hexagon": "shape", "left": "relation", "of": None, "small": "size", "covered": None,
                    "star": "covered_shape"}  # under the cloth: its shape is not in the image
    words = "a small red star on the left among two other shapes".split()
    # "left" here places one box against the image's middle
    assert [word_category(words, i) for i in range(len(words))] == \
        [None, "size", "colour", "shape", None, None, "place", None, "number", None, None]
    assert len(CATEGORIES["colour"]) == 6 and len(CATEGORIES["shape"]) == 8


def test_a_name_its_span_gives_away_is_scored_apart():
    """Masked, a word is one [MASK] per piece: with the packaged uncased vocab every shape is one piece but
    "hexagon" (he ##xa ##gon), so three [MASK]s name it and a text-only model gets it free."""
    from shards.tokenizer import bert_source_dir, load_tokenizer

    tokenizer = load_tokenizer(str(bert_source_dir("packaged")))
    telling = span_naming_lengths(tokenizer)
    assert telling["shape"] == {3} and telling["covered_shape"] == {3}
    assert telling["colour"] == set()  # six one-piece colours: the span says nothing
    assert CHANCE[NAMED_BY_SPAN] == 1.0 and REPORTED[-1] == NAMED_BY_SPAN


def test_softmax_attribute_loss_by_hand():
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [5.0, 5.0, 5.0]]])
    targets = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0]]])
    valid = torch.tensor([[True, True, True]])
    # box 1: -log softmax(2,0,0)_0; box 2: half of each of its two attributes; box 3 has none: not scored
    z1 = np.log(np.exp(2) + 2)
    z2 = np.log(2 + np.exp(1))
    expected = ((z1 - 2) + 0.5 * ((z2 - 1) + z2)) / 2
    assert attribute_loss(logits, targets, valid, "softmax").item() == pytest.approx(expected, rel=1e-5)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets).item()
    assert attribute_loss(logits, targets, valid, "bce").item() == pytest.approx(bce, rel=1e-5)


def test_lr_multipliers_make_groups_by_name():
    module = torch.nn.ModuleDict({"fast_rcnn": torch.nn.Linear(3, 3), "head": torch.nn.Linear(3, 3)})
    groups = param_groups(module, 0.01, lr=1e-3, lr_multipliers={"fast_rcnn.": 0.1})
    by_id = {id(p): g for g in groups for p in g["params"]}
    assert by_id[id(module["fast_rcnn"].weight)]["lr"] == pytest.approx(1e-4)
    assert by_id[id(module["fast_rcnn"].weight)]["weight_decay"] == 0.01
    assert by_id[id(module["fast_rcnn"].bias)]["weight_decay"] == 0.0
    assert "lr" not in by_id[id(module["head"].weight)]  # the optimizer's own rate
    assert groups[0]["params"][0] is module["head"].weight  # group 0 (the logged lr) has factor 1


def _two_images_differing_inside_a_box():
    """The masker test's pair (tests/pretrain/test_masking.py): a red object filling its box, and the same
    background without it, both shrunk 0.4x with antialiasing (which blends the box into a ring around it)."""
    import io

    import numpy as np
    from PIL import Image

    from shards.decode import decode_resized

    rng = np.random.default_rng(0)
    background = rng.integers(0, 256, (150, 200, 3), dtype=np.uint8)
    with_object = background.copy()
    with_object[40:90, 60:110] = [255, 0, 0]
    out = []
    for pixels in (with_object, background):
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")
        image, scale, _ = decode_resized(buf.getvalue(), 60, 1000)
        out.append((image, torch.tensor([[60.0, 40.0, 110.0, 90.0], [0.0, 0.0, 30.0, 30.0]]) * scale,
                    float(scale[:2].max())))
    return out


def test_hidden_regions_in_the_grounding_eval_leave_nothing_of_the_object(monkeypatch):
    """The grounding evaluator's zeroed regions (MRC's zeroed splits) are hidden as pretraining hides them:
    the box zeroed by the model and the resampling ring greyed. Two images differing only inside the box give
    the same visual input once it is hidden; without the ring (the control) they do not."""
    import diagnostics.grounding as grounding
    from model.config import model_config
    from model.vl_bert import VLBert

    torch.manual_seed(0)
    vb = VLBert(model_config("tiny", updates={"fast_rcnn": {"roi_output_size": 4}})).eval()
    evaluator = grounding.GroundingEval.__new__(grounding.GroundingEval)
    evaluator.extractor = None
    (a, boxes, scale), (b, _, _) = _two_images_differing_inside_a_box()
    hide = torch.tensor([[True, False]])

    def seen(image):
        with torch.no_grad():
            return evaluator._visual(vb, image, boxes, hide, "cpu", scale)[0]

    torch.testing.assert_close(seen(a), seen(b), atol=0, rtol=0)
    monkeypatch.setattr(grounding, "grey_resampling_rings", lambda images, *args: images)
    assert (seen(a) - seen(b)).abs().amax() > 1e-3


def test_an_image_ablated_model_is_given_its_own_input_as_ablated(demo_corpus):
    """The grounding table's `ablated` column: the cross-modal `all` fill for a model that reads the image, and for
    the image-ablated control (`model.image_ablated`, which reads every image as grey) the input it reads anyway,
    so its image - ablated difference is 0 by construction, as in the cross-modal diagnostic. Checked on the
    visual input the model is called with: both halves of the batch equal for the blind model, apart for the same
    weights without the flag."""
    from diagnostics.config import GroundingConfig
    from diagnostics.grounding import GroundingEval
    from model.config import model_config
    from model.vl_bert import VLBertForPretraining
    from shards.tokenizer import load_tokenizer

    raw = demo_corpus / "raw"
    evaluator = GroundingEval(GroundingConfig(
        flickr_root=str(raw / "flickr30k_entities"), images=str(raw / "images"),
        boxes=str(raw / "flickr30k_entities" / "boxes_val.jsonl"), short_side=64, long_side=96, max_images=1),
        load_tokenizer(None))
    updates = {"vocab_size": 30522, "cls_token_id": 101, "sep_token_id": 102, "mask_token_id": 103,
               "fast_rcnn": {"roi_output_size": 4}}
    torch.manual_seed(0)
    sighted = VLBertForPretraining(model_config("tiny", updates=updates)).eval()
    blind = VLBertForPretraining(model_config("tiny", updates={**updates, "image_ablated": True})).eval()
    blind.load_state_dict(sighted.state_dict())
    for model, same in ((blind, True), (sighted, False)):
        seen = []

        def keep(module, args, kwargs, seen=seen):
            if kwargs.get("visual_input") is not None and kwargs["visual_input"][0].shape[0] % 2 == 0:
                seen.append(kwargs["visual_input"][0])

        handle = model.vl_bert.register_forward_pre_hook(keep, with_kwargs=True)
        try:
            evaluator(model, "cpu", progress=False)
        finally:
            handle.remove()
        assert seen, "no masked-word batch was scored"
        image, ablated = seen[0].chunk(2)  # the first call is the masked words': image rows, then ablated rows
        assert torch.equal(image, ablated) is same


def test_names_covered_reads_the_phrase_as_word_category_does():
    from diagnostics.categories import names_covered

    assert names_covered("a small covered star".split())
    assert not names_covered("a small red star".split())
    assert not names_covered("the covered".split())  # no shape word after it: nothing named under the cloth


def test_regions_named_as_under_the_cloth_are_the_scenes_covered_objects(demo_corpus):
    """`GroundingData`'s covered flags, read from the captions, against the builder's own scene file: a region is
    flagged exactly when its object is drawn covered and one of the image's sentences says "covered <its shape>"."""
    import json
    from pathlib import Path

    from diagnostics.config import GroundingConfig
    from diagnostics.grounding import GroundingData
    from model.boxes import box_iou
    from shards.tokenizer import load_tokenizer

    raw = demo_corpus / "raw"
    root = raw / "flickr30k_entities"
    data = GroundingData(GroundingConfig(flickr_root=str(root), images=str(raw / "images"),
                                         boxes=str(root / "boxes_val.jsonl"), max_images=0), load_tokenizer(None))
    scenes = [json.loads(line) for line in (raw / "scenes.jsonl").read_text().splitlines()]
    flagged = 0
    for item in data.images:
        scene = scenes[int(item.image_id)]
        assert Path(scene["image"]).stem == item.image_id
        text = (root / "Sentences" / f"{item.image_id}.txt").read_text().lower()
        objects = torch.tensor([o["box"] for o in scene["objects"]], dtype=torch.float32)
        for j, o in enumerate(scene["objects"][k] for k in box_iou(item.boxes, objects).argmax(-1).tolist()):
            assert bool(item.covered[j]) == (o["covered"] and f"covered {o['category']}" in text), (item.image_id, j)
        flagged += int(item.covered.sum())
    assert flagged > 0  # the fixture's corpus draws some


def test_visible_mrc_is_split_by_the_cloth():
    from diagnostics.config import GroundingConfig
    from diagnostics.grounding import GroundingEval

    evaluator = GroundingEval.__new__(GroundingEval)
    evaluator.cfg, evaluator.data = GroundingConfig(), [0, 1]
    values = {"words": {k: np.array([]) for k in ("category", "image", "ablated", "cluster")},
              "mrc": {"split": np.array(["visible"] * 4 + ["zeroed_named", "zeroed_unnamed"]),
                      "correct": np.array([1.0, 1.0, 0.0, 0.0, 1.0, 0.0]),
                      "covered": np.array([False, False, True, True, True, False]),
                      "cluster": np.array([0, 1, 0, 1, 0, 1])}}
    mrc = evaluator.summarise(values)["mrc"]
    assert mrc["visible"]["mean"] == 0.5 and mrc["visible"]["n"] == 4
    assert mrc["visible_in_view"]["mean"] == 1.0 and mrc["visible_covered"]["mean"] == 0.0
    assert mrc["zeroed_named"]["mean"] == 1.0 and mrc["zeroed_unnamed"]["mean"] == 0.0
