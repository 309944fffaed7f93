#!/usr/bin/env bash
# VCR finetuning (VL-BERT 4.2.1): a Q->A run and a QA->R run, then Q->AR from their predictions.
#   bash launch/finetune_vcr.sh [key=value ...]
# Environment: CONFIG (default launch/configs/vcr_demo.yaml; the paper's: vcr_paper.yaml), RUNS (default
#   runs/vcr), SUBTASKS (default "qa qar"; one alone skips Q->AR), NUM_GPUS (default: all local GPUs; on CPU one
#   process).
#   QA->R on the demo config: 1.5 epochs unless epochs= is given.
# Outputs: $RUNS/qa and $RUNS/qar (metrics, predictions, model/, tb/), $RUNS/q2ar_<split>.json.
source "$(dirname "${BASH_SOURCE[0]}")/_finetune.sh"
case "${1:-}" in -h|--help) sed -n '2,7p' "$0" | cut -c3-; exit 0 ;; esac
split=val
for arg in "$@"; do case "$arg" in eval_split=*) split="${arg#eval_split=}" ;; esac; done
task_setup launch/configs/vcr_demo.yaml runs/vcr "$@"
subtasks="${SUBTASKS:-qa qar}"  # one alone (SUBTASKS=qa) runs it without the Q->AR step
# QA->R's sequences (question, answer, rationale) cost a third more a step than Q->A's: on the demo config it takes 1.5
# epochs, not 2, to stay under 10 minutes on 2 cores (its training loss flat from step ~210 of 422; docs/FINETUNE.md,
# session 70). An epochs= of the user's comes later and wins.
subtask_default() {
  if [ "$1" = qar ] && [ "$config" = launch/configs/vcr_demo.yaml ]; then echo "epochs=1.5"; fi
}
for subtask in $subtasks; do
  # shellcheck disable=SC2046
  run_module finetune.vcr --config "$config" subtask="$subtask" engine.run_dir="$runs/$subtask" \
    $(subtask_default "$subtask") ${extra[@]+"${extra[@]}"} "$@"
done
[ "$subtasks" = "qa qar" ] || exit 0
python -m finetune.vcr --combine "$runs/qa/predictions_$split.json" "$runs/qar/predictions_$split.json" \
  --out "$runs/q2ar_$split.json"
