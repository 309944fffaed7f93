#!/usr/bin/env bash
# RefCOCO+ at 15 training images (100 epochs, gt boxes, seeds 0-2) scored on data/demo_val4000's 1,976 held-out
# images (docs/FINETUNE.md, session 78): session 76 read +1.51 paired at 15 images on the 98-image val, the rows
# overlapping; session 77 found the 98-image val swings by points by itself at 150 images. Two arms, each the quick
# start's export PRETRAINED against its step 0 NONE:
#   on:  the demo config (relation word read against its landmark, regions taking their aligned words);
#   off: both of those off in both rows, where the finetune does not hand the relation reading to step 0.
# Session 77's pipeline does the work (refcoco_s77/run.sh: trains on data/demo as the launcher does, scores on its
# splits, then the saved model on the large val); it builds data/demo_val4000 if it is not there.
#   bash docs/table4_demo/refcoco_s78/run.sh    OUT (runs/refcoco_s78), PRETRAINED (runs/demo/export),
#                                                NONE (runs/demo_step0/export), ARMS ("on off"), N (15; other sizes'
#                                                reports go to <arm>/img<N>), SEEDS ("0 1 2"; others' reports go to
#                                                .../seeds_<seeds>: on/seeds_0_1_2_3_4, off/img150/seeds_0),
#                                                TRACK (gt; detected trains and scores on the detector's boxes, runs in
#                                                $OUT/<arm>/detected, reports in <arm>/detected/..., session 79)
set -euo pipefail
cd "$(dirname "$0")/../../.."
here=docs/table4_demo/refcoco_s78
out="${OUT:-runs/refcoco_s78}"
export PRETRAINED="${PRETRAINED:-runs/demo/export}" NONE="${NONE:-runs/demo_step0/export}" N="${N:-15}"
steps="train large report"
[ -f data/demo_val4000/raw/refcoco+/instances.json ] || steps="corpus $steps"  # session 77's large val, once
size=$([ "$N" = 15 ] || echo "/img$N")
track="${TRACK:-gt}"
sub=$([ "$track" = gt ] || echo "/$track")
for arm in ${ARMS:-on off}; do
  reports="$here/$arm$sub$size${SEEDS:+/seeds_${SEEDS// /_}}"
  mkdir -p "$reports"
  if [ "$arm" = off ]; then
    args="backbone.model.relation_alignment_landmark_first=false backbone.model.region_aligned_words=false"
  else
    args=""
  fi
  [ "$track" = gt ] || args="$args track=$track"
  OUT="$out/$arm$sub" REPORTS="$reports" REFCOCO_ARGS="$args" TRACK="$track" STEPS="$steps" \
    bash docs/table4_demo/refcoco_s77/run.sh
  steps="${steps#corpus }"
done
