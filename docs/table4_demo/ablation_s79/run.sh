#!/usr/bin/env bash
# Table 4's two pretraining ablations from the current quick start's recipe (docs/FINETUNE.md, session 79): no_mrc
# (losses.mrc_weight=0) and no_text (data.text_batch_size=0), each the quick start otherwise (same seed, warm-up,
# schedule, caption batches and steps; runs/demo_nomrc, runs/demo_notext, pretrained by launch/table4.sh when
# missing), finetuned beside the quick start's export (runs/demo) and its step 0 (runs/demo_step0) where those two
# were apart over three seeds in session 76: VQA on 150 training images' questions (session 62's budget) and VCR
# Q->A on 150 images. session 62's low-data pipeline runs each pair of rows; the four rows are then linked into one
# layout, $OUT/<task>/img150_s<seed>/<row>, for docs/table4_demo/refcoco_start/paired.py.
#   bash docs/table4_demo/ablation_s79/run.sh    OUT (runs/ablation_s79), SEEDS ("0 1 2"), VCR_SEEDS ("0"),
#                                                STEPS ("pretrain vqa vcr report")
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-runs/ablation_s79}"
here=docs/table4_demo/ablation_s79
seeds="${SEEDS:-0 1 2}"
vcr_seeds="${VCR_SEEDS:-0}"
# session 62's pipeline takes two rows at a time, named pretrained / none: the pair it runs, then our row names
declare -A pair_a=([main]=runs/demo/export [ablations]=runs/demo_nomrc/export)
declare -A pair_b=([main]=runs/demo_step0/export [ablations]=runs/demo_notext/export)
declare -A names=([main]="pretrained none" [ablations]="no_mrc no_text")

run_pairs() {  # lowdata step, its seeds, the task folder it writes
  local step="$1" seeds="$2" task="$3"
  for pair in main ablations; do
    OUT="$out/pairs/$pair" STEPS="$step" VQA_SIZES=150 SEEDS="$seeds" PRETRAINED="${pair_a[$pair]}" \
      NONE="${pair_b[$pair]}" bash docs/table4_demo/lowdata_s62/run.sh
    read -r a b <<<"${names[$pair]}"
    for seed in $seeds; do
      mkdir -p "$out/$task/img150_s$seed"
      ln -sfn "$(realpath "$out/pairs/$pair/$task/img150_s$seed/pretrained")" "$out/$task/img150_s$seed/$a"
      ln -sfn "$(realpath "$out/pairs/$pair/$task/img150_s$seed/none")" "$out/$task/img150_s$seed/$b"
    done
  done
}

for step in ${STEPS:-pretrain vqa vcr report}; do
  case "$step" in
    pretrain)
      RECIPE=demo PRETRAIN_ONLY=1 bash launch/table4.sh pretrained none no_mrc no_text ;;
    vqa) run_pairs vqa "$seeds" vqa ;;
    vcr) run_pairs vcr "$vcr_seeds" vcr ;;
    report)
      paired=docs/table4_demo/refcoco_start/paired.py
      for task in vqa vcr; do
        s=$([ "$task" = vqa ] && echo "$seeds" || echo "$vcr_seeds")
        s=$(echo $s | tr ' ' ,)
        [ -e "$out/$task/img150_s${s%%,*}/no_text" ] || continue
        python "$paired" --task "$task" --runs "$out/$task" --images 150 --seeds "$s" --base none \
          --row pretrained --row no_mrc --row no_text > "$here/${task}_img150_vs_none.json"
        python "$paired" --task "$task" --runs "$out/$task" --images 150 --seeds "$s" --base pretrained \
          --row no_mrc --row no_text > "$here/${task}_img150_vs_pretrained.json"
      done
      for run in demo demo_nomrc demo_notext; do  # each export's last grounding and detector-drift records
        grep -e '"grounding/colour/image"' -e '"detector/object_accuracy"' "runs/$run/eval.jsonl" | tail -n 2 \
          > "$here/eval_$run.jsonl"
      done ;;
  esac
done
