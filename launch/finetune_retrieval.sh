#!/usr/bin/env bash
# Image-text retrieval: train on the split file's train images, rank eval_split's images and captions.
#   bash launch/finetune_retrieval.sh [key=value ...]
# Environment: CONFIG (default launch/configs/retrieval_demo.yaml), RUNS (default
#   runs/retrieval), NUM_GPUS (default: all local GPUs; on CPU one process).
# Outputs under $RUNS/demo (or engine.run_dir): metrics_<split>.json, rankings_<split>.json, model/, tb/.
source "$(dirname "${BASH_SOURCE[0]}")/_finetune.sh"
case "${1:-}" in -h|--help) sed -n '2,6p' "$0" | cut -c3-; exit 0 ;; esac
task_setup launch/configs/retrieval_demo.yaml runs/retrieval "$@"
run_module finetune.retrieval --config "$config" engine.run_dir="$runs/demo" ${extra[@]+"${extra[@]}"} "$@"
