"""VL-BERT pretraining entry point, one process per rank (started by `deepspeed`, see launch/pretrain.sh).

    deepspeed --num_gpus N -m pretrain.run --config launch/configs/demo.yaml [--resume] [key=value ...]

Overrides address the config's sections: `engine.steps=200`, `data.caption_batch_size=64`,
`model.hidden_size=512`, `optim.lr=1e-4`.
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torchvision.utils import draw_bounding_boxes

from diagnostics.ablation import PeriodicDiagnostic, ablate, feature_extractor, v4l_line
from diagnostics.ablation import markdown as ablation_markdown
from diagnostics.config import DiagnosticConfig, GroundingConfig
from diagnostics.grounding import GroundingEval, scalars, table
from diagnostics.plots import ablation_figures, grounding_figure
from diagnostics.report import write_report
from model.config import ConfigError, deep_merge, load_config
from model.export import PRETRAINING_ARCHITECTURE, image_preprocessing, load_pretrained, save_pretrained
from model.hf_import import load_hf_bert
from model.vl_bert import VLBertForPretraining, real_positions
from shards.caption_inputs import BOX_DISTRIBUTIONS, expand_paths
from shards.reader import StreamLoader
from shards.tokenizer import (
    bert_source_dir,
    load_tokenizer,
    name_word_pieces,
    relation_word_ids,
    resolve_bert_dir,
)
from train.engine import entry_point, every_core, to_device
from train.run import Task, Training, run

from .config import PretrainConfig, build_model_config, build_optim_config
from .detector import DetectorConfig, drift
from .masking import PretrainMasker
from .tasks import VLBertPretraining

# the detector vocabulary's groups and the model config fields their names fill
REGION_WORD_GROUPS = {"classes": "region_class_words", "attributes": "region_attribute_words",
                      "sizes": "region_size_words"}


def region_word_updates(path: str, tokenizer, groups=tuple(REGION_WORD_GROUPS)) -> dict:
    """Model config updates from a detector vocabulary file: {"classes": [names by class id], "attributes":
    [names by attribute index], "sizes": [names by size index]} -> word-piece ids per name (and
    fast_rcnn.num_attributes / num_sizes)."""
    try:
        vocab = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"region_words: {path} not found (`python -m pretrain.detector` writes it beside "
                                f"fast_rcnn.pt)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"region_words: {path} is not JSON: {e}") from None
    if not isinstance(vocab, dict) or not isinstance(vocab.get("classes"), list):
        raise ValueError(f"region_words: {path} needs a 'classes' list (and optionally 'attributes', 'sizes')")
    unknown = sorted(set(groups) - set(REGION_WORD_GROUPS))
    if unknown:
        raise ValueError(f"region_word_groups: {unknown} are not among {list(REGION_WORD_GROUPS)}")
    out: dict = {}
    for key, field_name in REGION_WORD_GROUPS.items():
        names = (vocab.get(key) or []) if key in groups else []
        if not names:
            continue
        out[field_name] = name_word_pieces(names, tokenizer, f"region_words: {path}: {key}")
    for field_name, count in (("region_attribute_words", "num_attributes"), ("region_size_words", "num_sizes")):
        if field_name in out:
            out.setdefault("fast_rcnn", {})[count] = len(out[field_name])
    return out


def name_updates(cfg: PretrainConfig, tokenizer) -> dict:
    """The model config updates the names give: the detector vocabulary's (`region_words`) and the relation names
    (`relation_names` -> model.pair_relation_words), in the pretraining tokenizer's word-pieces."""
    out = region_word_updates(cfg.region_words, tokenizer, cfg.region_word_groups) if cfg.region_words else {}
    if cfg.relation_names is not None:
        out["pair_relation_words"] = relation_word_ids(cfg.relation_names, tokenizer)
    return out


def check_stored_attributes(pattern: str, num_attributes: int) -> None:
    """`losses.mrc_attribute_targets: shards` reads each box's attribute distribution from the caption shards:
    refuse at start, naming the shard, when the first local shard's first sample has none or the wrong width
    (a streamed shard is not opened here; a sample without them stops the step instead)."""
    first = expand_paths(pattern)[0]
    if not Path(first).is_file():
        return
    with tarfile.open(first) as tar:
        sample = None
        for member in tar:
            key, _, ext = member.name.partition(".")
            if sample is not None and key != sample:  # a sample's members are written together: it had none
                break
            sample = key
            if ext == BOX_DISTRIBUTIONS["attribute_probs"]:
                width = np.load(io.BytesIO(tar.extractfile(member).read())).shape[1]
                if width != num_attributes:
                    raise ConfigError(f"losses.mrc_attribute_targets: shards, but {first}:{key} holds {width} "
                                      f"attributes per box, model.fast_rcnn.num_attributes is {num_attributes}")
                return
    member = BOX_DISTRIBUTIONS["attribute_probs"]
    raise ConfigError(f"losses.mrc_attribute_targets: shards, but {first} carries no attribute distributions "
                      f"({member}, from a box file's attribute_probs): rebuild the shards (the demo corpus: "
                      "python -m shards.demo --out data/demo --force) or set losses.mrc_attribute_targets=detector")


def count_batch(batch: dict) -> dict[str, float]:
    """samples, images, tokens (real transformer positions: words, the whole image, regions, [END]) and
    positions (the same, padding included), whose ratio the engine logs as padding_fraction."""
    counts = {"samples": 0.0, "tokens": 0.0, "images": 0.0, "positions": 0.0}
    if "caption" in batch:
        c = batch["caption"]
        b, t = c["text_mask"].shape
        counts["samples"] += b  # masked sequences: a caption's word views count once each
        counts["images"] += c["images" if "images" in c else "region_features"].shape[0]
        counts["tokens"] += real_positions(c["text_mask"], c["box_mask"])
        counts["positions"] += b * (t + c["box_mask"].shape[1] + 2)
    if "text" in batch:
        counts["samples"] += batch["text"]["input_ids"].shape[0]
        counts["tokens"] += real_positions(batch["text"]["text_mask"])
        counts["positions"] += batch["text"]["text_mask"].numel()
    return counts


def draw_batch(batch: dict) -> torch.Tensor:
    """The first caption sample as the model sees it: zeroed regions filled red, other boxes green."""

    c = batch["caption"]
    h, w = c["image_sizes"][0].tolist()
    image = c["images"][0, :, :h, :w].clone()
    valid = c["box_mask"][0]
    boxes, zeroed = c["boxes"][0][valid], c["masked_regions"][0][valid]
    if zeroed.any():
        image = draw_bounding_boxes(image, boxes[zeroed], colors="red", fill=True, width=2)
    if (~zeroed).any():
        image = draw_bounding_boxes(image, boxes[~zeroed], colors="lime", width=1)
    return image


class PretrainTask(Task):
    """Pretraining as a `train.run.Task`: VL-BERT on the 1:1 caption/text stream, then the export, the grounding
    table and detector drift."""
    description = "VL-BERT pretraining (one process per rank)"
    doc = __doc__
    config_cls = PretrainConfig
    config_help = "PretrainConfig YAML (see launch/configs/)"
    overrides_example = "engine.steps=200"

    def seed(self, cfg: PretrainConfig) -> int:
        return cfg.engine.seed

    def build(self, cfg: PretrainConfig, args, rank: int, world: int) -> Training:
        tokenizer_dir = str(resolve_bert_dir(cfg.data.tokenizer or (bert_source_dir(cfg.bert) if cfg.bert else None)))
        cfg.data.tokenizer = tokenizer_dir
        tokenizer = load_tokenizer(tokenizer_dir)
        cfg.model = deep_merge(cfg.model, name_updates(cfg, tokenizer))
        model_cfg = build_model_config(cfg)
        cfg.optim = build_optim_config(cfg)  # the Engine reads cfg.optim after build
        model = VLBertForPretraining(model_cfg)
        if cfg.mlm_head_init not in ("random", "readout"):
            raise ValueError(f"mlm_head_init: '{cfg.mlm_head_init}' is not random or readout")
        loaded = load_hf_bert(model, bert_source_dir(cfg.bert))["loaded"] if cfg.bert else []
        if cfg.mlm_head_init == "readout" and not any(k.startswith("cls.predictions.transform") for k in loaded):
            model.mlm_head.init_as_readout()
            if model_cfg.region_class_words is not None:  # the classes have names: MRC reads them out the same way
                model.masked_roi_classification.init_as_readout(
                    model.vl_bert.embeddings.name_embeddings("class").detach())
        if cfg.losses.mrc_attribute_weight > 0 and cfg.losses.mrc_attribute_targets == "shards":
            check_stored_attributes(cfg.data.caption_shards, model_cfg.fast_rcnn.num_attributes)
        masker = PretrainMasker(cfg.masking, tokenizer, cls_id=model_cfg.cls_token_id, sep_id=model_cfg.sep_token_id,
                                mask_id=model_cfg.mask_token_id, pad_id=model_cfg.pad_token_id,
                                num_classes=model_cfg.fast_rcnn.num_classes, seed=cfg.data.seed, rank=rank,
                                pixel_mean=model_cfg.fast_rcnn.pixel_mean,
                                # class 0 is the background: no caption word names it
                                region_word_ids=[name[0] for name in (model_cfg.region_class_words or [])[1:]
                                                 + (model_cfg.region_attribute_words or [])
                                                 + (model_cfg.region_size_words or [])],
                                mrc=cfg.losses.mrc_weight > 0,
                                mrc_from_batch=cfg.losses.mrc_from_step * cfg.engine.gradient_accumulation_steps)
        loader = StreamLoader(cfg.data, pin_memory=torch.cuda.is_available(), transform=masker,
                              shuffle_images=cfg.masking.shuffle_images)
        evaluators = []
        if cfg.diagnostic is not None and cfg.engine.eval_every:
            diagnostic = PeriodicDiagnostic(cfg.diagnostic, tokenizer, model_cfg.fast_rcnn.num_classes,
                                            feature_extractor(model))
            evaluators.append(lambda model, device: diagnostic(model, device))
        if cfg.grounding is not None and cfg.engine.eval_every and cfg.grounding_periodic_images:
            periodic = GroundingEval(replace(cfg.grounding, max_images=cfg.grounding_periodic_images), tokenizer,
                                     feature_extractor(model))
            evaluators.append(
                lambda model, device: scalars(periodic.summarise(periodic(model, device, progress=False))))
        evaluate = None
        if evaluators:
            def evaluate(module, device):
                out = {}
                for run_one in evaluators:
                    out.update(run_one(module.model, device))
                return out
        self.tokenizer, self.tokenizer_dir, self.model_cfg = tokenizer, tokenizer_dir, model_cfg
        return Training(VLBertPretraining(model, cfg.losses), loader,
                        cfg.data.caption_batch_size + cfg.data.text_batch_size, count_batch=count_batch,
                        evaluate=evaluate, draw_batch=draw_batch if model_cfg.region_input == "pixels" else None,
                        # the final grounding (`finish`) measures the last step on all the held-out images the
                        # periodic one reads a few of, under the same TensorBoard names: ~20 s of the quick start
                        evaluated_at_end=cfg.engine.export and cfg.grounding is not None,
                        run_info={"config": asdict(cfg), "model": asdict(model_cfg),
                                  "world_size": torch.distributed.get_world_size()})

    def finish(self, engine, last: dict, cfg: PretrainConfig, args, rank: int) -> None:
        run_dir = Path(cfg.engine.run_dir)
        if cfg.engine.export:
            export(engine, self.model_cfg, run_dir / "export", self.tokenizer_dir, cfg.data)
            if cfg.grounding is not None:
                final_grounding(engine, cfg.grounding, run_dir, self.tokenizer)
            if cfg.diagnostic is not None and cfg.final_ablation_examples != 0:
                final_ablation(engine, replace(cfg.diagnostic, max_examples=cfg.final_ablation_examples, sweep=[]),
                               run_dir, self.tokenizer)
            if cfg.detector_drift and self.model_cfg.region_input == "pixels":
                final_drift(engine, cfg.detector_drift, run_dir)
        if rank == 0:
            print(f"\nTensorBoard: tensorboard --logdir {run_dir / 'tb'}\ncheckpoints: {run_dir / 'checkpoints'}"
                  + (f"\nexported model: {run_dir / 'export'}" if cfg.engine.export else ""), flush=True)
            if last:
                print(f"last logged step {engine.step}: " + ", ".join(f"{k}={v:.4g}" for k, v in last.items()
                                                                    if k.startswith(("loss/", "acc/"))), flush=True)


def main(argv: list[str] | None = None) -> int:
    return run(PretrainTask(), argv)


def final_ablation(engine, cfg: DiagnosticConfig, run_dir: Path, tokenizer) -> None:
    """Rank 0: the cross-modal ablation (diagnostics.ablation, without the threshold sweep) on the exported model,
    to <run_dir>/ablation/ (results.json / .md, figure2.png, per-example values), eval.jsonl and TensorBoard
    (xmodal_final/*), and printed: bits per condition and all - none with its interval."""
    if torch.distributed.get_rank() == 0:
        start = time.perf_counter()
        with every_core():
            model = load_pretrained(run_dir / "export").to(engine.device).eval()
            values, r, _ = ablate(model, tokenizer, cfg, engine.device, desc="cross-modal ablation (export)")
        report = {"config": cfg.__dict__, "step": engine.step, "models": {run_dir.name: r}}
        out = run_dir / "ablation"
        out.mkdir(exist_ok=True)
        np.savez_compressed(out / "per_example.npz", **values)
        write_report(out, "results", report, ablation_markdown(report), lambda: ablation_figures(report, out))
        diffs = {(t["metric"], t["a"], t["b"]): t for t in r["paired_tests"]}
        flat = {f"xmodal_final/{group}/{cond}": s["mean"] for group in ("v4l", "l4v_kl") for cond, s in
                r.get(group, {}).items() if s["mean"] is not None}
        gap = diffs.get(("v4l", "none", "all"))
        if gap is not None and gap["mean_diff"] is not None:
            flat["xmodal_final/v4l_all_minus_none"] = gap["mean_diff"]
        engine.write_scalars({**flat, "eval/ablation_seconds": time.perf_counter() - start}, "eval.jsonl")
        ci = (gap or {}).get("ci95")
        print(f"\ncross-modal ablation on {r['examples']} held-out phrases (step {engine.step}, "
              f"{time.perf_counter() - start:.0f} s; {out / 'results.md'}): {v4l_line(r)}"
              + (f"; all - none {gap['mean_diff']:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")
                 if gap is not None and gap["mean_diff"] is not None else ""), flush=True)
    torch.distributed.barrier()


def final_grounding(engine, cfg: GroundingConfig, run_dir: Path, tokenizer) -> None:
    """Rank 0: the grounding measurements on the exported model, over the whole held-out split, to
    <run_dir>/grounding/, TensorBoard (grounding/*) and eval.jsonl, and printed as a table."""
    if torch.distributed.get_rank() == 0:

        start = time.perf_counter()
        with every_core():
            model = load_pretrained(run_dir / "export").to(engine.device).eval()
            ev = GroundingEval(cfg, tokenizer, feature_extractor(model, engine.device))
            summary = ev.summarise(ev(model, engine.device))
        out = run_dir / "grounding"
        out.mkdir(exist_ok=True)
        (out / "grounding.json").write_text(json.dumps({"config": cfg.__dict__, "step": engine.step,
                                                        "models": {"export": summary}}, indent=1))
        text = table({run_dir.name: summary})
        (out / "grounding.md").write_text(text)
        grounding_figure({run_dir.name: summary}, out / "grounding.png")
        engine.write_scalars({**scalars(summary), "eval/seconds": time.perf_counter() - start}, "eval.jsonl")
        print(f"\ngrounding on {len(ev.data)} held-out images (step {engine.step}, "
              f"{time.perf_counter() - start:.0f} s):\n\n{text}", flush=True)
    torch.distributed.barrier()


def final_drift(engine, detector_config: str, run_dir: Path) -> None:
    """Rank 0: the exported Fast R-CNN on the warm-up's held-out boxes against the warm-up's own accuracy."""
    if torch.distributed.get_rank() == 0:

        prefix = "vl_bert.fast_rcnn."
        state = {k.removeprefix(prefix): v for k, v in load_file(str(run_dir / "export" / "model.safetensors")).items()
                 if k.startswith(prefix)}
        with every_core():  # a CPU rank trains on its share of the cores; the other ranks wait at the barrier
            result = drift(state, load_config(DetectorConfig, detector_config), engine.device)
        (run_dir / "detector_drift.json").write_text(json.dumps(result, indent=1))
        after, before = result["after"], result["warm_up"] or {}
        engine.write_scalars({f"detector/{k}": after[k] for k in ("object_accuracy", "attribute_accuracy",
                                                                   "size_accuracy") if after.get(k) is not None},
                             "eval.jsonl")

        def fmt(key):
            was = before.get(key)
            return f"{after[key]:.3f}" + (f" (warm-up {was:.3f})" if was is not None else "")

        print(f"\ndetector drift on {after['regions']} held-out boxes: object accuracy {fmt('object_accuracy')}"
              + (f", attribute accuracy {fmt('attribute_accuracy')}" if after.get("attribute_accuracy") is not None
                 else "") + (f", size accuracy {fmt('size_accuracy')}" if after.get("size_accuracy") is not None
                             else ""), flush=True)
    torch.distributed.barrier()


def export(engine, model_cfg, out: Path, tokenizer_dir, data) -> None:
    """Consolidated fp32 weights (any ZeRO stage), with the image preprocessing and the run they came from,
    then a check that the exported directory computes what the live model computes on a batch (every rank
    joins the live forward; ZeRO-3 gathers)."""

    state = engine.consolidated_state_dict()
    if state is not None:
        save_pretrained({k.removeprefix("model."): v for k, v in state.items()}, model_cfg, out, tokenizer_dir,
                        image=image_preprocessing(data.short_side, data.long_side, data.size_divisibility, model_cfg),
                        source={"run_dir": engine.run_dir, "run_id": engine.run_id, "step": engine.step},
                        architecture=PRETRAINING_ARCHITECTURE)
    probe = next(iter(engine.loader))
    engine.engine.eval()
    with torch.no_grad():
        _, live = engine.engine(to_device(probe, engine.device))
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:

        exported = VLBertPretraining(load_pretrained(out), engine.engine.module.losses).eval()
        with torch.no_grad():
            _, again = exported(probe)
        diff = max(abs(float(live[k]) - float(again[k])) for k in live if k.startswith("loss/"))
        (out / "verify.json").write_text(json.dumps({"max_abs_loss_diff": diff, "losses": {
            k: float(v) for k, v in again.items()}}, indent=1))
        print(f"exported fp32 weights to {out} (reproduces the live model's losses to {diff:.2e})", flush=True)


if __name__ == "__main__":
    sys.exit(entry_point(main))
