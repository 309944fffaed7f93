"""How readable colour and shape are in what an export's visual embedding gives the transformer
(docs/FINETUNE.md, session 44): the direct probe session 43's swap left unrun.

Session 43 found that a no-channel pretraining's visual projection makes RefCOCO+ colour-only expressions harder to
learn than a fresh one does, from a swap (step 0's projection in the pretrained model restores them). This reads
the regions of the detector's held-out images (their annotated boxes, shape class and colour) through each export's
own Fast R-CNN, one image per pass as the finetunes cache them, at three depths:
- `appearance`: the Fast R-CNN's region feature (what both the detector heads and VL-BERT read);
- `visual`: after the appearance standardiser and the visual feature FC (appearance ++ geometry);
- `object_term`: the projection and LayerNorm a region token adds to its embedding (what the transformer reads).
Per depth and label: how much of the representation's variance the label explains (eta^2 = between-class over
total sum of squares: a direction a gradient-trained reader finds first when it is large), nearest-class-mean
accuracy by cosine (parameter-free), and a converged multinomial logistic probe (capacity: what is there at all);
the probes fit on regions of `--train-images` training images and score the held-out ones, with 95% intervals from
a bootstrap over images.

    python docs/table4_demo/refcoco_start/colour_probe.py --export step0=runs/demo_long_nochannel_step0/export \\
        --export pretrained=runs/demo_long_nochannel/export --out docs/table4_demo/refcoco_start/colour_probe
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.report import write_report  # noqa: E402
from diagnostics.statistics import clustered_bootstrap, format_interval  # noqa: E402
from model.config import load_config  # noqa: E402
from model.export import load_pretrained  # noqa: E402
from pretrain.detector import BoxSet, DetectorConfig, read_vocabularies  # noqa: E402

DEPTHS = ("appearance", "visual", "object_term")


@torch.no_grad()
def represent(vl_bert, data: BoxSet, indices: list[int], desc: str) -> dict[str, np.ndarray]:
    """Each annotated region of the images `indices` at the three depths, with its shape, colour and image."""
    emb = vl_bert.embeddings
    out = {k: [] for k in (*DEPTHS, "shape", "colour", "image")}
    for i in tqdm(indices, desc=desc, leave=False):
        batch = data.batch([i])
        real = batch["box_mask"][0]
        appearance, boxes_norm, _ = vl_bert.region_features(images=batch["images"], image_sizes=batch["image_sizes"],
                                                            boxes=batch["boxes"], box_mask=batch["box_mask"])
        valid = torch.cat([real.new_ones(1), real])[None]
        visual = emb.visual_features(appearance, boxes_norm, valid)
        term = emb.object_visual_term(visual)
        for name, x in zip(DEPTHS, (appearance, visual, term)):
            out[name].append(x[0, 1:][real].float())  # element 0 is the whole image: no label
        out["shape"].append(batch["labels"][0][real])
        att = batch["attributes"][0][real]
        # one colour per demo object; a region with none (or several) is left out of the colour scores (-1)
        out["colour"].append(torch.where(att.sum(-1) == 1, att.argmax(-1), -1))
        out["image"].append(torch.full((int(real.sum()),), i))
    return {k: torch.cat(v).numpy() for k, v in out.items()}


def eta_squared(x: np.ndarray, y: np.ndarray) -> float:
    """Share of the total sum of squares that the class means account for."""
    mu = x.mean(0)
    total = ((x - mu) ** 2).sum()
    between = sum((y == c).sum() * ((x[y == c].mean(0) - mu) ** 2).sum() for c in np.unique(y))
    return float(between / total)


def nearest_mean(train_x: np.ndarray, train_y: np.ndarray, x: np.ndarray) -> np.ndarray:
    classes = np.unique(train_y)
    means = F.normalize(torch.tensor(np.stack([train_x[train_y == c].mean(0) for c in classes])), dim=-1)
    score = F.normalize(torch.tensor(x), dim=-1) @ means.T
    return classes[score.argmax(-1).numpy()]


def logistic(train_x: np.ndarray, train_y: np.ndarray, x: np.ndarray, l2: float = 1e-3) -> np.ndarray:
    """Multinomial logistic regression on features z-scored by the training regions, fitted by L-BFGS to
    convergence (what is linearly there, however it is scaled)."""
    classes, target = np.unique(train_y, return_inverse=True)
    mu, sd = train_x.mean(0), train_x.std(0) + 1e-6
    a, b = torch.tensor((train_x - mu) / sd), torch.tensor((x - mu) / sd)
    t = torch.tensor(target)
    w = torch.zeros(a.shape[1], len(classes), dtype=a.dtype, requires_grad=True)
    bias = torch.zeros(len(classes), dtype=a.dtype, requires_grad=True)
    opt = torch.optim.LBFGS([w, bias], max_iter=500, tolerance_grad=1e-7, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(a @ w + bias, t) + l2 * (w ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return classes[(b @ w + bias).argmax(-1).numpy()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--export", action="append", required=True, help="NAME=EXPORT_DIR")
    ap.add_argument("--detector-config", default="launch/configs/detector_demo_long.yaml",
                    help="its train / val annotations give the regions and their labels")
    ap.add_argument("--train-images", type=int, default=400, help="training images the probes fit on")
    ap.add_argument("--val-images", type=int, default=0, help="the first N held-out images (0: all)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    dcfg = load_config(DetectorConfig, args.detector_config)
    _, attributes, sizes = read_vocabularies(dcfg.train)
    sets = {}
    for split, path in (("train", dcfg.train), ("val", dcfg.val)):
        sets[split] = BoxSet(path, dcfg, dcfg.fast_rcnn.num_classes, max(attributes, default=0),
                             max(sizes, default=0))
    rng = np.random.default_rng(0)
    train_idx = sorted(rng.choice(len(sets["train"]), min(args.train_images, len(sets["train"])), replace=False))
    val_idx = list(range(args.val_images or len(sets["val"])))
    report, rows = {}, []
    for spec in args.export:
        name, export = spec.split("=", 1)
        vl_bert = load_pretrained(export).eval().vl_bert  # once for both splits
        tr = represent(vl_bert, sets["train"], train_idx, f"{name} train")
        va = represent(vl_bert, sets["val"], val_idx, f"{name} val")
        report[name] = {"export": export}
        for label in ("colour", "shape"):
            ok_tr, ok_va = tr[label] >= 0, va[label] >= 0
            for depth in DEPTHS:
                xt, yt, xv, yv = tr[depth][ok_tr], tr[label][ok_tr], va[depth][ok_va], va[label][ok_va]
                clusters = va["image"][ok_va]
                ncm = clustered_bootstrap((nearest_mean(xt, yt, xv) == yv).astype(float), clusters)
                lin = clustered_bootstrap((logistic(xt, yt, xv) == yv).astype(float), clusters)
                eta = eta_squared(xv, yv)
                report[name][f"{label}/{depth}"] = {"eta2": eta, "nearest_mean": ncm, "logistic": lin,
                                                    "regions": int(ok_va.sum()), "train_regions": int(ok_tr.sum())}
                rows.append((name, label, depth, eta, ncm, lin))
                print(f"{name:>14} {label:>6} {depth:>12}  eta2 {eta:.3f}  nearest mean {ncm['mean']:.3f}  "
                      f"logistic {lin['mean']:.3f}", flush=True)

    lines = ["| export | label | depth | variance explained (eta^2) | nearest class mean (cosine) | "
             "logistic probe |", "|---|---|---|---|---|---|"]
    lines += [f"| {n} | {lab} | {d} | {e:.3f} | {format_interval(c)} | {format_interval(g)} |"
              for n, lab, d, e, c, g in rows]
    first = next(iter(report.values()))
    text = "\n".join(lines) + (
        f"\n\nRegions of the detector's held-out images ({first['colour/appearance']['regions']} with one colour; "
        f"{first['shape/appearance']['regions']} with a shape), each export's own Fast R-CNN, one image per pass; "
        f"the probes fit on {first['colour/appearance']['train_regions']} regions of {len(train_idx)} training "
        "images. Chance: 1/6 colour, 1/8 shape. 95% intervals from a bootstrap over images.\n")
    out = Path(args.out)
    for path in write_report(out, "colour_probe", report, text, lambda: plot(rows, out / "colour_probe.png")):
        print(f"wrote {path}")
    print(text)
    return 0


def plot(rows: list, path: Path) -> Path:
    """Colour's and shape's share of the variance at each depth, one line per export."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, label in zip(axes, ("colour", "shape")):
        for name in dict.fromkeys(r[0] for r in rows):
            eta = [next(r[3] for r in rows if r[:3] == (name, label, d)) for d in DEPTHS]
            ax.plot(DEPTHS, eta, marker="o", label=name)
        ax.set_title(f"{label}: share of the variance (eta^2)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("between-class / total sum of squares")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
