"""The ablated inputs: what an ablated region becomes (`ablation_fill`), the vision-for-language conditions
(none, object, object_masked, all, all_boxes, grey, other_image, text_only) and language-for-vision's (none,
phrase, all), and one pass of the diagnostic over a model (`evaluate`)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from model.boxes import normalise, with_whole_image
from model.fast_rcnn import grey_of
from model.vl_bert import VLBertForPretraining, assemble_text
from shards.images import grey_resampling_rings

from .data import PhraseData, choose_targets, regions_over

LN2 = math.log(2.0)

VISION_FOR_LANGUAGE = ("none", "object", "object_masked", "all")

LANGUAGE_FOR_VISION = ("none", "phrase", "all")


def other_image_rows(keys: list) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row, a row of the batch showing another image (the first row of the next image, in turn), and
    whether there is one (a batch of one image has none). Rows of one image are the phrases of one image."""
    first: dict = {}
    for row, key in enumerate(keys):
        first.setdefault(key, row)
    images = list(first)
    after = {key: first[images[(k + 1) % len(images)]] for k, key in enumerate(images)}
    return torch.tensor([after[key] for key in keys]), torch.full((len(keys),), len(images) > 1)


def _to(batch: dict, device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


ABLATION_FILLS = ("training", "evaluation")


def training_means(vb) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(whole image [F], region [F]): the average appearance of the model's own pretraining data, as its
    standardisers' running means keep it (an ablated element then standardises to exactly 0); None for a
    model without standardisers (e.g. an official checkpoint)."""
    emb = vb.embeddings
    whole, region = (getattr(emb, n, None) for n in ("whole_image_standardiser", "appearance_standardiser"))
    if whole is None or region is None or not bool(whole.initialised) or not bool(region.initialised):
        return None
    return whole.running_mean.float().clone(), region.running_mean.float().clone()


def resolve_fill(vb, fill: str) -> str:
    """The fill the ablation will use: `fill`, or "evaluation" where "training" has no statistics to read."""
    if fill not in ABLATION_FILLS:
        raise ValueError(f"ablation_fill: '{fill}' is not one of {', '.join(ABLATION_FILLS)}")
    return "training" if fill == "training" and training_means(vb) is not None else "evaluation"


class Ablator:
    """Runs one VLBertForPretraining on ablated inputs. `fit_means` first: the average region and
    whole-image features that ablated elements take (`fill`: see `HeldOutConfig.ablation_fill`)."""

    def __init__(self, model: VLBertForPretraining, device: torch.device | str = "cpu", fill: str = "training"):
        self.model, self.vb, self.cfg = model, model.vl_bert, model.cfg
        self.device = torch.device(device)
        self.fill = resolve_fill(self.vb, fill)
        self.region_mean: torch.Tensor | None = None
        self.whole_mean: torch.Tensor | None = None
        self.box_mean: torch.Tensor | None = None  # `fit_box_mean`: for the all_boxes condition

    def _visual_kwargs(self, b: dict) -> dict:
        if "region_features" in b:
            return {"region_features": b["region_features"], "image_hw": b["image_hw"]}
        return {"images": b["images"], "image_sizes": b["image_sizes"]}

    @torch.no_grad()
    def fit_means(self, batches) -> None:
        """The fill's averages: read off the model (`training`: `batches` is not consumed) or one pass
        over `batches` (`evaluation`)."""
        if self.fill == "training":
            self.whole_mean, self.region_mean = (m.to(self.device) for m in training_means(self.vb))
            return
        region_sum = whole_sum = 0.0
        regions = images = 0
        for b in batches:
            b = _to(b, self.device)
            appearance, _, _ = self.vb.region_features(boxes=b["boxes"], box_mask=b["box_mask"],
                                                       **self._visual_kwargs(b))
            appearance = appearance.float()
            region_sum = region_sum + (appearance[:, 1:] * b["box_mask"].unsqueeze(-1)).sum((0, 1))
            whole_sum = whole_sum + appearance[:, 0].sum(0)
            regions = regions + b["box_mask"].sum()
            images += appearance.shape[0]
        self.region_mean = region_sum / regions
        self.whole_mean = whole_sum / images

    @torch.no_grad()
    def fit_box_mean(self, batches) -> None:
        """The average normalised region box of `batches` (one pass, no CNN): what every region's box becomes in
        the all_boxes condition, where the geometry (and what a model reads off it, e.g. size names) is ablated
        with the appearance."""
        total, count = 0.0, 0
        for b in batches:
            b = _to(b, self.device)
            hw = b["image_hw"] if "image_hw" in b else b["image_sizes"]
            boxes = normalise(b["boxes"], hw).float()
            total = total + (boxes * b["box_mask"].unsqueeze(-1)).sum((0, 1))
            count = count + b["box_mask"].sum()
        self.box_mean = total / count

    def text(self, b: dict, ablate: str):
        """`[CLS] words [SEP]` with nothing, the phrase, or every word-piece as [MASK]."""
        ids, valid = b["input_ids"], b["attention_mask"]
        if ablate == "phrase":
            ids = ids.masked_fill(b["phrase"], self.cfg.mask_token_id)
        elif ablate == "all":
            ids = ids.masked_fill(valid, self.cfg.mask_token_id)
        elif ablate != "none":
            raise ValueError(f"text ablation '{ablate}' is not none, phrase or all")
        return assemble_text(ids, valid, cls_id=self.cfg.cls_token_id, sep_id=self.cfg.sep_token_id,
                             pad_id=self.cfg.pad_token_id)

    def visual(self, b: dict, ablated: torch.Tensor, whole: bool):
        """Appearance [B, 1+N, F] and normalised boxes with `ablated` regions (and the whole image if
        `whole`) set to the fill's averages; the rest computed without the ablated regions' pixels."""
        if self.region_mean is None:
            raise RuntimeError("Ablator.fit_means must run before ablating")
        if self.vb.cfg.image_ablated:
            # a model that reads no image (the image-ablated control) has nothing to ablate: every condition gives
            # it the grey input it trained on, where an average region would be an input it never saw
            appearance, boxes_norm, _ = self.vb.region_features(boxes=b["boxes"], box_mask=b["box_mask"],
                                                                **self._visual_kwargs(b))
            return appearance, boxes_norm
        bsz, n = ablated.shape
        mean = torch.cat([self.whole_mean.unsqueeze(0), self.region_mean.expand(n, -1)], 0)  # [1+N, F]
        if whole and bool((ablated == b["box_mask"]).all()):  # nothing of the image is left: no CNN to run
            hw = b["image_hw"] if "image_hw" in b else b["image_sizes"]
            inclusive = self.vb.cfg.fast_rcnn.box_convention == "inclusive"
            return mean.expand(bsz, -1, -1), normalise(with_whole_image(b["boxes"], hw, inclusive=inclusive), hw)
        appearance, boxes_norm, _ = self.vb.region_features(boxes=b["boxes"], box_mask=b["box_mask"],
                                                            masked_regions=ablated, **self._visual_kwargs(b))
        fill = torch.cat([torch.full_like(ablated[:, :1], whole), ablated], 1)  # [B, 1+N]
        return torch.where(fill.unsqueeze(-1), mean.to(appearance.dtype), appearance), boxes_norm

    def _phrase_bits(self, out, b: dict) -> torch.Tensor:
        positions = F.pad(b["phrase"], (1, 1))[:, : out.text_length]  # shifted by [CLS]
        labels = F.pad(b["input_ids"], (1, 1))[:, : out.text_length][positions]
        log_p = self.model.mlm_head(out.text_hidden[positions]).float().log_softmax(-1)
        bits = -log_p.gather(1, labels.unsqueeze(1)).squeeze(1) / LN2  # [M]
        rows = positions.nonzero()[:, 0]
        sums = torch.zeros(positions.shape[0], device=bits.device).index_add_(0, rows, bits)
        counts = positions.sum(1)
        return torch.where(counts > 0, sums / counts.clamp(min=1), torch.full_like(sums, float("nan")))

    @torch.no_grad()
    def vision_for_language(self, b: dict, condition: str, tau: float = 0.5) -> torch.Tensor:
        """Per example: the masked phrase's MLM cross-entropy in bits per word-piece [B] (NaN: not scored)."""
        out, scored = self.phrase_output(b, condition, tau)
        bits = self._phrase_bits(out, b)
        if scored is None:
            return bits
        return torch.where(scored.to(bits.device), bits, torch.full_like(bits, float("nan")))

    @torch.no_grad()
    def phrase_output(self, b: dict, condition: str, tau: float = 0.5):
        """The encoder's output with the phrase masked and the visual input of `condition`, and which examples it
        scores ([B] bool; None: all)."""
        ids, types, mask = self.text(b, "phrase")
        if condition == "text_only":  # no visual input at all (a text-only BERT)
            return self.vb(ids, mask, types), None
        if condition == "none":
            ablated, whole = torch.zeros_like(b["box_mask"]), False
        elif condition == "object":
            ablated, whole = regions_over(b["boxes"], b["box_mask"], b["gold"], b["gold_mask"], tau), False
        elif condition == "object_masked":  # as masked RoIs in training: pixels zeroed, RoI-[MASK] token
            ablated = regions_over(b["boxes"], b["box_mask"], b["gold"], b["gold_mask"], tau)
            visual = self._visual_kwargs(b)
            if "images" in visual:  # and, as pretraining's masker does, the resampling ring around them greyed
                visual["images"] = grey_resampling_rings(visual["images"], b["boxes"], ablated, b.get("resize_scales"),
                                                         grey_of(self.vb.cfg.fast_rcnn.pixel_mean))
            return self.vb(ids, mask, types, boxes=b["boxes"], box_mask=b["box_mask"], masked_regions=ablated,
                           **visual), None
        elif condition == "all":
            ablated, whole = b["box_mask"], True
        elif condition == "all_boxes":  # all, and every region's box the average box (`fit_box_mean`)
            if self.box_mean is None:
                raise RuntimeError("the all_boxes condition needs Ablator.fit_box_mean first")
            appearance, boxes_norm = self.visual(b, b["box_mask"], True)
            boxes_norm = torch.cat([boxes_norm[:, :1], self.box_mean.to(boxes_norm).expand_as(boxes_norm[:, 1:])], 1)
            return self.vb(ids, mask, types, boxes=b["boxes"], box_mask=b["box_mask"],
                           visual_input=(appearance, boxes_norm)), None
        elif condition == "other_image":
            # another held-out image's pixels (or features), boxes and detector outputs: every input in the
            # distribution a model pretrained on real images knows, only the match to the caption gone. The null for
            # a control that saw real images unrelated to its captions (masking.shuffle_images), where `all`'s
            # average features are new to it as real pixels are to the grey control (docs/ABLATION.md, session 36)
            rows, scored = other_image_rows(b["keys"])
            rows = rows.to(b["box_mask"].device)
            visual = {k: v[rows] for k, v in self._visual_kwargs(b).items()}
            return self.vb(ids, mask, types, boxes=b["boxes"][rows], box_mask=b["box_mask"][rows], **visual), scored
        elif condition == "grey":  # every pixel the pixel mean, boxes kept, no RoI-[MASK] token
            visual = self._visual_kwargs(b)
            if "images" not in visual:
                raise ValueError("visual ablation 'grey' needs images (the model reads precomputed features)")
            visual["images"] = grey_of(self.vb.cfg.fast_rcnn.pixel_mean).to(visual["images"]).expand_as(
                visual["images"]).clone()
            return self.vb(ids, mask, types, boxes=b["boxes"], box_mask=b["box_mask"], **visual), None
        else:
            raise ValueError(f"visual ablation '{condition}' is not none, object, object_masked, all, all_boxes, "
                             "grey, other_image or text_only")
        return self.vb(ids, mask, types, boxes=b["boxes"], box_mask=b["box_mask"],
                       visual_input=self.visual(b, ablated, whole)), None

    @torch.no_grad()
    def language_for_vision(self, b: dict, conditions=LANGUAGE_FOR_VISION, tau: float = 0.5) -> dict:
        """Per text condition: MRC-KL and MRC cross-entropy (gold label) in bits per example, NaN where
        not scored ([B] each). The masked visual input is computed once and shared by the conditions."""
        target, masked = choose_targets(b["boxes"], b["box_mask"], b["gold"], b["gold_mask"], tau)
        appearance, boxes_norm, _ = self.vb.region_features(boxes=b["boxes"], box_mask=b["box_mask"],
                                                            masked_regions=masked, **self._visual_kwargs(b))
        rows = torch.arange(len(target), device=target.device)
        index = target.clamp(min=0)
        p = b["class_probs"][rows, index].float()
        p = p / p.sum(-1, keepdim=True).clamp(min=1e-12)  # stored as float16: renormalise
        found = target >= 0
        out = {}
        for condition in conditions:
            ids, types, mask = self.text(b, condition)
            enc = self.vb(ids, mask, types, boxes=b["boxes"], box_mask=b["box_mask"], masked_regions=masked,
                          visual_input=(appearance, boxes_norm))
            log_q = self.model.masked_roi_classification(enc.region_hidden[:, 1:][rows, index]).float().log_softmax(-1)
            kl = (p * (p.clamp(min=1e-12).log() - log_q)).sum(-1) / LN2
            xe = -log_q.gather(1, b["gold_label"].clamp(min=0).unsqueeze(1)).squeeze(1) / LN2
            nan = torch.full_like(kl, float("nan"))
            out[condition] = (torch.where(found, kl, nan), torch.where(found & (b["gold_label"] >= 0), xe, nan))
        return out


def evaluate(ablator: Ablator, data: PhraseData, *, image: bool = True, sweep: list | None = None,
             tau: float = 0.5, progress: bool = True, desc: str = "ablation") -> dict[str, np.ndarray]:
    """Per-example values for every condition, aligned with `data.items` (NaN = not scored)."""

    if image:
        ablator.fit_means(data.batches() if ablator.fill == "training" else
                          tqdm(data.batches(), total=math.ceil(len(data) / data.cfg.batch_size),
                               desc=f"{desc}: average features", disable=not progress, leave=False))
    out: dict[str, list] = {}
    bar = tqdm(data.batches(), total=math.ceil(len(data) / data.cfg.batch_size), desc=desc, disable=not progress)
    for b in bar:
        b = _to(b, ablator.device)
        values = {}
        # no visual input at all: a text-only model's only condition, and for a VL model (pretrained
        # on text-only samples too, so in distribution) the floor below `all`
        values["v4l/text_only"] = ablator.vision_for_language(b, "text_only")
        if image:
            for c in VISION_FOR_LANGUAGE:
                values[f"v4l/{c}"] = ablator.vision_for_language(b, c, tau)
            for c, (kl, xe) in ablator.language_for_vision(b, LANGUAGE_FOR_VISION, tau).items():
                values[f"l4v_kl/{c}"], values[f"l4v_xe/{c}"] = kl, xe
            for t in sweep or []:
                values[f"sweep/{t:g}"] = (values["v4l/object"] if t == tau else
                                          ablator.vision_for_language(b, "object", t))
        for k, v in values.items():  # evaluation, not the training hot loop: one transfer per batch
            out.setdefault(k, []).append(v.float().cpu().numpy())
    return {k: np.concatenate(v) for k, v in out.items()}
