"""The one train-then-evaluate flow every trainer runs: `run(task, argv)`.

A trainer is a `Task`: it names its config class and command line, builds what the engine trains (`build`:
the module, its loader and how to count and draw a batch, or None when there is nothing to train, e.g.
`--eval-only`), and says what happens after training (`finish`: the export and the evaluation, on the ranks
that do them). The flow around it is the same for pretraining, the detector warm-up, the finetune tasks and
BERT-gen: parse the command line, load the config, join the process group, seed this rank, train on the
`Engine` (DeepSpeed, checkpoints and exact resume, metrics, stop signals), finish (unless a stop signal ended
the training early), and wait for every rank.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from model.config import load_config

from .engine import Engine, add_run_arguments, init_distributed, run_overrides, seed_rank


@dataclass
class Training:
    """What a task hands the engine."""
    module: torch.nn.Module  # forward(batch) -> (loss, metrics)
    loader: object  # iterable of batches with state_dict / load_state_dict (exact resume)
    micro_batch_size: int
    count_batch: Callable | None = None  # batch -> {"samples", "tokens", "images"} (throughput)
    evaluate: Callable | None = None  # (module, device) -> scalars, every engine.eval_every steps
    # the task measures the final model itself (`finish`): the evaluator skips the last step rather than repeat it
    evaluated_at_end: bool = False
    draw_batch: Callable | None = None  # batch -> uint8 [3, H, W] for TensorBoard
    run_info: dict = field(default_factory=dict)  # written beside the run's metrics


class Task:
    """What a trainer provides; `run` calls nothing else. Subclasses set the class attributes and implement `build`
    and `finish`; `add_arguments` and `seed` have the usual defaults."""
    description: str  # the command's one-line description
    doc: str  # its epilog
    config_cls: type  # a dataclass with `engine` (EngineConfig) and `optim` (OptimConfig)
    config_help: str
    overrides_example: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Flags of this task's own beyond the shared ones (--config, --resume, ...): none by default."""

    def seed(self, cfg) -> int:
        """The config's seed (rank r seeds torch with it + r): `cfg.seed` by default."""
        return cfg.seed

    def build(self, cfg, args, rank: int, world: int) -> Training | None:
        """What to train (None: nothing, go straight to `finish`)."""
        raise NotImplementedError

    def finish(self, engine: Engine | None, last: dict, cfg, args, rank: int) -> None:
        """After training to the last step (engine None when nothing was trained; `last`, the last logged metrics):
        export and evaluate. Every rank calls it; ZeRO-3's consolidation is collective. Not called for a run a stop
        signal ended early: its checkpoint is its only output until --resume finishes it."""
        raise NotImplementedError


def command_line(task: Task) -> argparse.ArgumentParser:
    """The command line `run` parses for `task`: the shared flags, the task's own and key=value overrides (also
    what a launcher's preparation reads, so that it accepts exactly what the run accepts). Parse it with
    `parse_intermixed_args`: a launcher puts its own overrides before the user's arguments, so a flag the user
    gives first (`--eval-only`) lands between two runs of overrides, which `parse_args` refuses."""
    parser = argparse.ArgumentParser(description=task.description, epilog=task.doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, task.config_help, task.overrides_example)
    task.add_arguments(parser)
    return parser


def run(task: Task, argv: list[str] | None = None) -> int:
    args = command_line(task).parse_intermixed_args(argv)
    cfg = load_config(task.config_cls, args.config, run_overrides(args))
    rank, world = init_distributed(args.local_rank, cfg.engine.dist_timeout_s)
    seed_rank(task.seed(cfg), rank)
    training = task.build(cfg, args, rank, world)
    engine, last = None, {}
    if training is not None:
        engine = Engine(training.module, training.loader, cfg.engine, cfg.optim,
                        micro_batch_size=training.micro_batch_size, count_batch=training.count_batch,
                        draw_batch=training.draw_batch, evaluate=training.evaluate, run_info=training.run_info,
                        evaluated_at_end=training.evaluated_at_end)
        last = engine.train(resume=args.resume, overwrite=args.overwrite)
    if engine is not None and not engine.finished:
        # a preempted run's weights are not its final model: finishing would write the export, the saved model and
        # the final metrics a finished run writes, and a sweep that skips the runs whose metrics exist (or a reader
        # of them) would take the stopped run as done. The checkpoint is the only output; --resume finishes it.
        if rank == 0:
            print(f"not finished ({engine.step} of {cfg.engine.steps} steps): no final model or evaluation written; "
                  f"checkpoint under {cfg.engine.run_dir}/checkpoints, rerun the same command with --resume to "
                  "finish it", flush=True)
    else:
        task.finish(engine, last, cfg, args, rank)
    torch.distributed.barrier()
    return 0
