"""VQG data readers on hand-written files in the official formats, the metrics on a hand-computed case,
and the protocol's Step 2 really training only W (a real run of finetune.vqg)."""

import base64
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from finetune.vqg_data import (
    ShardFeatures,
    TsvFeatures,
    VQGFormatError,
    read_coco_captions,
    read_vqa_questions,
    read_vqg_coco_csv,
    region_tensors,
    tsv_to_shards,
)
from tests.toy_engine import one_process_env

ROOT = Path(__file__).resolve().parents[2]


def test_vqg_coco_csv(tmp_path):
    path = tmp_path / "coco_test_all.csv"
    path.write_text('image_id,image_url,questions,ratings\n'
                    '457,http://farm4.staticflickr.com/1/457.jpg,"What is he doing, and why?---Who is that?",3---2\n'
                    '\n'
                    '12,http://x/12.jpg,Is it raining?---Where is it?---What time is it?,3---3---1\n')
    images = read_vqg_coco_csv(path)
    assert [i.image_id for i in images] == ["457", "12"]
    assert images[0].questions == ["What is he doing, and why?", "Who is that?"]
    assert images[1].questions[2] == "What time is it?" and images[1].ratings == ["3", "3", "1"]
    bad = tmp_path / "bad.csv"
    bad.write_text("id,url,q\n1,u,a?\n")
    with pytest.raises(VQGFormatError, match=r"bad.csv:1: expected the header"):
        read_vqg_coco_csv(bad)
    bad.write_text("image_id,image_url,questions,ratings\n1,u,a?,3\n2,u\n")
    with pytest.raises(VQGFormatError, match=r"bad.csv:3: expected 4 fields"):
        read_vqg_coco_csv(bad)


def test_vqa_questions_and_coco_captions(tmp_path):
    q = tmp_path / "OpenEnded_mscoco_val2014_questions.json"
    q.write_text(json.dumps({"questions": [{"image_id": 5, "question": "What?", "question_id": 50},
                                           {"image_id": 7, "question": "Who?", "question_id": 70},
                                           {"image_id": 5, "question": "Why?", "question_id": 51}]}))
    by_id = {i.image_id: i.questions for i in read_vqa_questions(q)}
    assert by_id == {"5": ["What?", "Why?"], "7": ["Who?"]}
    c = tmp_path / "captions_val2014.json"
    c.write_text(json.dumps({"images": [], "annotations": [{"image_id": 5, "id": 9, "caption": "second "},
                                                            {"image_id": 5, "id": 3, "caption": "first"}]}))
    assert read_coco_captions([c]) == {"5": ["first", "second"]}


def _b64(a):
    return base64.b64encode(np.asarray(a, dtype=np.float32).tobytes()).decode()


def test_bottom_up_tsv_and_shards(tmp_path):
    boxes = [[0, 0, 10, 20], [5, 5, 15, 15]]
    feats = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    tsv = tmp_path / "feats.tsv"
    # as bottom-up-attention's generate_tsv.py writes it, one line per image; the second line as
    # Python 3 ports write it, with the bytes' repr
    tsv.write_text(f"42\t640\t480\t2\t{_b64(boxes)}\t{_b64(feats)}\n"
                   f"7\t100\t50\t1\tb'{_b64([[1, 2, 3, 4]])}'\tb'{_b64([[9, 9, 9]])}'\n")
    store = TsvFeatures(tsv)
    r = store["42"]
    assert (r.width, r.height) == (640, 480)
    np.testing.assert_array_equal(r.boxes, boxes)
    np.testing.assert_array_equal(r.features, feats)
    np.testing.assert_array_equal(store[7].features, [[9, 9, 9]])
    feats_t, boxes_t, mask = region_tensors([store["42"], store["7"]], 36)
    torch.testing.assert_close(boxes_t[0, 0], torch.tensor([0, 0, 10 / 640, 20 / 480]))
    assert mask.tolist() == [[True, True], [True, False]]
    tsv_to_shards(tsv, tmp_path / "shards")
    shards = ShardFeatures(str(tmp_path / "shards" / "*.tar"))
    np.testing.assert_array_equal(shards["42"].features, feats)
    assert shards["7"].width == 100 and len(shards) == 2
    bad = tmp_path / "bad.tsv"
    bad.write_text(f"1\t10\t10\t2\t{_b64(boxes)}\n")
    with pytest.raises(VQGFormatError, match=r"bad.tsv:1: expected 6 tab-separated fields"):
        TsvFeatures(bad)["1"]
    bad.write_text(f"1\t10\t10\t3\t{_b64(boxes)}\t{_b64(feats)}\n")
    with pytest.raises(VQGFormatError, match=r"bad.tsv:1: field 'boxes' holds 8 floats"):
        TsvFeatures(bad)["1"]


def test_question_metrics_hand_computed():
    from finetune.vqg_eval import question_metrics

    refs = {"1": ["what is it"], "2": ["a b c e"]}
    hyp = {"1": "what is it ?", "2": "a b c d"}
    nqg = question_metrics(hyp, refs, "nqg", meteor=False)
    # image 1: 3 of 4 unigrams match ("?" kept); image 2: 3 of 4. Corpus BLEU-1 = 6/8, hypotheses
    # (8 tokens) are not shorter than references (7): no brevity penalty
    assert nqg["Bleu_1"] == pytest.approx(0.75, abs=1e-6)
    if shutil.which("java"):
        ptb = question_metrics(hyp, refs, "ptb", meteor=False)
        # PTB drops "?": image 1 matches fully, 7 tokens each side -> 6/7
        assert ptb["Bleu_1"] == pytest.approx(6 / 7, abs=1e-6)


def _vqg_csv(path: Path, images: dict[str, list[str]]) -> str:
    path.write_text("image_id,image_url,questions,ratings\n" +
                    "".join(f"{k},{k}.jpg,{'---'.join(v)},\n" for k, v in images.items()))
    return str(path)


@pytest.mark.skipif(not shutil.which("java"), reason="PTB tokenizer needs java")
def test_table4_scores_vqg_per_image_against_one_question_for_every_image(tmp_path):
    """Table 4's VQG column: CIDEr-D recomputed per image from the run's predictions (their mean is the corpus
    CIDEr-D), whether each question is one of the image's own non-generic references, and the priors (the
    training split's most frequent question, and its most frequent non-generic one, for every image), by hand.
    With n-gram-distinct references, a question equal to an image's only reference scores 10; equal to one of two
    references whose other shares no weighted n-gram, 5; sharing nothing, 0."""
    from finetune.table4 import vqg_examples, vqg_metrics
    from finetune.vqg_eval import question_metrics

    # 20 training images: generic = asked of >= 4 of them
    train = {f"t{i}": ["how many shapes are there?"] + ["what color is the circle?"] * (i < 5)
             + ["Is the square  big?"] * (i < 3) + ["what is under the cloth?"] * (i == 7) for i in range(20)}
    test = {"a": ["what color is the circle?"], "b": ["how many shapes are there?", "is the square big?"],
            "c": ["what is under the cloth?"]}
    data = {"train": _vqg_csv(tmp_path / "train.csv", train), "test": _vqg_csv(tmp_path / "test.csv", test)}
    run = tmp_path / "vqg" / "pretrained"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"config": {"eval_split": "test", "inputs": "image", "data": data}}))
    preds = {"a": "what color is the circle?", "b": "is the square big?", "c": "what color is the star?"}
    (run / "predictions_test.json").write_text(json.dumps([{"image_id": k, "question": q} for k, q in preds.items()]))
    found, prior = vqg_metrics(run)
    cider, own = found["VQG CIDEr-D x100 (image only)"], found["VQG asks an own non-generic question (image only)"]
    assert list(cider.keys) == ["a", "b", "c"] and list(cider.images) == ["a", "b", "c"]
    assert cider.values[:2].tolist() == pytest.approx([1000.0, 500.0]) and 0 < cider.values[2] < 500
    corpus = question_metrics(preds, test, "ptb", meteor=False)["CIDEr"]
    assert cider.values.mean() == pytest.approx(100 * corpus)
    # a's question is its reference, but a generic one (5 of 20 training images); c's is none of its references
    assert own.values.tolist() == [0.0, 100.0, 0.0]
    # "how many shapes are there?" for every image: one of b's two references, nothing shared with a's or c's
    assert prior["VQG CIDEr-D x100 (image only)"] == pytest.approx(500 / 3)
    # "is the square big?" (3 of 20, case and spacing ignored) for every image: b's alone
    assert prior["VQG asks an own non-generic question (image only)"] == pytest.approx(100 / 3)
    # a caller that has the prior already (the image control's second decoding) gets the same examples without it
    again, none = vqg_examples(json.loads((run / "run.json").read_text())["config"], preds, with_prior=False)
    assert none == {} and {k: v.values.tolist() for k, v in again.items()} == {k: v.values.tolist()
                                                                              for k, v in found.items()}


def test_epoch_loader_resumes_exactly():
    from train.loaders import EpochLoader

    class Data:
        def __len__(self):
            return 23

        def batch(self, idx):
            return idx

    a = EpochLoader(Data(), 4, seed=3)
    it = iter(a)
    first = [next(it) for _ in range(7)]  # crosses an epoch (5 batches per epoch)
    state = a.state_dict()
    rest = [next(it) for _ in range(4)]
    b = EpochLoader(Data(), 4, seed=3)
    b.load_state_dict(state)
    it2 = iter(b)
    assert [next(it2) for _ in range(4)] == rest
    assert sorted(sum(first[:5], [])) == sorted(set(sum(first[:5], [])))  # no pair twice in an epoch


@pytest.fixture(scope="module")
def tiny_vqg(tmp_path_factory):
    """Hand-made VQG_COCO files, bottom-up TSV features and a tiny transformers BERT."""
    from transformers import BertConfig, BertForMaskedLM

    from finetune.vqg_data import RegionFeatures, format_tsv_line
    from shards.tokenizer import resolve_bert_dir

    d = tmp_path_factory.mktemp("vqg")
    bert = d / "bert"
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                               max_position_embeddings=128)).save_pretrained(bert)
    shutil.copy(resolve_bert_dir(None) / "vocab.txt", bert / "vocab.txt")
    rng = np.random.default_rng(0)
    colours = ["red", "blue", "green"]
    with open(d / "feats.tsv", "w") as f:
        for i in range(12):
            boxes = np.array([[0, 0, 50, 40], [10, 10, 90, 70]], np.float32)
            f.write(format_tsv_line(str(i), RegionFeatures(100, 80, boxes, rng.normal(size=(2, 8)).astype(np.float32))))
    annotations = [{"image_id": i, "id": i, "caption": f"a {colours[i % 3]} circle"} for i in range(12)]
    (d / "captions.json").write_text(json.dumps({"images": [], "annotations": annotations}))
    for split, ids in (("train", range(8)), ("test", range(8, 12))):
        rows = [f"{i},images/{i}.jpg,what color is the circle?---is the circle {colours[i % 3]}?,3---3" for i in ids]
        (d / f"coco_{split}_all.csv").write_text("image_id,image_url,questions,ratings\n" + "\n".join(rows) + "\n")
    return d


def run_vqg(d: Path, run: str, *overrides: str) -> None:
    env = one_process_env()
    cmd = [sys.executable, "-m", "finetune.vqg", f"data.train={d}/coco_train_all.csv",
           f"data.test={d}/coco_test_all.csv", f"data.val={d}/coco_test_all.csv", f"data.captions=[{d}/captions.json]",
           f"data.features={d}/feats.tsv",
           f"data.image_root={d}", "batch_size=4", "epochs=2", "optim.lr=1e-2", "meteor=false", "attention_views=1",
           "decode.max_length=6", f"engine.run_dir={d}/{run}", "engine.progress=false", "engine.zero_stage=0",
           "engine.precision=fp32", "engine.log_every=1", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_step2_trains_only_the_projection(tiny_vqg):
    from safetensors.torch import load_file

    d = tiny_vqg
    run_vqg(d, "step1", "step=step1", "inputs=caption", f"init={d}/bert")
    run_vqg(d, "step2", "step=step2", "inputs=image", f"init={d}/step1/model", "train_only_projection=true")
    step1 = load_file(str(d / "step1/model/model.safetensors"))
    step2 = load_file(str(d / "step2/model/model.safetensors"))
    w = {"vl_bert.embeddings.visual_linear.weight", "vl_bert.embeddings.visual_linear.bias"}
    assert set(step1) == set(step2)
    for key in step1:
        if key not in w:
            assert torch.equal(step1[key], step2[key]), key  # bit-identical: frozen
    w_key = "vl_bert.embeddings.visual_linear.weight"
    assert not torch.equal(step1[w_key], step2[w_key])
    origin = json.loads((d / "step2/model/bert_gen.json").read_text())
    assert origin["step"] == "step2" and origin["train_only_projection"]
    assert str(d / "step1/model") in origin["theta_from"]
    assert origin["trainable_parameters"] == 32 * (8 + 4) + 32
    metrics = json.loads((d / "step2/metrics_test.json").read_text())
    assert set(metrics["ptb" if shutil.which("java") else "nqg"]) >= {"Bleu_4", "CIDEr", "ROUGE_L"}
    from finetune.vqg import VQGDataConfig

    sims = json.loads((d / "step2/xsim_test.json").read_text())
    assert len(sims["xsim"]) == len(sims["xsim_centred"]) == 2  # one value per layer
    np.testing.assert_allclose(np.mean(sims["per_image"], 0), sims["xsim"], atol=1e-6)
    # centred: each modality's per-layer mean over the images removed, recomputed here from the [CLS] states
    from finetune.vqg import VQGSet, load_bert_gen
    from finetune.vqg_data import open_features, read_coco_captions
    from shards.tokenizer import load_tokenizer

    gen = load_bert_gen(d / "step2/model").eval()
    data = VQGSet(str(d / "coco_test_all.csv"), VQGDataConfig(max_regions=36), load_tokenizer(str(d / "step2/model")),
                  read_coco_captions([str(d / "captions.json")]), open_features(str(d / "feats.tsv")), "image")
    b = data.inputs_for(list(range(len(data.images))), "both")
    with torch.no_grad():
        img = gen.cls_states(gen.embed_input(features=b["features"], boxes=b["boxes"], region_mask=b["region_mask"]))
        cap = gen.cls_states(gen.embed_input(text_ids=b["text_ids"], text_mask=b["text_mask"]))
    img, cap = img[1:].numpy(), cap[1:].numpy()
    img, cap = img - img.mean(1, keepdims=True), cap - cap.mean(1, keepdims=True)
    want = ((img * cap).sum(-1) / np.linalg.norm(img, axis=-1) / np.linalg.norm(cap, axis=-1)).T
    np.testing.assert_allclose(sims["per_image_centred"], want, atol=1e-5)
    from finetune.vqg import VQGConfig
    from finetune.vqg_report import gap_to_random, random_transformer_xsim

    gaps = gap_to_random(sims, sims)  # a model against itself: no gap, no width
    assert all(g["mean"] == 0 and g["ci95"] == [0, 0] for g in gaps)
    # the report's random-weights baseline on step 1's architecture: step 1 read no features (its W is sized for
    # 2048-d ones), the baseline is sized for the data's 8-d features
    cfg = VQGConfig(data=VQGDataConfig(train=str(d / "coco_train_all.csv"), val=str(d / "coco_test_all.csv"),
                                       test=str(d / "coco_test_all.csv"), captions=[str(d / "captions.json")],
                                       features=str(d / "feats.tsv")), eval_batch_size=4)
    random = random_transformer_xsim(d / "step1/model", cfg)
    assert len(random["xsim"]) == 2 and len(random["per_image"]) == 4
    # each generated question is scored by its own log P and length, the end token included
    preds = json.loads((d / "step2/predictions_test.json").read_text())
    assert all(1 <= p["length"] <= 6 and p["score"] <= 0 for p in preds)
    assert list((d / "step2/attention").glob("*.png"))
    # Step 3 takes Θ from step 1 and W from step 2; the record says so
    run_vqg(d, "step3", "step=step3", "inputs=both", f"init={d}/step1/model", f"init_projection={d}/step2/model",
            "epochs=0.5")
    origin = json.loads((d / "step3/model/bert_gen.json").read_text())
    assert origin["projection_from"] == str(d / "step2/model")


def test_launcher_refuses_unknown_steps_and_missing_inputs(tmp_path):
    script = ROOT / "launch" / "finetune_vqg.sh"
    out = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "step2_unfreeze" in out.stdout
    out = subprocess.run(["bash", str(script), "step4"], capture_output=True, text=True)
    assert out.returncode == 2 and "unknown step 'step4'" in out.stderr
    config = tmp_path / "c.yaml"
    config.write_text("init: packaged\n")
    env = {**os.environ, "CONFIG": str(config), "RUNS": str(tmp_path / "runs"), "NUM_GPUS": "0"}
    out = subprocess.run(["bash", str(script), "step3"], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "step3 needs step1 first" in out.stderr
    out = subprocess.run(["bash", str(script), "custom"], capture_output=True, text=True,
                         env={**env, "DETECTOR": str(tmp_path)})
    assert out.returncode == 2 and "DETECTOR and FEATURES go together" in out.stderr
    out = subprocess.run(["bash", str(script), "custom"], capture_output=True, text=True,
                         env={**env, "DETECTOR": str(tmp_path), "FEATURES": str(tmp_path / "f.tsv")})
    assert out.returncode == 2 and f"DETECTOR '{tmp_path}' is not an export" in out.stderr


def test_bert_gen_starts_from_a_vl_bert_export(tmp_path):
    """A VL-BERT pretrained here starts BERT-gen: its BERT (embeddings, layers, MLM head) carries over;
    its visual layers do not (BERT-gen has its own W)."""
    from finetune.vqg import VQGConfig, build_model
    from model.config import model_config
    from model.export import save_pretrained
    from model.vl_bert import VLBertForPretraining

    torch.manual_seed(0)
    vl = VLBertForPretraining(model_config("tiny"), with_fast_rcnn=False)
    # the quick start's config: its regions' words and the word-region alignment loss, which read the Fast
    # R-CNN's classifiers; BERT-gen has neither (its regions come through W)
    cfg = replace(vl.cfg, region_class_words=[[5], [6, 7]], region_word_alignment=0.1)
    save_pretrained(vl.state_dict(), cfg, tmp_path / "export")
    gen, record = build_model(VQGConfig(init=str(tmp_path / "export")), feature_size=24)
    own = gen.model.state_dict()
    for key in ("vl_bert.encoder.layer.1.output.dense.weight", "vl_bert.embeddings.word_embeddings.weight",
                "mlm_head.transform.dense.weight", "vl_bert.embeddings.token_type_embeddings.weight"):
        assert torch.equal(own[key], vl.state_dict()[key]), key
    assert gen.cfg.visual_embedding == "linear" and record["projection_from"] == "random init"
    assert str(tmp_path / "export") in record["theta_from"]


def test_vl_bert_input_keeps_the_export_whole(tiny_vqg, tmp_path):
    """visual_input=vlbert: every tensor of the export is loaded (its region words need its Fast R-CNN, which stays
    frozen); training moves the visual embedding; the saved model loads back as VLBertGen; the wrong features or
    init are refused with what to do."""
    from safetensors.torch import load_file

    from finetune.vqg import VQGConfig, build_model, load_bert_gen
    from finetune.vqg_data import RegionFeatures, format_tsv_line
    from model.bert_gen import VLBertGen
    from model.config import model_config
    from model.export import save_pretrained
    from model.vl_bert import VLBertForPretraining
    from shards.tokenizer import resolve_bert_dir

    d = tiny_vqg
    cfg = model_config("tiny", updates={"vocab_size": 30522, "cls_token_id": 101, "sep_token_id": 102,
                                        "mask_token_id": 103, "img_token_id": 1, "end_token_id": 2,
                                        "visual_ln_init": 1.0, "fast_rcnn": {"roi_output_size": 4},
                                        "region_class_words": [[2417], [3356], [2665], [4418], [2598], [2003],
                                                               [1996], [2054], [3609]],
                                        "region_word_alignment": 0.5})
    torch.manual_seed(0)
    export = tmp_path / "export"
    save_pretrained(VLBertForPretraining(cfg).state_dict(), cfg, export, resolve_bert_dir(None))
    rng = np.random.default_rng(1)
    with open(tmp_path / "feats512.tsv", "w") as f:
        for i in range(12):
            boxes = np.array([[0, 0, 50, 40], [10, 10, 90, 70]], np.float32)
            f.write(format_tsv_line(str(i), RegionFeatures(100, 80, boxes,
                                                           rng.random((2, 512)).astype(np.float32))))
    with pytest.raises(ValueError, match="vqg_features --model"):
        build_model(VQGConfig(init=str(export), visual_input="vlbert"), feature_size=8)
    with pytest.raises(ValueError, match="init must be an export"):
        build_model(VQGConfig(init="packaged", visual_input="vlbert"), feature_size=512)
    run_vqg(d, "vlbert", "step=custom", "inputs=image", f"init={export}", "visual_input=vlbert",
            f"data.features={tmp_path}/feats512.tsv", "epochs=1")
    before, after = load_file(str(export / "model.safetensors")), load_file(str(d / "vlbert/model/model.safetensors"))
    assert set(before) == set(after)
    detector = [k for k in before if ".fast_rcnn." in k]
    assert detector and all(torch.equal(before[k], after[k]) for k in detector)
    key = "vl_bert.embeddings.visual_feature_embedding.1.weight"
    assert not torch.equal(before[key], after[key])
    assert isinstance(load_bert_gen(d / "vlbert/model"), VLBertGen)
    origin = json.loads((d / "vlbert/model/bert_gen.json").read_text())
    assert origin["visual_input"] == "vlbert" and str(export) in origin["theta_from"]
    assert len(json.loads((d / "vlbert/predictions_test.json").read_text())) == 4


def test_deranged_features_give_each_image_the_next_ones():
    from finetune.vqg_data import DerangedFeatures

    store = DerangedFeatures({"a": 1, "b": 2, "c": 3, "z": 26}, ["a", "b", "c"])
    assert [store[k] for k in ("a", "b", "c")] == [2, 3, 1]  # cyclic: the last takes the first's
    assert "c" in store and "z" not in store  # only the images it was given an order for


def test_our_detector_features_as_bottom_up_tsv(tmp_path):
    """Features written by our Fast R-CNN pass read back by image id, in original pixels, equal to the
    detector run on the image alone (same sizes, multiples of 32, not resized: the batch has no padding)."""
    from PIL import Image

    from finetune.vqg_features import build_detector, extract

    rng = np.random.default_rng(0)
    entries = []
    for name, (h, w) in (("COCO_val2014_000000000042.jpg", (64, 96)), ("img_7.png", (64, 96))):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(tmp_path / name)
        entries.append((name, np.array([[2, 3, 40, 50], [10, 10, 60, 60]], np.float32)))
    detector, _ = build_detector(None, "resnet18", None, seed=0)
    extract(detector, entries, tmp_path, tmp_path / "f.tsv", short_side=0, long_side=0, batch_size=2,
            progress=False)
    store = TsvFeatures(tmp_path / "f.tsv")
    assert sorted(store.index) == ["42", "7"]
    r = store["7"]
    assert (r.width, r.height) == (96, 64) and r.features.shape == (2, 512)
    np.testing.assert_array_equal(r.boxes, entries[1][1])
    image = torch.from_numpy(np.array(Image.open(tmp_path / "img_7.png"))).permute(2, 0, 1)[None]
    with torch.no_grad():
        alone = detector.eval()(image, torch.tensor([[64, 96]]), torch.from_numpy(entries[1][1])[None],
                                torch.ones(1, 2, dtype=torch.bool))["appearance"][0, 1:]
    np.testing.assert_allclose(r.features, alone.numpy(), rtol=1e-4, atol=1e-5)


def test_distinct_n_and_diversity_by_hand():
    from finetune.vqg_eval import distinct_n, diversity

    texts = ["a b a", "A b"]
    assert distinct_n(texts, 1) == pytest.approx(2 / 5)  # a b a a b
    assert distinct_n(texts, 2) == pytest.approx(2 / 3)  # (a b) (b a) (a b)
    d = diversity(["x?", "y?", "x?", "x?"])
    assert d["distinct_questions"] == 2 and d["top_question"] == "x?" and d["top_share"] == 0.75


def test_decoding_diagnosis_by_hand():
    """Search error and the model's own preference, on hand-made scores: image 0's beam returned "b?" (log P -3
    over 3 tokens) while its reference "a?" scores -2 over 3 (the model ranks it higher: a search error) and is
    generic; image 1's beam returned its best reference itself."""
    from types import SimpleNamespace

    from finetune.vqg_decoding import diagnose

    data = SimpleNamespace(pairs=[(0, "a?"), (0, "b?"), (1, "a?"), (1, "c?")],
                           images=[SimpleNamespace(image_id="10"), SimpleNamespace(image_id="11")])
    ref_logp, ref_len = np.array([-2.0, -3.0, -4.0, -1.0]), np.array([3, 3, 3, 2])
    preds = [{"image_id": "10", "question": "b?", "score": -3.0, "length": 3},
             {"image_id": "11", "question": "c?", "score": -1.0, "length": 2}]
    out = diagnose(preds, data, ref_logp, ref_len, alpha=1.0, generic={"a?"})
    assert out == {"search_error": 0.5, "model_prefers_generic": 0.5}
    # with length penalty 0 image 1's ranks are -4 and -1: still its own question first, and image 0 unchanged
    assert diagnose(preds, data, ref_logp, ref_len, alpha=0.0, generic={"a?"})["search_error"] == 0.5
    # a question equal to the best reference is never an error, whatever the float noise in its score
    preds[0] = {"image_id": "10", "question": "A?", "score": -2.5, "length": 3}
    assert diagnose(preds, data, ref_logp, ref_len, alpha=1.0, generic=set())["search_error"] == 0.0


def test_decoding_diagnosis_runs_on_a_trained_model(tiny_vqg, tmp_path):
    from finetune.vqg_decoding import main

    d = tiny_vqg
    run_vqg(d, "dec", "step=step3_scratch", "inputs=both", f"init={d}/bert", "epochs=1")
    args = ["--run", str(d / "dec"), "--out", str(tmp_path), "--generic-share", "0.9",
            "--variants", "greedy,beam,diverse",
            f"data.train={d}/coco_train_all.csv", f"data.test={d}/coco_test_all.csv", f"data.val={d}/coco_test_all.csv",
            f"data.captions=[{d}/captions.json]", f"data.features={d}/feats.tsv", "decode.max_length=6"]
    assert main(args) == 0
    out = json.loads((tmp_path / "decoding.json").read_text())
    # "what color is the circle?" is asked of every training image, "is the circle red?" of a third
    assert out["generic"] == ["what color is the circle?"]
    rows = {r["name"]: r for r in out["variants"]}
    for r in rows.values():
        qs = [e["question"] for e in r["examples"]]  # all 4 test images
        assert r["images"] == 4 and r["distinct_questions"] == len(set(qs))
        assert r["generic_share"] == pytest.approx(np.mean([q == "what color is the circle?" for q in qs]))
    div = rows["diverse beam: 3 groups of 2, penalty 1"]
    assert "search_error" in rows["beam (the config's)"] and "search_error" in rows["greedy"]
    assert all(len(e["alternatives"]) == 2 for e in div["examples"]) and 1 <= div["per_image"]["distinct"] <= 3
    assert (tmp_path / "decoding.png").stat().st_size > 0 and "search error" in (tmp_path / "decoding.md").read_text()
