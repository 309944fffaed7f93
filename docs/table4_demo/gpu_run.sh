#!/usr/bin/env bash
# VL-BERT's Table 4 at demo scale on one GPU (issue: downstream proof), all four rows of launch/table4.sh side by side:
# one stream per pretraining (pretrained = demo_long, none = its step 0, no_mrc, no_text), each pretraining at the
# CPU recipe's global batch (one rank of 8 + 8) and then finetuning every task from its export with the launchers'
# defaults. Resumable: a second call on the same (warm) machine skips the exports and finetunes already done, so
# the work can span two device calls. Ends (when every stream is done) with `python -m finetune.table4`.
#   bash docs/table4_demo/gpu_run.sh         # from the repository root, .dev carried (gpu_s32/prepare_carry.sh)
# DEADLINE (seconds, default 580): streams still going are stopped then and the call returns what is done.
# Rehearsal on a CPU: SKIP_SETUP=1 WARMUP_EXTRA="epochs=0.02" PRETRAIN_EXTRA="engine.steps=4 grounding=null
#   detector_drift=null" FINETUNE_ARGS="epochs=0.005" TASKS="vqa vcr_qa" DEADLINE=3000 bash docs/table4_demo/gpu_run.sh
set -u
T0=$SECONDS
OUT_DIR="${OUT:-/tmp/out_table4}"; mkdir -p "$OUT_DIR"
DEADLINE="${DEADLINE:-580}"
LOG_TAG=table4
# shellcheck source=docs/grounding_demo/gpu_s33/device_setup.sh
source docs/grounding_demo/gpu_s33/device_setup.sh
runs_out=runs/table4_gpu
snap() {  # metrics, per-example predictions, logs and the report: what comes back even if the call is cut off
  local files
  files=$(ls -d runs/table4_*.log runs/demo_long*/eval.jsonl runs/demo_long*/grounding "$runs_out"/report \
    "$runs_out"/*/*/metrics_*.json "$runs_out"/*/*/predictions_*.json "$runs_out"/*/*/results_*.json \
    "$runs_out"/*/*/run.json 2>/dev/null)
  [ -n "$files" ] && tar czf "$OUT_DIR/.r.tgz" $files 2>/dev/null && mv "$OUT_DIR/.r.tgz" "$OUT_DIR/results.tgz"
}
mkdir -p runs
( while sleep 30; do snap; done ) &
snapper=$!
python3 -m shards.demo --out data/demo > runs/table4_corpus.log 2>&1 || { log "corpus failed"; exit 4; }
if [ ! -f runs/detector-demo-long/fast_rcnn.pt ]; then
  # shellcheck disable=SC2086
  python3 -m pretrain.detector --config launch/configs/detector_demo_long.yaml ${WARMUP_EXTRA:-} \
    > runs/table4_warmup.log 2>&1 || { log "warm-up failed"; tail -30 runs/table4_warmup.log; exit 4; }
fi
log "corpus and warm-up ready"
export PRETRAIN_ARGS="data.caption_batch_size=8 data.text_batch_size=8 engine.eval_every=400 engine.checkpoint_every=400
  engine.precision=fp32 ${PRETRAIN_EXTRA:-}"
# the tasks it was sized for: VQG (launch/table4.sh's default since session 40) needs java to score, and time
export TASKS="${TASKS:-vqa refcoco_gt refcoco_detected vcr_qa vcr_qar}"
declare -A pid
port=29611
for init in pretrained none no_mrc no_text; do
  REPORT=0 MASTER_PORT=$port OUT="$runs_out" bash launch/table4.sh "$init" > "runs/table4_$init.log" 2>&1 &
  pid[$init]=$!
  port=$((port + 1))
done
log "4 streams started"
alive() { local i; for i in "${!pid[@]}"; do kill -0 "${pid[$i]}" 2>/dev/null && return 0; done; return 1; }
while alive; do
  sleep 10
  if [ $((SECONDS - T0)) -gt "$DEADLINE" ]; then
    log "deadline: stopping the streams still going (a second call goes on from here)"
    for i in "${!pid[@]}"; do kill -TERM "${pid[$i]}" 2>/dev/null; done; sleep 10
    pkill -KILL -f launch/table4.sh; pkill -KILL -f "finetune\.|pretrain\.run"; break
  fi
  [ $(((SECONDS - T0) % 60)) -lt 10 ] && log "done: $(ls "$runs_out"/*/*/metrics_*.json 2>/dev/null | wc -l) finetunes"
done
for i in "${!pid[@]}"; do wait "${pid[$i]}"; echo "$i rc $?"; done
log "streams ended: $(ls "$runs_out"/*/*/metrics_*.json 2>/dev/null | wc -l) finetunes done"
# the streams write no report (REPORT=0): one here, over all four
python3 -m finetune.table4 --runs "$runs_out" > runs/table4_report.log 2>&1 && tail -25 runs/table4_report.log
kill $snapper 2>/dev/null
snap
ls -la "$OUT_DIR"
log "end"
