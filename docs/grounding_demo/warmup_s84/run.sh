#!/usr/bin/env bash
# Session 84 (docs/ABLATION.md): the quick start on a shorter detector warm-up, one change (launch/configs/
# detector_demo.yaml's epochs: 1.5 and 1 against the default 2), seed 0 for both and seeds 1-2 for 1.5; then the
# paired words against session 82's stride-8 draws (runs/demo_s8, runs/demo_s8_draw1, runs/demo_s8_draw2) and the
# figure. About 75 minutes on 2 cores. Run from the repository root.
set -euo pipefail
. .venv/bin/activate
here=docs/grounding_demo/warmup_s84
mkdir -p runs/s84
for e in 15 10; do
  sed -e "s#run_dir: runs/detector-demo-s8#run_dir: runs/det-s8-e$e#" \
    -e "s#^epochs: 2.0 .*#epochs: ${e:0:1}.${e:1:1}#" launch/configs/detector_demo.yaml > runs/s84/detector_e$e.yaml
  python -m pretrain.detector --config runs/s84/detector_e$e.yaml
done
pretrain() {  # epochs x 10, seed, run dir
  bash launch/pretrain.sh --master-port 29517 engine.seed=$2 data.seed=$2 engine.run_dir=$3 \
    model.fast_rcnn.weights=runs/det-s8-e$1/fast_rcnn.pt region_words=runs/det-s8-e$1/fast_rcnn.vocab.json \
    detector_drift=runs/s84/detector_e$1.yaml
}
pretrain 15 0 runs/demo_s8_e15
pretrain 10 0 runs/demo_s8_e10
pretrain 15 1 runs/demo_s8_e15_draw1
pretrain 15 2 runs/demo_s8_e15_draw2
for run in runs/demo_s8_e15 runs/demo_s8_e10 runs/demo_s8_e15_draw1 runs/demo_s8_e15_draw2; do
  e=${run#runs/demo_s8_e}; e=${e%%_*}; seed=${run##*draw}; [ "$seed" = "$run" ] && seed=0
  cp $run/grounding/grounding.json $here/e${e}_seed$seed.grounding.json
  cp $run/detector_drift.json $here/e${e}_seed$seed.drift.json
done
python docs/grounding_demo/quickstart_s82/paired.py --base runs/demo_s8 runs/demo_s8_draw1 runs/demo_s8_draw2 \
  --row runs/demo_s8_e15 runs/demo_s8_e15_draw1 runs/demo_s8_e15_draw2 --out $here/paired_e15.json
python $here/plot.py
