#!/usr/bin/env bash
# Session 90 (docs/FINETUNE.md): Table 4's VQA cell at 150 training images (three finetuning seeds) from the quick
# start's export since session 90 (the LR at 0.1 for its last 40 steps; runs/cut_s0 is that run, which a clean clone
# of the default reproduced to the last figure) against its own step 0 (the packaged MiniLM with the same warm-up,
# one step at LR 0). About 18 minutes on a 2-core Intel Xeon.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PRETRAINED="${PRETRAINED:-runs/demo/export}" NONE="${NONE:-runs/step0_s90/export}" OUT="${OUT:-runs/s90}" \
  REPORT=docs/table4_demo/cut_s90 STEPS=step0 bash docs/table4_demo/stride8_s83/run.sh
PRETRAINED="${PRETRAINED:-runs/demo/export}" NONE="${NONE:-runs/step0_s90/export}" OUT="${OUT:-runs/s90}" STEPS=vqa \
  VQA_SIZES=150 bash docs/table4_demo/lowdata_s62/run.sh
python docs/table4_demo/refcoco_start/paired.py --task vqa --runs "${OUT:-runs/s90}/vqa" --images 150 --base none \
  --row pretrained > docs/table4_demo/cut_s90/vqa_img150.json
