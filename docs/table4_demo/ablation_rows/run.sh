#!/usr/bin/env bash
# Table 4's two pretraining ablations from the quick start's recipe (session 39): `no_mrc` (losses.mrc_weight=0:
# no region hidden, no MRC head; the paper's setting (a) plus the text corpus) and `no_text` (data.text_batch_size=0:
# captions only; the paper's (b)), each the quick start otherwise (same seed, schedule, caption batches and steps;
# runs/demo_nomrc, runs/demo_notext, pretrained by launch/table4.sh when missing, ~15 min each on 2 CPU cores).
# Finetuned where the quick start's export and its step 0 were compared over three seeds: VQA on the questions of
# 150 training images (12.8 epochs, ~295 steps of 32; session 37) and RefCOCO+ (gt boxes) on the expressions of 150
# images (10 epochs, ~430 steps; session 38), finetuning seeds 0, 1, 2 (the seed draws the images too).
#   bash docs/table4_demo/ablation_rows/run.sh       OUT (default runs/table4_abl39), SEEDS (default "0 1 2"),
#                                                    TASKS (default "vqa refcoco_gt"), INITS (default "no_mrc no_text")
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-runs/table4_abl39}"
# shellcheck disable=SC2206
inits=(${INITS:-no_mrc no_text})
for task in ${TASKS:-vqa refcoco_gt}; do
  case "$task" in
    vqa) epochs=12.8 ;;
    refcoco_gt) epochs=10 ;;
    *) echo "$0: task '$task' is not vqa or refcoco_gt" >&2; exit 2 ;;
  esac
  for seed in ${SEEDS:-0 1 2}; do
    RECIPE=demo TASKS="$task" OUT="$out/img150_s$seed" REPORT=0 \
      FINETUNE_ARGS="train_images=150 epochs=$epochs seed=$seed" bash launch/table4.sh "${inits[@]}"
  done
done
