"""Where a VCR model loses the position of the objects a "where is [a] compared to [b] ?" question names: linear
probes on each layer's hidden states, fitted on train questions and scored on val questions.

The demo's VCR where question asks whether [a] is right of / left of / above / below [b] (centres compared on the
axis where they differ most). A word that refers to an object takes that object's visual feature, FC(appearance ++
sine/cosine box), as its visual term, so the box is in the input of both referring words. Three probes per layer
(0 = the embedding output, 1..L = after each layer), each a closed-form ridge regression or a softmax regression on
features standardised with the train set's statistics:
- `word x/y R2`: the centre of [a] from the hidden state of its first word-piece in the question (R2 on val);
- `region x/y R2`: the same from [a]'s region token;
- `relation acc`: the answer (4 classes) from the difference of [a]'s and [b]'s word states, on val (chance 0.25;
  the boxes' own centres give 0.95-1.0).
Before the layers, the same probes on what a referring word's visual term is built of: `geometry` (the sine/cosine
embedding of the box, the ceiling for any layer), `visual feature` (FC(appearance ++ geometry)) and `visual term`
(its projection and LayerNorm, which is added to the word embedding).

    python docs/table4_demo/vcr_where/position_probe.py --out docs/table4_demo/vcr_where/probe.json \
        step0=runs/demo_step0/export pretrained=runs/demo/export finetuned=runs/vcr_full/qa/model

A finetuned run's `model/` (finetune_main's export of the whole task model) is read through the task's rebuild.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from docs.table4_demo.lowdata_s62.vcr_reader import kind_of  # noqa: E402
from finetune.common import build_pretrained, encode, load_task_model  # noqa: E402
from finetune.vcr import VCRConfig, VCRSet, VCRTask, read_vcr_jsonl  # noqa: E402
from model.config import load_config  # noqa: E402
from shards.demo_tasks import RELATIONS  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402

LAMBDAS = [1.0, 10.0, 100.0, 1000.0, 10000.0]
DECAYS = [1e-4, 1e-3, 1e-2, 1e-1]


def relation_of(answer: list) -> int:
    words = " ".join(w for w in answer if isinstance(w, str))
    return next(k for k, r in enumerate(RELATIONS) if f" {r} " in f" {words} ")


def load_vl_bert(spec: str, config: str):
    """The VL-BERT of an export directory, or of a finetuned run's model/ directory."""
    if (Path(spec) / "task.json").exists():
        return load_task_model(spec, VCRTask.rebuild)[0].vl_bert
    cfg = load_config(VCRConfig, config, [f"backbone.init={spec}"])
    model, _, _ = build_pretrained(cfg.backbone)
    return model.vl_bert


def features(vl_bert, data: VCRSet, records: dict, limit: int) -> dict[str, np.ndarray]:
    """Per where question: every layer's word states of [a] and [b], [a]'s region states, [a]'s centre, the answer."""
    where = [i for i, item in enumerate(data.items) if kind_of(records[item["annot_id"]]) == "where"][:limit]
    words_a, words_b, regions_a, centres, labels, geometry = [], [], [], [], [], []
    visual_ab, term_ab = [], []
    with torch.no_grad():
        for start in range(0, len(where), 16):
            idx = where[start:start + 16]
            batch = data.batch(idx)
            # the right answer's sequence only: the question's states differ across candidates only through B
            keep = torch.tensor([4 * r + data.items[i]["label"] for r, i in enumerate(idx)])
            single = {k: batch[k] for k in ("images", "image_sizes", "boxes", "box_mask")}
            single.update({k: batch[k][keep] for k in ("a_ids", "a_mask", "a_region", "b_ids", "b_mask", "b_region")})
            appearance, boxes_norm, _ = vl_bert.region_features(
                images=single["images"], image_sizes=single["image_sizes"], boxes=single["boxes"],
                box_mask=single["box_mask"])
            out = encode(vl_bert, single, visual_input=(appearance, boxes_norm), output_hidden_states=True)
            states, text_len = out.hidden_states, out.text_length
            geo = vl_bert.embeddings.geometry(boxes_norm[:, 1:]).float()
            real = torch.cat([single["box_mask"].new_ones(len(idx), 1), single["box_mask"]], 1)
            visual = vl_bert.embeddings.visual_features(appearance, boxes_norm, real)[:, 1:].float()
            term = vl_bert.embeddings.text_visual_term(visual)
            for row, i in enumerate(idx):
                r = records[data.items[i]["annot_id"]]
                a, b = [t[0] for t in r["question"] if isinstance(t, list)][:2]
                region = single["a_region"][row].tolist()
                pa, pb = 1 + region.index(a), 1 + region.index(b)  # after [CLS]
                words_a.append(torch.stack([h[row, pa] for h in states]).float().numpy())
                words_b.append(torch.stack([h[row, pb] for h in states]).float().numpy())
                regions_a.append(torch.stack([h[row, text_len + 1 + a] for h in states]).float().numpy())
                box = boxes_norm[row, 1 + a].float()
                centres.append(((box[:2] + box[2:]) / 2).numpy())
                labels.append(relation_of(r["answer_choices"][r["answer_label"]]))
                geometry.append(np.stack([geo[row, a].numpy(), geo[row, b].numpy()]))
                visual_ab.append(np.stack([visual[row, a].numpy(), visual[row, b].numpy()]))
                term_ab.append(np.stack([term[row, a].numpy(), term[row, b].numpy()]))
    return {"word_a": np.stack(words_a), "word_b": np.stack(words_b), "region_a": np.stack(regions_a),
            "centre": np.stack(centres), "label": np.asarray(labels), "geometry": np.stack(geometry),
            "visual feature": np.stack(visual_ab), "visual term": np.stack(term_ab)}


def standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, std = train.mean(0), train.std(0) + 1e-6
    return (train - mean) / std, (test - mean) / std


def folds(n: int, k: int = 5) -> list[np.ndarray]:
    return np.array_split(np.random.default_rng(0).permutation(n), k)


def ridge_fit(x, y, lam):
    x = np.c_[x, np.ones(len(x))]
    return np.linalg.solve(x.T @ x + lam * np.eye(x.shape[1]), x.T @ y)


def ridge_predict(w, x):
    return np.c_[x, np.ones(len(x))] @ w


def r2(pred, y) -> list[float]:
    return [float(1 - ((pred[:, k] - y[:, k]) ** 2).sum() / ((y[:, k] - y[:, k].mean()) ** 2).sum())
            for k in range(y.shape[1])]


def ridge_r2(xtr, ytr, xte, yte) -> list[float]:
    """Val R2 of a ridge regression whose penalty is chosen by 5-fold cross-validation on train."""
    xtr, xte = standardise(xtr, xte)

    def cv(lam):
        err = 0.0
        for held in folds(len(xtr)):
            fit = np.setdiff1d(np.arange(len(xtr)), held)
            err += ((ridge_predict(ridge_fit(xtr[fit], ytr[fit], lam), xtr[held]) - ytr[held]) ** 2).sum()
        return err

    lam = min(LAMBDAS, key=cv)
    return r2(ridge_predict(ridge_fit(xtr, ytr, lam), xte), yte)


def softmax_fit(x, y, weight_decay):
    x, y = torch.tensor(x, dtype=torch.float64), torch.tensor(y)
    lin = torch.nn.Linear(x.shape[1], 4).double()
    torch.nn.init.zeros_(lin.weight)
    torch.nn.init.zeros_(lin.bias)
    opt = torch.optim.LBFGS(lin.parameters(), max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(lin(x), y) + weight_decay * lin.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return lin


def softmax_predict(lin, x) -> np.ndarray:
    with torch.no_grad():
        return lin(torch.tensor(x, dtype=torch.float64)).argmax(1).numpy()


def softmax_accuracy(xtr, ytr, xte, yte) -> float:
    """Val accuracy of a softmax regression whose L2 penalty is chosen by 5-fold cross-validation on train."""
    xtr, xte = standardise(xtr, xte)

    def cv(decay):
        hits = 0
        for held in folds(len(xtr)):
            fit = np.setdiff1d(np.arange(len(xtr)), held)
            hits += (softmax_predict(softmax_fit(xtr[fit], ytr[fit], decay), xtr[held]) == ytr[held]).sum()
        return -hits

    decay = min(DECAYS, key=cv)
    return float((softmax_predict(softmax_fit(xtr, ytr, decay), xte) == yte).mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="NAME=export or finetuned run's model/ directory")
    ap.add_argument("--config", default="launch/configs/vcr_demo.yaml")
    ap.add_argument("--train-questions", type=int, default=1000)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    cfg = load_config(VCRConfig, args.config, [])
    report = {}
    for spec in args.models:
        name, path = spec.split("=", 1)
        vl_bert = load_vl_bert(path, args.config).eval()
        tok = load_tokenizer(path)
        sets = {}
        for split, limit in (("train", args.train_questions), ("val", 10 ** 9)):
            data = VCRSet(cfg, split, tok)
            records = {r["annot_id"]: r for r in read_vcr_jsonl(Path(cfg.data.root) / f"{split}.jsonl", True)}
            sets[split] = features(vl_bert, data, records, limit)
        tr, te = sets["train"], sets["val"]
        rows = []
        for stage in ("geometry", "visual feature", "visual term"):  # what a referring word's input is built of
            rows.append({"layer": stage,
                         "word x/y R2": ridge_r2(tr[stage][:, 0], tr["centre"], te[stage][:, 0], te["centre"]),
                         "relation acc": softmax_accuracy(tr[stage][:, 0] - tr[stage][:, 1], tr["label"],
                                                          te[stage][:, 0] - te[stage][:, 1], te["label"])})
        for layer in range(tr["word_a"].shape[1]):
            rows.append({
                "layer": layer,
                "word x/y R2": ridge_r2(tr["word_a"][:, layer], tr["centre"], te["word_a"][:, layer], te["centre"]),
                "region x/y R2": ridge_r2(tr["region_a"][:, layer], tr["centre"], te["region_a"][:, layer],
                                          te["centre"]),
                "relation acc": softmax_accuracy(tr["word_a"][:, layer] - tr["word_b"][:, layer], tr["label"],
                                                 te["word_a"][:, layer] - te["word_b"][:, layer], te["label"])})
        report[name] = {"model": path, "train_questions": len(tr["label"]), "val_questions": len(te["label"]),
                        "layers": [{k: (np.round(v, 3).tolist() if isinstance(v, list) else
                                        round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}
                                   for r in rows]}
        print(json.dumps({name: report[name]}, indent=1), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
