# Shared by launch/finetune_{vqa,vcr,refcoco,retrieval}.sh (sourced, not run): one training/evaluation process per
# GPU through the deepspeed launcher, or one process on CPU.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$(dirname "$here")"
gpus="${NUM_GPUS:-$(python -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)}"

# The demo configs read data/demo and start from the demo pretraining export: build the corpus if it is
# missing, and without an export start from the packaged BERT (vision layers new) and say so.
need_config() {
  [ -f "$1" ] || { echo "launch: config '$1' not found" >&2; exit 2; }
}

demo_init() {  # config, then the user's overrides -> extra overrides on stdout
  local config="$1"; shift
  local own_init=0 arg
  for arg in "$@"; do case "$arg" in backbone.init=*) own_init=1 ;; esac; done
  if grep -q "data/demo" "$config"; then
    python -m shards.demo --out data/demo >&2
    if [ "$own_init" = 0 ] && grep -q "init: runs/demo/export" "$config" && [ ! -f runs/demo/export/model.safetensors ]; then
      echo "launch: runs/demo/export not found (bash launch/pretrain.sh makes it); starting from the packaged" \
           "BERT with a new detector" >&2
      echo "backbone.init=packaged"
    fi
  fi
}

task_setup() {  # default config, default runs folder, then the user's overrides -> sets config, runs and extra
  config="${CONFIG:-$1}"
  runs="${RUNS:-$2}"
  shift 2
  need_config "$config"
  mapfile -t extra < <(demo_init "$config" "$@")
}

source "$here/_signals.sh"

run_module() {  # module, then its arguments; SIGTERM/SIGINT reach the training processes (_signals.sh)
  local module="$1"; shift
  if [ "$gpus" -gt 0 ]; then
    # MASTER_PORT: two finetunes on one node (e.g. launch/table4.sh's tasks side by side on one GPU) need two ports
    forward_signals ranks deepspeed --num_gpus "$gpus" --master_port "${MASTER_PORT:-29500}" --module "$module" "$@"
  else
    forward_signals direct python -m "$module" "$@"
  fi
}
