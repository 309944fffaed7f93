"""Binding probe (docs/ABLATION.md, session 11): how many captions does the quick start's transformer (the
packaged MiniLM, readout MLM head) need to name a masked colour word when vision is PERFECT?

No CNN: each region's appearance is a one-hot of its ground-truth class and colour (scenes.jsonl), and the Fast
R-CNN's classifiers are fixed to read them exactly, so the region word embeddings carry the true names.
Captions only (no text stream, no MRC), 15% whole-word masking, AdamW, batch 32; every 50 steps, held-out
colour-word accuracy with each colour word masked alone (the grounding measurement's rule, argmax).

    python docs/grounding_demo/binding_probe.py [steps=400] [lr=2e-4] [align=0.7] [words=0] [textcopy=1] ...

views=K: BS/K images per step, each caption masked K times; words=0: no region words (the text prior);
textwarm=N: the first N steps are text-only MLM on the captions;
names=EXPORT: each region's appearance holds that export's Fast R-CNN logits on its gold box (the classifiers read
them with weight 1), so the region words carry the detector's own names, errors and softness included (session 57);
clip=C: gradient-norm clipping at C (0 = off); beta2=B, warm=N: Adam's beta2 and the LR warm-up's steps;
textcopy=1: the visible objects' "colour shape" pairs are written
after the caption as text, so the answer is in the input as words; align=T: region_word_alignment = T.
Run from the repository root after `python -m shards.demo --out data/demo`.
"""

import json
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from model.hf_import import config_from_hf, load_hf_bert
from model.vl_bert import VLBertForPretraining, assemble_text
from shards import shapes_world as sw
from shards.tokenizer import load_tokenizer, packaged_bert_dir

torch.manual_seed(0)
random.seed(0)
args = dict(a.split("=") for a in sys.argv[1:])
LR = float(args.get("lr", 2e-4))
STEPS = int(args.get("steps", 400))
BS = int(args.get("bs", 32))
MLMP = float(args.get("mlmp", 0.15))
HEAD = args.get("head", "readout")
GAIN = float(args.get("gain", 0.05))
WORDS = args.get("words", "1") == "1"
NAMES = args.get("names", "perfect")  # perfect | an export dir: its Fast R-CNN's own logits on every gold box
torch.set_num_threads(int(args.get("threads", 2)))
d = packaged_bert_dir()
tok = load_tokenizer(str(d))
cls_words = [tok(n.replace("_", " "), add_special_tokens=False)["input_ids"] for n in sw.CLASS_NAMES]
att_words = [tok(n, add_special_tokens=False)["input_ids"] for n in sw.COLOURS]
upd = dict(
    visual_size=512,
    geometry_size=128,
    visual_ln_init=0.05,
    visual_ln_init_object=GAIN,
    fast_rcnn=dict(backbone="resnet18", num_classes=9, num_attributes=6 if WORDS else 0, roi_output_size=8),
)
if WORDS:
    upd.update(region_class_words=cls_words, region_attribute_words=att_words)
    if "align" in args:
        upd.update(region_word_alignment=float(args["align"]))
cfg = config_from_hf(d, "base", updates=upd)
model = VLBertForPretraining(cfg)
load_hf_bert(model, d)
fr = model.vl_bert.fast_rcnn
with torch.no_grad():
    fr.object_classifier.weight.zero_()
    fr.object_classifier.bias.zero_()
    for c in range(9):
        fr.object_classifier.weight[c, c] = 10.0 if NAMES == "perfect" else 1.0
    if WORDS:
        fr.attribute_classifier.weight.zero_()
        fr.attribute_classifier.bias.zero_()
        for a in range(6):
            fr.attribute_classifier.weight[a, 9 + a] = 10.0 if NAMES == "perfect" else 1.0
for p in fr.parameters():
    p.requires_grad_(False)
if HEAD == "readout":
    model.mlm_head.init_as_readout()
scenes = [json.loads(l) for l in open("data/demo/raw/scenes.jsonl")]
for k, sc in enumerate(scenes):
    sc["_k"] = k
train, val = scenes[:1800], scenes[1800:]
colours = list(sw.COLOURS)


DET = {}
if NAMES != "perfect":
    from pathlib import Path

    from diagnostics.ablation import feature_extractor
    from diagnostics.config import GroundingConfig
    from diagnostics.grounding import GroundingEval
    from model.config import load_config
    from model.export import load_pretrained
    from shards.decode import decode_resized

    ex = load_pretrained(NAMES).eval()
    gcfg = load_config(GroundingConfig, "launch/configs/heldout_demo.yaml", ["max_images=1"])
    ev = GroundingEval(gcfg, tok, feature_extractor(ex, "cpu"))
    with torch.no_grad():
        for k, sc in enumerate(scenes):  # at the resolution the quick start reads them
            img, scale, _ = decode_resized(Path("data/demo/raw", sc["image"]).read_bytes(), gcfg.short_side,
                                           gcfg.long_side)
            bx = torch.tensor([o["box"] for o in sc["objects"]], dtype=torch.float) * scale
            a, _ = ev._visual(ex.vl_bert, img, bx, None, "cpu")
            detector = ex.vl_bert.fast_rcnn
            DET[k] = (detector.object_classifier(a[0, 1:]), detector.attribute_classifier(a[0, 1:]))
    print("detector logits for", len(DET), "scenes", flush=True)


def visual(scene):
    n = len(scene["objects"])
    app = torch.zeros(n + 1, 512)
    app[:, 20:] = 0.1 * torch.randn(n + 1, 492)
    if DET:  # the classifiers read dims 0-8 and 9-14 with weight 1 (above): softmax gives the detector's own
        cl, at = DET[scene["_k"]]
        app[1:, :9] = cl
        app[1:, 9:15] = at
    for i, o in enumerate([] if DET else scene["objects"]):
        if not o["covered"]:
            app[i + 1, sw.CLASS_NAMES.index(o["category"])] = 1.0
            app[i + 1, 9 + colours.index(o["colour"])] = 1.0
        else:
            app[i + 1, 15] = 1.0
    W, H = scene["width"], scene["height"]
    boxes = torch.tensor([[0, 0, W, H]] + [o["box"] for o in scene["objects"]], dtype=torch.float) / torch.tensor(
        [W, H, W, H]
    )
    return app, boxes


TEXTCOPY = args.get("textcopy", "0") == "1"
VIEWS = int(args.get("views", 1))


def tags(s):
    return " ".join(f"{o['colour']} {o['category']}" for o in s["objects"] if not o["covered"])


def batch(items, mask_fn):
    ids, labs, apps, bxs = [], [], [], []
    for s, caption in items:
        if TEXTCOPY:
            caption = caption + " . " + tags(s)
        words = caption.split()
        enc = tok(words, is_split_into_words=True, add_special_tokens=False)
        x = torch.tensor(enc["input_ids"])
        wid = enc.word_ids()
        chosen = mask_fn(words)
        m = torch.tensor([w in chosen for w in wid])
        lab = torch.where(m, x, torch.full_like(x, -100))
        ids.append(torch.where(m, torch.full_like(x, tok.mask_token_id), x))
        labs.append(lab)
        a, b = visual(s)
        apps.append(a)
        bxs.append(b)
    T = max(len(i) for i in ids)
    N = max(len(a) for a in apps)
    I = torch.zeros(len(ids), T, dtype=torch.long)
    L = torch.full((len(ids), T), -100)
    V = torch.zeros(len(ids), T, dtype=torch.bool)
    A = torch.zeros(len(ids), N, 512)
    B = torch.zeros(len(ids), N, 4)
    BM = torch.zeros(len(ids), N - 1, dtype=torch.bool)
    for k in range(len(ids)):
        I[k, : len(ids[k])] = ids[k]
        L[k, : len(ids[k])] = labs[k]
        V[k, : len(ids[k])] = True
        A[k, : len(apps[k])] = apps[k]
        B[k, : len(apps[k])] = bxs[k]
        BM[k, : len(apps[k]) - 1] = True
    inp, types, tm = assemble_text(I, V, cls_id=101, sep_id=102)
    lab, _, _ = assemble_text(L, V, cls_id=-100, sep_id=-100, pad_id=-100)
    return inp, types, tm, lab, A, B, BM


TEXTWARM = int(args.get("textwarm", 0))  # first N steps: the captions as text-only MLM (no regions)


def forward(b, text_only=False):
    inp, types, tm, lab, A, B, BM = b
    if text_only:
        out = model.vl_bert(inp, tm, types)
    else:
        out = model.vl_bert(
            inp, tm, types, boxes=torch.zeros(len(inp), BM.shape[1], 4), box_mask=BM, visual_input=(A, B)
        )
    h = out.text_hidden[lab != -100]
    return model.mlm_head(h), lab[lab != -100]


def evaluate():
    model.eval()
    hit = tot = 0
    rows = []
    for s in val:
        words = s["caption"].split()
        for j, w in enumerate(words):
            if w in colours:
                rows.append((s, s["caption"], j))
    with torch.no_grad():
        for k in range(0, len(rows), 64):
            logits, lab = forward(batch_single(rows[k : k + 64]))
            hit += (logits.argmax(-1) == lab).sum().item()
            tot += len(lab)
    model.train()
    return hit / max(1, tot)


def batch_single(chunk):
    """One row per (caption, colour word j): only word j masked."""
    it = iter(j for _, _, j in chunk)
    return batch([(s, c) for s, c, _ in chunk], lambda words: {next(it)})


CLIP = float(args.get("clip", 1.0))
B2 = float(args.get("beta2", 0.999))
WARM = int(args.get("warm", 20))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=1e-4,
                        betas=(0.9, B2), eps=1e-6)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARM))
t0 = time.time()
print("step 0 colour", round(evaluate(), 3), flush=True)
for step in range(1, STEPS + 1):
    # views=K: BS/K images, each caption masked K times independently (K word maskings per CNN pass)
    items = [(s, s["caption"]) for s in random.sample(train, BS // VIEWS) for _ in range(VIEWS)]

    def mask_fn(words):
        ch = {j for j in range(len(words)) if random.random() < MLMP}
        return ch or {random.randrange(len(words))}

    b = batch(items, mask_fn)
    logits, lab = forward(b, text_only=step <= TEXTWARM)
    loss = F.cross_entropy(logits.float(), lab)
    opt.zero_grad()
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP if CLIP > 0 else float('inf'))
    opt.step()
    sched.step()
    if step % 50 == 0:
        print(f"step {step} loss {loss.item():.3f} gn {gn.item():.1f} colour {evaluate():.3f} "
              f"t {time.time() - t0:.0f}s", flush=True)
