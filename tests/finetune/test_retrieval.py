import itertools
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from finetune.common import with_positions
from finetune.retrieval import (
    RetrievalModel,
    cross_scores,
    itc_loss,
    pairs_positions,
    random_recall,
    recalls,
    shortlists,
    two_stage,
)
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


def tiny_batch(more_padding: bool = False, first_stage: str = "none"):
    """A tiny retrieval model (eval mode) and a batch of 4 cached-feature rows, caption 2 padded; with
    more_padding, caption 0 and the boxes of images 1 and 3 padded too."""
    torch.manual_seed(0)
    cfg = model_config("tiny", updates={"visual_ln_init": 1.0})
    model = RetrievalModel(VLBert(cfg), dropout=0.0, hard_negatives=1, first_stage=first_stage, embed_size=8).eval()
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


def test_pairs_positions_is_with_positions_count_of_the_pairs():
    _, batch = tiny_batch(more_padding=True)
    b = batch["a_mask"].shape[0]
    captions, images = torch.tensor([0, 0, 2, 3, 1, 2]), torch.tensor([1, 3, 0, 3, 2, 2])
    pairs = with_positions({"a_mask": batch["a_mask"][captions], "box_mask": batch["box_mask"][images]})
    lengths, regions = batch["a_mask"].sum(1).numpy(), batch["box_mask"].sum(1).numpy()
    assert pairs_positions(lengths[captions], regions[images]) == pairs["real_positions"]
    every_c, every_m = np.repeat(np.arange(b), b), np.tile(np.arange(b), b)
    assert pairs_positions(lengths[every_c], regions[every_m]) == b * with_positions(dict(batch))["real_positions"]
    # a caption of 5 word-pieces with an image of 3 regions and one of 2 words with 4 regions, by hand
    assert pairs_positions(np.array([5, 2]), np.array([3, 4])) == (5 + 2 + 3 + 2) + (2 + 2 + 4 + 2) == 22


def test_itc_loss_by_hand():
    """Rows 0 and 1 share an image: each is half of the other's target, both directions."""
    sim = torch.tensor([[0.9, 0.2, -0.1], [0.3, 0.5, 0.0], [0.1, -0.4, 0.7]])
    image = torch.tensor([4, 4, 9])
    t = 0.1
    logits = sim / t
    target = [[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]
    rows = [-sum(target[i][j] * (logits[i, j] - torch.logsumexp(logits[i], 0)) for j in range(3)) for i in range(3)]
    cols = [-sum(target[i][j] * (logits[i, j] - torch.logsumexp(logits[:, j], 0)) for i in range(3)) for j in range(3)]
    expected = (sum(rows) / 3 + sum(cols) / 3) / 2
    assert itc_loss(sim, image, torch.tensor(t)).item() == pytest.approx(float(expected), rel=1e-6)


def test_itc_first_stage_mines_from_the_embeddings_and_adds_its_loss():
    """With first_stage itc the hard negatives are the highest cosine similarities of captions alone and images
    alone (same image index never), the loss is the cross-encoder's on those pairs plus the contrastive loss at
    its weight, and the projections and the temperature learn."""
    model, batch = tiny_batch(first_stage="itc")
    b = batch["a_mask"].shape[0]
    loss, metrics = model(batch)
    with torch.no_grad():
        visual = model.visual(batch)
        text = model.caption_embeddings(batch["a_ids"], batch["a_mask"])
        images = model.image_embeddings(batch["boxes"], batch["box_mask"], visual)
        sim = text @ images.T
        scores = torch.stack([torch.stack([model.pair_scores(batch, visual, torch.tensor([c]),
                                                             torch.tensor([m]))[0] for m in range(b)])
                              for c in range(b)])
    assert torch.allclose(text.norm(dim=1), torch.ones(b)) and torch.allclose(images.norm(dim=1), torch.ones(b))
    index = batch["image_index"]
    t2i, i2t = [], []
    for i in range(b):
        j = max((m for m in range(b) if index[m] != index[i]), key=lambda m: sim[i, m])
        t2i.append(F.cross_entropy(torch.stack([scores[i, i], scores[i, j]])[None], torch.tensor([0])))
        c = max((c for c in range(b) if index[c] != index[i]), key=lambda c: sim[c, i])
        i2t.append(F.cross_entropy(torch.stack([scores[i, i], scores[c, i]])[None], torch.tensor([0])))
    itm = (torch.stack(t2i).mean() + torch.stack(i2t).mean()) / 2
    itc = itc_loss(sim, index, torch.tensor(0.07))
    assert metrics["loss/itc"].item() == pytest.approx(itc.item(), rel=1e-4)
    assert model.itc_weight == 0.1 and loss.item() == pytest.approx((itm + 0.1 * itc).item(), rel=1e-4)
    loss.backward()
    for p in (model.text_projection.weight, model.image_projection.weight, model.temperature, model.scorer[1].weight):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_image_embeddings_skip_the_padding_and_equal_the_padded_run():
    model, batch = tiny_batch(more_padding=True, first_stage="itc")
    box_mask = batch["box_mask"]
    count = with_positions({"a_mask": box_mask[:, :0], "box_mask": box_mask})["real_positions"]
    assert count == int(box_mask.sum()) + 4 * box_mask.shape[0]  # [CLS] [SEP], whole image and [END]
    with torch.no_grad():
        visual = model.visual(batch)
        padded = model.image_embeddings(batch["boxes"], box_mask, visual)
        packed = model.image_embeddings(batch["boxes"], box_mask, visual, count)
        wrong = model.image_embeddings(batch["boxes"], box_mask, visual, count - 1)
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(wrong, padded, rtol=1e-5, atol=1e-6)


def test_shortlists_and_two_stage_ranking_by_hand():
    # 3 captions x 4 images; shortlist 2
    first = np.array([[0.9, 0.8, 0.1, 0.0],
                      [0.2, 0.3, 0.4, 0.5],
                      [0.6, 0.6, 0.7, -0.2]])
    by_caption, by_image = shortlists(first, 2)
    assert by_caption.tolist() == [[True, True, False, False], [False, False, True, True],
                                   [True, False, True, False]]  # the tie 0.6 / 0.6: the lower index
    assert by_image.tolist() == [[True, True, False, True], [False, False, True, True],
                                 [True, True, True, False]]
    second = np.full(first.shape, np.nan)
    second[by_caption | by_image] = [5.0, -3.0, 1.0, 2.0, 0.5, 4.0, -1.0, 7.0]
    scores = two_stage(first, second, by_caption)
    # caption 0: the cross-encoder puts image 1 (-3) below image 0 (5), both above images 2 and 3 (ITC order)
    assert np.argsort(-scores[0], kind="stable").tolist() == [0, 1, 2, 3]
    assert scores[0, 1] > scores[0, 2] > scores[0, 3]
    # caption 2: image 2 (7) over image 0 (4), then image 1 (ITC 0.6) over image 3 (ITC -0.2)
    assert np.argsort(-scores[2], kind="stable").tolist() == [2, 0, 1, 3]
    # image 1's column by image: caption 2 (-1) and caption 0 (-3) re-ranked, caption 1 below both
    column = two_stage(first, second, by_image)[:, 1]
    assert np.argsort(-column, kind="stable").tolist() == [2, 0, 1]


def test_cross_scores_of_chosen_pairs_equal_single_pair_scores():
    """The chunked, packed scoring of scattered pairs gives each pair the score it gets alone, unpadded."""
    model, batch = tiny_batch(more_padding=True)
    b = batch["a_mask"].shape[0]

    class Captions:
        caption_ids = [row[mask].tolist() for row, mask in zip(batch["a_ids"], batch["a_mask"], strict=True)]
    chosen = np.array([[1, 0, 1, 1], [0, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 1]], dtype=bool)
    with torch.no_grad():
        visual = model.visual(batch)
        got = cross_scores(model, Captions, batch, visual, chosen, batch["box_mask"].sum(1).numpy(), 3, "test")
        for c in range(b):
            for m in range(b):
                if not chosen[c, m]:
                    assert np.isnan(got[c, m])
                    continue
                alone = model.pair_scores(batch, visual, torch.tensor([c]), torch.tensor([m]))[0]
                assert got[c, m] == pytest.approx(alone.item(), rel=1e-4, abs=1e-5)


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
             "epochs=0.3", "detector=frozen", "eval_split=val", "shortlist=2")
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
    first = metrics["first_stage"]  # the default: ITC's shortlists re-ranked by the cross-encoder
    assert first["pairs_all"] == 5 * n * n and 2 * 5 * n <= first["pairs_scored"] <= 2 * (5 * n + n) < 5 * n * n
    # recall@K for K >= the shortlist can't be below the share of right items shortlisted
    assert metrics["text_to_image"]["R@5"]["recall"] >= first["right_in_shortlist"]["text_to_image"]
    for ranking in (first, first["cross_encoder_only"]):  # every query ranks all n images: R@10 is 100
        assert ranking["text_to_image"]["R@10"] == 100.0
