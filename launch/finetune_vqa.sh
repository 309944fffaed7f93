#!/usr/bin/env bash
# VQA v2 finetuning (VL-BERT 4.2.2): train on the config's training splits, evaluate on eval_split.
#   bash launch/finetune_vqa.sh [key=value ...]
# Environment: CONFIG (default launch/configs/vqa_demo.yaml; the paper's: vqa_paper.yaml), RUNS (default
#   runs/vqa), NUM_GPUS (default: all local GPUs; on CPU one process).
# Outputs under $RUNS/demo (or engine.run_dir): metrics_<split>.json, results_<split>.json, model/, tb/.
source "$(dirname "${BASH_SOURCE[0]}")/_finetune.sh"
case "${1:-}" in -h|--help) sed -n '2,6p' "$0" | cut -c3-; exit 0 ;; esac
task_setup launch/configs/vqa_demo.yaml runs/vqa "$@"
run_module finetune.vqa --config "$config" engine.run_dir="$runs/demo" ${extra[@]+"${extra[@]}"} "$@"
