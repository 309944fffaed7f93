#!/usr/bin/env bash
# Table 4 with little labelled data from the current quick start (docs/FINETUNE.md, session 76): the quick start's
# export PRETRAINED against its step 0 NONE, three finetuning seeds a cell, each launcher's demo config:
#   RefCOCO+ version 3, gt boxes, on 15 images' expressions (100 epochs) and 150 images' (24 epochs);
#   VQA at 50 / 150 images and VCR Q->A at 150 (docs/table4_demo/lowdata_s62/run.sh); VQA at full data from NONE
#   (the PRETRAINED run: RUNS=$OUT/vqa_full/full_s0/pretrained bash launch/finetune_vqa.sh, session 73's);
# then the reports and the figure in this folder. A cell whose metrics are there is skipped.
#   bash docs/table4_demo/refcoco_s76/run.sh    OUT (runs/lowdata_s76), PRETRAINED (runs/demo_s73/export),
#                                                NONE (runs/demo_step0_s74/export), SEEDS ("0 1 2"), STEPS
#                                                ("refcoco lowdata vqa_full report"), SIZES ("15 150"),
#                                                REFCOCO_ARGS (more RefCOCO+ overrides, word-split; none)
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-runs/lowdata_s76}"
here=docs/table4_demo/refcoco_s76
export PRETRAINED="${PRETRAINED:-runs/demo_s73/export}" NONE="${NONE:-runs/demo_step0_s74/export}"
declare -A export=([pretrained]="$PRETRAINED" [none]="$NONE")
for step in ${STEPS:-refcoco lowdata vqa_full report}; do
  case "$step" in
    refcoco)  # runs under $OUT/refcoco/img<N>_s<seed>/<row>, the layout paired.py reads
      for n in ${SIZES:-15 150}; do
        epochs=$([ "$n" = 15 ] && echo 100 || echo 24)
        for seed in ${SEEDS:-0 1 2}; do
          for row in pretrained none; do
            dir="$out/refcoco/img${n}_s$seed/$row"
            [ -f "$dir/metrics_testB.json" ] && continue
            RUNS="$out/refcoco" bash launch/finetune_refcoco.sh backbone.init="${export[$row]}" engine.run_dir="$dir" \
              track=gt train_images="$n" epochs="$epochs" seed="$seed" ${REFCOCO_ARGS:-}
          done
        done
      done ;;
    lowdata)
      OUT="$out" STEPS="vqa vcr" VQA_SIZES="50 150" SEEDS="${SEEDS:-0 1 2}" bash docs/table4_demo/lowdata_s62/run.sh ;;
    vqa_full)
      dir="$out/vqa_full/full_s0/none"
      [ -f "$dir/metrics_val2014.json" ] || RUNS="$out/vqa_full" bash launch/finetune_vqa.sh \
        backbone.init="$NONE" engine.run_dir="$dir" ;;
    report)
      paired=docs/table4_demo/refcoco_start/paired.py
      kinds=docs/table4_demo/vcr_s70/kind_pair.py
      errors=()
      for n in 15 150; do
        runs="$out/refcoco/img${n}_s*"
        python "$paired" --runs "$out/refcoco" --images "$n" --base none --row pretrained > "$here/paired_img$n.json"
        python "$kinds" --task refcoco --base "$runs/none/predictions_val.json" \
          --row "$runs/pretrained/predictions_val.json" --out "$here/by_kind_img$n.json" > /dev/null
        errors+=(--row "step0_img$n=$runs/none/predictions_val.json"
                 --row "pretrained_img$n=$runs/pretrained/predictions_val.json")
      done
      python "$kinds" --task refcoco --base "$out/refcoco/img150_s*/none/predictions_testA.json" \
        --row "$out/refcoco/img150_s*/pretrained/predictions_testA.json" \
        --out "$here/by_kind_img150_testA.json" > /dev/null
      # full data: session 75's runs (docs/FINETUNE.md, its section), where they are
      full=runs/refcoco_s75/rl_table_gt/full_s
      if ls "$full"0/none/predictions_val.json > /dev/null 2>&1; then
        errors=(--row "step0_full=${full}*/none/predictions_val.json"
                --row "pretrained_full=${full}*/pretrained/predictions_val.json" "${errors[@]}")
      fi
      python "$here/errors.py" "${errors[@]}" --out "$here/errors.json" > /dev/null
      for n in 50 150; do
        python "$paired" --task vqa --runs "$out/vqa" --images "$n" --base none --row pretrained \
          > "$here/vqa_img$n.json"
      done
      python "$paired" --task vcr --runs "$out/vcr" --images 150 --base none --row pretrained > "$here/vcr_img150.json"
      python "$kinds" --base "$out/vcr/img150_s*/none/qa/predictions_val.json" \
        --row "$out/vcr/img150_s*/pretrained/qa/predictions_val.json" --out "$here/vcr_img150_by_kind.json" > /dev/null
      if [ -f "$out/vqa_full/full_s0/pretrained/metrics_val2014.json" ]; then
        python "$paired" --task vqa --runs "$out/vqa_full" --images full --seeds 0 --base none --row pretrained \
          > "$here/vqa_full.json"
      fi
      python "$here/plot.py" ;;
  esac
done
