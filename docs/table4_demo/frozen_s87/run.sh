#!/usr/bin/env bash
# Table 4 from the quick start as it is since session 86 (docs/FINETUNE.md, session 87): its detector warm-up without
# padding (session 85) and its pretraining with the backbone frozen (session 86), against its own step 0 (the packaged
# MiniLM with the same warm-up, one step at learning rate 0). Session 83's cells on the stride-8 quick start, as far as
# one session on 2 cores reached: VQA at 150 training images, VCR Q->A at 150, RefCOCO+ gt at 15 (three finetuning
# seeds each), VCR Q->A at the launcher's default (seed 0), VCR Q->A at 150 images from a second pretraining draw of
# the default (DRAW_EXPORT<1>/export: bash launch/pretrain.sh engine.seed=1 data.seed=1 engine.run_dir=...); then the
# paired reports and the figure here.
# This session: PRETRAINED=runs/frz_s0/export (session 86's seed-0 draw of the default, which a clean clone
# reproduced to the last digit) NONE=runs/step0_s87/export OUT=runs/s87
# DRAW_EXPORT=runs/frz_s (session 86's seed-1 draw, runs/frz_s1).
#   bash docs/table4_demo/frozen_s87/run.sh    PRETRAINED (runs/demo/export), NONE (runs/demo_step0/export),
#                                               OUT (runs/s87), DRAW_EXPORT (runs/demo_draw)
set -euo pipefail
cd "$(dirname "$0")/../../.."
PRETRAINED="${PRETRAINED:-runs/demo/export}" NONE="${NONE:-runs/demo_step0/export}" OUT="${OUT:-runs/s87}" \
  VQA_SIZES=150 FULL_TASKS=vcr_qa DRAWS=1 DRAW_TASKS=vcr DRAW_EXPORT="${DRAW_EXPORT:-runs/demo_draw}" \
  REPORT=docs/table4_demo/frozen_s87 STEPS="step0 lowdata full draws report" \
  bash docs/table4_demo/stride8_s83/run.sh
