"""Does the detector's error rate bound the grounded recipe? (docs/ABLATION.md, session 13)

Splits an export's held-out masked colour/shape words by whether its own Fast R-CNN names the word's referent
right. The referent is the region over the gold box (IoU > 0.5) of the phrase the word is in; "named right"
means the region's top class is its true class AND its top colour is the object's colour (the caption's colour
word for that phrase). Both are needed: the model binds "[MASK] circle" to the region whose name is circle and
reads its colour, and binds "red [MASK]" through the colour. If accuracy is high where the detector is right and
near the text prior where it is wrong, detector errors are what holds accuracy below target; if accuracy is low
in both, the transformer is.

It also splits them by how much of the referent the image shows at all (`shards.shapes_world.visible_fractions`:
later objects occlude earlier ones, and captions name objects whatever their occlusion): a word whose object is
mostly hidden cannot be read off the image by any model. Shape words of covered objects (under the grey cloth)
are the evaluator's own category, covered_shape.

    python docs/grounding_demo/detector_errors.py runs/demo_long/export [--out FILE.json] [max_images=100]
    python docs/grounding_demo/detector_errors.py FILE.json     # re-plot a saved result
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, ".")
from diagnostics.ablation import feature_extractor  # noqa: E402
from diagnostics.config import GroundingConfig  # noqa: E402
from diagnostics.grounding import GroundingEval  # noqa: E402
from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from model.boxes import box_iou  # noqa: E402
from model.config import load_config  # noqa: E402
from model.export import load_pretrained  # noqa: E402
from shards.flickr30k_entities import parse_annotation, parse_sentences  # noqa: E402
from shards.shapes_world import COLOURS, Scene, ShapeObject, visible_fractions  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402

HELD_OUT = "launch/configs/heldout_demo.yaml"  # the demo's held-out images (run from the repository root)


def plot(result: dict, png: Path) -> None:
    """Bars: accuracy with the image per referent group (95% interval), ablated as a tick, per category."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = [s for s in ("groups", "visibility") if s in result]
    fig, grid = plt.subplots(len(sections), 2, figsize=(11, 3.8 * len(sections)), sharey=True, squeeze=False)
    for section, axes in zip(sections, grid):
        plot_section(result, section, axes)
    grid[0, 0].set_ylabel("accuracy with the image (red: ablated)")
    fig.suptitle(f"{result['export']}: by whether its detector names the word's referent right (top) and how much "
                 f"of the referent the image shows (bottom)", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def plot_section(result: dict, section: str, axes) -> None:
    labels = list(dict.fromkeys(k.split("/", 1)[1] for k in result[section]))
    for ax, cat in zip(axes, ("colour", "shape")):
        xs, names = [], []
        for i, label in enumerate(labels):
            g = result[section].get(f"{cat}/{label}")
            if g is None:
                continue
            lo, hi = g["image"]["ci95"]
            ax.bar(i, g["image"]["mean"], color="tab:blue", yerr=[[g["image"]["mean"] - lo], [hi - g["image"]["mean"]]],
                   capsize=4)
            ax.plot([i - 0.4, i + 0.4], [g["ablated"]["mean"]] * 2, color="tab:red", lw=2)
            ax.text(i, 0.02, f"n={g['n']}", ha="center", fontsize=8, color="white")
            xs.append(i)
            names.append(label.replace(" (class and colour)", "").replace(", ", ",\n").replace(" (", "\n("))
        ax.set_xticks(xs, names, fontsize=8)
        ax.set_title(f"masked {cat} words: right {result[f'{cat}/detector_right_fraction']:.0%} of referents"
                     if section == "groups" else f"masked {cat} words by the referent's visible fraction")
        ax.axhline(0.8, ls=":", color="grey")


args = sys.argv[1:]
if args[0].endswith(".json"):  # re-plot a saved result
    plot(json.loads(Path(args[0]).read_text()), Path(args[0]).with_suffix(".png"))
    sys.exit(0)
path = args[0]
out_path = args[args.index("--out") + 1] if "--out" in args else None
overrides = [a for a in args[1:] if "=" in a]
torch.set_num_threads(2)
cfg = load_config(GroundingConfig, HELD_OUT, ["max_images=100", *overrides])
model = load_pretrained(path).eval()
tokenizer = load_tokenizer(path)
ev = GroundingEval(cfg, tokenizer, feature_extractor(model, "cpu"))
values = ev(model, "cpu", progress=True)["words"]

vb, detector = model.vl_bert, model.vl_bert.fast_rcnn
class_names = [tokenizer.decode(ids).replace(" ", "") for ids in vb.cfg.region_class_words]  # word-piece ids
colour_names = [tokenizer.decode(ids).replace(" ", "") for ids in vb.cfg.region_attribute_words]
root = Path(cfg.flickr_root)
# per masked word, in the evaluator's order (images, sentences, category words): is its referent named right?
ref_class_ok, ref_colour_ok, has_ref, visible = [], [], [], []
# the scenes the held-out images were drawn from (one line per image, in image-id order): how much of each
# object the image shows
scenes = [json.loads(line) for line in (root.parent / "scenes.jsonl").read_text().splitlines()]
with torch.no_grad():
    for item in ev.data.images:
        scene = scenes[int(item.image_id)]
        assert Path(scene["image"]).stem == item.image_id, (scene["image"], item.image_id)
        objects = [ShapeObject(o["category"], o["colour"], o["size"], tuple(o["box"]), o["covered"])
                   for o in scene["objects"]]
        object_boxes = torch.tensor([o.box for o in objects])
        fractions = visible_fractions(Scene(scene["width"], scene["height"], (0, 0, 0), objects))
        image, boxes, _ = ev.data.load(item)
        app, _ = ev._visual(vb, image, boxes, None, "cpu")
        pred_class = detector.object_classifier(app[0, 1:]).argmax(-1)
        pred_colour = detector.attribute_classifier(app[0, 1:]).argmax(-1)
        ann = parse_annotation(root / "Annotations" / f"{item.image_id}.xml")
        sentences = parse_sentences(root / "Sentences" / f"{item.image_id}.txt")
        assert len(sentences) == len(item.sentences)
        for sentence, s in zip(sentences, item.sentences):
            for word_index, _cat in s.categories:
                phrase = next((p for p in sentence.phrases if p.first_word <= word_index < p.end), None)
                gold = ann.boxes.get(phrase.chain) if phrase is not None else None
                region = None
                fraction = float("nan")
                if gold is not None and len(gold) == 1:
                    fraction = fractions[int(box_iou(object_boxes, gold.float()).squeeze(-1).argmax())]
                    iou = box_iou(item.boxes, gold.float()).squeeze(-1)
                    if iou.max() > 0.5:
                        region = int(iou.argmax())
                # the object's true class and colour are the phrase's own words ("a big red circle"): the box
                # file's classes are the demo's simulated detections, not the truth
                words = [w.lower() for w in phrase.words] if phrase is not None else []
                colour = next((w for w in words if w in COLOURS), None)
                shape = next((w for w in words if w in class_names), None)
                visible.append(fraction)
                has_ref.append(region is not None and colour is not None and shape is not None)
                if not has_ref[-1]:
                    ref_class_ok.append(False)
                    ref_colour_ok.append(False)
                    continue
                ref_class_ok.append(class_names[int(pred_class[region])] == shape)
                ref_colour_ok.append(colour_names[int(pred_colour[region])] == colour)
has_ref, class_ok, colour_ok, visible = map(np.asarray, (has_ref, ref_class_ok, ref_colour_ok, visible))
assert len(has_ref) == len(values["image"]), (len(has_ref), len(values["image"]))

boot = {"resamples": cfg.bootstrap, "seed": cfg.seed}
groups = {"detector right (class and colour)": has_ref & class_ok & colour_ok,
          "class right, colour wrong": has_ref & class_ok & ~colour_ok,
          "class wrong": has_ref & ~class_ok,
          "no single referent": ~has_ref}
result = {"export": path, "images": len(ev.data), "groups": {}, "visibility": {}}


def split(section: str, cat: str, masks: dict[str, np.ndarray]) -> list[str]:
    """Accuracy with the image and ablated, with intervals, for the category's words under each mask: into
    result[section], and as table rows."""
    sel_cat = values["category"] == cat
    rows = []
    for label, sel in masks.items():
        s = sel_cat & sel
        if not s.any():
            continue
        img = clustered_bootstrap(values["image"][s], values["cluster"][s], **boot)
        abl = clustered_bootstrap(values["ablated"][s], values["cluster"][s], **boot)
        share = float(s.sum() / sel_cat.sum())
        result[section][f"{cat}/{label}"] = {"n": int(s.sum()), "image": img, "ablated": abl, "share": share}
        rows.append(f"| {cat} | {label} | {int(s.sum())} ({share:.0%}) | {img['mean']:.3f} [{img['ci95'][0]:.3f}, "
                    f"{img['ci95'][1]:.3f}] | {abl['mean']:.3f} |")
    return rows


lines = [f"### {path}: held-out masked-word accuracy by whether the detector names the referent right", "",
         "| category | referent | words | with image | ablated |", "|---|---|---|---|---|"]
for cat in ("colour", "shape"):
    lines += split("groups", cat, groups)
    referent = (values["category"] == cat) & has_ref
    result[f"{cat}/detector_right_fraction"] = float((class_ok & colour_ok)[referent].mean())
    lines.append(f"| {cat} | share of referents named right | {int(referent.sum())} | "
                 f"{(class_ok & colour_ok)[referent].mean():.3f} | |")
lines += ["", "| category | referent's visible fraction | words | with image | ablated |", "|---|---|---|---|---|"]
bins = {"in full view (>= 0.95)": visible >= 0.95, "partly hidden (0.5-0.95)": (visible >= 0.5) & (visible < 0.95),
        "mostly hidden (< 0.5)": visible < 0.5, "seen at least half (>= 0.5)": visible >= 0.5}
for cat in ("colour", "shape", "covered_shape"):
    lines += split("visibility", cat, bins)
print("\n".join(lines))
if out_path:
    Path(out_path).write_text(json.dumps(result, indent=1, default=float))
    Path(out_path).with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot(result, Path(out_path).with_suffix(".png"))
