#!/usr/bin/env bash
# Table 4 from the quick start as it is since session 86 (docs/FINETUNE.md, session 87): its detector warm-up without
# padding (session 85) and its pretraining with the backbone frozen (session 86), against its own step 0 (the packaged
# MiniLM with the same warm-up, one step at learning rate 0). Session 83's cells on the stride-8 quick start, as far as
# one session on 2 cores reached: VQA at 150 training images, VCR Q->A at 150, RefCOCO+ gt at 15 (three finetuning
# seeds each), VCR Q->A at the launcher's default (seed 0), VCR Q->A at 150 images from a second pretraining draw of
# the default (DRAW_EXPORT<1>/export: bash launch/pretrain.sh engine.seed=1 data.seed=1 engine.run_dir=...); then the
# paired reports and the figure here. Session 88 added the cells session 87 left: VQA at 50 training images (three
# seeds), VQA at full data and VCR QA->R at the launchers' defaults (seed 0).
# This session: PRETRAINED=runs/frz_s0/export (session 86's seed-0 draw of the default, which a clean clone
# reproduced to the last digit) NONE=runs/step0_s87/export OUT=runs/s87
# DRAW_EXPORT=runs/frz_s (session 86's seed-1 draw, runs/frz_s1).
# With TRAINED set (this session: runs/demo/export, session 85's recipe on the same warm-up, its backbone trained in
# pretraining), RefCOCO+ at 15, VCR Q->A and VQA at 150 from it too, and the freeze's paired reports (current minus it).
#   bash docs/table4_demo/frozen_s87/run.sh    PRETRAINED (runs/demo/export), NONE (runs/demo_step0/export),
#                                               OUT (runs/s87), DRAW_EXPORT (runs/demo_draw), TRAINED (unset)
set -euo pipefail
cd "$(dirname "$0")/../../.."
PRETRAINED="${PRETRAINED:-runs/demo/export}" NONE="${NONE:-runs/demo_step0/export}" OUT="${OUT:-runs/s87}" \
  VQA_SIZES="150 50" FULL_TASKS="vqa vcr_qa vcr_qar" DRAWS=1 DRAW_TASKS=vcr \
  DRAW_EXPORT="${DRAW_EXPORT:-runs/demo_draw}" REPORT=docs/table4_demo/frozen_s87 \
  STEPS="step0 lowdata full draws report" \
  bash docs/table4_demo/stride8_s83/run.sh
[ -n "${TRAINED:-}" ] || exit 0
out="${OUT:-runs/s87}"
here=docs/table4_demo/frozen_s87
paired=docs/table4_demo/refcoco_start/paired.py
kinds=docs/table4_demo/vcr_s70/kind_pair.py
for task in refcoco vcr vqa; do
  cell=img150; [ "$task" = refcoco ] && cell=img15
  for s in 0 1 2; do  # step 0's finetunes shared, as the draws step shares them
    mkdir -p "$out/unfrozen/$task/${cell}_s$s"
    ln -sfn "$PWD/$out/$task/${cell}_s$s/none" "$out/unfrozen/$task/${cell}_s$s/none"
  done
  PRETRAINED="$TRAINED" NONE="${NONE:-runs/demo_step0/export}" OUT="$out/unfrozen" STEPS="$task" VQA_SIZES=150 \
    bash docs/table4_demo/lowdata_s62/run.sh
  for s in 0 1 2; do
    ln -sfn "$PWD/$out/unfrozen/$task/${cell}_s$s/pretrained" "$out/$task/${cell}_s$s/unfrozen"
  done
done
python "$paired" --runs "$out/refcoco" --images 15 --base unfrozen --row pretrained \
  > "$here/refcoco_img15_frozen_vs_trained.json"
python "$kinds" --task refcoco --base "$out/refcoco/img15_s*/unfrozen/predictions_val.json" \
  --row "$out/refcoco/img15_s*/pretrained/predictions_val.json" \
  --out "$here/refcoco_img15_frozen_vs_trained_by_kind.json" > /dev/null
python "$paired" --task vcr --runs "$out/vcr" --images 150 --base none --row unfrozen --row pretrained \
  > "$here/vcr_img150_frozen_vs_trained.json"
python "$paired" --task vcr --runs "$out/vcr" --images 150 --base unfrozen --row pretrained \
  > "$here/vcr_img150_frozen_minus_trained.json"
python "$paired" --task vqa --runs "$out/vqa" --images 150 --base unfrozen --row pretrained \
  > "$here/vqa_img150_frozen_minus_trained.json"
