#!/usr/bin/env bash
# Session 33, one device call (issue: grounding): demo_long's CNN LR multiplier with matched controls on one draw.
# One GPU warm-up, then five runs side by side on the same seeds and batches: the CNN at 0.1 and at 0.03 of the LR,
# each with its matched control (masking.ablate_image=true), and at 0.01 (demo_long.yaml's value) without one
# (session 32 ran its control on another draw). One rank each, 8 + 8 per step (the CPU runs' global batch,
# 2 ranks x (4 + 4)), fp32 as the CPU recipe. Then the cross-modal diagnostic (all held-out phrases; colour words
# only for the pairs) on each export.
# Ran from the repository root as `bash docs/grounding_demo/gpu_s33/run.sh` with .dev carried (built by
# docs/grounding_demo/gpu_s32/prepare_carry.sh).
# Other runs: RUNS="name=multiplier[:ablate|:shuffle] ..." (a multiplier of 0 freezes the CNN; since session 35 an
# :ablate control's CNN is frozen whatever its multiplier, masking.ablate_image_cnn_lr; :shuffle is the
# shuffled-image control, masking.shuffle_images), SHED_RUN (stopped if the others
# fall behind; empty: none), COLOUR_RUNS. Session 33's next check, the 0.1 model against a control with its CNN frozen:
#   RUNS="m01=0.1 m01_control_frozen=0:ablate m001=0.01 m001_control=0.01:ablate" SHED_RUN= \
#   COLOUR_RUNS="m01 m01_control_frozen m001 m001_control" bash docs/grounding_demo/gpu_s33/run.sh
# (run in session 35). Session 35's next check, the 0.1 model against the shuffled-image control and the frozen grey one:
#   RUNS="m01=0.1 m01_shuffled=0.1:shuffle m01_control=0.1:ablate" SHED_RUN= \
#   COLOUR_RUNS="m01 m01_shuffled m01_control" bash docs/grounding_demo/gpu_s33/run.sh
# (since session 36 the shuffled control pairs across its length pool, and every export also gets other_image)
# Rehearsal on a CPU: SKIP_SETUP=1 WARMUP_EXTRA="epochs=0.02" TRAIN_EXTRA="engine.steps=4 engine.eval_every=2" \
#   DIAG_EXTRA=max_examples=20 DEADLINE_TRAIN=3000 DEADLINE_DIAG=3600 bash docs/grounding_demo/gpu_s33/run.sh
set -u
T0=$SECONDS
OUT="${OUT:-/tmp/out_s33}"; mkdir -p "$OUT"
DEADLINE_TRAIN="${DEADLINE_TRAIN:-470}"   # seconds after start: runs still going are stopped then
DEADLINE_DIAG="${DEADLINE_DIAG:-585}"
SHED_AT="${SHED_AT:-300}"                 # SHED_RUN is stopped then if another run is under SHED_STEP
SHED_STEP="${SHED_STEP:-1050}"
# each run: name=multiplier (the CNN's LR multiplier), ":ablate" for a matched control; the default is session 33's
RUNS="${RUNS:-m01=0.1 m01_control=0.1:ablate m003=0.03 m003_control=0.03:ablate m001=0.01}"
SHED_RUN="${SHED_RUN-m001}"
COLOUR_RUNS="${COLOUR_RUNS-m01 m01_control m003 m003_control}"   # also diagnosed on colour words alone
names=()
for r in $RUNS; do names+=("${r%%=*}"); done
snap() {
  # what comes back even if the call is cut off: logs, eval.jsonl, grounding tables, drift, diagnostics
  local files
  files=$(ls -d runs/*.log runs/long_*/eval.jsonl runs/long_*/grounding runs/long_*/detector_drift.json \
    runs/long_*/run_info.json runs/detector-demo-long/*.json runs/v4l_* 2>/dev/null)
  [ -n "$files" ] && tar czf "$OUT/.r.tgz" $files 2>/dev/null && mv "$OUT/.r.tgz" "$OUT/results.tgz"
}
LOG_TAG=s33
# shellcheck source=docs/grounding_demo/gpu_s33/device_setup.sh
source docs/grounding_demo/gpu_s33/device_setup.sh
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
declare -A pid
launch() {  # name port multiplier extra...: started in this shell (not a subshell), so that `wait` can reap it
  local name=$1 port=$2 mult=$3; shift 3
  # shellcheck disable=SC2086
  MASTER_PORT=$port bash launch/pretrain.sh "${common[@]}" engine.run_dir="runs/long_$name" \
    "optim.lr_multipliers={\"fast_rcnn.\":$mult}" "$@" ${TRAIN_EXTRA:-} > "runs/long_$name.log" 2>&1 &
  pid[$name]=$!
}
port=29511
for r in $RUNS; do
  spec=${r#*=}
  extra=()
  case "$spec" in
    *:ablate) extra=(masking.ablate_image=true) ;;
    *:shuffle) extra=(masking.shuffle_images=true) ;;
  esac
  launch "${r%%=*}" $port "${spec%%:*}" "${extra[@]}"
  port=$((port + 1))
done
log "${#names[@]} runs started"
step_of() { tr '\r' '\n' < "runs/long_$1.log" | grep -oE '[0-9]+/[0-9]+ \[' | tail -1 | cut -d/ -f1; }
alive() { local n; for n in "${names[@]}"; do kill -0 "${pid[$n]}" 2>/dev/null && return 0; done; return 1; }
shed=
while alive; do
  sleep 10
  if [ $((SECONDS - T0)) -gt "$DEADLINE_TRAIN" ]; then
    log "training deadline: stopping what is left"
    for n in "${names[@]}"; do kill -TERM "${pid[$n]}" 2>/dev/null; done; sleep 15
    pkill -KILL -f launch/pretrain.sh; break
  fi
  if [ -z "$shed" ] && [ -n "$SHED_RUN" ] && [ $((SECONDS - T0)) -gt "$SHED_AT" ]; then
    shed=checked
    for n in "${names[@]}"; do
      [ "$n" = "$SHED_RUN" ] && continue
      s=$(step_of "$n"); if [ "${s:-0}" -lt "$SHED_STEP" ] && kill -0 "${pid[$n]}" 2>/dev/null; then shed=yes; fi
    done
    [ "$shed" = yes ] && { log "behind pace: stopping $SHED_RUN"; kill -TERM "${pid[$SHED_RUN]}"; }
  fi
  [ $(((SECONDS - T0) % 60)) -lt 10 ] && log "steps: $(for n in "${names[@]}"; do echo -n "$n $(step_of $n)  "; done)"
done
for n in "${names[@]}"; do wait "${pid[$n]}"; echo "$n rc $?"; done
log "training done"
for n in "${names[@]}"; do
  echo "== $n"; grep -E "wall time by stage|detector drift|grounding on" "runs/long_$n.log"
done
snap

diags=()
diag() {  # name export extra...
  local name=$1 model=$2; shift 2
  [ -f "$model/model.safetensors" ] || { log "no export $model"; return; }
  # shellcheck disable=SC2086
  timeout $((DEADLINE_DIAG - (SECONDS - T0))) python3 -m diagnostics.ablation --config launch/configs/heldout_demo.yaml \
    --model "$name=$model" --out "runs/v4l_$name" batch_size=64 "$@" ${DIAG_EXTRA:-} > "runs/v4l_$name.log" 2>&1 &
  diags+=($!)
}
# the full diagnostics first, alone: in the session-33 call all nine ran side by side at ~4.8 s a batch and the five
# full ones were stopped by the deadline at batch 35-37 of 37 (only the colour-word ones wrote their results)
for n in "${names[@]}"; do diag "$n" "runs/long_$n/export"; done
for p in "${diags[@]}"; do wait "$p"; done
log "full diagnostics done"
snap
# session 36: the other_image condition (the phrase shown the next image of its batch), the null of a control that
# pretrained on real images (the shuffled one), beside all, on every export; control_leak.py takes any condition
diags=()
for n in "${names[@]}"; do
  [ -f "runs/long_$n/export/model.safetensors" ] || continue
  timeout $((DEADLINE_DIAG - (SECONDS - T0))) python3 docs/grounding_demo/control_leak.py --model "$n=runs/long_$n/export" \
    --variants live --conditions none,other_image,all --out "runs/v4l_${n}_other/other_image.md" batch_size=64 \
    ${DIAG_EXTRA:-} > "runs/v4l_${n}_other.log" 2>&1 &
  diags+=($!)
done
for p in "${diags[@]}"; do wait "$p"; done
log "other_image done"
grep -h "other_image\|all " runs/v4l_*_other.log
snap
diags=()
for n in $COLOUR_RUNS; do diag "${n}_colour" "runs/long_$n/export" phrase_words=colour sweep=[]; done
for p in "${diags[@]}"; do wait "$p"; done
log "diagnostics done"
grep -h "vision-for-language" runs/v4l_*.log
kill $snapper 2>/dev/null
snap
ls -la "$OUT"
log "end"
