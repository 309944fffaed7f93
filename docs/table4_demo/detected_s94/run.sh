#!/usr/bin/env bash
# Session 94 (docs/FINETUNE.md): RefCOCO+'s detected track from the current default. Session 79 measured it from
# session 77's draw of the quick start (15 training images, 1,976 val images, three seeds: -0.17, tied); the quick
# start has changed since (stride-8 detector, session 82; frozen backbone, 86; the LR cut, 90) and the cell was not
# rerun. Session 77's pipeline does the work (refcoco_s77/run.sh: train on data/demo as the launcher does at 15 images,
# 100 epochs, on the detector's boxes plus the ground truth; score; score the saved model on data/demo_val4000's
# detections), the quick start's export PRETRAINED against its step 0 NONE (made here if missing).
#   bash docs/table4_demo/detected_s94/run.sh    PRETRAINED (runs/demo/export), NONE (runs/step0_s90/export),
#                                                OUT (runs/s94), SEEDS ("0 1 2"), ARMS ("on"; "off": both relation
#                                                options off in both rows; "whole": the demo config with
#                                                model.align_whole_names in both rows), TRACK (detected; gt),
#                                                STEPS ("train large report"); the runs in $OUT/<arm>[/gt], the reports
#                                                in this folder's <arm>[/gt], landmarks.py's split beside them
set -euo pipefail
cd "$(dirname "$0")/../../.."
here=docs/table4_demo/detected_s94
out="${OUT:-runs/s94}"
export PRETRAINED="${PRETRAINED:-runs/demo/export}" NONE="${NONE:-runs/step0_s90/export}" N=15
[ -f "$NONE/model.safetensors" ] || PRETRAINED="$PRETRAINED" NONE="$NONE" OUT="$out" REPORT="$here" STEPS=step0 \
  bash docs/table4_demo/stride8_s83/run.sh
steps="${STEPS:-train large report}"
[ -f data/demo_val4000/raw/refcoco+/instances.json ] || steps="corpus $steps"
track="${TRACK:-detected}"
sub=$([ "$track" = detected ] || echo "/$track")
for arm in ${ARMS:-on}; do
  args="track=$track"
  case "$arm" in
    on) ;;
    off) args="$args backbone.model.relation_alignment_landmark_first=false backbone.model.region_aligned_words=false" ;;
    whole) args="$args backbone.model.align_whole_names=true" ;;
    *) echo "$0: unknown arm '$arm' (on, off, whole)" >&2; exit 2 ;;
  esac
  mkdir -p "$here/$arm$sub"
  OUT="$out/$arm$sub" REPORTS="$here/$arm$sub" REFCOCO_ARGS="$args" TRACK="$track" STEPS="$steps" \
    bash docs/table4_demo/refcoco_s77/run.sh
  steps="${steps#corpus }"
  glob="$out/$arm$sub/refcoco_val4000/img15_s[$(echo ${SEEDS:-0 1 2} | tr -d ' ')]"
  if ls $glob/none/predictions_val.json > /dev/null 2>&1; then
    python "$here/landmarks.py" --base "$glob/none/predictions_val.json" --row "$glob/pretrained/predictions_val.json" \
      --out "$here/$arm$sub/landmarks_val1976.json" > /dev/null
  fi
done
# the option against the demo config, same seed and row, paired by image: both arms' large-val runs linked side by side
if [ -d "$out/on$sub/refcoco_val4000" ] && [ -d "$out/whole$sub/refcoco_val4000" ]; then
  for seed in ${SEEDS:-0 1 2}; do
    for arm in on whole; do
      for row in pretrained none; do
        mkdir -p "$out/compare$sub/img15_s$seed"
        ln -sfn "$(realpath "$out/$arm$sub/refcoco_val4000/img15_s$seed/$row")" "$out/compare$sub/img15_s$seed/${arm}_$row"
      done
    done
  done
  seeds=$(echo ${SEEDS:-0 1 2} | tr ' ' ,)
  for row in pretrained none; do
    python docs/table4_demo/refcoco_start/paired.py --runs "$out/compare$sub" --images 15 --seeds "$seeds" \
      --base "on_$row" --row "whole_$row" > "$here/whole$sub/whole_minus_on_${row}_val1976.json"
  done
fi
[ -n "$sub" ] || python "$here/plot.py"
