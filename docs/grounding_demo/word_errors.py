"""What a quick-start export says when it misses a masked colour or shape word (docs/ABLATION.md, session 57).

The grounding table counts a held-out colour word right or wrong. A wrong answer can still come from the image:
the model may name the colour of ANOTHER object in the picture (it reads the image but binds the word to the
wrong object), a colour no object in the picture has (it reads nothing of this image), or a word that is no
colour at all. The same for shape words with the shape names. Beside them, the accuracy of a reader that knows
the picture's colours (shapes) and binds the word to none of its objects: one of them at random. Each word is
masked alone, as the grounding evaluator masks it (`diagnostics.grounding`), with the image and with every region
replaced by the training mean (the evaluator's ablation); shares with 95% intervals from a bootstrap over images.

"In the picture" reads the scene the held-out image was drawn from (`data/demo/raw/scenes.jsonl`): the colours
and shapes of its objects not under the grey cloth, the referent's own included (a right answer is counted as
right, not as "in the picture").

Beside the outcomes, accuracy with the image split by what the phrase's other words pin down (session 60): every
named object is "a SIZE COLOUR SHAPE"; a masked shape word's colour names one object of the picture ("the adjacent
word alone"), or several of which the size and colour together name one ("size + adjacent word"), or several even
together ("neither"); a masked colour word the same with its shape (the word after it).

    python docs/grounding_demo/word_errors.py EXPORT [EXPORT ...] [--out FILE.md] [max_images=100]
    python docs/grounding_demo/word_errors.py FILE.json     # re-plot a saved result
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from diagnostics.ablation import feature_extractor  # noqa: E402
from diagnostics.conditions import training_means  # noqa: E402
from diagnostics.config import GroundingConfig  # noqa: E402
from diagnostics.grounding import GroundingEval  # noqa: E402
from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from model.config import load_config  # noqa: E402
from model.export import load_pretrained  # noqa: E402
from model.vl_bert import assemble_text  # noqa: E402
from shards.collate import pad_ids  # noqa: E402
from shards.shapes_world import CLASS_NAMES, COLOURS, SIZES  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402

HELD_OUT = "launch/configs/heldout_demo.yaml"
OUTCOMES = ("right", "another in the picture", "none in the picture", "not a word of the kind")
PINNED = ("the adjacent word alone", "size + adjacent word", "neither")


def single_piece(tokenizer, words) -> dict[int, str]:
    """Word-piece id -> word, for the words that are one piece (all the colours; the shapes' singulars)."""
    out = {}
    for w in words:
        ids = tokenizer(w.replace("_", " "), add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            out[ids[0]] = w
    return out


def pinned_by(tokenizer, sentence, word: int, cat: str, shown: list[dict]) -> int:
    """Index into PINNED: how many of the picture's shown objects the phrase's adjacent word (a shape's colour, a
    colour's shape) names, alone and with the size word; -1 when the phrase is not "SIZE COLOUR SHAPE"."""
    def text(i):
        return tokenizer.decode([t for t, w in zip(sentence.ids.tolist(), sentence.word_ids) if w == i]).strip()
    size, adjacent = (text(word - 2), text(word - 1)) if cat == "shape" else (text(word - 1), text(word + 1))
    key = "colour" if cat == "shape" else "category"
    if size not in SIZES or adjacent not in (COLOURS if cat == "shape" else CLASS_NAMES):
        return -1
    alone = [o for o in shown if o[key] == adjacent]
    return 0 if len(alone) == 1 else 1 if sum(o["size"] == size for o in alone) == 1 else 2


def analyse(path: str, cfg: GroundingConfig) -> dict:
    model = load_pretrained(path).eval()
    tokenizer = load_tokenizer(path)
    ev = GroundingEval(cfg, tokenizer, feature_extractor(model, "cpu"))
    vb, mcfg = model.vl_bert, model.cfg
    kinds = {"colour": single_piece(tokenizer, COLOURS), "shape": single_piece(tokenizer, CLASS_NAMES)}
    scenes = [json.loads(line) for line in (Path(cfg.flickr_root).parent / "scenes.jsonl").read_text().splitlines()]
    whole_mean, region_mean = training_means(vb)
    rows_out = {k: {c: [] for c in ("image", "ablated", "cluster", "guess", "pinned")} for k in kinds}
    with torch.no_grad():
        for k, item in enumerate(ev.data.images):
            scene = scenes[int(item.image_id)]
            shown = [o for o in scene["objects"] if not o["covered"]]
            present = {"colour": {o["colour"] for o in shown}, "shape": {o["category"] for o in shown}}
            image, boxes, _ = ev.data.load(item)
            app, boxes_norm = ev._visual(vb, image, boxes, None, "cpu")
            n = len(boxes)
            mean_app = torch.cat([whole_mean.view(1, -1), region_mean.expand(n, -1)], 0).unsqueeze(0).to(app.dtype)
            rows, kind_of, pinned = [], [], []
            for s in item.sentences:
                for word, cat in s.categories:
                    pieces = torch.tensor([w == word for w in s.word_ids])
                    target = s.ids[pieces]
                    if cat in kinds and len(target) == 1 and int(target[0]) in kinds[cat]:
                        rows.append((s.ids, pieces))
                        kind_of.append(cat)
                        pinned.append(pinned_by(tokenizer, s, word, cat, shown))
            if not rows:
                continue
            ids, valid = pad_ids([r[0] for r in rows])
            pieces = pad_ids([r[1].long() for r in rows])[0].bool()
            inp, types, mask = assemble_text(ids.masked_fill(pieces, mcfg.mask_token_id), valid,
                                             cls_id=mcfg.cls_token_id, sep_id=mcfg.sep_token_id,
                                             pad_id=mcfg.pad_token_id)
            where = F.pad(pieces, (1, 1))[:, : inp.shape[1]]
            labels = F.pad(ids, (1, 1))[:, : inp.shape[1]][where]
            r = len(rows)
            visual = torch.cat([app.expand(r, -1, -1), mean_app.expand(r, -1, -1)])
            out = vb(inp.repeat(2, 1), mask.repeat(2, 1), types.repeat(2, 1),
                     boxes=boxes.unsqueeze(0).expand(2 * r, -1, -1), box_mask=torch.ones(2 * r, n, dtype=torch.bool),
                     visual_input=(visual, boxes_norm.expand(2 * r, -1, -1)))
            pred = model.mlm_head(out.text_hidden[where.repeat(2, 1)]).argmax(-1)
            for j, cat in enumerate(kind_of):
                names = kinds[cat]
                for condition, p in (("image", int(pred[j])), ("ablated", int(pred[r + j]))):
                    if p == int(labels[j]):
                        outcome = 0
                    elif p in names:
                        outcome = 1 if names[p] in present[cat] else 2
                    else:
                        outcome = 3
                    rows_out[cat][condition].append(outcome)
                rows_out[cat]["cluster"].append(k)
                rows_out[cat]["pinned"].append(pinned[j])
                truth = names[int(labels[j])]
                rows_out[cat]["guess"].append(1 / len(present[cat]) if truth in present[cat] else 0.0)
    result = {"export": path, "images": len(ev.data.images)}
    for cat, v in rows_out.items():
        cluster = np.asarray(v["cluster"])
        for condition in ("image", "ablated"):
            o = np.asarray(v[condition])
            result[f"{cat}/{condition}"] = {name: clustered_bootstrap((o == i).astype(float), cluster)
                                            for i, name in enumerate(OUTCOMES)}
        result[f"{cat}/n"] = len(cluster)
        right, group = np.asarray(v["image"]) == 0, np.asarray(v["pinned"])
        for i, name in enumerate(PINNED):
            sel = group == i
            result[f"{cat}/pinned/{name}"] = {"n": int(sel.sum()), **(
                clustered_bootstrap(right[sel].astype(float), cluster[sel]) if sel.any() else {})}
        # a reader of the picture's colours (shapes) that binds the word to none of its objects: one at random
        result[f"{cat}/picture_at_random"] = clustered_bootstrap(np.asarray(v["guess"]), cluster)
    return result


def markdown(results: list[dict]) -> str:
    lines = ["| export | word | condition | n | " + " | ".join(OUTCOMES) + " | the picture's at random |",
             "|---" * (5 + len(OUTCOMES)) + "|"]
    for res in results:
        for cat in ("colour", "shape"):
            for condition in ("image", "ablated"):
                cells = [f"{g['mean']:.3f} [{g['ci95'][0]:.3f}, {g['ci95'][1]:.3f}]"
                         for g in res[f"{cat}/{condition}"].values()]
                g = res[f"{cat}/picture_at_random"]
                guess = f"{g['mean']:.3f} [{g['ci95'][0]:.3f}, {g['ci95'][1]:.3f}]" if condition == "image" else ""
                lines.append(f"| {res['export']} | {cat} | {condition} | {res[f'{cat}/n']} | " + " | ".join(cells)
                             + f" | {guess} |")
    lines += ["", "With the image, by what the phrase's other words pin down (accuracy, 95% interval; n):", "",
              "| export | word | " + " | ".join(PINNED) + " |", "|---" * (2 + len(PINNED)) + "|"]
    for res in results:
        for cat in ("colour", "shape"):
            cells = []
            for name in PINNED:
                g = res.get(f"{cat}/pinned/{name}", {"n": 0})
                cells.append(f"{g['mean']:.3f} [{g['ci95'][0]:.3f}, {g['ci95'][1]:.3f}]; {g['n']}" if g["n"]
                             else "-; 0")
            lines.append(f"| {res['export']} | {cat} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict], png: Path) -> None:
    """Stacked bars per export and word kind (with the image): the outcome shares, and the share a reader of the
    picture that binds nothing would get right (black tick)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    colours = ("tab:green", "tab:orange", "tab:red", "tab:grey")
    for ax, cat in zip(axes, ("colour", "shape")):
        for i, res in enumerate(results):
            bottom = 0.0
            for name, colour in zip(OUTCOMES, colours):
                share = res[f"{cat}/image"][name]["mean"]
                ax.bar(i, share, bottom=bottom, color=colour, label=name if i == 0 else None)
                bottom += share
            guess = res[f"{cat}/picture_at_random"]["mean"]
            ax.plot([i - 0.4, i + 0.4], [guess, guess], color="black", lw=2,
                    label="one of the picture's at random" if i == 0 else None)
        ax.set_xticks(range(len(results)), [r["export"].replace(" (", "\n(") for r in results], fontsize=7)
        ax.set_title(f"masked {cat} words: what the model answers with the image", fontsize=9)
    axes[0].set_ylabel("share of held-out words")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    args = sys.argv[1:]
    if args and args[0].endswith(".json"):  # re-plot a saved result
        plot(json.loads(Path(args[0]).read_text()), Path(args[0]).with_suffix(".png"))
        return
    out_path = args[args.index("--out") + 1] if "--out" in args else None
    exports = [a for a in args if "=" not in a and a != "--out" and a != out_path]
    torch.set_num_threads(2)
    cfg = load_config(GroundingConfig, HELD_OUT, ["max_images=100", *[a for a in args if "=" in a]])
    results = [analyse(p, cfg) for p in exports]
    text = markdown(results)
    print(text)
    if out_path:
        Path(out_path).write_text(text)
        Path(out_path).with_suffix(".json").write_text(json.dumps(results, indent=1))
        plot(results, Path(out_path).with_suffix(".png"))


if __name__ == "__main__":
    main()
