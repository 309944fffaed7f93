#!/usr/bin/env bash
# RefCOCO+ finetuning (VL-BERT 4.2.3): train on train, then evaluate on val, testA and testB.
#   bash launch/finetune_refcoco.sh [key=value ...]      e.g. track=detected
# Environment: CONFIG (default launch/configs/refcoco_demo.yaml; the paper's: refcoco_paper.yaml), RUNS
#   (default runs/refcoco), NUM_GPUS (default: all local GPUs; on CPU one process).
# Outputs under $RUNS/<track>: metrics_<split>.json, predictions_<split>.json, model/, tb/.
source "$(dirname "${BASH_SOURCE[0]}")/_finetune.sh"
case "${1:-}" in -h|--help) sed -n '2,6p' "$0" | cut -c3-; exit 0 ;; esac
track=gt
for arg in "$@"; do case "$arg" in track=*) track="${arg#track=}" ;; esac; done
task_setup launch/configs/refcoco_demo.yaml runs/refcoco "$@"
run_module finetune.refcoco --config "$config" engine.run_dir="$runs/$track" eval_split=val \
  ${extra[@]+"${extra[@]}"} "$@"
for split in testA testB; do
  run_module finetune.refcoco --config "$config" --eval-only engine.run_dir="$runs/$track" eval_split="$split" \
    ${extra[@]+"${extra[@]}"} "$@"
done
