"""VL-BERT's pretraining tasks as one module the training engine steps: masked language modelling
with visual clues (caption samples), masked RoI classification with linguistic clues, and plain MLM
on text-only samples. Every batch holds both kinds of sample; the losses are summed with weights.

The MLM head runs only on the masked positions (positions computed by the data workers, so no host
sync): logits over a 30k vocabulary at every position are the single most wasteful thing a BERT
pretraining step can do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.vl_bert import VLBertForPretraining
from train.engine import METRIC_WEIGHT


@dataclass
class LossConfig:
    mlm_caption_weight: float = 1.0
    mrc_weight: float = 1.0  # 0: no masked RoI classification at all (the masker hides no region; no MRC head)
    # masked RoI classification from this step on; before it no region is chosen or zeroed (as at mrc_weight 0)
    mrc_from_step: int = 0
    mlm_text_weight: float = 1.0
    mrc_target: str = "soft"  # "soft": cross-entropy to the detector's class distribution (official);
    #                          "hard": cross-entropy to the detector's class; "kl": MRC-KL (UNITER/volta)
    # The chosen regions whose pixels stay visible also predict the Fast R-CNN's attribute (colour) distribution
    # of their appearance (`model.mrc_attributes`; 0 = off, official). The class targets name shapes only, and a
    # pretraining without region words then shrinks colour's share of the visual embedding from 0.21 to 0.07
    # (docs/FINETUNE.md, session 44). Zeroed regions have no appearance to take a target from. The targets come
    # from the live detector: with its CNN trained (demo_long's 0.1) they collapsed to one colour by step ~300
    # (detector colour 0.963 -> 0.173). Paired with a frozen CNN (`optim.lr_multipliers`; session 45) held-out
    # colour words reached 0.785 and 0.752 on two pretraining seeds without region words (0.296 without the
    # objective); RefCOCO+ at 15 images gained on colour-only expressions after both, overall after one (session 46).
    mrc_attribute_weight: float = 0.0
    # where the attribute targets come from: "detector", the live Fast R-CNN's attribute head on the unzeroed image
    # (drifts with a trained CNN, above); "shards", the per-box attribute distributions stored with the boxes
    # (`attrs.npy`, a box file's `attribute_probs`: fixed all run, as the class distributions are, so the CNN can
    # train end to end)
    mrc_attribute_targets: str = "detector"


def masked_roi_loss(logits: torch.Tensor, probs: torch.Tensor, labels: torch.Tensor, kind: str) -> torch.Tensor:
    log_q = logits.float().log_softmax(-1)
    if logits.shape[0] == 0:  # a step before `mrc_from_step`: no target, and the head keeps a (zero) gradient
        return log_q.sum() * 0.0
    if kind == "soft":
        return -(probs * log_q).sum(-1).mean()
    if kind == "kl":
        return (probs * (probs.clamp(min=1e-12).log() - log_q)).sum(-1).mean()
    if kind == "hard":
        return F.nll_loss(log_q, labels)
    raise ValueError(f"mrc_target: '{kind}' is not soft, hard or kl")


def masked_roi_attribute_loss(logits: torch.Tensor, target: torch.Tensor, visible: torch.Tensor
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cross-entropy of the head's attribute logits [K, A] to the target attribute distribution [K, A],
    averaged over the visible regions [K] bool; how often the two argmaxes agree there; and how many visible
    regions the two means are over (0: both are 0). Masked sums, not indexing: no host sync."""
    per = -(target.float() * logits.float().log_softmax(-1)).sum(-1)
    weight = visible.float()
    n = weight.sum()
    count = n.clamp(min=1)
    hits = (logits.argmax(-1) == target.argmax(-1)).float()
    return (per * weight).sum() / count, (hits * weight).sum() / count, n


class VLBertPretraining(nn.Module):
    def __init__(self, model: VLBertForPretraining, losses: LossConfig):
        super().__init__()
        self.model = model
        self.losses = losses
        masked_roi_loss(torch.zeros(1, 2), torch.ones(1, 2) / 2, torch.zeros(1, dtype=torch.long), losses.mrc_target)
        if losses.mrc_attribute_weight > 0 and (losses.mrc_weight <= 0 or not model.cfg.mrc_attributes):
            raise ValueError("losses.mrc_attribute_weight needs masked RoI classification (losses.mrc_weight > 0) "
                             "and its attribute head (model.mrc_attributes: true)")
        if losses.mrc_attribute_targets not in ("detector", "shards"):
            raise ValueError(f"losses.mrc_attribute_targets: '{losses.mrc_attribute_targets}' is not detector or "
                             "shards")

    def _mlm(self, parts: list[tuple[str, torch.Tensor, torch.Tensor]]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Each part's (loss, accuracy) from one head call over every part's masked positions: (name, hidden at
        the masked positions [M, hidden], labels [M]). The decoder is the vocabulary's [30522, hidden] matrix, and
        its products with a few dozen rows are bound by reading and writing it: one call for the caption and the
        text batch reads it, and writes its gradient, once instead of twice (the quick start's step 0.95x,
        docs/BENCHMARKS.md, session 89); each part's loss is its own mean, as with a call each."""
        logits = self.model.mlm_head(torch.cat([h for _, h, _ in parts])).float()
        out, start = {}, 0
        for name, hidden, labels in parts:
            part = logits[start: start + hidden.shape[0]]
            start += hidden.shape[0]
            out[name] = (F.cross_entropy(part, labels), (part.argmax(-1) == labels).float().mean())
        return out

    @staticmethod
    def _masked(out, batch) -> torch.Tensor:
        return out.text_hidden.flatten(0, 1)[batch["mlm_positions"]]  # [M, hidden]

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg = self.losses
        total = 0.0
        metrics: dict[str, torch.Tensor] = {}
        masked: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # the MLM parts, one head call at the end
        if "caption" in batch:
            c = batch["caption"]
            if "region_features" in c:  # precomputed features (bottom-up TSV): no detector in the step
                visual = {"region_features": c["region_features"], "image_hw": c["image_hw"]}
            else:
                visual = {"images": c["images"], "image_sizes": c["image_sizes"]}
            attributes = cfg.mrc_attribute_weight > 0
            stored = cfg.mrc_attribute_targets == "shards"
            if attributes and stored and "mrc_attribute_probs" not in c:
                raise ValueError("losses.mrc_attribute_targets: shards, but a caption batch carries no attribute "
                                 "distributions (attrs.npy, from a box file's attribute_probs, missing in one of its "
                                 "samples): rebuild the shards or set losses.mrc_attribute_targets=detector")
            out = self.model(c["input_ids"], c["text_mask"], c["token_type_ids"], boxes=c["boxes"],
                             box_mask=c["box_mask"], masked_regions=c["masked_regions"],
                             real_positions=c.get("real_positions"), aligned_words=c.get("aligned_words"),
                             neighbour_words=c.get("neighbour_words"), roi_index=c.get("roi_index"),
                             output_attribute_logits=attributes and not stored, **visual)
            masked.append(("caption", self._masked(out, c), c["mlm_labels"]))
            if cfg.mrc_weight > 0:
                regions = out.region_hidden[:, 1:].flatten(0, 1)[c["mrc_positions"]]  # [K, hidden], no whole image
                mrc_logits = self.model.masked_roi_classification(regions)
                mrc = masked_roi_loss(mrc_logits, c["mrc_probs"], c["mrc_labels"], cfg.mrc_target)
                total = total + cfg.mrc_weight * mrc
                # weighted by the step's targets: steps before `mrc_from_step` have none and leave the logged means
                n = mrc_logits.new_ones(mrc_logits.shape[0], dtype=torch.float32).sum()  # on the device: no copy
                hits = (mrc_logits.argmax(-1) == c["mrc_labels"]).float().sum() / n.clamp(min=1)
                metrics.update({"loss/mrc": mrc, "acc/mrc": hits,
                                "loss/mrc" + METRIC_WEIGHT: n, "acc/mrc" + METRIC_WEIGHT: n})
                if attributes:
                    target = (c["mrc_attribute_probs"] if stored else
                              out.region_attribute_logits[:, 1:].flatten(0, 1)[c["mrc_positions"]].float().softmax(-1))
                    visible = ~c["masked_regions"].flatten()[c["mrc_positions"]]
                    att, hits, n = masked_roi_attribute_loss(
                        self.model.masked_roi_classification.attributes(regions), target, visible)
                    total = total + cfg.mrc_attribute_weight * att
                    # a step whose chosen regions were all zeroed has no attribute target: weighted by the visible
                    # count, it leaves the logged means alone instead of pulling them towards 0
                    metrics.update({"loss/mrc_attribute": att, "acc/mrc_attribute": hits,
                                    "loss/mrc_attribute" + METRIC_WEIGHT: n, "acc/mrc_attribute" + METRIC_WEIGHT: n})
        if "text" in batch:
            t = batch["text"]
            out = self.model(t["input_ids"], t["text_mask"], t["token_type_ids"],
                             real_positions=t.get("real_positions"))
            masked.append(("text", self._masked(out, t), t["mlm_labels"]))
        if masked:
            weights = {"caption": cfg.mlm_caption_weight, "text": cfg.mlm_text_weight}
            for name, (mlm, mlm_acc) in self._mlm(masked).items():
                total = total + weights[name] * mlm
                metrics.update({f"loss/mlm_{name}": mlm, f"acc/mlm_{name}": mlm_acc})
        metrics["loss/total"] = total
        return total, {k: v.detach() for k, v in metrics.items()}
