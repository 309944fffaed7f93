#!/usr/bin/env bash
# Session 86 (docs/ABLATION.md): the quick start with its backbone frozen in pretraining (model.fast_rcnn.freeze_res3 /
# freeze_res4, demo.yaml's default since) and res5 on the real boxes alone (the masker's roi_index), against the
# quick start before (the same warm-up, seeds and batches), on one 2-core AMD EPYC (Zen 3, AVX2). About 70 minutes on
# 2 cores. Run from the repository root.
set -euo pipefail
. .venv/bin/activate
here=docs/grounding_demo/frozen_backbone_s86
# before: session 85's code (cf0b5a9) in a worktree, warm-up included (the same warm-up both codes build)
git worktree add -f /tmp/before cf0b5a9
(cd /tmp/before && ln -sfn "$OLDPWD/.venv" .venv && bash launch/pretrain.sh)                   # before, seed 0
mkdir -p runs && mv /tmp/before/runs/demo runs/demo && cp -r /tmp/before/runs/detector-demo-s8 runs/
bash launch/pretrain.sh engine.run_dir=runs/frz_s0                                               # now, seed 0
bash launch/pretrain.sh engine.seed=1 data.seed=1 engine.run_dir=runs/frz_s1                     # now, seed 1
python -m bench.quickstart_step --repeats 5 --write
python docs/grounding_demo/quickstart_s82/paired.py --base runs/demo --row runs/frz_s0 --out $here/paired_seed0.json
for run in runs/demo runs/frz_s0 runs/frz_s1; do
  cp $run/grounding/grounding.json $here/$(basename $run).grounding.json
  cp $run/detector_drift.json $here/$(basename $run).drift.json
done
