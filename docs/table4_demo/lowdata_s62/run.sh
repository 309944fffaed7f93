#!/usr/bin/env bash
# Table 4's pretrained-vs-none pair from the quick start's default (session 62) with little labelled data, three
# finetuning seeds per cell: VQA on the questions of N training images (~300 steps of 32 at every N: epochs =
# 300 x 32 / (5 N)), RefCOCO+ gt boxes on 15 images (100 epochs); with STEPS=vcr VCR Q->A on 150 images (17 epochs,
# ~306 steps of 16) and with STEPS=refcoco_detected RefCOCO+ on the detector's boxes (15 images, 100 epochs);
# STEPS=refcoco_detected_noalign is that with the word-region alignment turned off for the finetune (session 65).
# Rows: pretrained = runs/demo/export (bash launch/pretrain.sh), none = runs/demo_step0/export (its step 0, built by
# RECIPE=demo launch/table4.sh), or the exports PRETRAINED and NONE name (session 76: runs/demo_s73/export and
# runs/demo_step0_s74/export). Runs land in the layout docs/table4_demo/refcoco_start/paired.py reads:
# $OUT/<task>/img<N>_s<seed>/<row>; a cell whose metrics are there is skipped.
#   bash docs/table4_demo/lowdata_s62/run.sh       OUT (runs/lowdata), VQA_SIZES ("15 50 150"), SEEDS ("0 1 2"),
#                                                  STEPS ("vqa refcoco"; also "vcr": ~5-12 min a run on
#                                                  2 cores, and "refcoco_detected", both run in session 63)
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-runs/lowdata}"
declare -A export=([pretrained]="${PRETRAINED:-runs/demo/export}" [none]="${NONE:-runs/demo_step0/export}")
for row in "${!export[@]}"; do
  # launch/table4.sh pretrains a missing row before its first task; an empty TASKS would mean its default, all tasks
  [ -f "${export[$row]}/model.safetensors" ] || { echo "lowdata: ${export[$row]} missing (pretrained: bash launch/pretrain.sh; none: RECIPE=demo TASKS=vqa bash launch/table4.sh none)" >&2; exit 2; }
done
for step in ${STEPS:-vqa refcoco}; do
  for seed in ${SEEDS:-0 1 2}; do
    for row in pretrained none; do
      case "$step" in
        vqa)
          for n in ${VQA_SIZES:-15 50 150}; do
            epochs=$(python -c "print(round(300 * 32 / (5 * $n), 2))")
            dir="$out/vqa/img${n}_s$seed/$row"
            [ -f "$dir/metrics_val2014.json" ] && continue
            RUNS="$out/vqa" bash launch/finetune_vqa.sh backbone.init="${export[$row]}" engine.run_dir="$dir" \
              train_images="$n" epochs="$epochs" seed="$seed"
          done ;;
        refcoco)
          dir="$out/refcoco/img15_s$seed/$row"
          [ -f "$dir/metrics_val.json" ] && continue
          RUNS="$out/refcoco" bash launch/finetune_refcoco.sh backbone.init="${export[$row]}" engine.run_dir="$dir" \
            track=gt train_images=15 epochs=100 seed="$seed" ;;
        refcoco_detected)  # the same 15 images and budget on the detector's boxes (session 63)
          dir="$out/refcoco_detected/img15_s$seed/$row"
          [ -f "$dir/metrics_val.json" ] && continue
          RUNS="$out/refcoco_detected" bash launch/finetune_refcoco.sh backbone.init="${export[$row]}" \
            engine.run_dir="$dir" track=detected train_images=15 epochs=100 seed="$seed" ;;
        refcoco_detected_noalign)  # the same, with the words' region alignment off in the finetune (session 65)
          dir="$out/refcoco_detected_noalign/img15_s$seed/$row"
          [ -f "$dir/metrics_val.json" ] && continue
          RUNS="$out/refcoco_detected_noalign" bash launch/finetune_refcoco.sh backbone.init="${export[$row]}" \
            engine.run_dir="$dir" track=detected train_images=15 epochs=100 seed="$seed" \
            backbone.model.region_word_alignment=null backbone.model.alignment_neighbours=0 ;;
        vcr)
          dir="$out/vcr/img150_s$seed/$row"
          [ -f "$dir/qa/metrics_val.json" ] && continue
          SUBTASKS=qa RUNS="$dir" bash launch/finetune_vcr.sh backbone.init="${export[$row]}" \
            train_images=150 epochs=17 seed="$seed" ;;
      esac
    done
  done
done
