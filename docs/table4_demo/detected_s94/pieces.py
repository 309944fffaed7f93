"""What a finetuned RefCOCO+ model reads as the landmark of a relational expression whose landmark is a hexagon
(docs/FINETUNE.md, session 94). Scores the trained run again (`finetune.refcoco --eval-only`, in a new run folder
beside it) with a hook on `relation_anchors`: for each relational expression, each word-piece's alignment mass (a
piece names when > 0.5) and the object found after the relation word (found; its largest weight). Summed by whether
the landmark is a hexagon ("he ##xa ##gon"). With --whole the same trained weights are read with
`model.align_whole_names` on (the run's config.json edited in the copy; nothing retrained).

    python docs/table4_demo/detected_s94/pieces.py --run runs/s94/on/refcoco/img15_s0/pretrained --out DIR \
        [--whole] [overrides, e.g. track=detected]
Prints JSON; DIR gets the scoring's metrics and predictions and pieces.json (the per-expression records).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from finetune import refcoco  # noqa: E402
from finetune.common import load_tokenizer  # noqa: E402
from model import vl_bert  # noqa: E402


def probe_run(run: Path, out: Path, whole: bool) -> None:
    """out/model: the run's model files linked, its config.json copied (align_whole_names set with whole)."""
    model = out / "model"
    model.mkdir(parents=True, exist_ok=True)
    for f in (run / "model").iterdir():
        target = model / f.name
        if target.is_symlink() or target.exists():
            target.unlink()
        if f.name == "config.json":
            config = json.loads(f.read_text())
            if whole:
                config["align_whole_names"] = True
            target.write_text(json.dumps(config, indent=1))
        else:
            target.symlink_to(f.resolve())
    (out / "run.json").write_text((run / "run.json").read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, type=Path, help="a finetuned RefCOCO+ run folder (model/, run.json)")
    ap.add_argument("--out", required=True, type=Path, help="the new run folder the scoring writes to")
    ap.add_argument("--whole", action="store_true", help="read the pieces of a split name as the name")
    args, overrides = ap.parse_known_args(argv)
    probe_run(args.run, args.out, args.whole)
    tok = load_tokenizer(str(args.run / "model"))
    hexagon = tok.convert_tokens_to_ids(tok.tokenize("hexagon"))
    records, current = [], {}
    embed, anchors = vl_bert.VLBert.embed, vl_bert.VLBertEmbeddings.relation_anchors

    def embed_hook(self, input_ids, *a, **k):
        current["ids"] = input_ids
        return embed(self, input_ids, *a, **k)

    def anchors_hook(self, weights, candidates, real, relation, *a, **k):
        after, before = anchors(self, weights, candidates, real, relation, *a, **k)
        ids = current["ids"]
        if ids.shape[1] == weights.shape[1]:
            mass = weights.sum(-1)
            for b in range(ids.shape[0]):
                where = (relation[b] >= 0).nonzero().flatten().tolist()
                if where:
                    records.append({"ids": ids[b].tolist(), "mass": [round(float(m), 4) for m in mass[b]],
                                    "relation": where[0], "found": bool(after[b, where[0]].sum() > 0),
                                    "top": round(float(after[b, where[0]].max()), 4)})
        return after, before

    vl_bert.VLBert.embed, vl_bert.VLBertEmbeddings.relation_anchors = embed_hook, anchors_hook
    refcoco.main(["--config", "launch/configs/refcoco_demo.yaml", "--eval-only", f"engine.run_dir={args.out}",
                  *overrides])
    (args.out / "pieces.json").write_text(json.dumps(records) + "\n")
    groups: dict[str, dict[str, list]] = {}
    for r in records:
        after = r["ids"][r["relation"] + 1:]
        at = next((i for i in range(len(after) - len(hexagon) + 1) if after[i:i + len(hexagon)] == hexagon), None)
        g = groups.setdefault("hexagon landmark" if at is not None else "other landmark",
                              {"found": [], "top > 0.9": [], **({f"mass of {p}": [] for p in
                                                                  tok.convert_ids_to_tokens(hexagon)}
                                                                 if at is not None else {})})
        g["found"].append(r["found"])
        g["top > 0.9"].append(r["top"] > 0.9)
        if at is not None:
            for k, p in enumerate(tok.convert_ids_to_tokens(hexagon)):
                g[f"mass of {p}"].append(r["mass"][r["relation"] + 1 + at + k])
    config = json.loads((args.out / "model" / "config.json").read_text())
    report = {"run": str(args.run), "align_whole_names": bool(config.get("align_whole_names", False)),
              "accuracy": json.loads((args.out / "metrics_val.json").read_text())["accuracy"]}
    for name, g in groups.items():
        report[name] = {"n": len(g["found"])}
        for key, values in g.items():
            values = np.array(values, dtype=float)
            report[name][key] = round(float(values.mean()), 3)
            if key.startswith("mass"):
                report[name][key.replace("mass", "naming (> 0.5)")] = int((values > 0.5).sum())
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
