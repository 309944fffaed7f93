#!/usr/bin/env bash
# VL-BERT's Table 4 at demo scale: each downstream task finetuned, with one budget, from
#   pretrained  runs/demo_long/export          launch/configs/demo_long.yaml (the grounded recipe)
#   none        runs/demo_long_step0/export    the same model at step 0: packaged BERT + the warmed-up
#                                              detector, no visual-linguistic pretraining
#   no_mrc      runs/demo_long_nomrc/export    demo_long without masked RoI classification (no region hidden, no
#                                              MRC head: the paper's Table 4 setting (a), with the text corpus)
#   no_text     runs/demo_long_notext/export   demo_long without the text-only corpus (captions only: setting (b))
# A missing pretraining is run first (demo_long: ~70 min on 2 CPU cores; step 0: ~2 min).
# RECIPE=demo: the same rows from the quick start's recipe instead (launch/configs/demo.yaml: runs/demo, runs/demo_step0,
#   runs/demo_nomrc, runs/demo_notext; the quick start's pretraining ~15 min on 2 CPU cores).
#   bash launch/table4.sh [init ...]            default: all four
# Environment: TASKS (default "vqa refcoco_gt refcoco_detected vcr_qa vcr_qar vqg"), OUT (default runs/table4): the
#   finetune runs go to $OUT/<task>/<init>; each writes metrics_<split>.json and its per-example predictions beside
#   it. FINETUNE_ARGS: overrides for every finetune run (the same budget for all, e.g. "epochs=0.5"); each task's
#   own budget is its launcher's default (launch/configs/<task>_demo.yaml: the frozen detector, <= 10 min).
#   vqg: BERT-gen (launch/finetune_vqg.sh) on the export's own visual input (visual_input=vlbert: its visual
#   embedding, region words and word-region alignment; FINETUNE_ARGS="visual_input=linear" for the paper's fresh W
#   over the features instead) and questions from the image alone (the demo's captions name every shape and colour,
#   so with them a model need not look); region features from the export's own Fast R-CNN, extracted once to
#   $OUT/vqg/features_<init>.tsv.
#   PRETRAIN_ONLY=1: make the rows' missing exports and stop (scripts with their own finetune layout, session 79).
#   PRETRAIN_ARGS: overrides for every pretraining run (on one GPU "data.caption_batch_size=8 data.text_batch_size=8":
#   the CPU recipe's global batch of 2 ranks x (4 + 4)). MASTER_PORT: a port of its own per instance side by side.
# Ends with `python -m finetune.table4`: the table with 95% intervals by image, the paired differences from
#   `none`, and the plot, under $OUT/report.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-runs/table4}"
tasks="${TASKS:-vqa refcoco_gt refcoco_detected vcr_qa vcr_qar vqg}"
inits=("$@")
[ ${#inits[@]} -gt 0 ] || inits=(pretrained none no_mrc no_text)

recipe="${RECIPE:-demo_long}"
case "$recipe" in
  demo|demo_long) ;;
  *) echo "launch/table4.sh: RECIPE '$recipe' is not demo or demo_long" >&2; exit 2 ;;
esac

run_dir() {
  case "$1" in
    pretrained) echo "runs/$recipe" ;;
    none) echo "runs/${recipe}_step0" ;;
    no_mrc) echo "runs/${recipe}_nomrc" ;;
    no_text) echo "runs/${recipe}_notext" ;;
    *) echo "launch/table4.sh: unknown init '$1' (pretrained, none, no_mrc, no_text)" >&2; exit 2 ;;
  esac
}

pretrain_overrides() {
  case "$1" in
    pretrained) ;;
    # one step at learning rate 0: the export is the model as pretraining starts it (the export needs a
    # checkpoint; the step moves only the appearance standardiser's statistics). Its grounding: the text prior
    none) echo "engine.steps=1 optim.lr=0 optim.warmup_steps=0 grounding=null detector_drift=null" ;;
    no_mrc) echo "losses.mrc_weight=0" ;;
    no_text) echo "data.text_batch_size=0" ;;
  esac
}

for init in "${inits[@]}"; do
  dir="$(run_dir "$init")"
  if [ ! -f "$dir/export/model.safetensors" ]; then
    echo "== table4: pretraining '$init' into $dir" >&2
    # shellcheck disable=SC2046
    bash launch/pretrain.sh --config "launch/configs/$recipe.yaml" engine.run_dir="$dir" \
      $(pretrain_overrides "$init") ${PRETRAIN_ARGS:-}
  fi
done
[ "${PRETRAIN_ONLY:-0}" = 1 ] && exit 0

# a Table 4 column: its launcher and the overrides that pick the track or subtask
launcher() {
  case "$1" in
    vqa) echo "finetune_vqa.sh" ;;
    refcoco_gt) echo "finetune_refcoco.sh track=gt" ;;
    refcoco_detected) echo "finetune_refcoco.sh track=detected" ;;
    vcr_qa) echo "finetune_vcr.sh" ;;
    vcr_qar) echo "finetune_vcr.sh" ;;
    vqg) echo "finetune_vqg.sh custom inputs=image visual_input=vlbert" ;;
    *) echo "launch/table4.sh: unknown task '$1' (vqa refcoco_gt refcoco_detected vcr_qa vcr_qar vqg)" >&2; exit 2 ;;
  esac
}

for task in $tasks; do
  read -r script task_args <<<"$(launcher "$task")"
  for init in "${inits[@]}"; do
    dir="$(run_dir "$init")"
    target="$out/$task/$init"
    if [ -f "$target/metrics_val2014.json" ] || [ -f "$target/metrics_val.json" ] || [ -f "$target/metrics_test.json" ]; then
      echo "== table4: $task from '$init' already in $target" >&2
      continue
    fi
    echo "== table4: finetuning $task from '$init' ($dir/export) into $target" >&2
    if [ "$task" = vqg ]; then
      # shellcheck disable=SC2086
      DETECTOR="$dir/export" FEATURES="$out/vqg/features_$init.tsv" RUNS="$out/vqg" bash "launch/$script" $task_args \
        init="$dir/export" engine.run_dir="$target" ${FINETUNE_ARGS:-} --overwrite
      continue
    fi
    # shellcheck disable=SC2086
    # the flag last: argparse takes the key=value overrides as one run of positionals
    SUBTASKS="${task#vcr_}" RUNS="$out/$task" bash "launch/$script" backbone.init="$dir/export" engine.run_dir="$target" $task_args \
      ${FINETUNE_ARGS:-} --overwrite
  done
done
# REPORT=0: no table at the end (instances side by side, one report once all are done)
[ "${REPORT:-1}" = 0 ] || python -m finetune.table4 --runs "$out"
