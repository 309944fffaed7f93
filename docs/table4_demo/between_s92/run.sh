#!/usr/bin/env bash
# Session 92 (docs/FINETUNE.md): VQA's spatial yes/no questions ("is the triangle above the hexagon?") read 54% exact
# (chance 50) in both Table 4 rows at full data: no model here compared two boxes. `model.relation_between` gives the
# words between two named objects the relation the boxes show (a relation word: the names other than its own), and
# launch/configs/vqa_demo.yaml turns it on since this session. This runs VQA at the launcher's default (full data)
# in each row and scores each model again on data/demo_val4000's 4,000 held-out images (session 77's pipeline):
#   none                the step-0 export (NONE)
#   pretrained          the quick start's export (PRETRAINED; its pretraining without the option)
#   pretrained_between  an export pretrained with the option on (BETWEEN: bash launch/pretrain.sh
#                       engine.run_dir=runs/between_s0 model.relation_between=true)
#   bash docs/table4_demo/between_s92/run.sh     PRETRAINED (runs/demo/export), NONE (runs/step0_s90/export),
#                                                 BETWEEN (runs/between_s0/export), OUT (runs/s92),
#                                                 ROWS ("none pretrained"), SEEDS ("0"), STEPS ("vqa report"),
#                                                 WITHOUT (session 91's large-val runs without the option)
set -euo pipefail
cd "$(dirname "$0")/../../.."
here=docs/table4_demo/between_s92
out="${OUT:-runs/s92}"
big=data/demo_val4000
declare -A export=([pretrained]="${PRETRAINED:-runs/demo/export}" [none]="${NONE:-runs/step0_s90/export}"
                   [pretrained_between]="${BETWEEN:-runs/between_s0/export}")
paired=docs/table4_demo/refcoco_start/paired.py
source docs/table4_demo/score_large.sh
seeds="${SEEDS:-0}"
WITHOUT="${WITHOUT:-runs/s90/full/vqa_val4000/full_s0}"
for step in ${STEPS:-vqa report}; do
  case "$step" in
    vqa)
      [ -f "$big/raw/vqa/v2_mscoco_val2014_annotations.json" ] || python -m shards.demo --out "$big" --images 5800 --val 4000
      for seed in $seeds; do
        for row in ${ROWS:-none pretrained}; do
          dir="$out/vqa/full_s$seed/$row"
          [ -f "$dir/metrics_val2014.json" ] || RUNS="$out/vqa" bash launch/finetune_vqa.sh \
            backbone.init="${export[$row]}" engine.run_dir="$dir" seed="$seed"
          score_large vqa "$dir" "$out/vqa_val4000/full_s$seed/$row" eval_split=val2014 "data.root=$big/raw/vqa" \
            "data.boxes=$big/raw/boxes.jsonl" "image.root=$big/raw"
        done
      done ;;
    report)
      mkdir -p "$here"
      for split in vqa vqa_val4000; do
        for row in pretrained pretrained_between; do
          ok=$(for s in $seeds; do [ ! -f "$out/$split/full_s$s/$row/metrics_val2014.json" ] || echo "$s"; done | paste -sd,)
          [ -n "$ok" ] || continue
          python "$paired" --task vqa --runs "$out/$split" --images full --seeds "$ok" --base none --row "$row" \
            > "$here/${split}_${row}.json"
        done
      done
      for seed in $seeds; do
        for row in none pretrained pretrained_between; do
          [ -f "$out/vqa_val4000/full_s$seed/$row/results_val2014.json" ] || continue
          python "$here/spatial.py" --raw "$big/raw" --results "$out/vqa_val4000/full_s$seed/$row/results_val2014.json" \
            > "$here/spatial_val4000_s${seed}_$row.json"
        done
      done
      # the same questions from session 91's runs, without the option (default_s91/run.sh's full and large steps)
      for row in none pretrained; do
        [ -f "$WITHOUT/$row/results_val2014.json" ] || continue
        python "$here/spatial.py" --raw "$big/raw" --results "$WITHOUT/$row/results_val2014.json" \
          > "$here/spatial_val4000_without_$row.json"
      done
      python "$here/plot.py" ;;
    *) echo "$0: unknown step '$step' (vqa, report)" >&2; exit 2 ;;
  esac
done
