#!/usr/bin/env bash
# Table 4 with little labelled data from the stride-8 quick start (docs/FINETUNE.md, session 83): session 76's cells
# (VQA at 50 and 150 training images, VCR Q->A at 150, RefCOCO+ gt at 15; three finetuning seeds each, the launchers'
# recipes of docs/table4_demo/lowdata_s62/run.sh) from the export `bash launch/pretrain.sh` makes since session 82
# (its detector at feature stride 8) against its own step 0 (the packaged MiniLM with the same stride-8 warm-up, one
# step at learning rate 0, as launch/table4.sh makes a `none` row), the launchers' defaults at full data (VQA, VCR
# Q->A and, since session 84, QA->R; seed 0), VCR Q->A and VQA at 150 images from more pretraining draws (session
# 82's seeds 1 and 2), then the paired reports and the figure here. This session: PRETRAINED=runs/demo_s8/export
# OUT=runs/s83/lowdata DRAW_EXPORT=runs/demo_s8_draw.
#   bash docs/table4_demo/stride8_s83/run.sh    PRETRAINED (runs/demo/export), NONE (runs/demo_step0_s8/export),
#                                                OUT (runs/stride8_s83), STEPS ("step0 lowdata full draws report"),
#                                                DRAWS ("1 2"), DRAW_EXPORT (runs/demo_draw: <it><D>/export),
#                                                VQA_SIZES ("150 50"), FULL_TASKS ("vqa vcr_qa vcr_qar"),
#                                                DRAW_TASKS ("vcr vqa"), REPORT (this folder: where the reports and the
#                                                figure go; a cell not run is left out of them)
set -euo pipefail
cd "$(dirname "$0")/../../.."
here="${REPORT:-docs/table4_demo/stride8_s83}"
mkdir -p "$here"
out="${OUT:-runs/stride8_s83}"
pretrained="${PRETRAINED:-runs/demo/export}"
none="${NONE:-runs/demo_step0_s8/export}"
for step in ${STEPS:-step0 lowdata full draws report}; do
  case "$step" in
    step0)
      [ -f "$none/model.safetensors" ] || bash launch/pretrain.sh engine.run_dir="$(dirname "$none")" \
        engine.steps=1 optim.lr=0 optim.warmup_steps=0 grounding=null detector_drift=null ;;
    lowdata)
      PRETRAINED="$pretrained" NONE="$none" OUT="$out" STEPS="vqa vcr refcoco" VQA_SIZES="${VQA_SIZES:-150 50}" \
        bash docs/table4_demo/lowdata_s62/run.sh ;;
    draws)  # VCR Q->A and VQA at 150 images from more pretraining draws of the recipe (one warm-up: step 0's runs
            # shared; runs/demo_draw<D>: bash launch/pretrain.sh engine.seed=D data.seed=D engine.run_dir=...)
      for d in ${DRAWS:-1 2}; do
        for task in ${DRAW_TASKS:-vcr vqa}; do
          [ "$task" = vqa ] && [ "$d" != 1 ] && continue  # VQA's gain replicated on draw 1; VCR's was the question
          for s in 0 1 2; do
            mkdir -p "$out/draw$d/$task/img150_s$s"
            ln -sfn "$PWD/$out/$task/img150_s$s/none" "$out/draw$d/$task/img150_s$s/none"
          done
          PRETRAINED="${DRAW_EXPORT:-runs/demo_draw}$d/export" NONE="$none" OUT="$out/draw$d" STEPS="$task" \
            VQA_SIZES=150 bash docs/table4_demo/lowdata_s62/run.sh
        done
      done ;;
    full)  # the launchers' defaults, seed 0: VQA at full data, VCR Q->A and QA->R (FULL_TASKS picks among them)
      tasks=" ${FULL_TASKS:-vqa vcr_qa vcr_qar} "
      for row in pretrained none; do
        init="$pretrained"; [ "$row" = none ] && init="$none"
        dir="$out/full/vqa/full_s0/$row"
        [[ "$tasks" != *" vqa "* ]] || [ -f "$dir/metrics_val2014.json" ] || RUNS="$out/full/vqa" \
          bash launch/finetune_vqa.sh backbone.init="$init" engine.run_dir="$dir"
        dir="$out/full/vcr/full_s0/$row"
        [[ "$tasks" != *" vcr_qa "* ]] || [ -f "$dir/qa/metrics_val.json" ] || SUBTASKS=qa RUNS="$dir" \
          bash launch/finetune_vcr.sh backbone.init="$init"
        # QA->R beside it (session 84), so the report gives QA->R and Q->AR at the default too
        [[ "$tasks" != *" vcr_qar "* ]] || [ -f "$dir/qar/metrics_val.json" ] || SUBTASKS=qar RUNS="$dir" \
          bash launch/finetune_vcr.sh backbone.init="$init"
      done ;;
    report)
      paired=docs/table4_demo/refcoco_start/paired.py
      kinds=docs/table4_demo/vcr_s70/kind_pair.py
      for n in ${VQA_SIZES:-50 150}; do
        python "$paired" --task vqa --runs "$out/vqa" --images "$n" --base none --row pretrained \
          > "$here/vqa_img$n.json"
      done
      # each draw's finetunes beside draw 0's, as paired.py reads rows (a draw not finetuned is left out)
      draws=()
      for d in ${DRAWS-1 2}; do
        for task in vcr vqa; do
          for s in 0 1 2; do
            runs="$out/draw$d/$task/img150_s$s/pretrained"
            [ -d "$runs" ] && ln -sfn "$PWD/$runs" "$out/$task/img150_s$s/pretrained_draw$d"
          done
        done
        [ -d "$out/draw$d/vcr" ] && draws+=(--row "pretrained_draw$d")
      done
      if [ "${#draws[@]}" -gt 0 ]; then
        python "$paired" --task vcr --runs "$out/vcr" --images 150 --base none --row pretrained "${draws[@]}" \
          --pool > "$here/vcr_img150_draws.json"
      fi
      if [ -d "$out/draw1/vqa" ]; then
        python "$paired" --task vqa --runs "$out/vqa" --images 150 --base none --row pretrained \
          --row pretrained_draw1 --pool > "$here/vqa_img150_draws.json"
      fi
      if [ -d "$out/vcr" ]; then
        python "$paired" --task vcr --runs "$out/vcr" --images 150 --base none --row pretrained \
          > "$here/vcr_img150.json"
        python "$kinds" --base "$out/vcr/img150_s*/none/qa/predictions_val.json" \
          --row "$out/vcr/img150_s*/pretrained/qa/predictions_val.json" --out "$here/vcr_img150_by_kind.json" \
          > /dev/null
      fi
      if [ -d "$out/refcoco" ]; then
        python "$paired" --runs "$out/refcoco" --images 15 --base none --row pretrained > "$here/refcoco_img15.json"
        python "$kinds" --task refcoco --base "$out/refcoco/img15_s*/none/predictions_val.json" \
          --row "$out/refcoco/img15_s*/pretrained/predictions_val.json" --out "$here/refcoco_img15_by_kind.json" \
          > /dev/null
      fi
      if [ -d "$out/full/vqa" ]; then
        python "$paired" --task vqa --runs "$out/full/vqa" --images full --seeds 0 --base none --row pretrained \
          > "$here/vqa_full.json"
      fi
      if [ -d "$out/full/vcr" ]; then
        python "$paired" --task vcr --runs "$out/full/vcr" --images full --seeds 0 --base none --row pretrained \
          > "$here/vcr_full.json"
        python "$kinds" --base "$out/full/vcr/full_s0/none/qa/predictions_val.json" \
          --row "$out/full/vcr/full_s0/pretrained/qa/predictions_val.json" --out "$here/vcr_full_by_kind.json" \
          > /dev/null
        if [ -f "$out/full/vcr/full_s0/none/qar/predictions_val.json" ]; then
          python "$kinds" --base "$out/full/vcr/full_s0/none/qar/predictions_val.json" \
            --row "$out/full/vcr/full_s0/pretrained/qar/predictions_val.json" \
            --out "$here/vcr_full_qar_by_kind.json" > /dev/null
        fi
      fi
      python docs/table4_demo/stride8_s83/plot.py "$here" ;;
    *) echo "$0: unknown step '$step' (step0, lowdata, full, draws, report)" >&2; exit 2 ;;
  esac
done
