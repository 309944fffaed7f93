#!/usr/bin/env bash
# Table 4's pretrained-vs-none pair on less labelled data (session 36): VQA finetuned on the questions of N of the
# 1,800 training images (`train_images=N`, one seeded draw: the smaller sets inside the larger), every run ~300
# steps of 32 (epochs = 300 x 32 / (5 N), the corpus asking ~5 questions per image), from the quick start's export
# (RECIPE=demo: runs/demo/export) and from its step 0 (runs/demo_step0: the packaged MiniLM and the warmed-up
# detector). Each size is one launch/table4.sh report under $OUT/img<N>/report; then the curve.
#   bash docs/table4_demo/data_efficiency/run.sh            SIZES (default "50 150 450"), OUT (runs/data_efficiency)
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-runs/data_efficiency}"
for n in ${SIZES:-50 150 450}; do
  epochs=$(python -c "print(round(300 * 32 / (5 * $n), 2))")
  RECIPE=demo TASKS=vqa OUT="$out/img$n" FINETUNE_ARGS="train_images=$n epochs=$epochs" \
    bash launch/table4.sh pretrained none
done
python docs/table4_demo/data_efficiency/curve.py --runs "$out" --out docs/table4_demo/data_efficiency
