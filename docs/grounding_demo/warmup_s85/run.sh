#!/usr/bin/env bash
# Session 85 (docs/ABLATION.md): the quick start before and after the warm-up's orientation groups and real RoIs
# (launch/configs/detector_demo.yaml's group_by_aspect, FastRCNN's roi_index), on one 2-core AMD EPYC (Zen 3, AVX2).
# `before` checks out the commit before the change (0c54772) into a worktree; both runs build their own warm-up.
# Then the paired words, the MRC-against-detector split and the records. About 80 minutes on 2 cores. Run from the
# repository root.
set -euo pipefail
. .venv/bin/activate
here=docs/grounding_demo/warmup_s85
git worktree add -f /tmp/before 0c54772
(cd /tmp/before && ln -sfn "$OLDPWD/.venv" .venv && bash launch/pretrain.sh)  # warm-up + pretraining, seed 0
mkdir -p runs && mv /tmp/before/runs/demo runs/s85_base_demo && mv /tmp/before/runs/detector-demo-s8 runs/s85_base_det
bash launch/pretrain.sh                                                                     # after, seed 0
bash launch/pretrain.sh engine.seed=1 data.seed=1 engine.run_dir=runs/demo_s85_draw1      # after, seed 1
sed -e "s#run_dir: runs/detector-demo-s8#run_dir: runs/s85_base_det#" launch/configs/detector_demo.yaml > runs/det_base.yaml
bash launch/pretrain.sh engine.seed=1 data.seed=1 engine.run_dir=runs/s85_base_draw1 \
  model.fast_rcnn.weights=runs/s85_base_det/fast_rcnn.pt region_words=runs/s85_base_det/fast_rcnn.vocab.json \
  detector_drift=runs/det_base.yaml                                                       # before, seed 1
python docs/grounding_demo/quickstart_s82/paired.py --base runs/s85_base_demo runs/s85_base_draw1 \
  --row runs/demo runs/demo_s85_draw1 --out $here/paired.json
python docs/grounding_demo/mrc_vs_detector.py runs/s85_base_demo/export runs/demo/export runs/s85_base_draw1/export \
  runs/demo_s85_draw1/export --out $here/mrc_vs_detector.md
cp runs/s85_base_det/metrics_val.json $here/warmup_before.metrics_val.json
cp runs/detector-demo-s8/metrics_val.json $here/warmup_now.metrics_val.json
for run in runs/s85_base_demo runs/demo runs/s85_base_draw1 runs/demo_s85_draw1; do
  cp $run/grounding/grounding.json $here/$(basename $run).grounding.json
  cp $run/detector_drift.json $here/$(basename $run).drift.json
done
python -m bench.warmup_step --write
