import io
import json
import tarfile

import numpy as np
import pytest

from shards import write_captions, write_text
from shards.caption_inputs import encode_probs, image_regions, iter_img2dataset, load_box_file, parse_box_entry
from shards.reader import StreamConfig, StreamLoader
from shards.skips import SkipLog, numbered_lines
from shards.tokenizer import load_tokenizer

from .helpers import add_member, jpeg_bytes, write_tsv_corpus


def read_shards(out_dir):
    samples = {}
    for tar_path in sorted(out_dir.glob("*.tar")):
        with tarfile.open(tar_path) as tar:
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                samples.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return samples


def test_tsv_round_trip_and_counted_skips(tmp_path, capsys):
    probs = np.full((2, 5), 0.2)
    attributes = np.array([[0.7, 0.3, 0.0], [0.125, 0.125, 0.75]], dtype=np.float16)  # as shards.detect encodes
    boxes = {
        "a.jpg": {"boxes": [[1, 2, 30, 40], [10, 10, 60, 47]], "classes": [1, 3], "scores": [0.9, 0.6],
                  "class_probs": probs.tolist(), "attribute_probs_f16": encode_probs(attributes)},
        "b.jpg": {"boxes": [[0, 0, 20, 20]], "classes": [2], "scores": [0.7]},
        "c.jpg": {"boxes": [[0, 0, 500, 20]], "classes": [2], "scores": [0.7]},  # outside the 64x48 image
    }
    rows = [("a red circle", "a.jpg", (64, 48), None),
            ("", "x.jpg", (64, 48), None),  # empty caption
            (None, None, None, "no tab on this line"),  # malformed
            ("a blue star", "missing.jpg", None, None),  # missing image
            ("a green square", "b.jpg", (32, 32), None),
            ("bad box", "c.jpg", (64, 48), None),
            ("no boxes", "d.jpg", (64, 48), None)]
    tsv = write_tsv_corpus(tmp_path, rows, boxes)
    (tmp_path / "img" / "e.jpg").write_bytes(b"not a jpeg")
    with open(tsv, "a") as f:
        f.write("broken image\te.jpg\n")
    boxes_file = tmp_path / "boxes.jsonl"
    with open(boxes_file, "a") as f:
        f.write('{"image": "e.jpg", "boxes": [[0, 0, 5, 5]]}\n{not json\n')
    out = tmp_path / "shards"
    assert write_captions.main(["--tsv", str(tsv), "--image-root", str(tmp_path / "img"), "--boxes",
                                str(boxes_file), "--num-classes", "5", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["total"] == 2 and sum(s["samples"] for s in manifest["shards"]) == 2
    skipped = manifest["skips"]["skipped"]
    assert skipped == {"empty caption": 1, "malformed TSV line": 1, "missing image": 1, "bad boxes": 1,
                       "no boxes in the box file for this image": 1, "undecodable image": 1,
                       "bad box file line": 1}
    # the summary names file and line of the bad records
    assert f"{tsv}:3: malformed TSV line" in err and f"{tsv}:2: empty caption" in err
    assert f"{boxes_file}:5: bad box file line" in err

    written = read_shards(out)
    a = written["000000000"]
    meta = json.loads(a["json"])
    assert meta["caption"] == "a red circle" and (meta["width"], meta["height"]) == (64, 48)
    assert meta["boxes"] == boxes["a.jpg"]["boxes"] and meta["classes"] == [1, 3] and meta["source"] == "a.jpg"
    assert a["jpg"] == (tmp_path / "img" / "a.jpg").read_bytes()  # JPEG bytes kept, not re-encoded
    assert np.array_equal(np.load(io.BytesIO(a["probs.npy"])), probs.astype(np.float16))
    assert np.array_equal(np.load(io.BytesIO(a["attrs.npy"])), attributes)
    assert "probs.npy" not in written["000000001"] and "attrs.npy" not in written["000000001"]
    with pytest.raises(ValueError, match=r"'attribute_probs' must be \[boxes=2, attributes\], got \[3, 2\]"):
        parse_box_entry({**boxes["a.jpg"], "attribute_probs": [[0.5, 0.5]] * 3}, 5)

    # ... and the streaming reader gives the same values back
    cfg = StreamConfig(caption_shards=str(out / "*.tar"), text_batch_size=0, caption_batch_size=2,
                       short_side=0, num_workers=0, epochs=1)
    batch = next(iter(StreamLoader(cfg, rank=0, world_size=1)))["caption"]
    i = batch["keys"].index("000000000")
    assert batch["boxes"][i, :2].tolist() == boxes["a.jpg"]["boxes"]
    assert batch["box_classes"][i].tolist() == [1, 3]
    assert batch["image_sizes"][i].tolist() == [48, 64]
    tok = load_tokenizer(None)
    assert tok.decode(batch["input_ids"][i][batch["attention_mask"][i]]) == "a red circle"
    assert batch["class_probs"] is None and batch["attribute_probs"] is None  # one sample of the batch has none


def test_img2dataset_input(tmp_path):
    tar_path = tmp_path / "00000.tar"
    with tarfile.open(tar_path, "w") as tar:
        for key, caption, status in [("000000001", "a dog on a sofa", "success"),
                                     ("000000002", "lost", "failed_to_download"),
                                     ("000000003", "a cat", "success")]:
            add_member(tar, f"{key}.jpg", jpeg_bytes(40, 30))
            add_member(tar, f"{key}.txt", caption.encode())
            add_member(tar, f"{key}.json", json.dumps({"status": status, "key": key}).encode())
    records = list(iter_img2dataset(str(tmp_path / "*.tar")))
    assert [(r.key, r.caption, r.error) for r in records] == [
        ("000000001", "a dog on a sofa", None), ("000000002", "", "img2dataset download failed"),
        ("000000003", "a cat", None)]
    boxes = tmp_path / "boxes.jsonl"
    boxes.write_text('{"image": "000000001", "boxes": [[0, 0, 10, 10]], "classes": [1], "scores": [0.9]}\n')
    assert write_captions.main(["--img2dataset", str(tar_path), "--boxes", str(boxes), "--out",
                                str(tmp_path / "out")]) == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["total"] == 1
    assert manifest["skips"]["skipped"] == {"img2dataset download failed": 1,
                                            "no boxes in the box file for this image": 1}


def test_shards_are_size_capped(tmp_path):
    rows = [(f"caption {i}", f"{i}.jpg", (64, 64), None) for i in range(7)]
    tsv = write_tsv_corpus(tmp_path, rows, {f"{i}.jpg": {"boxes": [[0, 0, 8, 8]]} for i in range(7)})
    write_captions.main(["--tsv", str(tsv), "--image-root", str(tmp_path / "img"), "--boxes",
                         str(tmp_path / "boxes.jsonl"), "--out", str(tmp_path / "o"), "--max-count", "3"])
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert [s["samples"] for s in manifest["shards"]] == [3, 3, 1]
    assert not list((tmp_path / "o").glob(".*partial"))


def test_text_chunks_at_most_64_tokens_and_whole_words(tmp_path):
    tok = load_tokenizer(None)
    books = tmp_path / "books"
    books.mkdir()
    long_sentence = "Unbelievably " + " ".join(["unbelievably"] * 39) + "."  # 40 words of 3+ pieces: must be cut
    doc = ("The cat sat on the mat. It was happy! Was it? " + long_sentence + " The end came quickly.")
    (books / "b1.txt").write_text(doc)
    wiki = tmp_path / "wiki.txt"
    wiki.write_text("First article. Two sentences.\n\nSecond article here.\n")
    assert write_text.main(["--books", str(books), "--wiki", str(wiki), "--out", str(tmp_path / "t")]) == 0
    chunks = []
    for tar_path in sorted((tmp_path / "t").glob("*.tar")):
        with tarfile.open(tar_path) as tar:
            chunks += [json.loads(tar.extractfile(m).read()) for m in tar.getmembers()]
    assert all(0 < len(c["input_ids"]) <= 64 for c in chunks)
    # nothing lost: the book's chunks concatenate to the book's tokens, sentence by sentence
    book_ids = [i for c in chunks if "b1.txt" in c["source"] for i in c["input_ids"]]
    sentences = write_text.split_sentences(doc)
    assert sentences[:3] == ["The cat sat on the mat.", "It was happy!", "Was it?"]
    assert book_ids == [i for s in sentences for i in tok(s, add_special_tokens=False)["input_ids"]]
    # the short sentences share the first chunk; no chunk starts inside a word
    assert tok.decode(chunks[0]["input_ids"]) == "the cat sat on the mat. it was happy! was it?"
    for c in chunks:
        assert not tok.convert_ids_to_tokens(c["input_ids"][0]).startswith("##")
    wiki_chunks = [c for c in chunks if "wiki.txt" in c["source"]]
    assert [c["source"].rsplit(":", 1)[1] for c in wiki_chunks] == ["1", "3"]


def test_chunking_by_hand():
    # sentences of 3, 2 and 7 tokens; limit 5; the 7-token sentence has one word over its tokens 3-6 (8, 9, 10, 11)
    ids = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11, 12]]
    cont = [False] * 5 + [False, False, False, True, True, True, False]
    assert write_text.chunk_document(ids, cont, 5) == [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11, 12]]


def test_cli_help_and_missing_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        write_captions.main(["--help"])
    assert e.value.code == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        write_captions.main(["--tsv", str(tmp_path / "missing.tsv"), "--boxes", str(tmp_path / "b.jsonl"),
                             "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and f"--tsv {tmp_path / 'missing.tsv'}: no such file" in capsys.readouterr().err


def test_box_file_lines_are_named_and_images_checked(tmp_path):
    path = tmp_path / "boxes.jsonl"
    path.write_text('{"image": "a.jpg", "boxes": [[0, 0, 10, 10]], "classes": [1], "scores": [0.9]}\n'
                    "\n"
                    "not json\n"
                    '{"boxes": []}\n'
                    '{"image": "b", "boxes": [[5, 5, 50, 50]], "classes": [2], "scores": [0.8]}\n')
    # blank lines are skipped but still counted, so line 3 is named as line 3
    assert [where for where, _ in numbered_lines(path)] == [f"{path}:{n}" for n in (1, 3, 4, 5)]
    skips = SkipLog("box lines")
    boxes = load_box_file(path, skips)
    assert sorted(boxes) == ["a.jpg", "b"]
    assert skips.examples == {"bad box file line": [f"{path}:3: bad box file line (Expecting value: line 1 column"
                                                   " 1 (char 0))"],
                              "box file line without 'image'": [f"{path}:4: box file line without 'image' ('image')"]}
    entry, why = image_regions(boxes, "a", 20, 20)  # keyed by the file name, asked by id
    assert why == "" and entry.boxes.tolist() == [[0, 0, 10, 10]]
    assert image_regions(boxes, "c", 20, 20) == (None, "image has no regions in the box file")
    entry, why = image_regions(boxes, "b", 20, 20)  # a box outside the 20 x 20 image
    assert entry is None and why.startswith("bad regions: ")
