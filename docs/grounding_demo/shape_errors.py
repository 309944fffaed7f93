"""Which shape words does a grounded export get wrong, and does it answer with another object's shape?
(docs/ABLATION.md, session 19). Masks every shape word of the first 100 held-out images' captions alone, as
`diagnostics.grounding` does, with the image, and prints the confusions, how many wrong answers name a shape that
the same image's captions mention (another object in the picture: a binding error), and the accuracy split by
whether the phrase's colour (and size) single its object out in the scene.

    python docs/grounding_demo/shape_errors.py runs/demo_long_mrc5/export
"""

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from diagnostics.categories import COLOURS, SHAPES, SIZES  # noqa: E402
from diagnostics.config import GroundingConfig  # noqa: E402
from diagnostics.grounding import GroundingEval  # noqa: E402
from model.config import load_config  # noqa: E402
from model.export import load_pretrained  # noqa: E402
from model.vl_bert import assemble_text  # noqa: E402
from shards.collate import pad_ids  # noqa: E402
from shards.flickr30k_entities import parse_sentences  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402

HELD_OUT = "launch/configs/heldout_demo.yaml"  # the demo's held-out images (run from the repository root)


def singular(word: str) -> str:
    for cut in ("es", "s"):
        if word.endswith(cut) and word[: -len(cut)] in SHAPES:
            return word[: -len(cut)]
    return word


def cue(phrase_words: list[str], objects: list[dict]) -> str:
    """Whether the phrase's colour, then its colour and size, single its object out among the uncovered ones."""
    colour = next((w for w in phrase_words if w in COLOURS), None)
    size = next((w for w in phrase_words if w in SIZES), None)
    same = [o for o in objects if not o["covered"] and o["colour"] == colour]
    if colour is None:
        return "no colour in the phrase"
    if len(same) <= 1:
        return "colour unique in the image"
    if sum(o["size"] == size for o in same) <= 1:
        return "colour shared, colour+size unique"
    return "colour and size shared"


def main(path: str) -> None:
    torch.set_grad_enabled(False)
    model = load_pretrained(path).eval()
    vb, cfg = model.vl_bert, model.cfg
    tok = load_tokenizer(path)
    ev = GroundingEval(load_config(GroundingConfig, HELD_OUT, ["max_images=100"]), tok)
    root = Path(ev.data.cfg.flickr_root)
    scenes = [json.loads(line) for line in (root.parent / "scenes.jsonl").read_text().splitlines()]
    confusions, wrong_kind, by_cue, expected = Counter(), Counter(), defaultdict(list), []
    for item in ev.data.images:
        image, boxes, _ = ev.data.load(item)
        n = len(boxes)
        box_mask = torch.ones(1, n, dtype=torch.bool)
        app, boxes_norm, _ = vb.region_features(images=image.unsqueeze(0), image_sizes=torch.tensor(
            [list(image.shape[1:])]), boxes=boxes.unsqueeze(0), box_mask=box_mask)
        present = {singular(t) for s in item.sentences for t in tok.convert_ids_to_tokens(s.ids.tolist())
                   if singular(t) in SHAPES}  # shapes any caption of this image names
        scene = scenes[int(item.image_id)]
        assert Path(scene["image"]).stem == item.image_id
        rows, cues = [], []
        for sentence, s in zip(parse_sentences(root / "Sentences" / f"{item.image_id}.txt"), item.sentences):
            for word, category in s.categories:
                if category == "shape":
                    phrase = next((p for p in sentence.phrases if p.first_word <= word < p.end), None)
                    words = [w.lower() for w in phrase.words] if phrase is not None else []
                    rows.append((s.ids, torch.tensor([w == word for w in s.word_ids])))
                    cues.append(cue(words, scene["objects"]))
        if not rows:
            continue
        ids, valid = pad_ids([r[0] for r in rows])
        pieces = pad_ids([r[1].long() for r in rows])[0].bool()
        inp, types, mask = assemble_text(ids.masked_fill(pieces, cfg.mask_token_id), valid, cls_id=cfg.cls_token_id,
                                         sep_id=cfg.sep_token_id, pad_id=cfg.pad_token_id)
        target = F.pad(pieces, (1, 1))[:, : inp.shape[1]]
        labels = F.pad(ids, (1, 1))[:, : inp.shape[1]]
        r = len(rows)
        out = vb(inp, mask, types, boxes=boxes.unsqueeze(0).expand(r, -1, -1), box_mask=box_mask.expand(r, -1),
                 visual_input=(app.expand(r, -1, -1), boxes_norm.expand(r, -1, -1)))
        predicted = model.mlm_head(out.text_hidden[target]).argmax(-1)
        rows_of = target.nonzero()[:, 0]
        for i in range(r):
            gold, guess = tok.decode(labels[target][rows_of == i]), tok.decode(predicted[rows_of == i])
            confusions[(gold, guess)] += 1
            by_cue[cues[i]].append(gold == guess)
            if gold != guess:
                # a wrong guess drawn at random among the other shapes would name a present one this often
                expected.append(len(present - {singular(gold)}) / (len(SHAPES) - 1))
                wrong_kind["present" if singular(guess) in present else "absent"] += 1
    total = sum(confusions.values())
    wrong = {k: v for k, v in confusions.items() if k[0] != k[1]}
    print("total", total, "right", total - sum(wrong.values()))
    for (gold, guess), v in sorted(wrong.items(), key=lambda x: -x[1])[:25]:
        print(f"{gold:>10} -> {guess:<10} {v}")
    print(f"wrong answers naming a shape the image's captions name: {wrong_kind['present']}, not: "
          f"{wrong_kind['absent']}; a random wrong shape would name a present one in "
          f"{sum(expected) / max(1, len(expected)):.0%}")
    for name, hits in sorted(by_cue.items()):
        print(f"{name:40s} words {len(hits):4d}  accuracy {sum(hits) / len(hits):.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
