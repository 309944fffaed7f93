#!/usr/bin/env bash
# Table 4's VQG column from the quick start's recipe (sessions 40-41, docs/FINETUNE.md): BERT-gen on the image alone
# from runs/demo/export (pretrained) and runs/demo_step0/export (none), each with its own detector's region features;
# items 1-2 below with the paper's fresh W over the features (visual_input=linear), item 3 on VL-BERT's own input (the
# launcher's default since session 41);
# launch/table4.sh pretrains a missing row first (the quick start ~25 min with its warm-up, step 0 ~1 min).
#   1. the config's budget (1 epoch, 224 steps of 32, ~4 min + 1 min decoding and scoring), finetune seeds 0 1 2;
#   2. seeds 0, 1 and 2 with 3 epochs, and seed 0 on features standardised by the training split's regions;
#   3. VL-BERT's own input (visual_input=vlbert: the export's visual embedding and region words), the config's
#      budget, seeds 0-4 (session 41);
#   4. the image control on every run (its questions again with another image's regions), the image's information
#      about each reference question (likelihood.py, no decoding) and the reports.
#   bash docs/table4_demo/vqg/run.sh           OUT (default runs/table4_vqg)
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-runs/table4_vqg}"
here=docs/table4_demo/vqg
for seed in 0 1 2; do
  if [ "$seed" != 0 ]; then  # the same detectors' features: extracted once
    mkdir -p "$out/s$seed/vqg"; cp -n "$out"/s0/vqg/features_*.tsv "$out/s$seed/vqg/"
  fi
  RECIPE=demo TASKS=vqg OUT="$out/s$seed" REPORT=0 FINETUNE_ARGS="seed=$seed visual_input=linear" \
    bash launch/table4.sh pretrained none
done
mkdir -p "$out/std_s0/vqg"
for init in pretrained none; do
  python "$here/standardise_features.py" "$out/s0/vqg/features_$init.tsv" "$out/std_s0/vqg/features_$init.tsv" \
    --train data/demo/raw/vqg/coco_train_all.csv
done
RECIPE=demo TASKS=vqg OUT="$out/std_s0" REPORT=0 FINETUNE_ARGS="seed=0 visual_input=linear" \
  bash launch/table4.sh pretrained none
for seed in 0 1 2; do
  mkdir -p "$out/e3_s$seed/vqg"; cp -n "$out"/s0/vqg/features_*.tsv "$out/e3_s$seed/vqg/"
  RECIPE=demo TASKS=vqg OUT="$out/e3_s$seed" REPORT=0 FINETUNE_ARGS="seed=$seed epochs=3 visual_input=linear" \
    bash launch/table4.sh pretrained none
done
for seed in 0 1 2 3 4; do
  mkdir -p "$out/vl_s$seed/vqg"; cp -n "$out"/s0/vqg/features_*.tsv "$out/vl_s$seed/vqg/"
  RECIPE=demo TASKS=vqg OUT="$out/vl_s$seed" REPORT=0 FINETUNE_ARGS="seed=$seed visual_input=vlbert" \
    bash launch/table4.sh pretrained none
done

python "$here/image_control.py" "$out"/s{0,1,2}/vqg/{pretrained,none} --out "$here/image_control"
python "$here/likelihood.py" "$out"/{s,e3_s}{0,1,2}/vqg/{pretrained,none} "$out"/vl_s{0,1,2,3,4}/vqg/{pretrained,none}
runs=()
for init in none pretrained; do runs+=(--vqg "$init=$out/s0/vqg/$init,$out/s1/vqg/$init,$out/s2/vqg/$init"); done
python docs/table4_demo/ablation_rows/report.py "${runs[@]}" --vqg-task "VQG, image only, 1 epoch (the config's budget)" \
  --out "$here/seeds"
runs=()
for init in none pretrained; do runs+=(--vqg "$init=$out/e3_s0/vqg/$init,$out/e3_s1/vqg/$init,$out/e3_s2/vqg/$init"); done
python docs/table4_demo/ablation_rows/report.py "${runs[@]}" --vqg-task "VQG, image only, 3 epochs" --out "$here/e3_seeds"
runs=()
for init in none pretrained; do
  runs+=(--vqg "$init=$out/vl_s0/vqg/$init,$out/vl_s1/vqg/$init,$out/vl_s2/vqg/$init,$out/vl_s3/vqg/$init,$out/vl_s4/vqg/$init")
done
python docs/table4_demo/ablation_rows/report.py "${runs[@]}" \
  --vqg-task "VQG, image only, VL-BERT's own input, 1 epoch (the config's budget)" --out "$here/vl_seeds"
python "$here/image_control.py" "$out"/vl_s{0,1,2,3,4}/vqg/{pretrained,none} --out "$here/vl_image_control"
for d in std_s0 e3_s0 e3_s1 e3_s2 vl_s0 vl_s1 vl_s2 vl_s3 vl_s4; do
  python -m finetune.table4 --runs "$out/$d" --out "$here/$d"
  python "$here/image_control.py" "$out/$d"/vqg/{pretrained,none} --out "$here/$d"
done
