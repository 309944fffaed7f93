#!/usr/bin/env bash
# Session 93 (docs/FINETUNE.md): VQA at full data in both Table 4 rows with `model.relation_between_window` 4 (the
# launcher's default since this session), each model scored again on data/demo_val10000's 10,000 held-out images
# (session 77's pipeline on a larger draw of the same stream: data/demo's train split question for question, and
# data/demo_val4000's val images among its own); session 92's models (window 3) scored there too. subset: the same
# results read on data/demo_val4000's 19,921 questions; report: paired reports, the spatial questions (per seed and
# pooled), each row's window 4 against window 3 paired, the plot.
#   bash docs/table4_demo/window_s93/run.sh     PRETRAINED (runs/demo/export), NONE (runs/step0_s90/export),
#                                                OUT (runs/s93), SEEDS ("0 1 2"), STEPS ("vqa before subset report"),
#                                                BEFORE (session 92's runs: runs/s92/vqa)
set -euo pipefail
cd "$(dirname "$0")/../../.."
here=docs/table4_demo/window_s93
out="${OUT:-runs/s93}"
before="${BEFORE:-runs/s92/vqa}"
big=data/demo_val10000
declare -A export=([pretrained]="${PRETRAINED:-runs/demo/export}" [none]="${NONE:-runs/step0_s90/export}")
paired=docs/table4_demo/refcoco_start/paired.py
source docs/table4_demo/score_large.sh
seeds="${SEEDS:-0 1 2}"
large=(eval_split=val2014 "data.root=$big/raw/vqa" "data.boxes=$big/raw/boxes.jsonl" "image.root=$big/raw")
[ -f "$big/raw/vqa/v2_mscoco_val2014_annotations.json" ] || python -m shards.demo --out "$big" --images 11800 --val 10000
for step in ${STEPS:-vqa before subset report}; do
  case "$step" in
    vqa)
      for seed in $seeds; do
        for row in none pretrained; do
          dir="$out/vqa/full_s$seed/$row"
          [ -f "$dir/metrics_val2014.json" ] || RUNS="$out/vqa" bash launch/finetune_vqa.sh \
            backbone.init="${export[$row]}" engine.run_dir="$dir" seed="$seed"
          score_large vqa "$dir" "$out/vqa_val10000/full_s$seed/$row" "${large[@]}"
        done
      done ;;
    before)
      for seed in $seeds; do
        for row in none pretrained; do
          [ -f "$before/full_s$seed/$row/metrics_val2014.json" ] || continue
          score_large vqa "$before/full_s$seed/$row" "$out/before_val10000/full_s$seed/$row" "${large[@]}"
        done
      done ;;
    subset)  # data/demo_val4000's 19,921 questions (the same ids) read out of the large val's results: no rescoring
      for split in vqa before; do
        for seed in $seeds; do
          for row in none pretrained; do
            src="$out/${split}_val10000/full_s$seed/$row" dir="$out/${split}_val4000/full_s$seed/$row"
            [ -f "$src/results_val2014.json" ] || continue
            mkdir -p "$dir"
            ln -sfn "$(realpath "$src/results_val2014.json")" "$dir/results_val2014.json"
            ln -sfn "$(realpath "$src/metrics_val2014.json")" "$dir/metrics_val2014.json"
            sed "s#$big/#data/demo_val4000/#g" "$src/run.json" > "$dir/run.json"
          done
        done
      done ;;
    report)
      mkdir -p "$here"
      for split in vqa vqa_val10000 before_val10000 vqa_val4000 before_val4000; do
        ok=$(for s in $seeds; do [ ! -f "$out/$split/full_s$s/pretrained/metrics_val2014.json" ] || echo "$s"; done |
             paste -sd,)
        [ -n "$ok" ] || continue
        python "$paired" --task vqa --runs "$out/$split" --images full --seeds "$ok" --base none --row pretrained \
          > "$here/$split.json"
        raw="$big/raw"
        [ "$split" != vqa ] || raw=data/demo/raw
        [ "${split%_val4000}" = "$split" ] || raw=data/demo_val4000/raw
        for seed in ${ok//,/ }; do
          for row in none pretrained; do
            python docs/table4_demo/between_s92/spatial.py --raw "$raw" \
              --results "$out/$split/full_s$seed/$row/results_val2014.json" > "$here/spatial_${split}_s${seed}_$row.json"
          done
        done
        for row in none pretrained; do  # the seeds pooled: each question's mean over them
          python docs/table4_demo/between_s92/spatial.py --raw "$raw" \
            --results $(for seed in ${ok//,/ }; do echo "$out/$split/full_s$seed/$row/results_val2014.json"; done) \
            > "$here/spatial_${split}_pooled_$row.json"
        done
      done
      # the window's own effect: each row's window-4 model against the same seed's window-3 one, paired by image
      for seed in $seeds; do
        for row in none pretrained; do
          [ -d "$out/before_val10000/full_s$seed/$row" ] && [ -d "$out/vqa_val10000/full_s$seed/$row" ] || continue
          mkdir -p "$out/cmp_val10000/full_s$seed"
          ln -sfn "$(realpath "$out/before_val10000/full_s$seed/$row")" "$out/cmp_val10000/full_s$seed/${row}_w3"
          ln -sfn "$(realpath "$out/vqa_val10000/full_s$seed/$row")" "$out/cmp_val10000/full_s$seed/${row}_w4"
        done
      done
      for row in none pretrained; do
        [ -d "$out/cmp_val10000/full_s0/${row}_w4" ] || continue
        python "$paired" --task vqa --runs "$out/cmp_val10000" --images full --seeds "${seeds// /,}" \
          --base "${row}_w3" --row "${row}_w4" > "$here/window_${row}_val10000.json"
      done
      python "$here/plot.py" ;;
    *) echo "$0: unknown step '$step' (vqa, before, subset, report)" >&2; exit 2 ;;
  esac
done
