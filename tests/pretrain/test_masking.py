import pytest
import torch

from pretrain.masking import IGNORE, MaskingConfig, PretrainMasker, trimmed_lengths
from shards.tokenizer import load_tokenizer


def official_trim(words, regions, limit):
    """The loop of the official VL-BERT dataset code."""
    while words + regions > limit and words > 0 and regions > 0:
        if regions > words:
            regions -= 1
        else:
            words -= 1
    return words, regions


@pytest.mark.parametrize("words", range(1, 70, 7))  # captions are never empty (writers skip them)
@pytest.mark.parametrize("regions", range(1, 101, 9))
def test_trim_rule_matches_the_official_loop(words, regions):
    assert trimmed_lengths(words, regions, 64) == official_trim(words, regions, 64)


@pytest.fixture(scope="module")
def masker():
    tok = load_tokenizer(None)
    return tok, PretrainMasker(MaskingConfig(), tok, cls_id=101, sep_id=102, mask_id=103, num_classes=9)


def mask_rows(tok, m, text: str, rows: int, seed: int):
    """`rows` copies of `text` through the masker: ids, masked ids, labels, chosen pieces, continuation pieces."""
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]] * rows)
    out, labels = m.mask_words(ids, torch.ones_like(ids, dtype=torch.bool), torch.Generator().manual_seed(seed))
    return ids, out, labels, labels != IGNORE, m.continuation[ids]


def test_whole_words_are_masked_together(masker):
    tok, m = masker
    text = "unbelievably tokenization of extraordinarily hyperparameters " * 6
    ids, _, labels, chosen, cont = mask_rows(tok, m, text, rows=64, seed=0)
    # a continuation piece is chosen exactly when the piece before it is
    assert torch.equal(chosen[:, 1:][cont[:, 1:]], chosen[:, :-1][cont[:, 1:]])
    words_chosen = chosen[~cont].float().mean().item()
    assert 0.12 < words_chosen < 0.18  # 15% of words


def test_80_10_10(masker):
    tok, m = masker
    ids = torch.randint(2000, 20000, (400, 64))
    ids[:, :] = 2204  # "good": a whole word, so every token is its own word
    valid = torch.ones_like(ids, dtype=torch.bool)
    out, labels = m.mask_words(ids, valid, torch.Generator().manual_seed(1))
    chosen = labels != IGNORE
    n = chosen.sum().item()
    as_mask = (out[chosen] == 103).sum().item() / n
    unchanged = (out[chosen] == 2204).sum().item() / n
    assert abs(as_mask - 0.8) < 0.02 and abs(unchanged - 0.1) < 0.02
    assert (out[chosen & (out != 103) & (out != 2204)] >= m.first_word_id).all()  # random words are words
    assert torch.equal(out[~chosen], ids[~chosen])


def caption_batch(b=64, n=20):
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(b, n, 2, generator=g) * 100
    boxes = torch.cat([xy, xy + 20], -1)
    return {"index": 3, "caption": {
        "keys": [str(i) for i in range(b)], "input_ids": torch.full((b, 12), 2204),
        "attention_mask": torch.ones(b, 12, dtype=torch.bool), "images": torch.zeros(b, 3, 128, 128, dtype=torch.uint8),
        "image_sizes": torch.full((b, 2), 128), "boxes": boxes, "box_mask": torch.ones(b, n, dtype=torch.bool),
        "box_scores": torch.rand(b, n, generator=g), "box_classes": torch.randint(1, 9, (b, n), generator=g),
        "class_probs": torch.softmax(torch.randn(b, n, 9, generator=g), -1).half()}}


def test_region_masking_rates_and_targets(masker):
    _, m = masker
    batch = caption_batch()
    out = m(batch)["caption"]
    b, n = batch["caption"]["box_mask"].shape
    chosen = torch.zeros(b * n, dtype=torch.bool)
    chosen[out["mrc_positions"]] = True
    chosen = chosen.view(b, n)
    assert 0.12 < chosen.float().mean().item() < 0.18
    zeroed = out["masked_regions"]
    assert (zeroed <= chosen).all()  # without co-masking only chosen regions are zeroed
    assert abs(zeroed.sum().item() / chosen.sum().item() - 0.9) < 0.06
    expected = batch["caption"]["class_probs"].flatten(0, 1)[out["mrc_positions"]].float()
    torch.testing.assert_close(out["mrc_probs"], expected)
    assert torch.equal(out["mrc_labels"], batch["caption"]["box_classes"].flatten()[out["mrc_positions"]])


@pytest.mark.parametrize("fraction, images", [(0.25, 16), (0.5, 32), (0.01, 1), (0.99, 63)])
def test_conditional_masking_keeps_words_and_regions_apart(fraction, images):
    """UNITER's conditional masking: round(fraction * B) images (at least one, at most B - 1) have regions chosen
    and every word whole in all their views; the others have words masked and no region chosen or zeroed."""
    tok = load_tokenizer(None)
    m = PretrainMasker(MaskingConfig(mrc_probability=0.5, co_mask_iou=0.3, word_views=2, mlm_probability=0.3,
                                     conditional_mrc_fraction=fraction), tok, cls_id=101, sep_id=102, mask_id=103,
                       num_classes=9)
    batch = caption_batch()
    out = m(batch)["caption"]
    b, n = batch["caption"]["box_mask"].shape
    chosen = torch.zeros(2 * b * n, dtype=torch.bool)
    chosen[out["mrc_positions"]] = True
    region_rows = (chosen.view(2 * b, n) | out["masked_regions"]).any(1)  # [2B]: rows with a region masked
    words = torch.zeros_like(out["input_ids"].flatten(), dtype=torch.bool)
    words[out["mlm_positions"]] = True
    word_rows = words.view(2 * b, -1).any(1)
    assert torch.equal(region_rows[:b], region_rows[b:])  # both views of an image
    # 0.5 of 20 regions: an image of region masking without a region chosen has chance 1e-6
    assert region_rows[:b].sum() == images
    assert not (region_rows & word_rows).any()
    assert word_rows[~region_rows].float().mean() > 0.95  # 12 words at 0.3: a row without any, 1.4%
    # the region-masking images' words are whole: their rows are the caption itself between [CLS] and [SEP]
    assert (out["input_ids"][region_rows][:, 1:13] == 2204).all()


def test_conditional_masking_with_one_image_is_joint():
    tok = load_tokenizer(None)
    joint = PretrainMasker(MaskingConfig(mrc_probability=0.5), tok, cls_id=101, sep_id=102, mask_id=103,
                           num_classes=9)
    conditional = PretrainMasker(MaskingConfig(mrc_probability=0.5, conditional_mrc_fraction=0.25), tok, cls_id=101,
                                 sep_id=102, mask_id=103, num_classes=9)
    batch = caption_batch(b=1)
    a, c = joint(batch)["caption"], conditional(batch)["caption"]
    assert all(torch.equal(a[k], c[k]) for k in ("input_ids", "mlm_positions", "mrc_positions", "masked_regions"))
    with pytest.raises(ValueError, match="conditional_mrc_fraction"):
        PretrainMasker(MaskingConfig(conditional_mrc_fraction=1.0), tok, cls_id=101, sep_id=102, mask_id=103,
                       num_classes=9)


def test_mrc_from_batch_chooses_no_region_before_it():
    """losses.mrc_from_step: batches before it are masked as at mrc_weight 0 (every word draw the same), from it on
    as the default."""
    tok = load_tokenizer(None)
    kw = dict(cls_id=101, sep_id=102, mask_id=103, num_classes=9)
    late = PretrainMasker(MaskingConfig(), tok, mrc_from_batch=4, **kw)
    off, on = PretrainMasker(MaskingConfig(), tok, mrc=False, **kw), PretrainMasker(MaskingConfig(), tok, **kw)
    for index, same in ((3, off), (4, on)):
        batch = {**caption_batch(), "index": index}
        a, b = late(batch)["caption"], same(batch)["caption"]
        assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "mlm_positions", "mrc_positions", "masked_regions"))
    assert len(late({**caption_batch(), "index": 3})["caption"]["mrc_positions"]) == 0


def test_mrc_loss_without_targets_is_zero_with_a_gradient():
    from pretrain.tasks import masked_roi_loss

    logits = torch.zeros(0, 9, requires_grad=True)
    for kind in ("soft", "kl", "hard"):
        loss = masked_roi_loss(logits, torch.zeros(0, 9), torch.zeros(0, dtype=torch.long), kind)
        assert loss.item() == 0.0
        loss.backward()
    assert logits.grad is not None


def test_co_masking_zeroes_overlapping_regions():
    tok = load_tokenizer(None)
    m = PretrainMasker(MaskingConfig(mrc_probability=0.3, co_mask_iou=0.3), tok, cls_id=101, sep_id=102,
                       mask_id=103, num_classes=9)
    batch = caption_batch()
    out = m(batch)["caption"]
    from model.boxes import box_iou

    iou = box_iou(batch["caption"]["boxes"], batch["caption"]["boxes"])
    b, n = out["box_mask"].shape
    chosen = torch.zeros(b * n, dtype=torch.bool)
    chosen[out["mrc_positions"]] = True
    chosen = chosen.view(b, n)
    zeroed = out["masked_regions"]
    primary = zeroed & chosen  # zeroed as MRC targets
    neighbours = ((iou > 0.3) & primary.unsqueeze(1)).any(-1)
    assert torch.equal(zeroed & ~chosen, neighbours & ~chosen)  # co-masked = exactly the overlapping ones
    assert (zeroed & ~chosen).any()


def test_caption_budget_and_determinism(masker):
    _, m = masker
    batch = caption_batch(b=4, n=60)  # 12 words + 60 regions > 64
    out = m(batch)["caption"]
    words = out["text_mask"].sum(1) - 2  # minus [CLS], [SEP]
    regions = out["box_mask"].sum(1)
    assert (words + regions).tolist() == [64] * 4 and words.tolist() == [12] * 4
    kept_scores = batch["caption"]["box_scores"].masked_fill(~out["box_mask"], float("inf")).min(1).values
    dropped = batch["caption"]["box_scores"].masked_fill(out["box_mask"], float("-inf")).max(1).values
    assert (kept_scores > dropped).all()  # the lowest-scoring regions went
    again = m(caption_batch(b=4, n=60))["caption"]
    for k in ("input_ids", "masked_regions", "mlm_positions", "mrc_positions"):
        assert torch.equal(out[k], again[k])  # same batch index -> same masks


def test_image_always_ablated_control_sees_only_the_mean_colour():
    from model.config import FastRCNNConfig
    from model.fast_rcnn import FastRCNN

    tok = load_tokenizer(None)
    m = PretrainMasker(MaskingConfig(ablate_image=True), tok, cls_id=101, sep_id=102, mask_id=103, num_classes=9)
    batch = caption_batch()
    out = m(batch)["caption"]
    plain = PretrainMasker(MaskingConfig(), tok, cls_id=101, sep_id=102, mask_id=103, num_classes=9)(batch)
    # the same words and region targets; only the pixels differ
    for key in ("input_ids", "mlm_labels", "mrc_positions", "boxes"):
        assert torch.equal(out[key], plain["caption"][key])
    normalised = FastRCNN(FastRCNNConfig(num_classes=9)).normalise(out["images"], out["image_sizes"])
    assert normalised.abs().max() < 0.01  # the detector's pixel mean: 0 after normalisation, up to rounding
    assert not torch.equal(batch["caption"]["images"], out["images"])


def test_the_two_image_controls_exclude_each_other():
    """The shuffled-image control's pairing is the reader's (tests/shards/test_reader.py); the masker refuses both."""
    with pytest.raises(ValueError, match="two controls"):
        PretrainMasker(MaskingConfig(shuffle_images=True, ablate_image=True), load_tokenizer(None), cls_id=101,
                       sep_id=102, mask_id=103, num_classes=9)


def test_80_10_10_is_drawn_once_per_word(masker):
    """Every piece of a chosen word gets the same treatment: all [MASK], all random, or all kept."""
    tok, m = masker
    text = "unbelievably extraordinarily hyperparameters " * 8
    ids, out, labels, chosen, cont = mask_rows(tok, m, text, rows=200, seed=3)
    as_mask = out == 103
    kept = out == ids
    pairs = chosen[:, 1:] & cont[:, 1:]  # a chosen continuation piece and the piece before it
    assert pairs.sum() > 1000
    assert torch.equal(as_mask[:, 1:][pairs], as_mask[:, :-1][pairs])
    # random replacements may by chance equal the original piece, which is then "kept": allow for it
    differ = (kept[:, 1:][pairs] != kept[:, :-1][pairs]).float().mean().item()
    assert differ < 0.002


def test_word_views_mask_each_caption_several_times_over_one_image(masker):
    tok, plain = masker
    m = PretrainMasker(MaskingConfig(word_views=3), tok, cls_id=101, sep_id=102, mask_id=103, num_classes=9)
    batch = caption_batch(b=8)
    batch["caption"]["input_ids"] = torch.randint(2000, 20000, (8, 12), generator=torch.Generator().manual_seed(2))
    out = m(batch)["caption"]
    one = plain(batch)["caption"]
    b, n = batch["caption"]["box_mask"].shape
    assert out["images"].shape[0] == b and out["input_ids"].shape[0] == 3 * b
    # every view is the caption (its unmasked words, [CLS]/[SEP] around them), masked on its own
    def unmasked(c):
        labels = torch.full(c["input_ids"].shape, IGNORE)
        labels.view(-1)[c["mlm_positions"]] = c["mlm_labels"]
        return torch.where(labels != IGNORE, labels, c["input_ids"]), labels

    text, labels = unmasked(out)
    assert torch.equal(text, unmasked(one)[0].repeat(3, 1))
    views = (labels != IGNORE).view(3, b, -1)
    assert not torch.equal(views[0], views[1]) and not torch.equal(views[1], views[2])
    # the same regions are zeroed and classified in every view, with the same targets
    for key in ("boxes", "box_mask", "masked_regions"):
        assert torch.equal(out[key], out[key][:b].repeat(3, *[1] * (out[key].dim() - 1)))
    chosen = torch.zeros(3 * b * n, dtype=torch.bool)
    chosen[out["mrc_positions"]] = True
    chosen = chosen.view(3, b, n)
    assert torch.equal(chosen[0], chosen[1]) and torch.equal(chosen[0], chosen[2]) and chosen[0].any()
    expected = batch["caption"]["box_classes"].repeat(3, 1).flatten()[out["mrc_positions"]]
    assert torch.equal(out["mrc_labels"], expected)
    probs = batch["caption"]["class_probs"].repeat(3, 1, 1).flatten(0, 1)[out["mrc_positions"]].float()
    torch.testing.assert_close(out["mrc_probs"], probs)
    with pytest.raises(ValueError, match="word_views"):
        PretrainMasker(MaskingConfig(word_views=0), tok, cls_id=101, sep_id=102, mask_id=103, num_classes=9)(batch)


def test_a_zeroed_box_leaves_nothing_of_its_object_after_resizing():
    """The reader resizes before boxes are chosen, so a hidden object's pixels were blended into a ring around
    its box. Two images that differ only inside the box must reach the detector identical once it is zeroed;
    without the ring greyed (the control) they differ next to the box."""
    import io

    import numpy as np
    from PIL import Image

    from model.config import FastRCNNConfig
    from model.fast_rcnn import FastRCNN
    from shards.collate import collate_captions
    from shards.decode import decode_resized

    rng = np.random.default_rng(0)
    background = rng.integers(0, 256, (150, 200, 3), dtype=np.uint8)
    with_object = background.copy()
    with_object[40:90, 60:110] = [255, 0, 0]  # the object fills its box exactly
    box = torch.tensor([[60.0, 40.0, 110.0, 90.0]])
    samples = []
    for i, pixels in enumerate((with_object, background)):
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")  # lossless: JPEG blocks would spread the object too
        image, scale, _ = decode_resized(buf.getvalue(), 60, 1000)  # 0.4x, antialiased
        samples.append({"key": str(i), "image": image, "resize_scale": float(scale[0]), "boxes": box * scale,
                        "scores": torch.ones(1), "classes": torch.ones(1, dtype=torch.long), "class_probs": None,
                        "input_ids": torch.tensor([2204, 2204])})
    batch = {"index": 0, "caption": collate_captions(samples)}
    tok = load_tokenizer(None)
    m = PretrainMasker(MaskingConfig(mrc_probability=1.0, mrc_zero_fraction=1.0), tok, cls_id=101, sep_id=102,
                       mask_id=103, num_classes=9)
    detector = FastRCNN(FastRCNNConfig(num_classes=9))

    def seen(c):
        x = detector.normalise(c["images"], c["image_sizes"], c["boxes"][:2], c["masked_regions"][:2])
        return x[0], x[1]

    out = m(batch)["caption"]
    assert out["masked_regions"][:2].all()
    a, b = seen(out)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    # the control: the same masking without the ring leaves the object's colour in the pixels around its box
    m.grey_resampling_rings = lambda images, batch, zeroed: images
    a, b = seen(m(batch)["caption"])
    assert (a - b).abs().amax() > 0.1  # 0.44 here: ~25 grey levels of red in the ring


def test_region_words_are_masked_more_in_captions_only():
    """masking.region_word_probability: in captions, a word whose first piece names a class or attribute
    ("red", "circle"; "hexagon" is two pieces, its first counts) is chosen at that rate, whole; other words
    and text-corpus samples keep mlm_probability; without it the draw is exactly BERT's."""
    tok = load_tokenizer(None)
    sentence = "a red hexagon is left of the blue circle near a small square"
    row = tok(sentence, add_special_tokens=False)["input_ids"]
    names = [tok(w, add_special_tokens=False)["input_ids"] for w in ("red", "blue", "circle", "hexagon")]
    assert len(names[3]) > 1  # a name of several pieces
    cfg = MaskingConfig(mlm_probability=0.1, region_word_probability=0.7, mask_fraction=1.0, random_fraction=0.0)
    m = PretrainMasker(cfg, tok, cls_id=101, sep_id=102, mask_id=103, num_classes=9,
                       region_word_ids=[n[0] for n in names])
    ids = torch.tensor([row] * 4000)
    valid = torch.ones_like(ids, dtype=torch.bool)
    _, labels = m.mask_words(ids, valid, torch.Generator().manual_seed(0), caption=True)
    chosen = (labels != IGNORE).float().mean(0)  # per position
    region = torch.tensor([any(i in n for n in names) for i in row])
    assert (chosen[region] - 0.7).abs().max() < 0.04 and (chosen[~region] - 0.1).abs().max() < 0.04
    pieces = [k for k, i in enumerate(row) if i in names[3]]
    assert torch.equal(labels[:, pieces[0]] != IGNORE, labels[:, pieces[1]] != IGNORE)  # whole word
    _, text = m.mask_words(ids, valid, torch.Generator().manual_seed(0))  # a text-corpus sample
    assert ((text != IGNORE).float().mean(0) - 0.1).abs().max() < 0.04
    plain = PretrainMasker(MaskingConfig(mlm_probability=0.1, mask_fraction=1.0, random_fraction=0.0), tok,
                           cls_id=101, sep_id=102, mask_id=103, num_classes=9)
    assert torch.equal(plain.mask_words(ids, valid, torch.Generator().manual_seed(0), caption=True)[1], text)
    with pytest.raises(ValueError, match="region_words"):
        PretrainMasker(cfg, tok, cls_id=101, sep_id=102, mask_id=103, num_classes=9)


def test_relation_words_are_masked_more_in_captions_only():
    """masking.relation_words: in captions, a word whose first piece is a listed word's ("left", "above") is chosen
    at relation_word_probability, beside region words at theirs; other words and text-corpus samples keep
    mlm_probability; one of the pair without the other is an error naming both."""
    tok = load_tokenizer(None)
    sentence = "a red hexagon is left of the blue circle above a small square"
    row = tok(sentence, add_special_tokens=False)["input_ids"]
    red = tok("red", add_special_tokens=False)["input_ids"][0]
    relation = [tok(w, add_special_tokens=False)["input_ids"][0] for w in ("left", "above")]
    cfg = MaskingConfig(mlm_probability=0.1, region_word_probability=0.5, relation_words=["left", "right", "above"],
                        relation_word_probability=0.9, mask_fraction=1.0, random_fraction=0.0)
    m = PretrainMasker(cfg, tok, cls_id=101, sep_id=102, mask_id=103, num_classes=9, region_word_ids=[red])
    ids = torch.tensor([row] * 4000)
    valid = torch.ones_like(ids, dtype=torch.bool)
    _, labels = m.mask_words(ids, valid, torch.Generator().manual_seed(0), caption=True)
    chosen = (labels != IGNORE).float().mean(0)
    expected = torch.tensor([0.9 if i in relation else 0.5 if i == red else 0.1 for i in row])
    assert (chosen - expected).abs().max() < 0.04 and (expected == 0.9).sum() == 2
    _, text = m.mask_words(ids, valid, torch.Generator().manual_seed(0))  # a text-corpus sample
    assert ((text != IGNORE).float().mean(0) - 0.1).abs().max() < 0.04
    for half in ({"relation_words": ["left"]}, {"relation_word_probability": 0.9}):
        with pytest.raises(ValueError, match="relation_words and masking.relation_word_probability"):
            PretrainMasker(MaskingConfig(**half), tok, cls_id=101, sep_id=102, mask_id=103, num_classes=9)


@pytest.mark.parametrize("option,key", [("alignment_drop", "aligned_words"), ("neighbour_drop", "neighbour_words")])
def test_alignment_drop_draws_a_row_flag_after_every_default_draw(masker, option, key):
    """masking.alignment_drop (neighbour_drop): each caption row (every word view) is left without aligned region
    words (its neighbours' aligned regions) with that probability, drawn after everything else, so the rest of the
    batch is the default run's exactly; off by default (no flag: every row takes them)."""
    tok, plain = masker
    batch = caption_batch(b=256, n=8)
    batch["caption"]["input_ids"] = torch.randint(2000, 5000, (256, 12), generator=torch.Generator().manual_seed(1))
    base = plain(batch)["caption"]
    assert key not in base
    views = PretrainMasker(MaskingConfig(word_views=2), tok, cls_id=101, sep_id=102, mask_id=103,
                           num_classes=9)(batch)["caption"]
    for p in (0.25, 0.5):
        m = PretrainMasker(MaskingConfig(**{option: p}, word_views=2), tok, cls_id=101, sep_id=102, mask_id=103,
                           num_classes=9)
        out = m(batch)["caption"]
        flags = out.pop(key)
        assert flags.shape == (512,) and flags.dtype == torch.bool
        assert abs((~flags).float().mean().item() - p) < 0.07  # 512 rows: 3 standard errors
        assert out.keys() == views.keys()
        for name, value in views.items():
            assert torch.equal(out[name], value) if torch.is_tensor(value) else out[name] == value, name
        assert torch.equal(m(batch)["caption"][key], flags)  # seeded by the batch index
    with pytest.raises(ValueError, match=f"{option}: 1.5"):
        PretrainMasker(MaskingConfig(**{option: 1.5}), tok, cls_id=101, sep_id=102, mask_id=103, num_classes=9)


def test_without_mrc_no_region_is_hidden_and_the_words_masks_are_the_mrc_runs(masker):
    """mrc=False (pretraining's losses.mrc_weight: 0, the paper's Table 4 setting (a)): no region chosen or zeroed,
    the images as the stream gave them; every other draw (the words' masks) is the MRC run's."""
    tok, plain = masker
    batch = caption_batch(b=16, n=8)
    batch["caption"]["input_ids"] = torch.randint(2000, 5000, (16, 12), generator=torch.Generator().manual_seed(1))
    batch["caption"]["images"] = torch.randint(0, 256, (16, 3, 128, 128), dtype=torch.uint8,
                                               generator=torch.Generator().manual_seed(2))
    base = plain(batch)["caption"]
    assert base["masked_regions"].any() and len(base["mrc_positions"]) > 0  # the MRC run hides some
    out = PretrainMasker(MaskingConfig(), tok, cls_id=101, sep_id=102, mask_id=103, num_classes=9,
                         mrc=False)(batch)["caption"]
    assert not out["masked_regions"].any()
    assert len(out["mrc_positions"]) == len(out["mrc_labels"]) == len(out["mrc_probs"]) == 0
    assert torch.equal(out["images"], batch["caption"]["images"])
    for key in ("input_ids", "mlm_positions", "mlm_labels", "text_mask", "token_type_ids", "box_mask", "boxes"):
        assert torch.equal(out[key], base[key]), key
    assert out["real_positions"] == base["real_positions"]


def test_the_masker_never_takes_a_false_positive_as_an_mrc_target():
    tok = load_tokenizer(None)
    m = PretrainMasker(MaskingConfig(mrc_probability=1.0, mrc_zero_fraction=0.5), tok, cls_id=101, sep_id=102,
                       mask_id=103, num_classes=9)
    b, n = 8, 6
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(b, n, 2, generator=g) * 100
    classes = torch.randint(1, 9, (b, n), generator=g)
    classes[:, 4:] = -1  # two false positives per image (shards.detector_view's class)
    batch = {"index": 0, "caption": {
        "keys": [str(i) for i in range(b)], "input_ids": torch.full((b, 8), 2204),
        "attention_mask": torch.ones(b, 8, dtype=torch.bool), "images": torch.zeros(b, 3, 128, 128, dtype=torch.uint8),
        "image_sizes": torch.full((b, 2), 128), "boxes": torch.cat([xy, xy + 20], -1),
        "box_mask": torch.ones(b, n, dtype=torch.bool), "box_scores": torch.ones(b, n), "box_classes": classes,
        "class_probs": torch.softmax(torch.randn(b, n, 9, generator=g), -1).half()}}
    out = m(batch)["caption"]
    chosen = torch.zeros(b * n, dtype=torch.bool)
    chosen[out["mrc_positions"]] = True
    # at probability 1 every region with a target is chosen, and no false positive
    assert torch.equal(chosen.view(b, n), classes >= 0)
    assert (out["mrc_labels"] >= 1).all()
