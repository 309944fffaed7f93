#!/usr/bin/env bash
# A second pretraining draw of the quick start's recipe and of its no_text ablation (docs/FINETUNE.md, session 80):
# run.sh compares exports that are one pretraining draw each (seed 0), so its intervals (by image, over three
# finetuning seeds) say nothing of how far two draws of one recipe land apart. Here both recipes are pretrained again
# with engine.seed and data.seed DRAW (other caption and text batches, masks and initialisation; the same detector
# warm-up, held-out subsets and schedule), finetuned in run.sh's arm (15 training images, seeds 0-2, scored on the
# 1,976 val images), and linked beside run.sh's rows as pretrained_draw<DRAW> and no_text_draw<DRAW>: the full
# recipe's draw-to-draw gap is the yardstick for the ablation's.
#   bash docs/table4_demo/ablation_s80/draw.sh    DRAW (1), ARMS ("off"), OUT (runs/ablation_s80), SEEDS ("0 1 2"),
#                                                  STEPS ("pretrain train report")
set -euo pipefail
cd "$(dirname "$0")/../../.."
draw="${DRAW:-1}"
out="${OUT:-runs/ablation_s80}"
here=docs/table4_demo/ablation_s80
seeds="${SEEDS:-0 1 2}"
full="runs/demo_draw$draw"
notext="runs/demo_notext_draw$draw"
for step in ${STEPS:-pretrain train report}; do
  for arm in ${ARMS:-off}; do
    args=$([ "$arm" = off ] && echo "backbone.model.relation_alignment_landmark_first=false \
backbone.model.region_aligned_words=false" || true)
    pairs="$out/pairs_draw$draw/$arm"
    layout="$out/$arm/refcoco_val4000"
    case "$step" in
      pretrain)  # once for every arm
        [ -f "$full/export/model.safetensors" ] || bash launch/pretrain.sh engine.run_dir="$full" \
          engine.seed="$draw" data.seed="$draw"
        [ -f "$notext/export/model.safetensors" ] || bash launch/pretrain.sh engine.run_dir="$notext" \
          engine.seed="$draw" data.seed="$draw" data.text_batch_size=0 ;;
      train)
        OUT="$pairs" PRETRAINED="$full/export" NONE="$notext/export" N=15 SEEDS="$seeds" REFCOCO_ARGS="$args" \
          STEPS="train large" bash docs/table4_demo/refcoco_s77/run.sh ;;
      report)  # run.sh's report step made the layout and its rows
        for seed in $seeds; do
          ln -sfn "$(realpath "$pairs/refcoco_val4000/img15_s$seed/pretrained")" \
            "$layout/img15_s$seed/pretrained_draw$draw"
          ln -sfn "$(realpath "$pairs/refcoco_val4000/img15_s$seed/none")" "$layout/img15_s$seed/no_text_draw$draw"
        done
        s=$(echo $seeds | tr ' ' ,)
        python docs/table4_demo/refcoco_start/paired.py --runs "$layout" --images 15 --seeds "$s" --base pretrained \
          --row "pretrained_draw$draw" --row no_text --row "no_text_draw$draw" > "$here/$arm/draw${draw}_vs_pretrained.json"
        python docs/table4_demo/refcoco_start/paired.py --runs "$layout" --images 15 --seeds "$s" \
          --base "pretrained_draw$draw" --row "no_text_draw$draw" > "$here/$arm/draw${draw}_no_text_vs_draw.json"
        python docs/table4_demo/refcoco_start/paired.py --runs "$layout" --images 15 --seeds "$s" --base none \
          --row "pretrained_draw$draw" --row "no_text_draw$draw" > "$here/$arm/draw${draw}_vs_none.json"
        for row in "pretrained_draw$draw" "no_text_draw$draw"; do
          python docs/table4_demo/vcr_s70/kind_pair.py --task refcoco \
            --records "data/demo_val4000/raw/refcoco+/refs(unc).p" \
            --base "$layout/img15_s*/pretrained/predictions_val.json" \
            --row "$layout/img15_s*/$row/predictions_val.json" --out "$here/$arm/by_kind_${row}_vs_pretrained.json" \
            > /dev/null
        done
        python docs/table4_demo/vcr_s70/kind_pair.py --task refcoco \
          --records "data/demo_val4000/raw/refcoco+/refs(unc).p" \
          --base "$layout/img15_s*/pretrained_draw$draw/predictions_val.json" \
          --row "$layout/img15_s*/no_text_draw$draw/predictions_val.json" \
          --out "$here/$arm/by_kind_no_text_draw${draw}_vs_draw.json" > /dev/null ;;
    esac
  done
done
