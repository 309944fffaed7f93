"""Where the image-ablated control's tiny vision-for-language effect comes from (docs/ABLATION.md, session 17).

The control (`masking.ablate_image=true`) pretrained on grey images, yet its cross-modal diagnostic gives
V4L all - none = +0.00013 bits with an interval just above 0. Hypothesis: the region word terms. They are
parameter-free (each region's token and its aligned words add the word embeddings of the names the detector's
classifiers give it), so a BERT that never learnt anything from images still reads "red" added to the circle's
word when the region shows a red circle. In `none` they come from the real pixels, in `all` from the dataset
mean; nothing else in the control has learnt to tell the two apart.

This measures all - none on every held-out phrase twice, in one pass, the same batches:
  - `live`: as the diagnostic does (reproduces its figure);
  - `frozen`: the detector's object and attribute classifiers read the dataset-mean region feature for every
    region in both conditions, so the region words are the same in `none` and `all` and only the learnt visual
    terms (appearance and geometry through the visual embedding) differ.
If the leak is the region words, `frozen` has an interval that includes 0 (session 17: it does not).

Session 18: `--silence-below VAR` makes the standardiser channels whose running variance is below VAR output 0
(what `AppearanceStandardiser.CONSTANT_VAR` now does for 1e-12), to test the other path: channels constant
over the control's grey images, amplified 316-fold when a real image moves them. `--conditions none,object,all`
adds visual conditions (each reported minus none): a lean V4L on every phrase, for a model's targets.

Session 19: `grey` (every pixel the pixel mean, boxes kept: the control's own training input) and the
`ablation_fill=training|evaluation` override (what `all` fills in: the model's pretraining average, the default
now, or the held-out images' average, the paper's); `--dump F` keeps every phrase's bits and words.

Session 22: `all_boxes` (all, and every region's box the held-out regions' average box): the geometry the
size names and the visual embedding's box term read, ablated too.

Session 53: `--variants mean_names`: an ablated region's class and colour names are the average of the held-out
regions' names (the detector's mean probabilities), not the names the detector gives the average feature. The
average region feature is no typical region: the live classifiers name it one colour with p ~0.77, and which colour
moved from orange to green between two checkpoints 50 steps apart (demo_long on the CPU, steps 1,550 and 1,600),
so `all` shows every region as, say, a green star. With the names averaged, `all` keeps the names' information out
without telling the model something false.

    python docs/grounding_demo/control_leak.py --model control=runs/demo_long_control/export \\
        [--model demo_long=runs/demo_long/export] [--variants live,mean_names] [--conditions none,object,all] \\
        [--silence-below 1e-12] [--dump F] [--out docs/grounding_demo/long_s17/control_leak.md] [ablation_fill=...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from diagnostics.ablation import feature_extractor  # noqa: E402
from diagnostics.conditions import Ablator  # noqa: E402
from diagnostics.config import DiagnosticConfig  # noqa: E402
from diagnostics.data import PhraseData  # noqa: E402
from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from model.config import load_config  # noqa: E402
from model.export import load_pretrained  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402

HELD_OUT = "launch/configs/heldout_demo.yaml"  # the demo's held-out images (run from the repository root)


class Frozen(torch.nn.Module):
    """A classifier that answers every input as it answers `feature` (the dataset-mean region feature)."""

    def __init__(self, classifier: torch.nn.Module, feature: torch.Tensor):
        super().__init__()
        self.classifier, self.feature = classifier, feature

    @property
    def weight(self) -> torch.Tensor:  # the detector reads its dtype off the classifier's weight
        return self.classifier.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.feature.to(x.dtype)).expand(*x.shape[:-1], -1)


class AverageNames(torch.nn.Module):
    """A classifier that answers the ablation's fill (rows equal to `feature`) with `log_probs`, the log of the
    held-out regions' mean probabilities: the softmax the region words take gives those back, so an ablated
    region's name term is the average of the real regions' terms. Every other row as the live classifier."""

    def __init__(self, classifier: torch.nn.Module, feature: torch.Tensor, log_probs: torch.Tensor):
        super().__init__()
        self.classifier, self.feature, self.log_probs = classifier, feature, log_probs

    @property
    def weight(self) -> torch.Tensor:
        return self.classifier.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.classifier(x)
        fill = (x == self.feature.to(x.dtype)).all(-1, keepdim=True)
        return torch.where(fill, self.log_probs.to(out.dtype), out)


@torch.no_grad()
def mean_name_log_probs(ablator: Ablator, data: PhraseData, device: str
                        ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The log of the detector's mean class (foreground; background at -1e4) and attribute probabilities over the
    held-out phrases' real regions, one pass of the CNN. An image serves several phrases: every row counts, so an
    image weighs as many times as it has phrases (as in the diagnostic's averages)."""
    obj, attr = ablator.vb.fast_rcnn.object_classifier, ablator.vb.fast_rcnn.attribute_classifier
    sums, regions = [0.0, 0.0], 0
    for b in data.batches():
        b = {k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()}
        appearance = ablator.visual(b, torch.zeros_like(b["box_mask"]), False)[0][:, 1:]  # nothing ablated
        real = b["box_mask"].unsqueeze(-1).float()
        if obj is not None:
            sums[0] = sums[0] + (obj(appearance)[..., 1:].float().softmax(-1) * real).sum((0, 1))
        if attr is not None:
            sums[1] = sums[1] + (attr(appearance).float().softmax(-1) * real).sum((0, 1))
        regions += int(b["box_mask"].sum())
    cls = None if obj is None else torch.cat([torch.full((1,), -1e4, device=device), (sums[0] / regions).log()])
    return cls, None if attr is None else (sums[1] / regions).log()


def silence_constant_channels(model, below: float) -> dict[str, int]:
    """Standardiser channels whose running variance is below `below` (constant over pretraining: the control's
    grey images give 159 such region channels) output 0, whatever the input. Returns the count per standardiser."""
    counts = {}
    for name in ("appearance_standardiser", "whole_image_standardiser"):
        std = getattr(model.vl_bert.embeddings, name)
        dead = std.running_var < below
        std.running_var[dead] = float("inf")  # rsqrt(inf) = 0: the channel's deviation from its mean is dropped
        counts[name] = int(dead.sum())
    return counts


def measure(model, data: PhraseData, device: str, desc: str, variants=("live", "frozen"),
            conditions=("none", "all")) -> dict[str, np.ndarray]:
    ablator = Ablator(model, device, data.cfg.ablation_fill)
    ablator.fit_means(data.batches())
    if "all_boxes" in conditions:
        ablator.fit_box_mean(data.batches())
    detector = model.vl_bert.fast_rcnn
    live = (detector.object_classifier, detector.attribute_classifier)
    frozen = tuple(Frozen(c, ablator.region_mean) if c is not None else None for c in live)
    classifiers = {"live": live, "frozen": frozen}
    if "mean_names" in variants:
        classifiers["mean_names"] = tuple(
            AverageNames(c, ablator.region_mean, lp) if c is not None else None
            for c, lp in zip(live, mean_name_log_probs(ablator, data, device)))
    out: dict[str, list] = {}
    for b in tqdm(data.batches(), total=math.ceil(len(data) / data.cfg.batch_size), desc=desc):
        b = {k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()}
        for name, (obj, attr) in classifiers.items():
            if name not in variants:
                continue
            detector.object_classifier, detector.attribute_classifier = obj, attr
            for cond in conditions:
                out.setdefault(f"{name}/{cond}", []).append(
                    ablator.vision_for_language(b, cond, data.cfg.tau).float().cpu().numpy())
        detector.object_classifier, detector.attribute_classifier = live
    return {k: np.concatenate(v) for k, v in out.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--out", default="docs/grounding_demo/long_s17/control_leak.md")
    p.add_argument("--device", default="cpu")
    p.add_argument("--variants", default="live,frozen", help="region words: live, frozen, mean_names, comma-separated")
    p.add_argument("--conditions", default="none,all",
                   help="visual conditions (none first; each other one is reported minus none), e.g. none,object,all")
    p.add_argument("--silence-below", type=float, metavar="VAR",
                   help="standardiser channels with running variance below VAR output 0 (constant in pretraining)")
    p.add_argument("--dump", metavar="NPZ", help="also write every phrase's bits per variant/condition, its image "
                   "id and its masked words (for splits by word category)")
    p.add_argument("overrides", nargs="*", help="DiagnosticConfig fields as key=value")
    args = p.parse_args(argv)
    cfg = load_config(DiagnosticConfig, HELD_OUT, args.overrides)
    torch.set_grad_enabled(False)
    rows, report = [], {}
    for spec in args.model:
        name, _, path = spec.partition("=")
        model = load_pretrained(path).to(args.device).eval()
        if args.silence_below is not None:
            print(f"{name}: silenced channels {silence_constant_channels(model, args.silence_below)}", flush=True)
        data = PhraseData(cfg, load_tokenizer(path), model.cfg.fast_rcnn.num_classes, feature_extractor(model))
        variants = tuple(args.variants.split(","))
        conditions = tuple(args.conditions.split(","))
        if conditions[0] != "none":
            raise ValueError(f"--conditions {args.conditions}: the first must be none (the others are minus it)")
        values = measure(model, data, args.device, name, variants, conditions)
        clusters = np.array([it.image_id for it in data.items])
        if args.dump:
            tok = load_tokenizer(path)
            words = [tok.decode(it.ids[it.phrase]) for it in data.items]
            np.savez(Path(args.dump).with_suffix(f".{name}.npz"), image_id=clusters, words=np.array(words),
                     **{k.replace("/", "__"): v for k, v in values.items()})
        report[name] = {}
        for variant in variants:
            none = clustered_bootstrap(values[f"{variant}/none"], clusters, resamples=cfg.bootstrap, seed=cfg.seed)
            report[name][variant] = {"none": none}
            for cond in conditions[1:]:
                diff = values[f"{variant}/{cond}"] - values[f"{variant}/none"]
                s = clustered_bootstrap(diff, clusters, resamples=cfg.bootstrap, seed=cfg.seed)
                mean = clustered_bootstrap(values[f"{variant}/{cond}"], clusters, resamples=cfg.bootstrap,
                                           seed=cfg.seed)
                report[name][variant][f"{cond}_minus_none"] = s
                report[name][variant][cond] = mean
                lo, hi = s["ci95"]
                rows.append(f"| {name} | {variant} | {cond} | {none['mean']:.4f} | {mean['mean']:.4f} | "
                            f"{s['mean']:+.6f} [{lo:+.6f}, {hi:+.6f}] | {s['n']} / {s['clusters']} |")
                print(rows[-1], flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("### V4L: each visual condition minus none, with the region word terms live or frozen to the "
                   "dataset mean\n\n"
                   "| model | region words | condition | none (bits) | condition (bits) | condition - none (bits, 95% "
                   "interval by image) | phrases / images |\n"
                   "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
