#!/usr/bin/env bash
# Session 33, device call 2 (issue: scale out, item 4 on a GPU): bench.gpu_step with the Engine's loops timed in the
# same interleaved repeats as the plain loop, at the paper's e2e shapes, base and large: DeepSpeed's bf16 mode at
# ZeRO 2 (the pretraining configs') and bf16_autocast (fp32 weights under autocast; ZeRO 2 on one rank runs as 0).
# Not run yet: session 33's device time went to call 1 (the machine was released before a second call). Run as
# `bash docs/grounding_demo/gpu_s33/bench.sh` with .dev carried; the bench itself was checked on a CPU at a tiny preset.
set -u
OUT="${OUT:-/tmp/out_s33b}"; mkdir -p "$OUT"
LOG_TAG=bench
# shellcheck source=docs/grounding_demo/gpu_s33/device_setup.sh
source docs/grounding_demo/gpu_s33/device_setup.sh
# shellcheck disable=SC2086
python3 -m bench.gpu_step --sizes ${SIZES:-base large} --steps "${STEPS:-6}" --repeats "${REPEATS:-5}" \
  --engine-stages 2 --engine-precisions bf16 bf16_autocast --tokenizer .dev/tok --out "$OUT/gpu_step_s33.json" \
  ${BENCH_EXTRA:-} > "$OUT/bench.log" 2>&1
echo "rc $?"
tail -c 3000 "$OUT/bench.log"
