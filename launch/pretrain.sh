#!/usr/bin/env bash
""":"
# VL-BERT pretraining launcher. This file is both a bash script and the Python program each rank runs:
#   bash launch/pretrain.sh [options] [key=value ...]   wraps the deepspeed launcher (this part)
#   deepspeed launch/pretrain.sh [--config F] [...]     each rank runs the Python part below
# With no arguments it runs the embedded demo: builds the demo shards if missing, then pretrains on
# every local GPU or, without GPUs, on 2 CPU processes.
#
# Options (environment in brackets):
#   --config FILE        PretrainConfig YAML [CONFIG]; default launch/configs/demo.yaml
#   --gpus N             processes per node [NUM_GPUS]; default: all local GPUs, or CPU_PROCS (2) on CPU
#   --hostfile FILE      deepspeed hostfile for several nodes [HOSTFILE]
#   --master-addr ADDR   [MASTER_ADDR]      --master-port PORT   [MASTER_PORT, default 29500]
#   --node-rank R        [NODE_RANK] without ssh: start this node's ranks only (run once on every node of the
#                        hostfile, R = its line, 0 = the master's); Kubernetes, SLURM, any scheduler that starts
#                        one command per node. Needs --hostfile and --master-addr.
#   --resume             continue from the newest complete checkpoint
#   --overwrite          replace a previous run in engine.run_dir (a new run refuses one otherwise)
#   --skip-batches S,..  with --resume: drop the batches of these steps (as <run_dir>/nonfinite.jsonl names)
#   key=value            config overrides, e.g. engine.steps=1000 data.caption_batch_size=128
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
cd "$root"
config="${CONFIG:-launch/configs/demo.yaml}"
gpus="${NUM_GPUS:-}"
hostfile="${HOSTFILE:-}"
master_addr="${MASTER_ADDR:-}"
master_port="${MASTER_PORT:-29500}"
node_rank="${NODE_RANK:-}"
passthrough=()
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config="$2"; shift 2 ;;
    --gpus) gpus="$2"; shift 2 ;;
    --hostfile) hostfile="$2"; shift 2 ;;
    --master-addr) master_addr="$2"; shift 2 ;;
    --master-port) master_port="$2"; shift 2 ;;
    --node-rank) node_rank="$2"; shift 2 ;;
    -h|--help) sed -n '3,20p' "$0" | cut -c3-; exit 0 ;;
    *) passthrough+=("$1"); shift ;;
  esac
done
[ -f "$config" ] || { echo "launch/pretrain.sh: config '$config' not found" >&2; exit 2; }
if [ -n "$node_rank" ] && { [ -z "$hostfile" ] || [ -z "$master_addr" ]; }; then
  echo "launch/pretrain.sh: --node-rank starts one node of a hostfile's job: give --hostfile and --master-addr" >&2
  exit 2
fi
command -v deepspeed >/dev/null || { echo "launch/pretrain.sh: 'deepspeed' is not on PATH (pip install -e .)" >&2; exit 2; }
local_gpus="$(python -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
if [ "$local_gpus" = "0" ]; then
  export DS_ACCELERATOR=cpu
  gpus="${gpus:-${CPU_PROCS:-2}}"
else
  gpus="${gpus:-$local_gpus}"
fi
stage_start=$SECONDS
stages=()
stage_done() { stages+=("$1 $((SECONDS - stage_start)) s"); echo "launch/pretrain.sh: $1 took $((SECONDS - stage_start)) s" >&2; stage_start=$SECONDS; }
# what the run needs first (the demo corpus, a detector warm-up, precomputed features), read from the config as the
# run reads it, overrides included (pretrain/prepare.py); a config error stops here, before any of it
prepare="$(python -m pretrain.prepare --config "$config" ${passthrough[@]+"${passthrough[@]}"})"
while read -r step arg out <&3; do
  case "$step" in
    demo)
      python -m shards.demo --out data/demo
      stage_done "demo corpus" ;;
    warmup)
      echo "launch/pretrain.sh: warming up the demo's Fast R-CNN first ($arg)" >&2
      python -m pretrain.detector --config "$arg"
      stage_done "detector warm-up" ;;
    features)
      echo "launch/pretrain.sh: writing the demo's region features first (python -m pretrain.features)" >&2
      python -m pretrain.features --config "$config" --input "$arg" --out "$out"
      stage_done "region features" ;;
  esac
done 3<<< "$prepare"
launcher=(deepspeed --num_gpus "$gpus" --master_port "$master_port")
[ -n "$hostfile" ] && launcher+=(--hostfile "$hostfile")
[ -n "$master_addr" ] && launcher+=(--master_addr "$master_addr")
# without ssh the launcher starts this node's ranks as its own children, as on one node
[ -n "$node_rank" ] && launcher+=(--no_ssh --node_rank "$node_rank")
echo "launch/pretrain.sh: $gpus process(es) per node${DS_ACCELERATOR:+ on CPU}, config $config" >&2
# not exec: the stage times are printed once the ranks are done
source "$here/_signals.sh"
status=0
forward_signals "$([ -n "$hostfile" ] && [ -z "$node_rank" ] && echo direct || echo ranks)" \
  "${launcher[@]}" "$0" --config "$config" ${passthrough[@]+"${passthrough[@]}"} || status=$?
stage_done "pretraining (with its final evaluation)"
echo "launch/pretrain.sh: wall time by stage: $(IFS=,; echo "${stages[*]}" | sed 's/,/, /g'); total $SECONDS s" >&2
exit $status
":"""
# ---- the Python part: one rank of the job, started by the deepspeed launcher ----------------------
import os
import sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(root))
os.chdir(root)
argv = sys.argv[1:]
if not any(a == "--config" or a.startswith("--config=") for a in argv):
    # `deepspeed launch/pretrain.sh` with no config: the embedded demo, as `bash launch/pretrain.sh` runs it
    from shards.demo import ensure_demo

    ensure_demo("data/demo", builder=int(os.environ.get("LOCAL_RANK", 0)) == 0)
    argv = ["--config", "launch/configs/demo.yaml", *argv]
from pretrain.run import main  # noqa: E402
from train.engine import entry_point  # noqa: E402

# entry_point: a config error is one line, and a rank that fails exits at once (the launcher then ends the job)
sys.exit(entry_point(lambda: main(argv)))
