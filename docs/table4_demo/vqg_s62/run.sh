#!/usr/bin/env bash
# Table 4's VQG column from the quick start's default since session 61 (runs/demo/export) against its step 0
# (runs/demo_step0/export): BERT-gen from the image alone on VL-BERT's own input (visual_input=vlbert, the launcher's
# default; docs/FINETUNE.md session 41), the config's budget (1 epoch), finetuning seeds SEEDS (default "0 1 2");
# then the decoding-free image information (docs/table4_demo/vqg/likelihood.py), the rows over seeds and the image
# control, reports under docs/table4_demo/vqg_s62/.
#   bash docs/table4_demo/vqg_s62/run.sh       OUT (default runs/vqg_s62), REPORT (default this folder; session 91:
#                                              docs/table4_demo/vqg_s91 from runs/demo -> the session-90 default),
#                                              LABEL (the report's task line)
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-runs/vqg_s62}"
here="${REPORT:-docs/table4_demo/vqg_s62}"
label=${LABEL:-"VQG, image only, VL-BERT's own input, 1 epoch, the session-61 default"}
seeds=(${SEEDS:-0 1 2})
for seed in "${seeds[@]}"; do
  if [ "$seed" != "${seeds[0]}" ]; then  # the same detectors' features: extracted once
    mkdir -p "$out/vl_s$seed/vqg"; cp -n "$out/vl_s${seeds[0]}"/vqg/features_*.tsv "$out/vl_s$seed/vqg/"
  fi
  RECIPE=demo TASKS=vqg OUT="$out/vl_s$seed" REPORT=0 FINETUNE_ARGS="seed=$seed visual_input=vlbert" \
    bash launch/table4.sh pretrained none
done
runs=(); controls=()
for seed in "${seeds[@]}"; do controls+=("$out/vl_s$seed/vqg/pretrained" "$out/vl_s$seed/vqg/none"); done
python docs/table4_demo/vqg/likelihood.py "${controls[@]}"
for init in none pretrained; do
  list=""; for seed in "${seeds[@]}"; do list="$list${list:+,}$out/vl_s$seed/vqg/$init"; done
  runs+=(--vqg "$init=$list")
done
python docs/table4_demo/ablation_rows/report.py "${runs[@]}" \
  --vqg-task "$label" --out "$here/vl_seeds"
python docs/table4_demo/vqg/image_control.py "${controls[@]}" --out "$here/vl_image_control"
