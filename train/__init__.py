"""The training runtime every trainer shares: the Engine (DeepSpeed ZeRO, the step loop, checkpoints and exact
resume, metrics and TensorBoard, stop signals, per-rank seeds) and the loaders that feed it. Above `model` and
`shards`; pretraining, finetuning and the diagnostics sit on it."""
