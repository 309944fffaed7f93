"""Does a region's input to the transformer carry where the region is? (docs/ABLATION.md, session 54.) A linear probe
(ridge, 5 folds split by image) from each held-out region's vectors to its box centre (x, y, normalised), on an
export: the standardised appearance alone, the geometry embedding alone, the visual term FC(appearance ++ geometry)
the transformer adds to the region's token, and the region's hidden state after the embeddings (layer 0) and each
of the 6 layers (the caption in view).
R^2 near 1 says the vector holds the position linearly; the relation words (left of, above, ...) need the
transformer to compare two regions' positions.

    python docs/grounding_demo/long_s54/position_probe.py OUT.md --config launch/configs/heldout_demo.yaml \
        LABEL=EXPORT_DIR ... [--images 100]
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.conditions import Ablator  # noqa: E402
from diagnostics.config import DiagnosticConfig  # noqa: E402
from diagnostics.data import PhraseData  # noqa: E402
from model.config import load_config  # noqa: E402
from model.export import load_pretrained  # noqa: E402
from model.vl_bert import geometry_embedding  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402

ALPHAS = (1.0, 10.0, 100.0, 1000.0, 10000.0)


def ridge_r2(x: np.ndarray, y: np.ndarray, groups: np.ndarray, alpha: float, folds: int = 5) -> float:
    """Held-out R^2 (pooled over folds, both coordinates) of ridge regression x -> y, folds split by group."""
    ids = np.unique(groups)
    fold_of = dict(zip(ids, np.random.default_rng(0).permutation(len(ids)) % folds))
    fold = np.array([fold_of[g] for g in groups])
    pred = np.zeros_like(y)
    for f in range(folds):
        tr, te = fold != f, fold == f
        mu, sd = x[tr].mean(0), x[tr].std(0) + 1e-6
        a = np.c_[(x[tr] - mu) / sd, np.ones(tr.sum())]
        w = np.linalg.solve(a.T @ a + alpha * np.eye(a.shape[1]), a.T @ y[tr])
        pred[te] = np.c_[(x[te] - mu) / sd, np.ones(te.sum())] @ w
    return float(1 - ((y - pred) ** 2).sum() / ((y - y.mean(0)) ** 2).sum())


@torch.no_grad()
def vectors(export: str, data: PhraseData, images: int) -> dict[str, np.ndarray]:
    model = load_pretrained(export).eval()
    vb, ablator = model.vl_bert, Ablator(model)
    emb = vb.embeddings
    out: dict[str, list] = {}
    done = set()
    for b in data.batches():
        first = [k not in done for k in b["keys"]]  # each image once (its first sentence)
        if not any(first):
            continue
        done.update(b["keys"])
        pixels = {"images": b["images"], "image_sizes": b["image_sizes"]}
        appearance, boxes_norm, _ = vb.region_features(boxes=b["boxes"], box_mask=b["box_mask"], **pixels)
        real = torch.cat([torch.ones_like(b["box_mask"][:, :1]), b["box_mask"]], 1)
        std = torch.cat([emb.whole_image_standardiser(appearance[:, :1], real[:, :1]),
                         emb.appearance_standardiser(appearance[:, 1:], real[:, 1:])], 1)
        visual = emb.visual_features(appearance, boxes_norm, real)
        geometry = geometry_embedding(boxes_norm, vb.cfg.geometry_size)
        ids, types, mask = ablator.text(b, "none")
        enc = vb(ids, mask, types, boxes=b["boxes"], box_mask=b["box_mask"], output_hidden_states=True, **pixels)
        regions = slice(enc.text_length + 1, enc.text_length + enc.num_regions)  # the regions, not the whole image
        layers = {f"layer {i}": h[:, regions] for i, h in enumerate(enc.hidden_states)}
        keep = b["box_mask"] & torch.tensor(first).unsqueeze(1)
        centre = (boxes_norm[:, 1:, :2] + boxes_norm[:, 1:, 2:]) / 2
        for name, v in (("appearance", std[:, 1:]), ("geometry", geometry[:, 1:]), ("visual term", visual[:, 1:]),
                        *layers.items(), ("centre", centre)):
            out.setdefault(name, []).append(v[keep].float().numpy())
        out.setdefault("image", []).append(np.repeat(np.array(b["keys"]), keep.sum(1).numpy()))
        if len(done) >= images:
            break
    return {k: np.concatenate(v) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--config", required=True)
    p.add_argument("--images", type=int, default=100)
    p.add_argument("models", nargs="+", metavar="LABEL=EXPORT")
    args = p.parse_args()
    cfg = load_config(DiagnosticConfig, args.config, ["batch_size=8"])
    data = PhraseData(cfg, load_tokenizer(None), 9)
    lines = []
    for spec in args.models:
        label, export = spec.split("=", 1)
        v = vectors(export, data, args.images)
        parts = [k for k in v if k not in ("centre", "image")]
        if not lines:
            lines = ["### Linear probe of a region's box centre (x, y) from its vectors: held-out R^2 (5 folds by "
                     f"image; the best of ridge penalties {ALPHAS})", "",
                     "| model | regions (images) | " + " | ".join(parts) + " |", "|---" * (len(parts) + 2) + "|"]
        # the best of a few penalties (on standardised inputs): the probe's capacity, not the penalty, is the question
        row = [max(ridge_r2(v[k], v["centre"], v["image"], a) for a in ALPHAS) for k in parts]
        lines.append(f"| {label} | {len(v['centre'])} ({len(set(v['image']))}) | "
                     + " | ".join(f"{r:.3f}" for r in row) + " |")
        print(lines[-1], flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
