"""Grounding measurements on held-out captions: does a pretrained model read what the image shows?

    python -m diagnostics.grounding --model image=runs/demo/export --model control=runs/demo-noimg/export \\
        --config launch/configs/heldout_demo.yaml --out runs/grounding [key=value ...]

Data: the held-out split in Flickr30k Entities' format (as `diagnostics.ablation`), its images and box file.
Two measurements, each with a 95% interval from a bootstrap that resamples images (the sentences, words
and regions of one image are not independent):

- Masked-word accuracy per word category (colour, shape, covered_shape, size, relation, place, number; `CATEGORIES`):
  every word of a category in every sentence is masked alone (all its word-pieces -> [MASK]) and counts as
  right when the MLM head's argmax gives back every piece. A word whose piece count names it among its
  category (the shapes' "hexagon") is scored apart, as `named_by_span`: its span of [MASK]s tells it. Once
  with the image (`image`) and once with every region and the whole image replaced by the average feature
  (`ablated`: the cross-modal ablation's `all` condition, with its `ablation_fill`), so a model's gain from the
  image is read on the same words.
- Masked RoI classification split three ways, target = the region's class from the box file:
  `visible` (chosen but not zeroed, as 10% of training's targets: its own pixels decide, a test of
  vision), `zeroed_named` (pixels zeroed and RoI-[MASK] token, the caption names the object: a test of
  language) and `zeroed_unnamed` (zeroed, not named: at best the class prior). A region is named when
  its IoU with the single box of one of the sentence's phrase chains is > 0.5. `visible` is reported whole and in
  two parts: `visible_in_view` and `visible_covered`, the regions one of the image's sentences names as under the
  cloth ("a small covered star", `categories.names_covered`), whose class is not in their pixels.

In the shapes world a colour word can only come from the image, so `colour/image` is the headline; the
matched control (`masking.ablate_image=true`, same seed and schedule) must stay near chance (1/6).
`GroundingEval` also runs inside pretraining (engine.eval_every) and at the end of `launch/pretrain.sh`.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from model.boxes import box_iou
from model.export import load_pretrained
from model.fast_rcnn import grey_of
from model.vl_bert import VLBertForPretraining, assemble_text
from shards.caption_inputs import image_regions, load_box_file
from shards.collate import pad_ids
from shards.decode import decode_resized
from shards.flickr30k_entities import parse_annotation, parse_sentences, read_split
from shards.images import grey_resampling_rings
from shards.skips import SkipLog
from shards.tokenizer import load_tokenizer

from .ablation import feature_extractor
from .categories import CHANCE, MRC_SPLITS, NAMED_BY_SPAN, REPORTED, names_covered, span_naming_lengths, word_category
from .conditions import resolve_fill, training_means
from .config import GroundingConfig, command_config, command_line, model_specs
from .plots import grounding_figure
from .report import write_report
from .statistics import clustered_bootstrap, format_interval

# --- data ---------------------------------------------------------------------------------------------

@dataclass
class _Sentence:
    ids: torch.Tensor  # [T] word-pieces
    word_ids: list[int | None]  # per piece: its word's index
    categories: list[tuple[int, str]]  # (word index, category) of the words to mask
    named: torch.Tensor  # [N] bool: region named by one of the sentence's phrases


@dataclass
class _Image:
    image_id: str
    boxes: torch.Tensor  # [N, 4] original pixels
    classes: torch.Tensor  # [N]
    sentences: list[_Sentence]
    covered: torch.Tensor  # [N] bool: named as under the cloth by one of the image's sentences


class GroundingData:
    def __init__(self, cfg: GroundingConfig, tokenizer):
        self.cfg = cfg
        root = Path(cfg.flickr_root)
        skips = SkipLog("box file lines")
        boxes = load_box_file(cfg.boxes, skips)
        if skips.skipped:
            raise ValueError(f"{cfg.boxes}: {skips.summary()}")
        ids = read_split(root, cfg.split)
        telling = span_naming_lengths(tokenizer)
        self.images: list[_Image] = []
        self.skipped: Counter = Counter()
        for image_id in ids[: cfg.max_images] if cfg.max_images else ids:
            ann = parse_annotation(root / "Annotations" / f"{image_id}.xml")
            entry, problem = image_regions(boxes, image_id, ann.width, ann.height)
            if entry is None:
                self.skipped[problem] += 1
                continue
            keep = np.argsort(-entry.scores, kind="stable")[: cfg.max_regions]
            region_boxes = torch.from_numpy(entry.boxes[keep]).float()
            sentences = []
            covered = torch.zeros(len(region_boxes), dtype=torch.bool)
            for sentence in parse_sentences(root / "Sentences" / f"{image_id}.txt"):
                enc = tokenizer(sentence.words, add_special_tokens=False, is_split_into_words=True)
                named = torch.zeros(len(region_boxes), dtype=torch.bool)
                for phrase in sentence.phrases:
                    gold = ann.boxes.get(phrase.chain)
                    if gold is not None and len(gold) == 1:  # one object (a chain over every shape names none)
                        over = box_iou(region_boxes, gold.float()).squeeze(-1) > 0.5
                        named |= over
                        if names_covered(phrase.words):
                            covered |= over
                pieces = Counter(w for w in enc.word_ids() if w is not None)
                cats = [(i, NAMED_BY_SPAN if pieces[i] in telling[c] else c) for i in range(len(sentence.words))
                        if (c := word_category(sentence.words, i)) is not None]
                sentences.append(_Sentence(torch.tensor(enc["input_ids"]), enc.word_ids(), cats, named))
            self.images.append(_Image(image_id, region_boxes, torch.from_numpy(entry.classes[keep]).long(),
                                      sentences, covered))
        if not self.images:
            raise ValueError(f"{root} ({cfg.split}): no image to evaluate; skipped {self.skipped}")

    def __len__(self) -> int:
        return len(self.images)

    def load(self, item: _Image) -> tuple[torch.Tensor, torch.Tensor, float]:
        """uint8 [3, H, W] resized as in training, the boxes scaled with it, and the resize scale (the reader's
        `resize_scale`: how far the resampling carried a box's pixels)."""
        path = Path(self.cfg.images) / f"{item.image_id}.jpg"
        image, scale, _ = decode_resized(path.read_bytes(), self.cfg.short_side, self.cfg.long_side)
        return image, item.boxes * scale, float(scale[:2].max())


# --- the model side -----------------------------------------------------------------------------------

class GroundingEval:
    """Per-example results of one model on `GroundingData`, then summaries with clustered intervals."""

    def __init__(self, cfg: GroundingConfig, tokenizer, extractor=None):
        self.cfg = cfg
        self.data = GroundingData(cfg, tokenizer)
        self.extractor = extractor  # for `region_input: features` models: the frozen Fast R-CNN

    def _visual(self, vb, image, boxes, masked: torch.Tensor | None, device, resize_scale: float = 1.0):
        """Appearance [K, 1+N, F] and normalised boxes [K, 1+N, 4] for one image seen K times, row k with
        the regions of masked[k] hidden (masked [K, N] bool; None = one row, nothing hidden): pixels zeroed by
        the model, and the resampling ring around them greyed as pretraining's masker does."""
        n = len(boxes)
        masked = torch.zeros(1, n, dtype=torch.bool) if masked is None else masked
        k = masked.shape[0]
        box_mask = torch.ones(k, n, dtype=torch.bool, device=device)
        b = boxes.unsqueeze(0).expand(k, -1, -1).to(device)
        hw = torch.tensor([list(image.shape[1:])], device=device).expand(k, -1)
        if self.extractor is not None:  # features of the unmasked image; the model zeroes the masked ones
            feats = self.extractor([{"key": "", "image": image, "boxes": boxes, "scores": torch.ones(n),
                                     "classes": torch.zeros(n, dtype=torch.long), "class_probs": None,
                                     "input_ids": torch.zeros(1, dtype=torch.long)}])[0]
            kw = {"region_features": feats.unsqueeze(0).expand(k, -1, -1).to(device), "image_hw": hw}
        else:
            images = image.unsqueeze(0).expand(k, -1, -1, -1)
            if masked.any():
                images = grey_resampling_rings(images, boxes.unsqueeze(0).expand(k, -1, -1), masked,
                                               torch.full((k,), resize_scale), grey_of(vb.cfg.fast_rcnn.pixel_mean))
            kw = {"images": images.to(device), "image_sizes": hw}
        appearance, boxes_norm, _ = vb.region_features(boxes=b, box_mask=box_mask, masked_regions=masked.to(device),
                                                       **kw)
        return appearance, boxes_norm

    @torch.no_grad()
    def __call__(self, model: VLBertForPretraining, device="cpu", progress: bool = True) -> dict:
        vb, cfg = model.vl_bert, model.cfg
        device = torch.device(device)
        # the cross-modal ablation's `all` condition, with its fill (HeldOutConfig.ablation_fill)
        fill = resolve_fill(vb, self.data.cfg.ablation_fill)
        sums, whole_sum, n_regions = 0.0, 0.0, 0
        visuals = []
        for item in tqdm(self.data.images, desc="grounding: features", disable=not progress, leave=False):
            image, boxes, resize_scale = self.data.load(item)
            app, boxes_norm = self._visual(vb, image, boxes, None, device)
            visuals.append((image, boxes, resize_scale, app, boxes_norm))
            sums = sums + app[0, 1:].float().sum(0)
            whole_sum = whole_sum + app[0, 0].float()
            n_regions += app.shape[1] - 1
        if fill == "training":
            whole_mean, region_mean = (m.to(device) for m in training_means(vb))
        else:
            region_mean, whole_mean = sums / max(1, n_regions), whole_sum / len(visuals)
        words: dict[str, list] = {"category": [], "image": [], "ablated": [], "cluster": []}
        mrc: dict[str, list] = {"split": [], "correct": [], "covered": [], "cluster": []}
        for k, (item, (image, boxes, resize_scale, app, boxes_norm)) in enumerate(tqdm(
                list(zip(self.data.images, visuals)), desc="grounding", disable=not progress)):
            n = len(boxes)
            b = boxes.unsqueeze(0).to(device)
            box_mask = torch.ones(1, n, dtype=torch.bool, device=device)
            # a model that reads no image has nothing to ablate: its "ablated" input is the grey one it reads (as
            # `conditions.Ablator.visual` gives it), where an average region would be an input new to it
            mean_app = app if vb.cfg.image_ablated else torch.cat(
                [whole_mean.view(1, -1), region_mean.expand(n, -1)], 0).unsqueeze(0).to(app.dtype)
            # masked words: one row per (sentence, category word), both visual conditions
            rows, cats = [], []
            for s in item.sentences:
                for word, cat in s.categories:
                    pieces = torch.tensor([w == word for w in s.word_ids])
                    rows.append((s.ids, pieces))
                    cats.append(cat)
            if rows:
                ids, valid = pad_ids([r[0] for r in rows])
                pieces = pad_ids([r[1].long() for r in rows])[0].bool()
                masked_ids = ids.masked_fill(pieces, cfg.mask_token_id)
                inp, types, mask = assemble_text(masked_ids.to(device), valid.to(device), cls_id=cfg.cls_token_id,
                                                 sep_id=cfg.sep_token_id, pad_id=cfg.pad_token_id)
                target = F.pad(pieces, (1, 1))[:, : inp.shape[1]].to(device)  # shifted by [CLS]
                labels = F.pad(ids, (1, 1))[:, : inp.shape[1]].to(device)
                r = len(rows)
                visual = torch.cat([app.expand(r, -1, -1), mean_app.expand(r, -1, -1)])  # image, then ablated
                out = vb(inp.repeat(2, 1), mask.repeat(2, 1), types.repeat(2, 1), boxes=b.expand(2 * r, -1, -1),
                         box_mask=box_mask.expand(2 * r, -1),
                         visual_input=(visual, boxes_norm.expand(2 * r, -1, -1)))
                where = target.repeat(2, 1)
                hit = (model.mlm_head(out.text_hidden[where]).argmax(-1) == labels.repeat(2, 1)[where]).float()
                per_row = torch.zeros(2 * r, device=device).index_add_(0, where.nonzero()[:, 0], hit)
                right = (per_row == where.sum(1)).float().cpu()
                words["image"] += right[:r].tolist()
                words["ablated"] += right[r:].tolist()
                words["category"] += cats
                words["cluster"] += [k] * len(rows)
            # masked RoI classification, per sentence: every region visible, then each zeroed in turn
            ids, valid = pad_ids([s.ids for s in item.sentences])
            inp, types, mask = assemble_text(ids.to(device), valid.to(device), cls_id=cfg.cls_token_id,
                                             sep_id=cfg.sep_token_id, pad_id=cfg.pad_token_id)
            named = torch.stack([s.named for s in item.sentences])  # [S, N]
            m = len(item.sentences)
            classes = item.classes.to(device)
            out = vb(inp, mask, types, boxes=b.expand(m, -1, -1), box_mask=box_mask.expand(m, -1),
                     visual_input=(app.expand(m, -1, -1), boxes_norm.expand(m, -1, -1)))
            pred = model.masked_roi_classification(out.region_hidden[:, 1:]).argmax(-1)  # [S, N]
            mrc["correct"] += (pred == classes).float().flatten().cpu().tolist()
            mrc["split"] += ["visible"] * (m * n)
            mrc["covered"] += item.covered.repeat(m).tolist()  # row s * n + j: region j
            mrc["cluster"] += [k] * (m * n)
            # each region zeroed in turn: one CNN pass per hidden region, one encoder pass per (region, sentence)
            hide = torch.eye(n, dtype=torch.bool)  # [N, N]: row j hides region j
            app_z, norm_z = self._visual(vb, image, boxes, hide, device, resize_scale)  # [N, 1+N, F]
            rows = n * m
            out = vb(inp.repeat(n, 1), mask.repeat(n, 1), types.repeat(n, 1), boxes=b.expand(rows, -1, -1),
                     box_mask=box_mask.expand(rows, -1), masked_regions=hide.to(device).repeat_interleave(m, 0),
                     visual_input=(app_z.repeat_interleave(m, 0), norm_z.repeat_interleave(m, 0)))
            region = torch.arange(n, device=device).repeat_interleave(m)  # row (j, s) -> j
            hidden = out.region_hidden[torch.arange(rows, device=device), 1 + region]  # [N*S, hidden]
            pred = model.masked_roi_classification(hidden).argmax(-1)
            mrc["correct"] += (pred == classes[region]).float().cpu().tolist()
            mrc["split"] += ["zeroed_named" if bool(x) else "zeroed_unnamed" for x in named.T.flatten()]
            mrc["covered"] += item.covered[region.cpu()].tolist()
            mrc["cluster"] += [k] * rows
        return {"words": {k: np.asarray(v) for k, v in words.items()},
                "mrc": {k: np.asarray(v) for k, v in mrc.items()}}

    def summarise(self, values: dict) -> dict:
        """Per category: accuracy with the image, ablated, and their difference; per MRC split: accuracy;
        each with its clustered interval; plus chance levels."""
        boot = {"resamples": self.cfg.bootstrap, "seed": self.cfg.seed}
        w, m = values["words"], values["mrc"]
        out: dict = {"words": {}, "mrc": {}, "images": len(self.data)}
        for cat in REPORTED:
            sel = w["category"] == cat
            if not sel.any():
                continue
            out["words"][cat] = {
                "image": clustered_bootstrap(w["image"][sel], w["cluster"][sel], **boot),
                "ablated": clustered_bootstrap(w["ablated"][sel], w["cluster"][sel], **boot),
                "image_minus_ablated": clustered_bootstrap(w["image"][sel] - w["ablated"][sel], w["cluster"][sel],
                                                           **boot),
                "chance": CHANCE[cat]}
        for split in MRC_SPLITS:
            sel = mrc_selection(m, split)
            if sel.any():
                out["mrc"][split] = clustered_bootstrap(m["correct"][sel], m["cluster"][sel], **boot)
        return out


def mrc_selection(mrc: dict, split: str) -> np.ndarray:
    """The rows of `GroundingEval`'s MRC values in one of `MRC_SPLITS`."""
    if split == "visible_in_view":
        return (mrc["split"] == "visible") & ~mrc["covered"].astype(bool)
    if split == "visible_covered":
        return (mrc["split"] == "visible") & mrc["covered"].astype(bool)
    return mrc["split"] == split


def scalars(summary: dict, prefix: str = "grounding/") -> dict[str, float]:
    """Flat {name: value} for TensorBoard and eval.jsonl."""
    out = {}
    for cat, r in summary["words"].items():
        out[f"{prefix}{cat}/image"] = r["image"]["mean"]
        out[f"{prefix}{cat}/ablated"] = r["ablated"]["mean"]
    for split, r in summary["mrc"].items():
        out[f"{prefix}mrc/{split}"] = r["mean"]
    return out


def table(summaries: dict[str, dict]) -> str:
    """Markdown: masked-word accuracy per category (image / ablated) and MRC per split, one row per model."""
    lines = ["### Held-out masked-word accuracy per category (95% interval, bootstrap over images)", "",
             "| model | condition | " + " | ".join(REPORTED) + " |", "|---|---|" + "---|" * len(REPORTED)]
    for name, s in summaries.items():
        for cond in ("image", "ablated", "image_minus_ablated"):
            lines.append(f"| {name} | {cond.replace('_', ' ')} | " + " | ".join(
                format_interval(s["words"].get(c, {}).get(cond)) for c in REPORTED) + " |")
    lines.append("| chance | | " + " | ".join(f"{CHANCE[c]:.3f}" for c in REPORTED) + " |")
    lines += ["", "### Masked RoI classification accuracy by what the model could see", "",
              "| model | " + " | ".join(MRC_SPLITS) + " |", "|---|" + "---|" * len(MRC_SPLITS)]
    for name, s in summaries.items():
        lines.append(f"| {name} | " + " | ".join(format_interval(s["mrc"].get(k)) for k in MRC_SPLITS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = command_line("Grounding: masked-word accuracy per category, MRC by visibility", __doc__,
                     config_name="GroundingConfig", out="runs/grounding", models_required=True,
                     model_help="an exported VL-BERT directory (repeat to compare, e.g. with the image-ablated "
                                "control)", overrides_example="max_images=50")
    args = p.parse_args(argv)
    models = model_specs(p, args.model)
    cfg, out = command_config(p, GroundingConfig, args)
    summaries = {}
    for name, path in models:
        model, tokenizer_dir = load_pretrained(path), path
        model = model.to(args.device).eval()
        ev = GroundingEval(cfg, load_tokenizer(str(tokenizer_dir)), feature_extractor(model, args.device))
        summaries[name] = ev.summarise(ev(model, args.device))
    text = table(summaries)
    written = write_report(out, "grounding", {"config": cfg.__dict__, "models": summaries}, text,
                           lambda: grounding_figure(summaries, out / "grounding.png"))
    print(text + "\nwritten: " + ", ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
