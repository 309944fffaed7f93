#!/usr/bin/env bash
# Session 32, one device call: demo_long (the grounded recipe) with the CNN at 0.01 of the LR and its matched
# control (masking.ablate_image=true), plus demo_long at 0.1 (the config's value) on the same seeds and batches:
# one GPU, one rank each, 8 + 8 per step (the CPU runs' global batch, 2 ranks x (4 + 4)), fp32 as the CPU recipe.
# Then the cross-modal diagnostic (all held-out phrases; colour words only) on each export.
# Ran from the repository root as `bash .dev/gpu_s32.sh` with .dev carried: .dev/whl (DeepSpeed 0.19.8 built
# here with DS_BUILD_OPS=0, webdataset, braceexpand, hjson, pydantic and its needs, for the device's Python 3.12),
# .dev/minilm (the packaged MiniLM, weights in fp16) and restore_minilm.py (beside this file).
# Rehearsal on a CPU: WARMUP_EXTRA="epochs=0.02" TRAIN_EXTRA="engine.steps=4 engine.eval_every=2" DIAG_EXTRA=max_examples=20
set -u
T0=$SECONDS
OUT="${OUT:-/tmp/out_s32}"; mkdir -p "$OUT"
DEADLINE_TRAIN="${DEADLINE_TRAIN:-455}"   # seconds after start: runs still going are stopped then
DEADLINE_DIAG="${DEADLINE_DIAG:-560}"
log() { echo "[s32 $((SECONDS - T0)) s] $*"; }
snap() {
  # what comes back even if the call is cut off: logs, eval.jsonl, grounding tables, drift, diagnostics
  local files
  files=$(ls -d runs/*.log runs/long_*/eval.jsonl runs/long_*/grounding runs/long_*/detector_drift.json \
    runs/long_*/run_info.json runs/detector-demo-long/*.json runs/v4l_* 2>/dev/null)
  [ -n "$files" ] && tar czf "$OUT/.r.tgz" $files 2>/dev/null && mv "$OUT/.r.tgz" "$OUT/results.tgz"
}
export PYTHONUNBUFFERED=1
if [ -z "${SKIP_SETUP:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/whl/*.whl \
    || { log "pip install failed"; exit 3; }
  python3 .dev/restore_minilm.py /tmp/site || exit 3
  export PYTHONPATH="/tmp/site:$PWD" PATH="/tmp/site/bin:$PATH"
fi
python3 -c "import torch; print(torch.cuda.is_available())" | grep -q True && export DS_ACCELERATOR=cuda
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv 2>/dev/null
python3 -c "
import torch, torchvision, transformers, deepspeed, webdataset, sys
print(sys.version.split()[0], torch.__version__, torchvision.__version__, transformers.__version__, deepspeed.__version__,
      torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')
import pretrain.run, diagnostics.ablation, pretrain.detector
from shards.tokenizer import load_tokenizer
print(load_tokenizer(None).tokenize('a red hexagon'))" || { log "import check failed"; exit 3; }
log "setup done"
mkdir -p runs
( while sleep 20; do snap; done ) &
snapper=$!

python3 -m shards.demo --out data/demo > runs/corpus.log 2>&1 || { log "corpus failed"; tail -20 runs/corpus.log; snap; exit 4; }
log "corpus done"
# shellcheck disable=SC2086
python3 -m pretrain.detector --config launch/configs/detector_demo_long.yaml ${WARMUP_EXTRA:-} > runs/warmup.log 2>&1 \
  || { log "warm-up failed"; tail -30 runs/warmup.log; snap; exit 4; }
log "warm-up done: $(grep -i "held-out\|accuracy" runs/warmup.log | tail -2 | tr '\n' ' ')"

common=(--config launch/configs/demo_long.yaml data.caption_batch_size=8 data.text_batch_size=8
        engine.eval_every=160 engine.checkpoint_every=400 engine.precision=fp32)
launch() {  # name port extra...: started in this shell (not a subshell), so that `wait` can reap it
  local name=$1 port=$2; shift 2
  # shellcheck disable=SC2086
  MASTER_PORT=$port bash launch/pretrain.sh "${common[@]}" engine.run_dir="runs/$name" "$@" ${TRAIN_EXTRA:-} \
    > "runs/$name.log" 2>&1 &
}
launch long_m001 29511 'optim.lr_multipliers={"fast_rcnn.":0.01}'; p1=$!
launch long_m001_control 29512 'optim.lr_multipliers={"fast_rcnn.":0.01}' masking.ablate_image=true; p2=$!
launch long_m01 29513; p3=$!
log "3 runs started"
while kill -0 $p1 2>/dev/null || kill -0 $p2 2>/dev/null || kill -0 $p3 2>/dev/null; do
  sleep 10
  if [ $((SECONDS - T0)) -gt "$DEADLINE_TRAIN" ]; then
    log "training deadline: stopping what is left"; kill -TERM $p1 $p2 $p3 2>/dev/null; sleep 15
    pkill -KILL -f launch/pretrain.sh; break
  fi
  [ $(((SECONDS - T0) % 60)) -lt 10 ] && log "steps: $(for n in long_m001 long_m001_control long_m01; do
    tr '\r' '\n' < runs/$n.log | grep -oE '[0-9]+/[0-9]+ \[' | tail -1 | tr '\n[' '  '; done)"
done
for p in $p1 $p2 $p3; do wait $p; echo "rc $?"; done
log "training done"
for n in long_m001 long_m001_control long_m01; do
  grep -E "wall time by stage|detector drift|grounding on" runs/$n.log
done
snap

diag() {  # name export extra...
  local name=$1 model=$2; shift 2
  [ -f "$model/model.safetensors" ] || { log "no export $model"; return; }
  # shellcheck disable=SC2086
  timeout $((DEADLINE_DIAG - (SECONDS - T0))) python3 -m diagnostics.ablation --config launch/configs/heldout_demo.yaml \
    --model "$name=$model" --out "runs/v4l_$name" batch_size=64 "$@" ${DIAG_EXTRA:-} > "runs/v4l_$name.log" 2>&1 &
  diags+=($!)
}
diags=()
diag m001 runs/long_m001/export
diag control runs/long_m001_control/export
diag m01 runs/long_m01/export
diag m001_colour runs/long_m001/export phrase_words=colour sweep=[]
diag control_colour runs/long_m001_control/export phrase_words=colour sweep=[]
for p in "${diags[@]}"; do wait "$p"; done
log "diagnostics done"
grep -h "vision-for-language" runs/v4l_*.log
kill $snapper 2>/dev/null
snap
ls -la "$OUT"
log "end"
