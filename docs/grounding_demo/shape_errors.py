"""Which shape words does a grounded export get wrong, and does it answer with another object's shape?
(docs/ABLATION.md, session 19). Masks every shape word of the first 100 held-out images' captions alone, as
`pretrain.grounding` does, with the image, and prints the confusions and how many wrong answers name a shape
that the same image's captions mention (another object in the picture: a binding error).

    python docs/grounding_demo/shape_errors.py runs/demo_long_mrc5/export
"""
import sys, collections, json
sys.path.insert(0, ".")
import torch, torch.nn.functional as F
from model.export import load_pretrained
from model.vl_bert import assemble_text
from pretrain.grounding import GroundingConfig, GroundingEval
from shards.reader import pad_ids
from shards.tokenizer import load_tokenizer
from shards.flickr30k_entities import parse_sentences
from model.config import load_config
torch.set_grad_enabled(False)
path = sys.argv[1]
model = load_pretrained(path).eval(); vb = model.vl_bert; cfg = model.cfg
tok = load_tokenizer(path)
ev = GroundingEval(load_config(GroundingConfig, None, ["max_images=100"]), tok)
conf = collections.Counter(); other_in_image = collections.Counter(); expected = []
from pathlib import Path
from pretrain.grounding import COLOURS, SIZES
root = Path(ev.data.cfg.flickr_root)
scenes = [json.loads(line) for line in (root.parent / "scenes.jsonl").read_text().splitlines()]
by_cue = collections.defaultdict(list)  # how many objects of the image share the phrase's colour (and size)
from pretrain.grounding import SHAPES as SH


def singular(w):
    for cut in ("es", "s"):
        if w.endswith(cut) and w[: -len(cut)] in SH:
            return w[: -len(cut)]
    return w


for item in ev.data.images:
    image, boxes, rs = ev.data.load(item)
    n = len(boxes); b = boxes.unsqueeze(0); bm = torch.ones(1, n, dtype=torch.bool)
    app, boxes_norm, _ = vb.region_features(images=image.unsqueeze(0), image_sizes=torch.tensor([list(image.shape[1:])]),
                                            boxes=b, box_mask=bm)
    # shape words present anywhere in this image's captions
    present = set()
    for s in item.sentences:
        for w in s.ids.tolist():
            t = tok.convert_ids_to_tokens(w)
            if singular(t) in SH:
                present.add(singular(t))
    scene = scenes[int(item.image_id)]
    assert Path(scene["image"]).stem == item.image_id
    sentences = parse_sentences(root / "Sentences" / f"{item.image_id}.txt")
    for sentence, s in zip(sentences, item.sentences):
        for word, cat in s.categories:
            if cat != "shape": continue
            phrase = next((ph for ph in sentence.phrases if ph.first_word <= word < ph.end), None)
            words = [w.lower() for w in phrase.words] if phrase is not None else []
            colour = next((w for w in words if w in COLOURS), None)
            size = next((w for w in words if w in SIZES), None)
            same = [o for o in scene["objects"] if not o["covered"] and o["colour"] == colour]
            cue = ("no colour in the phrase" if colour is None else
                   "colour unique in the image" if len(same) <= 1 else
                   "colour shared, colour+size unique" if sum(o["size"] == size for o in same) <= 1 else
                   "colour and size shared")
            pieces = torch.tensor([w == word for w in s.word_ids])
            ids = s.ids.unsqueeze(0); valid = torch.ones_like(ids, dtype=torch.bool)
            masked = ids.masked_fill(pieces.unsqueeze(0), cfg.mask_token_id)
            inp, types, mask = assemble_text(masked, valid, cls_id=cfg.cls_token_id, sep_id=cfg.sep_token_id, pad_id=cfg.pad_token_id)
            target = F.pad(pieces.unsqueeze(0), (1, 1))[:, : inp.shape[1]]
            labels = F.pad(ids, (1, 1))[:, : inp.shape[1]]
            out = vb(inp, mask, types, boxes=b, box_mask=bm, visual_input=(app, boxes_norm))
            pred = model.mlm_head(out.text_hidden[target]).argmax(-1)
            g = tok.decode(labels[target]); p = tok.decode(pred)
            conf[(g, p)] += 1
            by_cue[cue].append(g == p)
            if g != p:
                # a wrong guess drawn at random among the other shapes would name a present one this often
                expected.append(len(present - {singular(g)}) / (len(SH) - 1))
                other_in_image[("pred shape present in image's captions" if singular(p) in present else "pred not present", )] += 1
tot = sum(conf.values()); wrong = {k: v for k, v in conf.items() if k[0] != k[1]}
print("total", tot, "right", tot - sum(wrong.values()))
for (g, p), v in sorted(wrong.items(), key=lambda x: -x[1])[:25]: print(f"{g:>10} -> {p:<10} {v}")
print(other_in_image, f"a random wrong shape would name a present one in {sum(expected) / max(1, len(expected)):.0%}")
for cue, hits in sorted(by_cue.items()):
    print(f"{cue:40s} words {len(hits):4d}  accuracy {sum(hits) / len(hits):.3f}")
