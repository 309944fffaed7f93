#!/usr/bin/env bash
# Table 4's two pretraining ablations on RefCOCO+ from the current quick start's recipe (docs/FINETUNE.md, session
# 80): the no_mrc and no_text exports of session 79 (runs/demo_nomrc, runs/demo_notext: the quick start's seed,
# warm-up, schedule, caption batches and steps, without MRC's loss / without the text corpus) finetuned as session 78
# finetuned the quick start's export and its step 0 where those two rows were apart: 15 training images (100
# epochs), seeds 0-2, scored on data/demo_val4000's 1,976 held-out images, in session 78's two arms (on: the demo
# config; off: both relation options off) and on either track. The paper's ablation that moves RefCOCO+ most is MRC
# (Table 4: 69.1 without it, 70.7 with it, on detected boxes). Session 77's pipeline does the work with the two
# ablation exports in its two row slots; the four rows are then linked into one layout,
# $OUT/<arm>[/detected]/refcoco_val4000/img15_s<seed>/<row>, for refcoco_start/paired.py.
#   bash docs/table4_demo/ablation_s80/run.sh    OUT (runs/ablation_s80), MAIN (runs/refcoco_s78: session 78's and
#                                                79's pretrained / none runs), ARMS ("on off"), TRACK (gt or
#                                                detected), SEEDS ("0 1 2"), STEPS ("train report")
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-runs/ablation_s80}"
main="${MAIN:-runs/refcoco_s78}"
here=docs/table4_demo/ablation_s80
track="${TRACK:-gt}"
sub=$([ "$track" = gt ] || echo "/$track")
seeds="${SEEDS:-0 1 2}"
for arm in ${ARMS:-on off}; do
  args=$([ "$arm" = off ] && echo "backbone.model.relation_alignment_landmark_first=false \
backbone.model.region_aligned_words=false" || true)
  [ "$track" = gt ] || args="$args track=$track"
  pairs="$out/pairs/$arm$sub"
  layout="$out/$arm$sub/refcoco_val4000"
  reports="$here/$arm$sub"
  for step in ${STEPS:-train report}; do
    case "$step" in
      train)  # session 77's train and large steps: the ablation exports in its pretrained / none slots
        OUT="$pairs" PRETRAINED=runs/demo_nomrc/export NONE=runs/demo_notext/export N=15 SEEDS="$seeds" \
          REFCOCO_ARGS="$args" TRACK="$track" STEPS="train large" bash docs/table4_demo/refcoco_s77/run.sh ;;
      report)
        mkdir -p "$reports"
        for seed in $seeds; do
          d="$layout/img15_s$seed"
          mkdir -p "$d"
          for row in pretrained none; do
            ln -sfn "$(realpath "$main/$arm$sub/refcoco_val4000/img15_s$seed/$row")" "$d/$row"
          done
          ln -sfn "$(realpath "$pairs/refcoco_val4000/img15_s$seed/pretrained")" "$d/no_mrc"
          ln -sfn "$(realpath "$pairs/refcoco_val4000/img15_s$seed/none")" "$d/no_text"
        done
        s=$(echo $seeds | tr ' ' ,)
        paired=docs/table4_demo/refcoco_start/paired.py
        python "$paired" --runs "$layout" --images 15 --seeds "$s" --base none --row pretrained --row no_mrc \
          --row no_text > "$reports/vs_none.json"
        python "$paired" --runs "$layout" --images 15 --seeds "$s" --base pretrained --row no_mrc --row no_text \
          > "$reports/vs_pretrained.json"
        for row in none no_mrc no_text; do  # by kind: names and relational expressions, against the full recipe
          python docs/table4_demo/vcr_s70/kind_pair.py --task refcoco \
            --records "data/demo_val4000/raw/refcoco+/refs(unc).p" \
            --base "$layout/img15_s*/pretrained/predictions_val.json" \
            --row "$layout/img15_s*/$row/predictions_val.json" --out "$reports/by_kind_${row}_vs_pretrained.json" \
            > /dev/null
        done ;;
    esac
  done
done
