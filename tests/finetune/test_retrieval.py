import itertools
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from finetune.common import with_positions
from finetune.retrieval import RetrievalModel, all_pairs_positions, random_recall, recalls
from model.config import model_config
from model.vl_bert import VLBert
from tests.finetune.test_tasks import losses, run_task, tiny_export  # noqa: F401 (a fixture)


def test_recalls_by_hand():
    # 4 captions (of images 0, 0, 1, 2) x 3 images
    scores = np.array([[0.9, 0.1, 0.5],    # caption 0: its image first
                       [0.2, 0.8, 0.7],    # caption 1: image 0 third
                       [0.3, 0.3, 0.1],    # caption 2: image 1 tied with image 0: counts against it -> rank 1
                       [0.0, 0.4, 0.6]])   # caption 3: image 2 first
    hits = recalls(scores, np.array([0, 0, 1, 2]))
    t2i = hits["text_to_image"]
    assert t2i[1].tolist() == [True, False, False, True]
    assert t2i[5].tolist() == [True, True, True, True]
    # image 0's column: captions 0 (0.9) and 1 (0.2); 0.9 is the highest -> rank 0
    # image 1's column: 0.1, 0.8, 0.3, 0.4 -> its caption 2 (0.3) has 0.8 and 0.4 above it -> rank 2
    # image 2's column: 0.5, 0.7, 0.1, 0.6 -> its caption 3 (0.6) has 0.7 above it -> rank 1
    i2t = hits["image_to_text"]
    assert i2t[1].tolist() == [True, False, False]
    assert i2t[5].tolist() == [True, True, True]


def test_random_recall_equals_enumerating_every_ranking():
    # 4 items, 2 of them right, recall@2: the share of the 4! orders with a right one in the top 2
    hits = [any(p.index(r) < 2 for r in (0, 1)) for p in itertools.permutations(range(4))]
    assert random_recall(2, np.array([2]), 4) == pytest.approx(np.mean(hits)) == pytest.approx(5 / 6)
    assert random_recall(1, np.ones(3, dtype=np.int64), 10) == pytest.approx(0.1)
    assert random_recall(10, np.ones(4, dtype=np.int64), 4) == 1.0  # fewer items than k: all in the top k
    assert random_recall(10, np.array([5, 1]), 50) == pytest.approx(
        ((1 - math.comb(45, 10) / math.comb(50, 10)) + 10 / 50) / 2)


def tiny_batch(more_padding: bool = False):
    """A tiny retrieval model (eval mode) and a batch of 4 cached-feature rows, caption 2 padded; with
    more_padding, caption 0 and the boxes of images 1 and 3 padded too."""
    torch.manual_seed(0)
    cfg = model_config("tiny", updates={"visual_ln_init": 1.0})
    model = RetrievalModel(VLBert(cfg), dropout=0.0, hard_negatives=1).eval()
    b, n, width = 4, 3, model.vl_bert.fast_rcnn.feature_size
    batch = {"a_ids": torch.randint(5, 99, (b, 6)), "a_mask": torch.ones(b, 6, dtype=torch.bool),
             "boxes": torch.rand(b, n, 4) * 50, "box_mask": torch.ones(b, n, dtype=torch.bool),
             "appearance": torch.randn(b, 1 + n, width), "boxes_norm": torch.rand(b, 1 + n, 4),
             "image_index": torch.tensor([7, 7, 3, 5])}
    batch["a_mask"][2, 4:] = False
    if more_padding:
        batch["a_mask"][0, 1:] = False
        batch["box_mask"][1, 1:] = False
        batch["box_mask"][3, 2] = False
    return model, batch


def test_loss_takes_the_batch_hardest_other_images_and_captions():
    """The forward's loss against a brute force over every pair: each caption against its image and the
    highest-scoring image of another image index (captions 0 and 1 share image 7: never each other's
    negative), each image against its caption and the highest-scoring caption of another image."""
    model, batch = tiny_batch()
    b = batch["a_mask"].shape[0]
    batch["appearance"][1] = batch["appearance"][0]  # the same image in rows 0 and 1
    loss, metrics = model(batch)
    with torch.no_grad():
        scores = torch.stack([torch.stack([model.pair_scores(batch, model.visual(batch), torch.tensor([c]),
                                                             torch.tensor([m]))[0] for m in range(b)])
                              for c in range(b)])
    same = [[int(batch["image_index"][c]) == int(batch["image_index"][m]) for m in range(b)] for c in range(b)]
    t2i, i2t = [], []
    for i in range(b):
        j = max((m for m in range(b) if not same[i][m]), key=lambda m: scores[i, m])
        t2i.append(F.cross_entropy(torch.stack([scores[i, i], scores[i, j]])[None], torch.tensor([0])))
        c = max((c for c in range(b) if not same[c][i]), key=lambda c: scores[c, i])
        i2t.append(F.cross_entropy(torch.stack([scores[i, i], scores[c, i]])[None], torch.tensor([0])))
    expected = (torch.stack(t2i).mean() + torch.stack(i2t).mean()) / 2
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)
    assert metrics["loss/text_to_image"].item() == pytest.approx(torch.stack(t2i).mean().item(), rel=1e-4)
    loss.backward()  # the scorer and the encoder learn from the pairs
    assert model.scorer[1].weight.grad.abs().sum() > 0


def test_all_pairs_positions_is_with_positions_count_of_every_pair():
    _, batch = tiny_batch(more_padding=True)
    b = batch["a_mask"].shape[0]
    captions, images = torch.arange(b).repeat_interleave(b), torch.arange(b).repeat(b)
    pairs = with_positions({"a_mask": batch["a_mask"][captions], "box_mask": batch["box_mask"][images]})
    assert all_pairs_positions(int(batch["a_mask"].sum()), b, int(batch["box_mask"].sum()), b) == \
        pairs["real_positions"] == b * with_positions(dict(batch))["real_positions"]
    # 3 captions of 5 word-pieces against 2 images of 4 regions, by hand: 6 x (5 + 2) / 3 ... summed per pair
    assert all_pairs_positions(15, 3, 8, 2) == 2 * (15 + 6) + 3 * (8 + 4) == 78


def test_hard_negative_scoring_skips_the_padding_and_scores_the_same():
    """The b x b pairs scored for the hard negatives run packed, with b times the batch's loader count: the
    scores equal the padded run's; a count one short changes them (the count is used, and must be exact); the
    forward passes that count and its loss equals the padded forward's."""
    model, batch = tiny_batch(more_padding=True)
    b = batch["a_mask"].shape[0]
    captions, images = torch.arange(b).repeat_interleave(b), torch.arange(b).repeat(b)
    count = b * with_positions(dict(batch))["real_positions"]
    with torch.no_grad():
        visual = model.visual(batch)
        padded = model.pair_scores(batch, visual, captions, images)
        packed = model.pair_scores(batch, visual, captions, images, count)
        wrong = model.pair_scores(batch, visual, captions, images, count - 1)
        seen = []
        score = model.pair_scores
        model.pair_scores = lambda *a: seen.append(a[2:]) or score(*a)
        loss, _ = model(with_positions(dict(batch)))
        model.pair_scores = score
        padded_loss, _ = model(dict(batch))
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(wrong, padded, rtol=1e-5, atol=1e-6)
    # the pairs trained on, picked on the host (CPU): counted there, so they skip their padding too
    trained = with_positions({"a_mask": batch["a_mask"][seen[1][0]], "box_mask": batch["box_mask"][seen[1][1]]})
    assert seen[0][-1] == count and seen[1][-1] == trained["real_positions"] and len(seen[1][0]) == 3 * b
    assert loss.item() == pytest.approx(padded_loss.item(), rel=1e-5)


def test_demo_retrieval_file_is_karpathys_format(demo_corpus):
    data = json.loads((demo_corpus / "raw/retrieval/dataset_flickr30k.json").read_text())
    assert data["dataset"] == "flickr30k"
    images = data["images"]
    assert {i["split"] for i in images} == {"train", "val", "test"}
    assert [i["imgid"] for i in images] == list(range(len(images)))
    sentids = [s["sentid"] for i in images for s in i["sentences"]]
    assert sentids == list(range(len(sentids))) == [k for i in images for k in i["sentids"]]
    for image in images:
        assert len(image["sentences"]) == 5 and image["filename"].endswith(".jpg")
        for s in image["sentences"]:
            assert s["imgid"] == image["imgid"] and s["tokens"] == s["raw"].replace(",", " ,").split()
    # the held-out images are val and test, the corpus caption first
    val = {line.split("\t")[1].strip().split("/")[-1] for line in open(demo_corpus / "raw/captions_val.tsv")}
    assert {i["filename"] for i in images if i["split"] != "train"} == val
    scenes = {json.loads(line)["image"].split("/")[-1]: json.loads(line)["caption"]
              for line in open(demo_corpus / "raw/scenes.jsonl")}
    assert all(i["sentences"][0]["raw"] == scenes[i["filename"]] for i in images)


def test_retrieval_trains_from_an_export_and_ranks(demo_corpus, tiny_export, tmp_path):  # noqa: F811
    raw = demo_corpus / "raw"
    run = tmp_path / "retrieval"
    run_task("finetune.retrieval", run, f"backbone.init={tiny_export}", f"image.root={raw}",
             f"data.karpathy={raw}/retrieval/dataset_flickr30k.json", f"data.boxes={raw}/boxes.jsonl",
             "epochs=0.3", "detector=frozen", "eval_split=val")
    assert len(losses(run)) > 5 and all(np.isfinite(losses(run)))
    metrics = json.loads((run / "metrics_val.json").read_text())
    images = json.loads((raw / "retrieval/dataset_flickr30k.json").read_text())["images"]
    n = sum(i["split"] == "val" for i in images)
    assert metrics["images"] == n and metrics["captions"] == 5 * n
    assert metrics["text_to_image"]["R@1"]["random"] == pytest.approx(100 / n, abs=0.01)
    assert metrics["image_to_text"]["R@1"]["random"] == pytest.approx(100 * 5 / (5 * n), abs=0.01)
    assert metrics["text_to_image"]["R@10"]["recall"] == 100.0  # 10 >= the number of images
    rankings = json.loads((run / "rankings_val.json").read_text())
    assert len(rankings["text_to_image"]) == 5 * n and len(rankings["image_to_text"]) == n
