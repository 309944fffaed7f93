#!/usr/bin/env bash
# RefCOCO+ at 150 training images and VQA at full data, scored on 20x the held-out images (docs/FINETUNE.md, session
# 77). Session 76's rows (the quick start's export PRETRAINED against its step 0 NONE) were ahead with the paired
# interval above 0, but their own intervals overlapped: 98 RefCOCO+ val images (200 for VQA) are too few. The corpus'
# draws are sequential and per image, so a corpus of 5,800 images with 4,000 held out (data/demo_val4000) has
# data/demo's 2,000 images byte for byte, the same training images, questions and expressions, and 20x the held-out
# images (keeping data/demo's). Neither export saw any of the new 3,800 images: pretraining and the detector's warm-up
# read data/demo's train split. Each finetune trains on data/demo exactly as the launcher does and is scored on
# data/demo's splits, then its saved model is scored again on the large val (--eval-only).
#   RefCOCO+: gt boxes, N training images (150: 24 epochs, 15: 100; session 76's budgets), seeds SEEDS;
#   VQA: the launcher's default (full data), seed 0.
#   bash docs/table4_demo/refcoco_s77/run.sh    OUT (runs/refcoco_s77), PRETRAINED (runs/demo_s73/export),
#                                                NONE (runs/demo_step0_s74/export), SEEDS ("0 1 2"), N (150),
#                                                STEPS ("corpus train large vqa report"), REPORTS (this folder),
#                                                REFCOCO_ARGS (more RefCOCO+ finetune overrides, session 78's),
#                                                TRACK (gt; the track the large val is scored on), LARGE (refcoco_val4000;
#                                                the large step's folder under OUT), DETS (the large val's dets.json;
#                                                another box set for the detected track), session 79's
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-runs/refcoco_s77}"
here="${REPORTS:-docs/table4_demo/refcoco_s77}"
big=data/demo_val4000
n="${N:-150}"
declare -A export=([pretrained]="${PRETRAINED:-runs/demo_s73/export}" [none]="${NONE:-runs/demo_step0_s74/export}")

source docs/table4_demo/score_large.sh

for step in ${STEPS:-corpus train large vqa report}; do
  case "$step" in
    corpus)
      python -m shards.demo --out "$big" --images 5800 --val 4000 ;;
    train)  # session 76's RefCOCO+ step at N images: $OUT/refcoco/img<N>_s<seed>/<row>, the layout paired.py reads
      OUT="$out" SIZES="$n" STEPS=refcoco PRETRAINED="${export[pretrained]}" NONE="${export[none]}" \
        bash docs/table4_demo/refcoco_s76/run.sh ;;
    large)  # the same saved models on the large val: $OUT/refcoco_val4000/img<N>_s<seed>/<row>
      for seed in ${SEEDS:-0 1 2}; do
        for row in pretrained none; do
          score_large refcoco "$out/refcoco/img${n}_s$seed/$row" "$out/${LARGE:-refcoco_val4000}/img${n}_s$seed/$row" \
            eval_split=val track="${TRACK:-gt}" "data.refs=$big/raw/refcoco+/refs(unc).p" \
            "data.instances=$big/raw/refcoco+/instances.json" "data.detections=${DETS:-$big/raw/refcoco+/dets.json}" \
            "image.root=$big/raw/images"
        done
      done ;;
    vqa)  # the launcher's default, seed 0: $OUT/vqa/full_s0/<row>, and on the large val $OUT/vqa_val4000/...
      for row in pretrained none; do
        dir="$out/vqa/full_s0/$row"
        [ -f "$dir/metrics_val2014.json" ] || RUNS="$out/vqa" bash launch/finetune_vqa.sh \
          backbone.init="${export[$row]}" engine.run_dir="$dir" seed=0
        score_large vqa "$dir" "$out/vqa_val4000/full_s0/$row" eval_split=val2014 "data.root=$big/raw/vqa" \
          "data.boxes=$big/raw/boxes.jsonl" "image.root=$big/raw"
      done ;;
    report)
      paired=docs/table4_demo/refcoco_start/paired.py
      kinds=docs/table4_demo/vcr_s70/kind_pair.py
      seeds=$(echo ${SEEDS:-0 1 2} | tr ' ' ,)
      python "$paired" --runs "$out/refcoco" --images "$n" --seeds "$seeds" --base none --row pretrained \
        > "$here/paired_img${n}_val98.json"
      python "$paired" --runs "$out/refcoco_val4000" --images "$n" --seeds "$seeds" --base none --row pretrained \
        > "$here/paired_img${n}_val1976.json"
      python "$kinds" --task refcoco --base "$out/refcoco/img${n}_s*/none/predictions_val.json" \
        --row "$out/refcoco/img${n}_s*/pretrained/predictions_val.json" --out "$here/by_kind_img${n}_val98.json" \
        > /dev/null
      python "$kinds" --task refcoco --records "$big/raw/refcoco+/refs(unc).p" \
        --base "$out/refcoco_val4000/img${n}_s*/none/predictions_val.json" \
        --row "$out/refcoco_val4000/img${n}_s*/pretrained/predictions_val.json" \
        --out "$here/by_kind_img${n}_val1976.json" > /dev/null
      if [ -f "$out/vqa_val4000/full_s0/none/metrics_val2014.json" ]; then
        for split in vqa vqa_val4000; do
          python "$paired" --task vqa --runs "$out/$split" --images full --seeds 0 --base none --row pretrained \
            > "$here/${split}_full.json"
        done
      fi ;;
  esac
done
