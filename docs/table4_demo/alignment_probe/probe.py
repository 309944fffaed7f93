"""Where a finetuned VQA model finds the object a question names (docs/FINETUNE.md, session 37).

The demo's models carry a parameter-free word-region alignment (`region_word_alignment`): a word whose
embedding matches a region's class or colour name (cosine above the threshold) adds that region's names, so
"what color is the circle?" gets the circle region's colour name added to the word "circle". The alignment
only fires where the detector names the object confidently; elsewhere a model must find the object by
attention. This measures, for each finetuned VQA run given:

1. colour questions ("what color is the <shape>?", the scene holding one such shape): accuracy split by the
   shape word's alignment weight on its object's region (>= 0.5: aligned; the region is the detected box that
   overlaps the scene's object most), and by whether the detector's colour and class for that region are
   right;
2. every val question, per question type, with the alignment as trained and with it off (no word aligns to
   any region; the region tokens keep their names): how much of each answer goes through the alignment.

Intervals: 95%, a bootstrap over images; the differences paired by question (second run minus first).

    python docs/table4_demo/alignment_probe/probe.py --run step0=runs/table4_demo36/vqa/none \\
        --run pretrained=runs/table4_demo36/vqa/pretrained [--run ...] --out docs/table4_demo/alignment_probe/s37
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.statistics import clustered_bootstrap, paired_test  # noqa: E402
from finetune.common import RegionFeatureCache, eval_batches, load_task_model  # noqa: E402
from finetune.vqa import VQAConfig, VQATask  # noqa: E402
from finetune.vqa_score import vqa_accuracy  # noqa: E402
from model.boxes import box_iou  # noqa: E402
from model.config import load_config  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402

COLOUR_Q = "what color is the "
OFF = 2.0  # an alignment threshold above any cosine: every word's weight goes to "no region"


def read_scenes(path: Path) -> dict:
    return {s["image"]: s for s in map(json.loads, path.read_text().splitlines())}


def probe_run(run_dir: Path, cfg: VQAConfig, scenes: dict, batch_size: int) -> list[dict]:
    module, info = load_task_model(run_dir / "model", VQATask.rebuild)
    tok = load_tokenizer(str(run_dir / "model"))
    vl_bert = module.vl_bert
    if vl_bert.cfg.region_word_alignment is None:
        raise ValueError(f"{run_dir}/model: no region_word_alignment to probe")
    data = VQATask.dataset(cfg, tok, info, train=False)
    cache = RegionFeatureCache(data, vl_bert, batch_size, "cpu", "val images")
    names = {kind: [tok.decode(ids) for ids in getattr(vl_bert.cfg, f"region_{kind}_words")]
             for kind in ("class", "attribute")}
    seen: dict = {}
    emb, detector = vl_bert.embeddings, vl_bert.fast_rcnn
    weights_of = emb.alignment_weights

    def recorded_weights(words, terms, candidates):
        seen["align"] = weights_of(words, terms, candidates)
        return seen["align"]

    emb.alignment_weights = recorded_weights
    detector.object_classifier.register_forward_hook(lambda m, i, o: seen.__setitem__("class", o))
    detector.attribute_classifier.register_forward_hook(lambda m, i, o: seen.__setitem__("colour", o))
    rows: list[dict] = []
    trained = vl_bert.cfg.region_word_alignment
    with torch.no_grad():
        for threshold in (trained, OFF):
            vl_bert.cfg.region_word_alignment = threshold
            for idx, batch in eval_batches(cache, batch_size, desc=f"{run_dir.name} align={threshold}"):
                answers = module.logits(batch).argmax(1).tolist()
                for r, i in enumerate(idx):
                    q, rel = data.items[i]
                    score = vqa_accuracy(data.answers[answers[r]], q.answers)
                    if threshold == OFF:  # the same order as the first pass
                        assert rows[i]["question_id"] == q.question_id
                        rows[i]["score_off"] = score
                        continue
                    row = {"question_id": q.question_id, "image": rel, "type": q.question_type, "score": score}
                    if q.question.startswith(COLOUR_Q):
                        row.update(colour_question(q.question, rel, r, data.question_ids[i], data, tok, cfg,
                                                   scenes, seen, names))
                    rows.append(row)
    vl_bert.cfg.region_word_alignment = trained
    return rows


def colour_question(question: str, rel: str, r: int, ids: list[int], data, tok, cfg, scenes: dict, seen: dict,
                    names: dict) -> dict:
    shape = question[len(COLOUR_Q):].rstrip("?").strip()
    objects = [o for o in scenes[rel]["objects"] if o["category"] == shape]
    if len(objects) != 1:
        return {"colour_probe": None}  # two objects of the shape: the question names no one region
    obj = objects[0]
    boxes = torch.tensor(data.boxes[rel].boxes[: cfg.image.max_regions], dtype=torch.float32)
    iou = box_iou(torch.tensor([obj["box"]], dtype=torch.float32), boxes)[0]
    region = int(iou.argmax())
    pieces = tok(shape, add_special_tokens=False)["input_ids"]
    start = max(j for j in range(len(ids) - len(pieces) + 1) if ids[j: j + len(pieces)] == pieces)
    # text positions: [CLS] question ...; regions: the whole image, then the boxes
    weight = seen["align"][r, 1 + start: 1 + start + len(pieces), 1 + region].mean().item()
    colour = names["attribute"][int(seen["colour"][r, 1 + region].argmax())]
    cls = names["class"][1 + int(seen["class"][r, 1 + region, 1:].argmax())]
    return {"colour_probe": {"iou": float(iou.max()), "alignment": weight, "size": obj["size"],
                             "detector_colour_right": colour == obj["colour"], "detector_class_right": cls == shape}}


def interval(values: np.ndarray, images: np.ndarray) -> dict:
    s = clustered_bootstrap(values * 100, images)
    return {"n": s["n"], "mean": s["mean"], "ci95": s["ci95"]}


def summarise(runs: dict[str, list[dict]]) -> dict:
    out: dict = {"per_type": {}, "colour_split": {}, "paired": {}}
    splits = {
        "aligned (weight >= 0.5)": lambda p: p["alignment"] >= 0.5,
        "not aligned (< 0.5)": lambda p: p["alignment"] < 0.5,
        "detector colour right": lambda p: p["detector_colour_right"],
        "detector class right": lambda p: p["detector_class_right"],
        "detector class wrong": lambda p: not p["detector_class_right"],
        "all": lambda p: True,
    }
    for name, rows in runs.items():
        images = np.array([r["image"] for r in rows])
        types = sorted({r["type"] for r in rows})
        table = {}
        for t in ["all", *types]:
            keep = np.array([t == "all" or r["type"] == t for r in rows])
            on = np.array([r["score"] for r in rows])[keep]
            off = np.array([r["score_off"] for r in rows])[keep]
            table[t] = {"on": interval(on, images[keep]), "off": interval(off, images[keep])}
        out["per_type"][name] = table
        probed = [r for r in rows if r.get("colour_probe")]
        out["colour_split"][name] = {
            s: interval(np.array([r["score"] for r in probed if f(r["colour_probe"])]),
                        np.array([r["image"] for r in probed if f(r["colour_probe"])])) for s, f in splits.items()}
        out["colour_split"][name]["share not aligned"] = float(np.mean([r["colour_probe"]["alignment"] < 0.5
                                                                       for r in probed]))
    names = list(runs)
    for later in range(1, len(names)):
        for earlier in range(later):
            out["paired"][f"{names[later]} - {names[earlier]}"] = paired(runs[names[earlier]], runs[names[later]],
                                                                        splits)
    return out


def paired(a: list[dict], b: list[dict], splits: dict) -> dict:
    """b - a in points, paired by question, by image-clustered bootstrap."""
    if [r["question_id"] for r in a] != [r["question_id"] for r in b]:
        raise ValueError("the runs were scored on different questions")
    images = np.array([r["image"] for r in a])
    out = {}
    for s in ("aligned (weight >= 0.5)", "not aligned (< 0.5)"):
        # split by the later run's alignment (the two differ only by their word embeddings' drift)
        keep = np.array([bool(rb.get("colour_probe")) and splits[s](rb["colour_probe"]) for rb in b])
        out[f"colour, {s}"] = paired_test(np.array([r["score"] for r in a])[keep] * 100,
                                          np.array([r["score"] for r in b])[keep] * 100, images[keep])
    types = sorted({r["type"] for r in a})
    for t in ["all", *types]:
        keep = np.array([t == "all" or r["type"] == t for r in a])
        for key in ("score", "score_off"):
            out[f"{t}, alignment {'off' if key == 'score_off' else 'on'}"] = paired_test(
                np.array([r[key] for r in a])[keep] * 100, np.array([r[key] for r in b])[keep] * 100, images[keep])
    return out


def fmt(s: dict) -> str:
    if s.get("mean") is None:
        return "-"
    return f"{s['mean']:.2f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}] (n {s['n']})"


def report(summary: dict) -> str:
    names = list(summary["per_type"])
    lines = ["# VQA answers through the word-region alignment", "",
             "Colour questions with one object of the named shape, split by the shape word's alignment weight on "
             "its object's region and by the detector's names for it (accuracy, 95% interval over images):", "",
             "| split | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for s in summary["colour_split"][names[0]]:
        if s == "share not aligned":
            continue
        lines.append(f"| {s} | " + " | ".join(fmt(summary["colour_split"][n][s]) for n in names) + " |")
    lines.append("| share not aligned | " + " | ".join(f"{summary['colour_split'][n]['share not aligned']:.3f}"
                                                       for n in names) + " |")
    lines += ["", "Every val question by type, alignment as trained / off (no word aligns; region tokens keep their "
              "names):", "", "| question type | " + " | ".join(f"{n}: on | {n}: off" for n in names) + " |",
              "|---|" + "---|---|" * len(names)]
    for t in summary["per_type"][names[0]]:
        cells = []
        for n in names:
            cells += [fmt(summary["per_type"][n][t]["on"]), fmt(summary["per_type"][n][t]["off"])]
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    for pair, table in summary["paired"].items():
        lines += ["", f"Paired differences, {pair} (points, 95% interval over images, by question):", ""]
        for k, p in table.items():
            ci = p.get("ci95") or [float("nan")] * 2
            lines.append(f"- {k}: {p['mean_diff']:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}] (n {p['n']})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="append", required=True, help="NAME=finetuned VQA run dir (holding model/)")
    ap.add_argument("--config", default="launch/configs/vqa_demo.yaml")
    ap.add_argument("--scenes", default="data/demo/raw/scenes.jsonl", help="the demo corpus's scene annotations")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    cfg = load_config(VQAConfig, args.config)
    scenes = read_scenes(Path(args.scenes))
    runs = {}
    for spec in args.run:
        name, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--run {spec!r}: expected NAME=DIR")
        runs[name] = probe_run(Path(path), cfg, scenes, args.batch_size)
    summary = summarise(runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps({"runs": args.run, "summary": summary}, indent=1))
    (out / "probe.md").write_text(report(summary))
    print(report(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
