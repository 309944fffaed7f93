"""The cross-modal input ablation diagnostic: overlap rules by hand, what each ablation hides, the
metrics against transformers' BERT and hand-computed statistics, skip accounting, the command line."""

import json
import math
import shutil

import numpy as np
import pytest
import torch

from diagnostics.ablation import against_reference, model_report, reference_bits
from diagnostics.conditions import Ablator, evaluate
from diagnostics.config import DiagnosticConfig
from diagnostics.data import PhraseData, choose_targets, gold_label, regions_over
from diagnostics.statistics import format_interval, paired_test, summarise
from model.config import model_config
from model.vl_bert import VLBertForPretraining

GOLD = torch.tensor([[[0.0, 0, 10, 10]], [[50.0, 50, 60, 60]]])  # [B=2, K=1, 4]
REGIONS = torch.tensor([
    [[0.0, 0, 10, 10],   # the gold box: IoT 1, IoU 1
     [0, 0, 20, 20],     # contains it: IoT 100/100 = 1, IoU 0.25
     [5, 5, 15, 15],     # 5x5 overlap: IoT 0.25
     [0, 0, 6, 10],      # 6x10 overlap: IoT 0.6, IoU 0.6
     [0, 0, 10, 10]],    # padding
    [[0.0, 0, 10, 10], [20, 20, 40, 40], [0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1]],  # nothing near the gold box
])
BOX_MASK = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)


def test_object_ablation_takes_regions_over_the_gold_box_by_iot():
    over = regions_over(REGIONS, BOX_MASK, GOLD, torch.ones(2, 1, dtype=torch.bool), 0.5)
    assert over.tolist() == [[True, True, False, True, False], [False] * 5]
    # a lower threshold takes the 0.25-overlap region too; padding never
    assert regions_over(REGIONS, BOX_MASK, GOLD, torch.ones(2, 1, dtype=torch.bool), 0.2)[0].tolist() == \
        [True, True, True, True, False]


def test_mrc_target_is_the_best_iou_candidate_and_its_overlaps_are_masked():
    target, masked = choose_targets(REGIONS, BOX_MASK, GOLD, torch.ones(2, 1, dtype=torch.bool), 0.5)
    assert target.tolist() == [0, -1]  # example 2: no region over its gold box
    # IoT over region 0 (area 100): region 1 covers it (1.0), region 3 covers 0.6, region 2 0.25
    assert masked.tolist() == [[True, True, False, True, False], [False] * 5]


def test_gold_label_from_the_phrase():
    index = {"star": 4, "dress": 7}
    assert gold_label(["a", "small", "red", "star"], index) == 4
    assert gold_label(["two", "Stars"], index) == 4
    assert gold_label(["the", "dresses", "of", "it"], index) == 7
    assert gold_label(["it"], index) == -1


def test_statistics_by_hand():
    s = summarise(np.array([1.0, 2.0, 3.0, np.nan]))
    half = 4.302652729911275 / math.sqrt(3)  # t(0.975, 2 df) x sem (sd 1)
    assert s["n"] == 3 and s["mean"] == 2.0
    assert s["ci95"] == pytest.approx([2 - half, 2 + half])
    one = summarise(np.array([np.nan, 0.25]))  # one value: no interval, and the table says so
    assert one == {"n": 1, "mean": 0.25, "ci95": None} and format_interval(one) == "0.250 (n 1)"
    assert format_interval(s) == "2.000 [-0.484, 4.484]" and format_interval(None) == "-"
    t = paired_test(np.array([1.0, 2, 3, 4, np.nan]), np.array([2.0, 4, 5, 9, 1]))
    # differences 1, 2, 2, 5: mean 2.5, sd sqrt(3), t = 2.5 / (sqrt(3) / 2)
    assert t["n"] == 4 and t["mean_diff"] == 2.5 and t["t"] == pytest.approx(2.5 / (math.sqrt(3) / 2))
    assert 0.05 < t["p"] < 0.1


# --- the model side --------------------------------------------------------------------------------

def _model(seed=0):
    torch.manual_seed(seed)
    model = VLBertForPretraining(model_config("tiny", updates={"fast_rcnn": {"roi_output_size": 4}})).eval()
    for ln in (model.vl_bert.embeddings.visual_ln_text, model.vl_bert.embeddings.visual_ln_object):
        torch.nn.init.ones_(ln.weight)  # open the visual gates so vision reaches the words
    return model


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 99, (2, 7), generator=g)
    valid = torch.ones(2, 7, dtype=torch.bool)
    valid[1, 5:] = False
    phrase = torch.zeros(2, 7, dtype=torch.bool)
    phrase[0, 1:3] = phrase[1, 2:4] = True
    return {"images": torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8, generator=g),
            "image_sizes": torch.tensor([[64, 64], [60, 64]]), "boxes": REGIONS * 2, "box_mask": BOX_MASK,
            "input_ids": ids, "attention_mask": valid, "phrase": phrase, "gold": GOLD * 2,
            "gold_mask": torch.ones(2, 1, dtype=torch.bool), "gold_label": torch.tensor([3, -1]),
            "class_probs": torch.softmax(torch.randn(2, 5, 9, generator=g), -1)}


def _fitted(model, b):
    ablator = Ablator(model)
    ablator.fit_means([b])
    return ablator


def test_object_ablation_replaces_exactly_the_overlapping_regions():
    model, b = _model(), _batch()
    ablator = _fitted(model, b)
    ablated = regions_over(b["boxes"], b["box_mask"], b["gold"], b["gold_mask"], 0.5)
    appearance, _ = ablator.visual(b, ablated, whole=False)
    is_mean = (appearance[:, 1:] == ablator.region_mean).all(-1)
    assert is_mean.tolist() == ablated.tolist()
    assert not (appearance[:, 0] == ablator.whole_mean).all(-1).any()
    # All: every element, the whole image included, is the average; no CNN needed
    appearance, boxes_norm = ablator.visual(b, b["box_mask"], whole=True)
    assert (appearance[:, 0] == ablator.whole_mean).all() and (appearance[:, 1:] == ablator.region_mean).all()
    _, reference = model.vl_bert.region_features(images=b["images"], image_sizes=b["image_sizes"],
                                                 boxes=b["boxes"], box_mask=b["box_mask"])[:2]
    torch.testing.assert_close(boxes_norm, reference)


def test_all_boxes_ablates_the_geometry_with_the_appearance():
    """all_boxes = all with every region's normalised box the average real box (by hand, off the model's own
    normalised boxes): the image's boxes then no longer change the phrase's bits, as they do under all."""
    model, b = _model(), _batch()
    ablator = _fitted(model, b)
    with pytest.raises(RuntimeError, match="fit_box_mean"):
        ablator.vision_for_language(b, "all_boxes")
    ablator.fit_box_mean([b])
    _, boxes_norm = model.vl_bert.region_features(images=b["images"], image_sizes=b["image_sizes"],
                                                  boxes=b["boxes"], box_mask=b["box_mask"])[:2]
    real = boxes_norm[:, 1:][b["box_mask"]]
    torch.testing.assert_close(ablator.box_mean, real.mean(0))
    moved = dict(b, boxes=b["boxes"].clone())
    moved["boxes"][:, :, 2:] = (moved["boxes"][:, :, 2:] - 3).clamp(min=moved["boxes"][:, :, :2] + 1)
    for condition, same in (("all", False), ("all_boxes", True)):
        a, c = ablator.vision_for_language(b, condition), ablator.vision_for_language(moved, condition)
        assert torch.equal(a, c) == same, condition  # the same inputs give the same bits, bit for bit


def test_whole_image_element_carries_no_ablated_information():
    model, b = _model(), _batch()
    ablator = _fitted(model, b)
    ablated = regions_over(b["boxes"], b["box_mask"], b["gold"], b["gold_mask"], 0.5)
    other = dict(b, images=b["images"].clone())
    x2 = int(b["boxes"][0, ablated[0]][:, 2].max())
    y2 = int(b["boxes"][0, ablated[0]][:, 3].max())
    other["images"][0, :, :y2, :x2] = 255 - other["images"][0, :, :y2, :x2]  # change only ablated pixels
    with torch.no_grad():
        a, _ = ablator.visual(b, ablated, whole=False)
        c, _ = ablator.visual(other, ablated, whole=False)
        torch.testing.assert_close(a, c, rtol=0, atol=0)  # nothing of those pixels reaches any element
        # without the ablation the same pixel change does reach the whole image (the test can fail)
        plain, _ = ablator.visual(b, torch.zeros_like(ablated), whole=False)
        changed, _ = ablator.visual(other, torch.zeros_like(ablated), whole=False)
        assert not torch.allclose(plain[0, 0], changed[0, 0])
        # MRC target masking: the same holds for language-for-vision's masked regions
        l4v = ablator.language_for_vision(b, ("none",))["none"][0]
        l4v_other = ablator.language_for_vision(other, ("none",))["none"][0]
        torch.testing.assert_close(l4v[0], l4v_other[0], rtol=0, atol=0)


def test_whole_image_in_precomputed_mode_is_the_mean_of_the_remaining_regions():
    torch.manual_seed(0)
    model = VLBertForPretraining(model_config("tiny", updates={"precomputed_feature_size": 16}),
                                 with_fast_rcnn=False).eval()
    b = _batch()
    b.pop("images")
    b["image_hw"] = b.pop("image_sizes")
    b["region_features"] = torch.randn(2, 5, 16)
    ablator = _fitted(model, b)
    ablated = regions_over(b["boxes"], b["box_mask"], b["gold"], b["gold_mask"], 0.5)
    appearance, _ = ablator.visual(b, ablated, whole=False)
    remaining = b["box_mask"][0] & ~ablated[0]
    torch.testing.assert_close(appearance[0, 0], b["region_features"][0, remaining].mean(0))
    assert (appearance[0, 1:][ablated[0]] == ablator.region_mean).all()


def test_phrase_bits_match_transformers_bert(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    from model.hf_import import config_from_hf, load_hf_bert

    hf_cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    BertForMaskedLM(hf_cfg).save_pretrained(tmp_path)
    hf = BertForMaskedLM.from_pretrained(str(tmp_path), local_files_only=True).eval()
    model = VLBertForPretraining(config_from_hf(tmp_path, "tiny"), with_fast_rcnn=False).eval()
    load_hf_bert(model, tmp_path)
    b = _batch()
    bits = Ablator(model).vision_for_language(b, "text_only")
    cfg = model.cfg
    for i in range(2):
        words = b["input_ids"][i][b["attention_mask"][i]]
        phrase = b["phrase"][i][b["attention_mask"][i]]
        ids = torch.cat([torch.tensor([cfg.cls_token_id]), words.masked_fill(phrase, cfg.mask_token_id),
                         torch.tensor([cfg.sep_token_id])])
        with torch.no_grad():
            log_p = hf(input_ids=ids[None]).logits[0].log_softmax(-1)
        rows = phrase.nonzero()[:, 0] + 1
        expected = -log_p[rows, words[phrase]].mean() / math.log(2)
        assert bits[i].item() == pytest.approx(expected.item(), abs=1e-5)


# --- data, skips and the command line on the demo corpus -------------------------------------------

def _demo_cfg(demo_corpus, **kw):
    raw = demo_corpus / "raw"
    return DiagnosticConfig(flickr_root=str(raw / "flickr30k_entities"), images=str(raw / "images"),
                            boxes=str(raw / "flickr30k_entities" / "boxes_val.jsonl"),
                            class_names=str(raw / "class_names.json"), short_side=64, long_side=96,
                            batch_size=8, **kw)


def test_examples_without_an_overlapping_region_are_skipped_and_counted(demo_corpus, tmp_path):
    from shards.tokenizer import load_tokenizer

    cfg = _demo_cfg(demo_corpus, max_examples=12)
    # move every region of the first val image far from its objects: its phrases cannot be scored
    lines = (demo_corpus / "raw" / "flickr30k_entities" / "boxes_val.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["boxes"] = [[0, 0, 3, 3] for _ in first["boxes"]]
    boxes = tmp_path / "boxes.jsonl"
    boxes.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    cfg.boxes = str(boxes)
    data = PhraseData(cfg, load_tokenizer(None), 9)
    model = VLBertForPretraining(model_config("tiny", updates={"vocab_size": 30522, "cls_token_id": 101,
                                                               "sep_token_id": 102, "mask_token_id": 103,
                                                               "fast_rcnn": {"roi_output_size": 4}})).eval()
    values = evaluate(Ablator(model), data, sweep=[0.5], progress=False)
    on_first = np.array([it.image_id == first["image"][:-4] for it in data.items])
    assert on_first.any() and not on_first.all()
    assert np.isnan(values["l4v_kl/none"][on_first]).all()  # skipped, never a zero loss
    assert np.isfinite(values["l4v_kl/none"][~on_first]).all()
    assert np.isfinite(values["v4l/none"]).all()  # vision-for-language still scores them
    report = model_report(values, data)
    assert report["skipped"]["language-for-vision: no region over the gold box"] == on_first.sum()
    assert report["l4v_kl"]["none"]["n"] == (~on_first).sum()
    assert report["v4l"]["none"]["n"] == len(data) == 12


def test_split_against_a_reader_without_the_image_by_hand():
    """information = reference - none and overpayment = all - reference, per phrase: they add up to all - none,
    and the bootstrap resamples images (the two phrases of image a move together)."""
    values = {"v4l/none": np.array([1.0, 2.0, 0.5, 1.5]), "v4l/all": np.array([3.0, 5.0, 1.0, np.nan])}
    reference = np.array([2.0, 2.0, 1.5, 2.5])
    clusters = np.array(["a", "a", "b", "c"])
    split = against_reference(values, reference, clusters, resamples=500)
    assert split["reference_none"]["mean"] == pytest.approx(2.0)
    assert split["information"]["mean_diff"] == pytest.approx((1 + 0 + 1 + 1) / 4)
    assert split["information"]["n"] == 4 and split["information"]["clusters"] == 3
    # the phrase without an `all` value is left out of the overpayment, never scored as 0
    assert split["overpayment"]["mean_diff"] == pytest.approx((1 + 3 - 0.5) / 3) and split["overpayment"]["n"] == 3
    scored = np.isfinite(values["v4l/all"])
    assert (np.mean((reference - values["v4l/none"])[scored]) + split["overpayment"]["mean_diff"]
            == pytest.approx(np.mean((values["v4l/all"] - values["v4l/none"])[scored])))
    # images are resampled whole: image a's two phrases give 1 bit over 2 phrases, b and c 1 over 1, so a resampled
    # mean lies in [0.5 (a, a, a), 1.0]; resampling phrases would reach 0 (its phrase with 0 drawn thrice)
    lo, hi = split["information"]["ci95"]
    assert 0.5 - 1e-9 <= lo < hi <= 1 + 1e-9
    # a reader with no image input reads its text-only bits; a control reads its own (grey or unrelated) image
    assert reference_bits({"v4l/text_only": reference}) is reference
    assert reference_bits({"v4l/none": reference, "v4l/text_only": values["v4l/none"]}) is reference


def test_command_line_writes_tables_and_figures(demo_corpus, tmp_path, capsys):
    from diagnostics.ablation import main
    from model.export import save_pretrained
    from shards.tokenizer import packaged_bert_dir

    cfg = model_config("tiny", updates={"vocab_size": 30522, "cls_token_id": 101, "sep_token_id": 102,
                                        "mask_token_id": 103, "fast_rcnn": {"roi_output_size": 4}})
    torch.manual_seed(0)
    save_pretrained(VLBertForPretraining(cfg).state_dict(), cfg, tmp_path / "m", packaged_bert_dir())
    # a text-only BERT with an MLM head, on the packaged vocabulary
    from transformers import BertConfig, BertForMaskedLM

    BertForMaskedLM(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64)).save_pretrained(tmp_path / "bert")
    (tmp_path / "bert" / "vocab.txt").write_bytes((packaged_bert_dir() / "vocab.txt").read_bytes())
    raw = demo_corpus / "raw"
    data = [f"flickr_root={raw / 'flickr30k_entities'}", f"images={raw / 'images'}",
            f"boxes={raw / 'flickr30k_entities' / 'boxes_val.jsonl'}", f"class_names={raw / 'class_names.json'}"]
    # the held-out data has no default: the fields left unset are named
    with pytest.raises(SystemExit):
        main(["--text-baseline", "packaged", "--out", str(tmp_path / "x")])
    assert "flickr_root, images, boxes not set" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no MLM head"):  # all-MiniLM-L6-v2 ships without one
        main(["--text-baseline", "packaged", "--out", str(tmp_path / "x"), *data])
    with pytest.raises(SystemExit):  # a reference the command does not evaluate is named before any work
        main(["--model", f"tiny={tmp_path / 'm'}", "--reference", "control", "--out", str(tmp_path / "x"), *data])
    assert "--reference 'control' is none of the models: tiny" in capsys.readouterr().err
    out = tmp_path / "out"
    main(["--model", f"tiny={tmp_path / 'm'}", "--model", f"tiny2={tmp_path / 'm'}", "--reference", "tiny2",
          "--out", str(out), *data, "short_side=64", "long_side=96", "max_examples=10", "batch_size=5"])
    report = json.loads((out / "results.json").read_text())
    # the same weights as reference: nothing of the image is information, and the overpayment is all - none
    split = report["models"]["tiny"]["against_reference"]
    gap = next(t["mean_diff"] for t in report["models"]["tiny"]["paired_tests"]
               if (t["metric"], t["a"], t["b"]) == ("v4l", "none", "all"))
    assert split["information"]["mean_diff"] == 0.0 and split["overpayment"]["mean_diff"] == pytest.approx(gap)
    assert "against_reference" not in report["models"]["tiny2"] and report["reference"] == "tiny2"
    assert "| tiny | " in (out / "results.md").read_text().split("against a reader without the image (tiny2)")[1]
    assert (out / "information.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    main(["--model", f"tiny={tmp_path / 'm'}", "--text-baseline", str(tmp_path / "bert"), "--reference",
          "text-only BERT", "--out", str(out), *data, "short_side=64", "long_side=96", "max_examples=10",
          "batch_size=5"])
    report = json.loads((out / "results.json").read_text())
    assert set(report["models"]) == {"tiny", "text-only BERT"}
    # against the text-only BERT: its text-only bits, phrase by phrase, from the per-example files
    tiny_values, bert_values = np.load(out / "per_example_tiny.npz"), np.load(out / "per_example_text_only_BERT.npz")
    split = report["models"]["tiny"]["against_reference"]
    assert split["information"]["mean_diff"] == pytest.approx(
        float(np.mean(bert_values["v4l/text_only"] - tiny_values["v4l/none"])), rel=1e-5)
    assert split["overpayment"]["mean_diff"] == pytest.approx(
        float(np.mean(tiny_values["v4l/all"] - bert_values["v4l/text_only"])), rel=1e-5)
    # a reference on another vocabulary reads other word-pieces: no split, said, and the rest of the report written
    shutil.copytree(tmp_path / "bert", tmp_path / "bert_other")
    lines = (packaged_bert_dir() / "vocab.txt").read_text().splitlines()
    (tmp_path / "bert_other" / "vocab.txt").write_text("\n".join(lines[:999] + lines[999:][::-1]) + "\n")
    other = tmp_path / "other"
    main(["--model", f"tiny={tmp_path / 'm'}", "--text-baseline", str(tmp_path / "bert_other"), "--reference",
          "text-only BERT", "--out", str(other), *data, "short_side=64", "long_side=96", "max_examples=10",
          "batch_size=5"])
    report_other = json.loads((other / "results.json").read_text())
    assert report_other["not_split"] == ["tiny"] and "against_reference" not in report_other["models"]["tiny"]
    assert "tiny: not split against text-only BERT" in capsys.readouterr().err
    tiny = report["models"]["tiny"]
    assert set(tiny["v4l"]) == {"none", "object", "object_masked", "all", "text_only"}
    assert all("ci95" in t and "p_bootstrap" in t for t in tiny["paired_tests"] if t["mean_diff"] is not None)
    assert set(tiny["l4v_kl"]) == {"none", "phrase", "all"}
    assert set(tiny["sweep"]) == {"0.1", "0.3", "0.5", "0.7", "0.9"}
    assert {(t["metric"], t["a"], t["b"]) for t in tiny["paired_tests"]} >= {("v4l", "none", "all")}
    assert set(report["models"]["text-only BERT"]["v4l"]) == {"text_only"}
    assert "| tiny |" in (out / "results.md").read_text()
    for png in ("figure2.png", "threshold_sweep.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_colour_variant_masks_only_colour_words(demo_corpus):
    from shards.tokenizer import load_tokenizer

    tok = load_tokenizer(None)
    full = PhraseData(_demo_cfg(demo_corpus), tok, 9)
    colour = PhraseData(_demo_cfg(demo_corpus, phrase_words="colour"), tok, 9)
    colours = set(tok.convert_tokens_to_ids(["red", "green", "blue", "yellow", "purple", "orange"]))
    assert 0 < len(colour) < len(full)
    for it in colour.items:  # exactly one masked piece per phrase here: its colour word
        assert set(it.ids[it.phrase].tolist()) <= colours and int(it.phrase.sum()) == 1
    no_colour = sum(not (set(it.ids[it.phrase].tolist()) & colours) for it in full.items)
    assert colour.skipped["phrase has no colour word (phrase_words=colour)"] == no_colour


def test_object_masked_hides_the_object_as_in_training(demo_corpus):
    """The object_masked condition equals a forward with those regions hidden as pretraining's masker hides them
    (pixels zeroed, the resampling ring around them greyed, RoI-[MASK] token); it differs from the
    dataset-mean `object` condition."""
    from model.fast_rcnn import grey_of
    from shards.images import grey_resampling_rings
    from shards.tokenizer import load_tokenizer

    data = PhraseData(_demo_cfg(demo_corpus, max_examples=6), load_tokenizer(None), 9)
    torch.manual_seed(0)
    model = VLBertForPretraining(model_config("tiny", updates={
        "vocab_size": 30522, "cls_token_id": 101, "sep_token_id": 102, "mask_token_id": 103, "visual_ln_init": 1.0,
        "fast_rcnn": {"roi_output_size": 4}})).eval()
    ab = Ablator(model)
    ab.fit_means(data.batches())
    b = next(iter(data.batches()))
    got = ab.vision_for_language(b, "object_masked")
    ids, types, mask = ab.text(b, "phrase")
    over = regions_over(b["boxes"], b["box_mask"], b["gold"], b["gold_mask"], 0.5)
    images = grey_resampling_rings(b["images"], b["boxes"], over, b["resize_scales"],
                                   grey_of(model.cfg.fast_rcnn.pixel_mean))
    out = model.vl_bert(ids, mask, types, images=images, image_sizes=b["image_sizes"], boxes=b["boxes"],
                        box_mask=b["box_mask"], masked_regions=over)
    assert torch.allclose(got, ab._phrase_bits(out, b), atol=1e-6)
    # the ring matters: hiding the box alone is another input
    box_only = model.vl_bert(ids, mask, types, images=b["images"], image_sizes=b["image_sizes"], boxes=b["boxes"],
                             box_mask=b["box_mask"], masked_regions=over)
    assert not torch.allclose(got, ab._phrase_bits(box_only, b), atol=1e-6)
    assert not torch.equal(got, ab.vision_for_language(b, "object"))  # a different input, not an alias


def test_training_fill_is_the_models_own_pretraining_average():
    """`ablation_fill=training`: ablated elements take the standardisers' running means, which they then map
    to exactly 0; the held-out batches are not read. A model whose standardisers never saw data falls back to
    the held-out images' average (the paper's fill), and an unknown fill is refused."""
    b = _batch()
    assert Ablator(_model()).fill == "evaluation"  # no standardisers (an official model): nothing to read
    torch.manual_seed(0)
    model = VLBertForPretraining(model_config("tiny", updates={"fast_rcnn": {"roi_output_size": 4},
                                                               "standardise_appearance": True})).eval()
    assert Ablator(model).fill == "evaluation"  # standardisers that never saw data: nothing to read either
    with pytest.raises(ValueError, match="ablation_fill: 'dataset'"):
        Ablator(model, fill="dataset")
    emb = model.vl_bert.embeddings
    size = emb.appearance_standardiser.running_mean.numel()
    for std, offset in ((emb.whole_image_standardiser, 1.0), (emb.appearance_standardiser, -2.0)):
        std.running_mean.copy_(torch.arange(size, dtype=torch.float32) / size + offset)
        std.running_var.fill_(4.0)
        std.initialised.fill_(True)
    ablator = Ablator(model, fill="training")
    assert ablator.fill == "training"
    ablator.fit_means(iter(()))  # nothing to read: an evaluation pass would divide by zero regions
    whole = torch.arange(size, dtype=torch.float32) / size + 1.0
    torch.testing.assert_close(ablator.whole_mean, whole, rtol=0, atol=0)
    torch.testing.assert_close(ablator.region_mean, whole - 3.0, rtol=0, atol=0)
    appearance, _ = ablator.visual(b, b["box_mask"], whole=True)
    standardised = torch.cat([emb.whole_image_standardiser(appearance[:, :1], torch.ones(2, 1, dtype=torch.bool)),
                              emb.appearance_standardiser(appearance[:, 1:], b["box_mask"])], 1)
    assert standardised.abs().max() == 0  # an ablated element is the average: no deviation from it
    # the held-out average is another vector (the test can fail): it comes from the batch's pixels
    paper = Ablator(model, fill="evaluation")
    paper.fit_means([b])
    assert not torch.allclose(paper.region_mean, ablator.region_mean)


def test_grey_condition_is_the_image_at_the_pixel_mean():
    """`grey` sets every pixel to the pixel mean and keeps the boxes: on an image already grey it equals
    `none`; on a real image it differs; a precomputed-features batch is refused."""
    from model.fast_rcnn import grey_of

    model, b = _model(), _batch()
    ablator = _fitted(model, b)
    grey = dict(b, images=grey_of(model.cfg.fast_rcnn.pixel_mean).expand_as(b["images"]).clone())
    torch.testing.assert_close(ablator.vision_for_language(grey, "grey"), ablator.vision_for_language(grey, "none"),
                               rtol=0, atol=0)
    assert not torch.allclose(ablator.vision_for_language(b, "grey"), ablator.vision_for_language(b, "none"))
    features = {k: v for k, v in b.items() if k not in ("images", "image_sizes")}
    features.update(region_features=torch.zeros(2, 5, 8), image_hw=b["image_sizes"])
    with pytest.raises(ValueError, match="'grey' needs images"):
        ablator.vision_for_language(features, "grey")


def test_an_image_ablated_model_has_nothing_to_ablate():
    """The image-ablated control (`model.image_ablated`) reads every image as grey: the diagnostic gives it that
    input in every visual condition, so none, object and all are one value, the `grey` condition's; the same
    weights without the flag read the real image and its average regions apart (the test can fail)."""
    torch.manual_seed(0)
    blind = VLBertForPretraining(model_config("tiny", updates={"fast_rcnn": {"roi_output_size": 4},
                                                               "image_ablated": True})).eval()
    sighted = _model()
    blind.load_state_dict(sighted.state_dict())
    b = _batch()
    blind_ab, sighted_ab = _fitted(blind, b), _fitted(sighted, b)
    none = blind_ab.vision_for_language(b, "none")
    for condition in ("object", "all"):
        torch.testing.assert_close(blind_ab.vision_for_language(b, condition), none, rtol=0, atol=0)
        assert not torch.allclose(sighted_ab.vision_for_language(b, condition),
                                  sighted_ab.vision_for_language(b, "none"))
    torch.testing.assert_close(sighted_ab.vision_for_language(b, "grey"), none)


def _periodic_evaluators(demo_corpus):
    """The engine's two periodic evaluators on a few held-out demo phrases and images (as pretraining builds them)."""
    from diagnostics.ablation import PeriodicDiagnostic
    from diagnostics.config import GroundingConfig
    from diagnostics.grounding import GroundingEval
    from shards.tokenizer import load_tokenizer

    tok = load_tokenizer(None)
    raw = demo_corpus / "raw"
    held_out = dict(flickr_root=str(raw / "flickr30k_entities"), images=str(raw / "images"),
                    boxes=str(raw / "flickr30k_entities" / "boxes_val.jsonl"), short_side=64, long_side=96)
    return (PeriodicDiagnostic(_demo_cfg(demo_corpus, max_examples=6), tok, 9),
            GroundingEval(GroundingConfig(**held_out, max_images=2), tok))


def test_periodic_evaluators_run_on_a_module_in_deepspeed_bf16_mode(demo_corpus):
    """DeepSpeed's bf16 casts the module, and the engine's periodic evaluators get that module: the diagnostic's
    fills (fp32 averages) and the grounding eval's inputs must meet bf16 weights (an H200 run failed here), and
    give the fp32 module's figures to bf16's precision."""
    from diagnostics.grounding import scalars

    diagnostic, grounding = _periodic_evaluators(demo_corpus)
    # the demo config's model: standardised appearance, region words from the detector's heads, aligned words
    model = VLBertForPretraining(model_config("tiny", updates={
        "vocab_size": 30522, "cls_token_id": 101, "sep_token_id": 102, "mask_token_id": 103,
        "standardise_appearance": True, "region_class_words": [[2000 + i] for i in range(9)],
        "region_attribute_words": [[3000 + i] for i in range(6)], "region_word_alignment": 0.7,
        "fast_rcnn": {"roi_output_size": 4, "num_attributes": 6}})).eval()
    for ln in (model.vl_bert.embeddings.visual_ln_text, model.vl_bert.embeddings.visual_ln_object):
        torch.nn.init.ones_(ln.weight)
    reference = diagnostic(model, "cpu")
    model.to(torch.bfloat16)
    values = {**diagnostic(model, "cpu"), **scalars(grounding.summarise(grounding(model, "cpu", progress=False)))}
    assert all(math.isfinite(v) for k, v in values.items() if not k.endswith("_n")), values
    for key in ("xmodal/v4l/none", "xmodal/v4l/all"):
        assert values[key] == pytest.approx(reference[key], rel=0.05), key


def test_periodic_evaluators_draw_no_random_numbers(demo_corpus):
    """Below ZeRO-3 rank 0 runs the periodic evaluators alone (`train.engine.Engine._run_evaluation`): the other
    ranks then train on exactly as they would have only if the evaluators leave every random stream where it was."""
    import random

    import numpy as np

    from diagnostics.grounding import scalars

    diagnostic, grounding = _periodic_evaluators(demo_corpus)
    model = VLBertForPretraining(model_config("tiny", updates={
        "vocab_size": 30522, "cls_token_id": 101, "sep_token_id": 102, "mask_token_id": 103,
        "standardise_appearance": True, "region_class_words": [[2000 + i] for i in range(9)],
        "region_word_alignment": 0.7, "fast_rcnn": {"roi_output_size": 4}})).eval()
    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    before = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    diagnostic(model, "cpu")
    scalars(grounding.summarise(grounding(model, "cpu", progress=False)))
    assert torch.equal(torch.get_rng_state(), before[0])
    assert (np.random.get_state()[1] == before[1]).all() and random.getstate() == before[2]
    torch.rand(1)  # the check can fail: a draw moves the stream
    assert not torch.equal(torch.get_rng_state(), before[0])


def test_other_image_shows_each_phrase_the_next_image_of_its_batch():
    """`other_image`: row i scored as `none` scores it when its pixels, image size, boxes and box mask are another
    image's (built by hand here); a batch of one image scores nothing (NaN)."""
    from diagnostics.conditions import other_image_rows

    rows, scored = other_image_rows(["a", "a", "b", "c", "c"])
    assert rows.tolist() == [2, 2, 3, 0, 0] and scored.all()
    assert not other_image_rows(["a", "a"])[1].any()
    model, b = _model(), _batch()
    b = dict(b, box_mask=BOX_MASK.clone(), keys=["x", "y"])
    b["box_mask"][1, 3:] = False  # the two images differ in their regions too
    ablator = _fitted(model, b)
    swapped = dict(b, **{k: b[k].flip(0) for k in ("images", "image_sizes", "boxes", "box_mask")})
    torch.testing.assert_close(ablator.vision_for_language(b, "other_image"),
                               ablator.vision_for_language(swapped, "none"), rtol=0, atol=0)
    assert not torch.allclose(ablator.vision_for_language(b, "other_image"), ablator.vision_for_language(b, "none"))
    assert ablator.vision_for_language(dict(b, keys=["x", "x"]), "other_image").isnan().all()
