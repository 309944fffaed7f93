"""What a model names when V4L hides the masked phrase's own object (docs/ABLATION.md, session 74).

The cross-modal diagnostic masks a whole held-out phrase ("a small red star") and scores its bits with the image
(`none`), with the phrase's object's regions replaced by the average region (`object`) and with every region replaced
(`all`). Here, for every masked colour and shape word-piece of those phrases, the MLM head's argmax under each
condition is sorted into: the right word; the colour (shape) of ANOTHER object the picture shows; a colour (shape) no
object in the picture has; not a colour (shape) at all. A model that, missing its object, reads the phrase off another
one names another object's colour under `object` more often than under `all`, where no real region is left; one that
falls back to the sentence names the picture's colours no more often under `object` than under `all`.

"The picture" reads the scene the held-out image was drawn from (`raw/scenes.jsonl`): the colours and shapes of its
objects not under the grey cloth (the referent's own counts as right when it is the answer, and as "another object's"
only when another object shares it). Shares with 95% intervals from a bootstrap over images.

    python docs/grounding_demo/object_errors.py OUT.md --config launch/configs/heldout_demo.yaml \
        --scenes data/demo/raw/scenes.jsonl LABEL=EXPORT [LABEL=EXPORT ...]
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from diagnostics.ablation import feature_extractor  # noqa: E402
from diagnostics.conditions import Ablator  # noqa: E402
from diagnostics.config import DiagnosticConfig  # noqa: E402
from diagnostics.data import PhraseData  # noqa: E402
from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from docs.grounding_demo.word_errors import single_piece  # noqa: E402
from model.config import load_config  # noqa: E402
from model.export import load_pretrained  # noqa: E402
from shards.shapes_world import CATEGORIES, COLOURS  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402

CONDITIONS = ("none", "object", "all")
OUTCOMES = ("right", "another object's", "not in the picture", "not a colour / shape")


def analyse(path: str, cfg: DiagnosticConfig, scenes: list[dict]) -> dict:
    model = load_pretrained(path).eval()
    tokenizer = load_tokenizer(path)
    data = PhraseData(cfg, tokenizer, model.cfg.fast_rcnn.num_classes, feature_extractor(model, "cpu"))
    ablator = Ablator(model, "cpu", cfg.ablation_fill)
    ablator.fit_means(data.batches())
    kinds = {"colour": single_piece(tokenizer, COLOURS), "shape": single_piece(tokenizer, CATEGORIES)}
    key = {"colour": "colour", "shape": "category"}
    rows: dict = {k: {"cluster": [], **{c: [] for c in CONDITIONS}} for k in kinds}
    start = 0
    with torch.no_grad():
        for b in tqdm(data.batches(), total=-(-len(data) // cfg.batch_size), desc=f"object errors: {path}"):
            items = data.items[start: start + len(b["phrase"])]
            start += len(items)
            preds = {}
            for condition in CONDITIONS:  # the diagnostic's own inputs for the condition
                out, _ = ablator.phrase_output(b, condition, cfg.tau)
                positions = F.pad(b["phrase"], (1, 1))[:, : out.text_length]  # shifted by [CLS]
                preds[condition] = model.mlm_head(out.text_hidden[positions]).argmax(-1).tolist()
            labels = F.pad(b["input_ids"], (1, 1))[:, : out.text_length]
            rows_of = positions.nonzero()[:, 0]
            for j, (row, label) in enumerate(zip(rows_of.tolist(), labels[positions].tolist(), strict=True)):
                kind = next((k for k, names in kinds.items() if label in names), None)
                if kind is None:
                    continue
                item = items[row]
                shown = [o for o in scenes[int(item.image_id)]["objects"] if not o["covered"]]
                truth = kinds[kind][label]
                present = [o[key[kind]] for o in shown]
                others = set(present) - {truth} | ({truth} if present.count(truth) > 1 else set())
                for condition in CONDITIONS:
                    p = preds[condition][j]
                    name = kinds[kind].get(p)
                    outcome = 0 if p == label else 3 if name is None else 1 if name in others else 2
                    rows[kind][condition].append(outcome)
                rows[kind]["cluster"].append(item.image_id)
    result = {"export": path, "phrases": len(data)}
    for kind, v in rows.items():
        cluster = np.asarray(v["cluster"])
        result[kind] = {"n": len(cluster), **{c: {o: clustered_bootstrap((np.asarray(v[c]) == i).astype(float), cluster)
                                                  for i, o in enumerate(OUTCOMES)} for c in CONDITIONS}}
    return result


def markdown(results: dict[str, dict]) -> str:
    lines = ["### What the masked phrase's colour and shape pieces are named under V4L's conditions (share of pieces, "
             "95% interval by image)", "",
             "| model | word | condition | " + " | ".join(OUTCOMES) + " |", "|---" * (3 + len(OUTCOMES)) + "|"]
    for label, r in results.items():
        for kind in ("colour", "shape"):
            for c in CONDITIONS:
                cells = []
                for o in OUTCOMES:
                    s = r[kind][c][o]
                    cells.append(f"{s['mean']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]")
                lines.append(f"| {label} | {kind} ({r[kind]['n']}) | {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--config", required=True, help="the held-out data's config (launch/configs/heldout_demo.yaml)")
    p.add_argument("--scenes", required=True, help="the corpus' raw/scenes.jsonl")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="e.g. max_examples=400")
    p.add_argument("models", nargs="+", metavar="LABEL=EXPORT")
    args = p.parse_args()
    cfg = load_config(DiagnosticConfig, args.config, args.set)
    scenes = [json.loads(line) for line in Path(args.scenes).read_text().splitlines()]
    results = {}
    for spec in args.models:
        label, path = spec.split("=", 1)
        results[label] = analyse(path, cfg, scenes)
    text = markdown(results)
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(text)


if __name__ == "__main__":
    main()
