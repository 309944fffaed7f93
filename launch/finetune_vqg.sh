#!/usr/bin/env bash
# BERT-gen visual question generation: the three-step protocol and its ablations, one command each.
#   bash launch/finetune_vqg.sh [STEP ...] [key=value ...]
# STEP: step1          caption only, from BERT (the config's `init`)
#       step2          image only, from step 1, every BERT weight frozen: only W trains
#       step2_unfreeze image only, from step 1, everything trains
#       step3          image + caption, BERT from step 1 and W from step 2, everything trains
#       step3_scratch  image + caption, from BERT with a random W
#       custom         one run with the key=value settings alone (launch/table4.sh: inputs=image init=<export>)
#       report         table of every finished step, Xsim plot (with a random-weights transformer)
#       all            (default) every step in order, then the report
# --overwrite / --resume: passed to every run (a run directory holding another run is refused otherwise).
# Environment: CONFIG (default launch/configs/vqg_demo.yaml), RUNS (default runs/vqg),
#   NUM_GPUS (default: all local GPUs; on CPU one process), MASTER_PORT (default 29500).
#   DETECTOR: a VL-BERT export whose Fast R-CNN gives the region features, FEATURES: where they go (both or
#   neither; every step then reads them: data.features).
# With the demo config, the demo corpus and its region features (our Fast R-CNN: DETECTOR's, else the demo
# pretraining run's if runs/demo/export exists, else an untrained seeded ResNet-18) are built first if missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$(dirname "$here")"
config="${CONFIG:-launch/configs/vqg_demo.yaml}"
runs="${RUNS:-runs/vqg}"
steps=()
overrides=()
flags=()
for arg in "$@"; do
  case "$arg" in
    -h|--help) sed -n '2,18p' "$0" | cut -c3-; exit 0 ;;
    step1|step2|step2_unfreeze|step3|step3_scratch|custom|report) steps+=("$arg") ;;
    --overwrite|--resume) flags+=("$arg") ;;
    all) steps+=(step1 step2 step2_unfreeze step3 step3_scratch report) ;;
    *=*) overrides+=("$arg") ;;
    *) echo "launch/finetune_vqg.sh: unknown step '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#steps[@]} -gt 0 ] || steps=(step1 step2 step2_unfreeze step3 step3_scratch report)
[ -f "$config" ] || { echo "launch/finetune_vqg.sh: config '$config' not found" >&2; exit 2; }
features="data/demo/vqg_features.tsv"
if [ -n "${DETECTOR:-}${FEATURES:-}" ]; then
  [ -n "${DETECTOR:-}" ] && [ -n "${FEATURES:-}" ] || {
    echo "launch/finetune_vqg.sh: DETECTOR and FEATURES go together (the export, and where its features go)" >&2; exit 2; }
  [ -f "$DETECTOR/model.safetensors" ] || { echo "launch/finetune_vqg.sh: DETECTOR '$DETECTOR' is not an export" >&2; exit 2; }
  features="$FEATURES"
  overrides+=("data.features=$features")
fi

needs_features=0  # step 1 reads captions only: it does not wait for the region features
for step in "${steps[@]}"; do [ "$step" = step1 ] || needs_features=1; done
if grep -q "data/demo/vqg_features.tsv" "$config"; then
  python -m shards.demo --out data/demo
  if [ "$needs_features" = 1 ] && [ ! -s "$features" ]; then
    python - <<'PY' > data/demo/vqg_images.txt
import csv, glob
for path in sorted(glob.glob("data/demo/raw/vqg/coco_*_all.csv")):
    for row in csv.DictReader(open(path)):
        print(row["image_url"])
PY
    detector=(--backbone resnet18)
    [ -f runs/demo/export/model.safetensors ] && detector=(--model runs/demo/export)
    [ -n "${DETECTOR:-}" ] && detector=(--model "$DETECTOR")
    mkdir -p "$(dirname "$features")"
    part="$features.part.$$"  # this process' own: a second launcher does not truncate it
    python -m finetune.vqg_features --image-root data/demo/raw --boxes data/demo/raw/boxes.jsonl \
      --images data/demo/vqg_images.txt --out "$part" \
      --short-side 128 --long-side 192 --batch-size 16 "${detector[@]}"
    mv "$part" "$features"
  fi
fi

source "$(dirname "${BASH_SOURCE[0]}")/_signals.sh"  # SIGTERM/SIGINT reach the training processes
gpus="${NUM_GPUS:-$(python -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)}"
run_step() {  # name, then key=value settings of that step
  local name="$1"; shift
  echo "== $name ==" >&2
  if [ "$gpus" -gt 0 ]; then
    # MASTER_PORT: launchers side by side on one node (launch/table4.sh's rows on one GPU) need a port each
    forward_signals ranks deepspeed --num_gpus "$gpus" --master_port "${MASTER_PORT:-29500}" --module finetune.vqg \
      --config "$config" \
      ${flags[@]+"${flags[@]}"} step="$name" \
      engine.run_dir="$runs/$name" "$@" ${overrides[@]+"${overrides[@]}"}
  else
    forward_signals direct python -m finetune.vqg --config "$config" ${flags[@]+"${flags[@]}"} step="$name" \
      engine.run_dir="$runs/$name" \
      "$@" ${overrides[@]+"${overrides[@]}"}
  fi
}
need() { [ -f "$runs/$1/model/model.safetensors" ] || { echo "launch/finetune_vqg.sh: $2 needs $1 first ($runs/$1/model)" >&2; exit 2; }; }
for step in "${steps[@]}"; do
  case "$step" in
    step1) run_step step1 inputs=caption ;;
    step2) need step1 step2; run_step step2 inputs=image init="$runs/step1/model" train_only_projection=true ;;
    step2_unfreeze) need step1 step2_unfreeze; run_step step2_unfreeze inputs=image init="$runs/step1/model" ;;
    step3) need step1 step3; need step2 step3
           run_step step3 inputs=both init="$runs/step1/model" init_projection="$runs/step2/model" ;;
    step3_scratch) run_step step3_scratch inputs=both ;;
    custom) run_step custom ;;
    report) python -m finetune.vqg_report --config "$config" --runs "$runs" ${overrides[@]+"${overrides[@]}"} ;;
  esac
done
