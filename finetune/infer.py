"""One example through a finetuned model, from Python or the command line: an image plus a question,
an expression, or a question with choices in; the answer, box or choice with scores out. Without boxes
the detector pass (`shards.detect`, a torchvision Faster R-CNN from `--detector-config`) proposes them.

    python -m finetune.infer --model runs/vqa/demo/model --image img.jpg --question "what color is the star?"
    python -m finetune.infer --model runs/refcoco/demo/model --image img.jpg --expression "large red circle"
    python -m finetune.infer --model runs/vcr/qa/model --image img.jpg --objects circle,square \\
        --question "what color is [0] ?" --choice "[0] is red ." --choice "[0] is blue ." ...
    # boxes: --boxes boxes.json ([[x1, y1, x2, y2], ...] pixels) or --box x1,y1,x2,y2 (repeatable)

    from finetune.infer import Predictor
    Predictor("runs/vqa/demo/model").answer("img.jpg", "what color is the star?", boxes=[[10, 10, 60, 60]])

In VCR questions and choices, `[i]` (or `[i,j]`) refers to object i of `--objects`, as VCR's token lists do.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from model.config import load_config
from model.export import load_image_preprocessing
from shards.detect import DetectorConfig, RegionDetector, pil_to_tensor
from shards.images import ImageConfig, collate_visual, load_image
from shards.tokenizer import load_tokenizer
from train.engine import to_device

from .common import load_task_model, pad_lists
from .refcoco import RefTask
from .vcr import VCRTask, piece, words_of
from .vqa import VQATask

TASKS = {"vqa": VQATask, "refcoco": RefTask, "vcr": VCRTask}


def _rebuild(vl_bert, info: dict):
    task = info.get("task")
    if task not in TASKS:
        raise ValueError(f"task.json names an unknown task '{task}'")
    return TASKS[task].rebuild(vl_bert, info)


def vcr_tokens(text: str) -> list:
    """'what is [0,1] doing ?' -> ['what', 'is', [0, 1], 'doing', '?'] (VCR's token lists)."""
    out: list = []
    for tok in text.split():
        m = re.fullmatch(r"\[(\d+(?:\s*,\s*\d+)*)\]", tok)
        out.append([int(x) for x in m.group(1).split(",")] if m else tok)
    return out


class Predictor:
    def __init__(self, model_dir: str | Path, detector_config: str | None = None, device: str | None = None):
        self.model, self.info = load_task_model(model_dir, _rebuild)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device)
        self.tokenizer = load_tokenizer(str(model_dir))
        # the sizes the model was trained at, as its config.json records them (task.json's for older directories)
        recorded = load_image_preprocessing(model_dir) or {}
        sizes = {k: v for k, v in recorded.items() if k in ("short_side", "long_side")}
        self.image_cfg = ImageConfig(**{**self.info["image"], **sizes, "root": ""})
        self.detector_config = detector_config
        self._detector = None

    @property
    def task(self) -> str:
        return self.info["task"]

    def detect(self, image: str | Path) -> np.ndarray:
        if self._detector is None:
            cfg = load_config(DetectorConfig, self.detector_config)
            if cfg.weights is None:
                print("warning: the detector has no weights file (detector config's `weights`): its boxes are "
                      "random; pass --boxes or a trained detector", file=sys.stderr)
            self._detector = RegionDetector(cfg)
        return self._detector([pil_to_tensor(Image.open(image))])[0]["boxes"]

    def _visual(self, image, boxes) -> dict:
        boxes = self.detect(image) if boxes is None else np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
        boxes = boxes[: self.image_cfg.max_regions]
        return collate_visual([load_image(Path(image), boxes, self.image_cfg, str(image))]), boxes

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def answer(self, image, question: str, boxes=None, top_k: int = 5) -> dict:
        """VQA: the top answers with their sigmoid scores."""
        self._expect("vqa")
        batch, _ = self._visual(image, boxes)
        batch["a_ids"], batch["a_mask"] = pad_lists([self._ids(question)[: self.info["max_question_tokens"]]])
        batch["b_ids"], batch["b_mask"] = pad_lists([[self.tokenizer.mask_token_id]])
        scores = self.model.logits(self._to(batch))[0].float().sigmoid().cpu()
        top = scores.topk(min(top_k, len(scores)))
        answers = self.info["answers"]
        return {"answer": answers[int(top.indices[0])],
                "top": [{"answer": answers[int(i)], "score": round(float(s), 4)} for s, i in zip(*top, strict=True)]}

    @torch.no_grad()
    def refer(self, image, expression: str, boxes=None) -> dict:
        """RefCOCO+: the box the expression refers to, with every candidate's score."""
        self._expect("refcoco")
        batch, boxes = self._visual(image, boxes)
        batch["a_ids"], batch["a_mask"] = pad_lists([self._ids(expression)[: self.info["max_query_tokens"]]])
        scores = self.model.logits(self._to(batch))[0].float().cpu()
        k = int(scores.argmax())
        return {"box": [round(float(v), 2) for v in boxes[k]], "index": k, "score": round(float(scores[k]), 4),
                "scores": [round(float(s), 4) for s in scores]}

    @torch.no_grad()
    def choose(self, image, question: str, choices: list[str], objects: list[str], boxes=None) -> dict:
        """VCR: the probability of each of the 4 choices (Q->A; for QA->R pass question + answer as the
        question and the rationales as choices)."""

        self._expect("vcr")
        if len(choices) != 4:
            raise ValueError(f"VCR takes 4 choices, got {len(choices)}")
        batch, boxes = self._visual(image, boxes)
        if len(objects) != len(boxes):
            raise ValueError(f"{len(objects)} object names for {len(boxes)} boxes")
        m = self.image_cfg.max_regions
        a = piece(self.tokenizer, words_of(vcr_tokens(question), objects), m)
        bs = [piece(self.tokenizer, words_of(vcr_tokens(c), objects), m) for c in choices]
        batch["a_ids"], batch["a_mask"] = pad_lists([a[0]] * 4)
        batch["a_region"], _ = pad_lists([a[1]] * 4, pad=-1)
        batch["b_ids"], batch["b_mask"] = pad_lists([b[0] for b in bs])
        batch["b_region"], _ = pad_lists([b[1] for b in bs], pad=-1)
        scores, _ = self.model.run(self._to(batch))
        sigmoid = self.info["settings"]["candidate_loss"] == "sigmoid"
        probs = (scores.sigmoid() if sigmoid else scores.softmax(1))[0].float().cpu()
        return {"choice": int(probs.argmax()), "probs": [round(float(p), 4) for p in probs]}

    def _expect(self, task: str) -> None:
        if self.task != task:
            raise ValueError(f"this is a {self.task} model; {task} input was given")

    def _to(self, batch: dict) -> dict:
        return to_device(batch, self.device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="One example through a finetuned VQA / RefCOCO+ / VCR model",
                                epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a finetuned model directory (<run_dir>/model)")
    p.add_argument("--image", required=True)
    p.add_argument("--question")
    p.add_argument("--expression")
    p.add_argument("--choice", action="append", default=[], help="VCR: one of the 4 choices (repeat)")
    p.add_argument("--objects", help="VCR: comma-separated object names, one per box")
    p.add_argument("--boxes", help="JSON file with [[x1, y1, x2, y2], ...] in pixels")
    p.add_argument("--box", action="append", default=[], help="x1,y1,x2,y2 in pixels (repeat)")
    p.add_argument("--detector-config", help="DetectorConfig YAML for the detector pass when no boxes are given")
    args = p.parse_args(argv)
    boxes = None
    if args.boxes:
        boxes = json.loads(Path(args.boxes).read_text())
    elif args.box:
        boxes = [[float(v) for v in b.split(",")] for b in args.box]
    pred = Predictor(args.model, args.detector_config)
    if pred.task == "vqa":
        if not args.question:
            p.error("a VQA model needs --question")
        out = pred.answer(args.image, args.question, boxes)
    elif pred.task == "refcoco":
        if not args.expression:
            p.error("a RefCOCO+ model needs --expression")
        out = pred.refer(args.image, args.expression, boxes)
    else:
        if not args.question or len(args.choice) != 4 or not args.objects:
            p.error("a VCR model needs --question, 4 x --choice and --objects")
        out = pred.choose(args.image, args.question, args.choice, args.objects.split(","), boxes)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
