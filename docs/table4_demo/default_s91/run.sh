#!/usr/bin/env bash
# Session 91 (docs/FINETUNE.md): Table 4's "current default" cells again, from the quick start's export since session 90
# (the LR at 0.1 for its last 40 steps; runs/cut_s0 is that run, which a clean clone of the default reproduced to the
# last figure) against its own step 0 (the packaged MiniLM with the same warm-up, one step at LR 0). Session 90 ran
# the VQA cell at 150 images (docs/table4_demo/cut_s90/run.sh); this runs the rest, most telling first:
#   full      the launchers' defaults, seed 0: VQA at full data, VCR Q->A and QA->R (stride8_s83/run.sh's step)
#   refcoco   RefCOCO+ gt at 15 training images, three seeds (lowdata_s62/run.sh's cell)
#   large     those RefCOCO+ models and the full-data VQA pair scored again on data/demo_val4000's held-out images
#             (1,976 RefCOCO+ val images, 4,000 VQA; session 77's pipeline, which builds that corpus if missing)
#   vqa50     VQA at 50 training images, three seeds
#   vqa_relations  VQA at full data with RefCOCO+'s relation options on in both rows, scored on both vals
#   vcr       VCR Q->A at 150 training images, three seeds
#   report    the paired reports (bootstrap by image) and the figure (plot.py) here
#   bash docs/table4_demo/default_s91/run.sh    PRETRAINED (runs/demo/export), NONE (runs/step0_s90/export),
#                                                OUT (runs/s90: session 90's VQA cell lives there too),
#                                                STEPS ("full refcoco large vqa50 vcr report";
#                                                also vqa_relations)
set -euo pipefail
cd "$(dirname "$0")/../../.."
here=docs/table4_demo/default_s91
out="${OUT:-runs/s90}"
pretrained="${PRETRAINED:-runs/demo/export}"
none="${NONE:-runs/step0_s90/export}"
[ -f "$none/model.safetensors" ] || PRETRAINED="$pretrained" NONE="$none" OUT="$out" REPORT="$here" STEPS=step0 \
  bash docs/table4_demo/stride8_s83/run.sh
paired=docs/table4_demo/refcoco_start/paired.py
kinds=docs/table4_demo/vcr_s70/kind_pair.py
big=data/demo_val4000
lowdata() { PRETRAINED="$pretrained" NONE="$none" OUT="$out" bash docs/table4_demo/lowdata_s62/run.sh; }
for step in ${STEPS:-full refcoco large vqa50 vcr report}; do
  case "$step" in
    full)
      PRETRAINED="$pretrained" NONE="$none" OUT="$out" REPORT="$here" STEPS=full FULL_TASKS="vqa vcr_qa vcr_qar" \
        bash docs/table4_demo/stride8_s83/run.sh ;;
    refcoco) STEPS=refcoco lowdata ;;
    large)
      [ -f "$big/raw/refcoco+/instances.json" ] || python -m shards.demo --out "$big" --images 5800 --val 4000
      # session 77's pipeline reads the trained runs where lowdata_s62 left them: $OUT/refcoco/img15_s<seed>/<row>
      # and, for VQA, $OUT/vqa/full_s0/<row> (here under $out/full); its own report step is not used
      PRETRAINED="$pretrained" NONE="$none" OUT="$out" N=15 STEPS=large bash docs/table4_demo/refcoco_s77/run.sh
      PRETRAINED="$pretrained" NONE="$none" OUT="$out/full" STEPS=vqa bash docs/table4_demo/refcoco_s77/run.sh ;;
    vqa50) STEPS=vqa VQA_SIZES=50 lowdata ;;
    vqa_relations)  # VQA at full data (seed 0) with RefCOCO+'s two relation options on, both rows: does either read
                    # "is the X right of the Y?" (at the prior for both rows without them), and then part the rows?
      for row in pretrained none; do
        init="$pretrained"; [ "$row" = none ] && init="$none"
        dir="$out/full_relations/vqa/full_s0/$row"
        [ -f "$dir/metrics_val2014.json" ] || RUNS="$out/full_relations/vqa" bash launch/finetune_vqa.sh \
          backbone.init="$init" engine.run_dir="$dir" backbone.model.relation_alignment_landmark_first=true \
          backbone.model.region_aligned_words=true
      done
      PRETRAINED="$pretrained" NONE="$none" OUT="$out/full_relations" STEPS=vqa bash docs/table4_demo/refcoco_s77/run.sh ;;
    vcr) STEPS=vcr lowdata ;;
    report)
      mkdir -p "$here"
      for n in 50 150; do
        [ -d "$out/vqa/img${n}_s0/none" ] && python "$paired" --task vqa --runs "$out/vqa" --images "$n" --base none \
          --row pretrained > "$here/vqa_img$n.json"
      done
      if [ -d "$out/full/vqa/full_s0/none" ]; then
        python "$paired" --task vqa --runs "$out/full/vqa" --images full --seeds 0 --base none --row pretrained \
          > "$here/vqa_full.json"
      fi
      if [ -f "$out/full/vqa_val4000/full_s0/none/metrics_val2014.json" ]; then
        python "$paired" --task vqa --runs "$out/full/vqa_val4000" --images full --seeds 0 --base none \
          --row pretrained > "$here/vqa_full_val4000.json"
      fi
      if [ -d "$out/full/vcr/full_s0/none" ]; then
        python "$paired" --task vcr --runs "$out/full/vcr" --images full --seeds 0 --base none --row pretrained \
          > "$here/vcr_full.json"
        for sub in qa qar; do
          [ -f "$out/full/vcr/full_s0/none/$sub/predictions_val.json" ] || continue
          python "$kinds" --base "$out/full/vcr/full_s0/none/$sub/predictions_val.json" \
            --row "$out/full/vcr/full_s0/pretrained/$sub/predictions_val.json" \
            --out "$here/vcr_full_${sub}_by_kind.json" > /dev/null
        done
      fi
      for split in vqa vqa_val4000; do
        [ -f "$out/full_relations/$split/full_s0/none/metrics_val2014.json" ] || continue
        python "$paired" --task vqa --runs "$out/full_relations/$split" --images full --seeds 0 --base none \
          --row pretrained > "$here/vqa_full_relations${split#vqa}.json"
      done
      if [ -d "$out/vcr/img150_s0/none" ]; then
        python "$paired" --task vcr --runs "$out/vcr" --images 150 --base none --row pretrained \
          > "$here/vcr_img150.json"
      fi
      if [ -d "$out/refcoco/img15_s0/none" ]; then
        python "$paired" --runs "$out/refcoco" --images 15 --base none --row pretrained > "$here/refcoco_img15.json"
        python "$kinds" --task refcoco --base "$out/refcoco/img15_s*/none/predictions_val.json" \
          --row "$out/refcoco/img15_s*/pretrained/predictions_val.json" --out "$here/refcoco_img15_by_kind.json" \
          > /dev/null
      fi
      if [ -f "$out/refcoco_val4000/img15_s2/none/metrics_val.json" ]; then
        python "$paired" --runs "$out/refcoco_val4000" --images 15 --base none --row pretrained \
          > "$here/refcoco_img15_val1976.json"
        python "$kinds" --task refcoco --records "$big/raw/refcoco+/refs(unc).p" \
          --base "$out/refcoco_val4000/img15_s*/none/predictions_val.json" \
          --row "$out/refcoco_val4000/img15_s*/pretrained/predictions_val.json" \
          --out "$here/refcoco_img15_val1976_by_kind.json" > /dev/null
      fi
      python docs/table4_demo/default_s91/plot.py "$here" ;;
    *) echo "$0: unknown step '$step' (full, refcoco, large, vqa50, vcr, vqa_relations, report)" >&2; exit 2 ;;
  esac
done
