"""VQA v2 finetuning (VL-BERT section 4.2.2, Figure 2b, appendix A.2).

    python -m finetune.vqa --config launch/configs/vqa_demo.yaml [--resume | --eval-only] [key=value ...]
    python -m finetune.vqa score --results results.json --questions Q.json --annotations A.json [--legacy]
    bash launch/finetune_vqa.sh                         # the demo, end to end

Reads the official files as distributed: `v2_OpenEnded_mscoco_<split>_questions.json` and
`v2_mscoco_<split>_annotations.json` (none for the test splits), COCO images from a folder
(`data.images`, a pattern of image_id and split: test-dev2015 images live in test2015) and the regions
from a box file (`python -m shards.detect` writes one).

Input `[CLS] question [SEP] [MASK] [SEP] [IMG]... [END]`; a classifier on the [MASK] output (the
pretrained MLM head's transform, then a new linear layer over the answer vocabulary); soft targets are
each answer's official VQA accuracy; binary cross-entropy over answers. The vocabulary holds every
normalised `multiple_choice_answer` of at least `answer_min_count` training questions (the paper's
3,129 at 9) and is saved with the model.

Outputs under engine.run_dir: `results_<split>.json` (`[{question_id, answer}]`, the format the
evaluation server takes for test-dev/test-std), `metrics_<split>.json` (official accuracy overall, per
answer type and per question type, next to a question-type prior baseline), TensorBoard, checkpoints,
`model/` (for `python -m finetune.infer`).
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from model.config import required
from model.heads import BertPredictionHeadTransform
from model.vl_bert import word_table
from shards.skips import SkipLog
from train.engine import entry_point, to_device

from .common import (
    FinetuneConfig,
    TaskSpec,
    box_file_images,
    copy_transform,
    encode,
    eval_batches,
    finetune_main,
    pad_lists,
    read_box_files,
)
from .vqa_score import (
    VQAQuestion,
    accuracy_table,
    normalise_answer,
    read_vqa,
    soft_score,
    vqa_accuracy,
)
from .vqa_score import main as score_main


def build_answer_vocab(questions: list[VQAQuestion], min_count: int) -> list[str]:
    """Normalised multiple-choice answers given for at least min_count questions, most frequent first."""
    counts = Counter(normalise_answer(q.multiple_choice_answer) for q in questions if q.multiple_choice_answer)
    return [a for a, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if c >= min_count]


def question_type_prior(questions: list[VQAQuestion]) -> dict[str, str]:
    """The most frequent answer per question type: the language-prior baseline a model must beat."""
    by_type: dict[str, Counter] = defaultdict(Counter)
    for q in questions:
        by_type[q.question_type][normalise_answer(q.multiple_choice_answer)] += 1
    return {t: c.most_common(1)[0][0] for t, c in by_type.items()}


# --- data -------------------------------------------------------------------------------------------------

@dataclass
class VQADataConfig:
    root: str = required()
    questions: str = "v2_OpenEnded_mscoco_{split}_questions.json"  # relative to root
    annotations: str = "v2_mscoco_{split}_annotations.json"
    # relative to image.root; {image_dir} is the split's image folder (test-dev2015 -> test2015)
    images: str = "images/{image_id:06d}.jpg"
    boxes: str = required()  # box file keyed by the image path above
    train_splits: list = field(default_factory=lambda: ["train2014"])
    answer_min_count: int = 9
    max_question_tokens: int = 32


@dataclass
class VQAConfig(FinetuneConfig):
    data: VQADataConfig = field(default_factory=VQADataConfig)
    classifier_dropout: float = 0.1
    # the answer classifier's start: "random" (the official code's: a new linear layer on the MLM transform) or
    # "readout" (each answer's row the mean of its word-pieces' MLM decoder rows, its bias theirs: the head
    # starts as the pretrained MLM head scoring the answer at [MASK]; docs/FINETUNE.md, Table 4)
    classifier_init: str = "random"


def split_files(cfg: VQADataConfig, split: str) -> tuple[Path, Path | None]:
    q = Path(cfg.root) / cfg.questions.format(split=split)
    a = Path(cfg.root) / cfg.annotations.format(split=split)
    if not q.exists():
        raise FileNotFoundError(f"VQA split '{split}': questions file {q} not found")
    if not a.exists():
        if split.startswith("test"):
            return q, None  # the test splits are distributed without annotations
        raise FileNotFoundError(f"VQA split '{split}': annotations file {a} not found")
    return q, a


class VQASet:
    def __init__(self, cfg: VQAConfig, splits: list[str], tokenizer, mask_id: int, answers: list[str] | None = None):
        """answers: the classifier's vocabulary; None = build it from these (training) splits, read once."""

        self.skips = SkipLog("examples")
        self.cfg, self.mask_id, self.tokenizer = cfg, mask_id, tokenizer
        boxes = read_box_files(cfg.data.boxes, self.skips)
        self.items: list[tuple[VQAQuestion, str]] = []
        self.has_answers = True
        annotated = []
        for split in splits:
            q_path, a_path = split_files(cfg.data, split)
            self.has_answers &= a_path is not None
            image_dir = split.replace("test-dev", "test")
            questions = read_vqa(q_path, a_path, self.skips)
            annotated += questions if a_path is not None else []
            for q in questions:
                rel = cfg.data.images.format(image_id=q.image_id, split=split, image_dir=image_dir)
                if rel not in boxes:
                    self.skips.skip("image without boxes", f"{q_path}: question_id {q.question_id} ({rel})")
                    continue
                self.items.append((q, rel))
        if not self.items:
            raise ValueError(f"VQA {splits}: no usable questions ({dict(self.skips.reasons)})")
        self.boxes = boxes
        if answers is None:
            if not self.has_answers:
                raise FileNotFoundError(f"VQA training splits {splits}: every one needs an annotations file")
            answers = build_answer_vocab(annotated, cfg.data.answer_min_count)
            if not answers:
                raise ValueError(f"no answer is given {cfg.data.answer_min_count}+ times in {splits}: "
                                 "lower data.answer_min_count")
        self.answers = answers
        self.index = {a: i for i, a in enumerate(answers)}
        enc = tokenizer([q.question for q, _ in self.items], add_special_tokens=False, truncation=True,
                        max_length=cfg.data.max_question_tokens)
        self.question_ids = enc["input_ids"]
        self.targets = []  # sparse soft targets: [(answer index, score)]
        outside = 0
        for q, _ in self.items:
            counts = Counter(normalise_answer(a) for a in q.answers)
            target = [(self.index[a], soft_score(c, len(q.answers))) for a, c in counts.items() if a in self.index]
            outside += bool(q.answers) and not target
            self.targets.append([(i, s) for i, s in target if s > 0])
        self.outside_vocabulary = outside  # questions none of whose answers the classifier can give

    def __len__(self) -> int:
        return len(self.items)

    def batch(self, indices: list[int], pixels: bool = True) -> dict:
        out = box_file_images(self.cfg.image, self.boxes, [self.items[i][1] for i in indices],
                              [f"question_id {self.items[i][0].question_id}" for i in indices], pixels)
        out["a_ids"], out["a_mask"] = pad_lists([self.question_ids[i] for i in indices])
        out["b_ids"], out["b_mask"] = pad_lists([[self.mask_id] for _ in indices])
        target = torch.zeros(len(indices), len(self.answers))
        for row, i in enumerate(indices):
            for a, s in self.targets[i]:
                target[row, a] = s
        out["target"] = target
        return out


# --- the model ----------------------------------------------------------------------------------------------

class VQAModel(nn.Module):
    def __init__(self, vl_bert, num_answers: int, dropout: float):
        super().__init__()
        cfg = vl_bert.cfg
        self.vl_bert = vl_bert
        self.transform = BertPredictionHeadTransform(cfg)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(cfg.hidden_size, num_answers)
        nn.init.normal_(self.classifier.weight, std=cfg.initializer_range)
        nn.init.zeros_(self.classifier.bias)

    @torch.no_grad()
    def init_classifier_as_readout(self, mlm_head, answer_pieces: list[list[int]]) -> None:
        """Row a = the mean over answer a's word-pieces of the MLM decoder's rows, bias a = the mean of their MLM
        biases. With the transform copied from the MLM head, a one-piece answer's logit is then exactly the MLM
        head's logit for that word at [MASK]."""
        ids, weights = word_table(answer_pieces)
        decoder = mlm_head.decoder.weight
        self.classifier.weight.copy_((decoder[ids] * weights.unsqueeze(-1).to(decoder.dtype)).sum(1))
        self.classifier.bias.copy_((mlm_head.bias[ids] * weights.to(decoder.dtype)).sum(1))

    def logits(self, batch: dict) -> torch.Tensor:
        out = encode(self.vl_bert, batch)
        mask_pos = batch["a_mask"].sum(1) + 2  # [CLS] question [SEP] -> [MASK]
        hidden = out.last_hidden_state[torch.arange(mask_pos.shape[0], device=mask_pos.device), mask_pos]
        return self.classifier(self.dropout(self.transform(hidden)))

    def forward(self, batch: dict):
        logits = self.logits(batch)
        target = batch["target"]
        # the official code's scale: the mean over answers times their number = a sum over answers
        loss = F.binary_cross_entropy_with_logits(logits, target) * target.shape[1]
        score = target.gather(1, logits.argmax(1, keepdim=True)).mean()
        return loss, {"loss/total": loss.detach(), "acc/soft_vqa": score.detach()}


# --- the task for finetune_main -----------------------------------------------------------------------------

class VQATask(TaskSpec, name="vqa", config=VQAConfig):
    @staticmethod
    def dataset(cfg: VQAConfig, tokenizer, info: dict | None, train: bool):
        if train:
            data = VQASet(cfg, list(cfg.data.train_splits), tokenizer, tokenizer.mask_token_id)
            data.prior = question_type_prior([q for q, _ in data.items])
        else:
            data = VQASet(cfg, [cfg.eval_split], tokenizer, tokenizer.mask_token_id, info["answers"])
            data.prior = info.get("prior", {})
        return data

    @staticmethod
    def build_module(pretrained, cfg: VQAConfig, train: VQASet):
        model = VQAModel(pretrained.vl_bert, len(train.answers), cfg.classifier_dropout)
        copy_transform(model.transform, pretrained.mlm_head.transform)  # as the official code initialises it
        if cfg.classifier_init == "readout":
            model.init_classifier_as_readout(pretrained.mlm_head, [
                train.tokenizer(a, add_special_tokens=False)["input_ids"] or [train.tokenizer.unk_token_id]
                for a in train.answers])
        elif cfg.classifier_init != "random":
            raise ValueError(f"classifier_init: '{cfg.classifier_init}' is not random or readout")
        return model, {"task": "vqa", "answers": train.answers, "prior": train.prior,
                       "classifier_dropout": cfg.classifier_dropout, "image": vars(cfg.image),
                       "max_question_tokens": cfg.data.max_question_tokens}

    @staticmethod
    def rebuild(vl_bert, info: dict):
        return VQAModel(vl_bert, len(info["answers"]), info["classifier_dropout"])

    @staticmethod
    def evaluate(model: VQAModel, data: VQASet, cfg: VQAConfig, run_dir: Path, device) -> dict:
        results = []
        for idx, batch in eval_batches(data, cfg.eval_batch_size, cfg.max_eval_examples, "vqa eval"):
            logits = model.logits(to_device(batch, device)).float().cpu()
            for i, best in zip(idx, logits.argmax(1).tolist(), strict=True):
                results.append({"question_id": data.items[i][0].question_id, "answer": data.answers[best]})
        (run_dir / f"results_{cfg.eval_split}.json").write_text(json.dumps(results))
        metrics = {"split": cfg.eval_split, "questions": len(results), "answers_in_vocabulary": len(data.answers)}
        if not data.has_answers:
            return metrics
        prior = data.prior
        questions = [data.items[i][0] for i in range(len(results))]
        scores = [vqa_accuracy(r["answer"], q.answers) for r, q in zip(results, questions, strict=True)]
        baseline = [vqa_accuracy(prior.get(q.question_type, ""), q.answers) for q in questions]
        metrics.update(accuracy_table(questions, scores), prior_baseline=accuracy_table(questions, baseline),
                       outside_vocabulary=data.outside_vocabulary)
        return metrics

    @staticmethod
    def summary(metrics: dict) -> str:
        if "overall" not in metrics:
            return f"{metrics['questions']} answers written (no annotations for this split)"
        per = ", ".join(f"{k} {v:.2f}" for k, v in metrics["per_answer_type"].items())
        return (f"VQA accuracy {metrics['overall']:.2f} ({per}); question-type prior "
                f"{metrics['prior_baseline']['overall']:.2f}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["score"]:
        return score_main(argv[1:])
    return finetune_main(VQATask, argv)


if __name__ == "__main__":
    sys.exit(entry_point(main))
