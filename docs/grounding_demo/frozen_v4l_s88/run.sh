#!/usr/bin/env bash
# Session 88 (docs/ABLATION.md): the current quick start's matched control and V4L. The control (grey images, the
# same seed, warm-up, schedule and batches); V4L over all 2,363 held-out phrases of the default's three draws
# (session 86's runs/frz_s0, runs/frz_s1, and seed 2 here) and of session 85's recipe (the backbone trained in
# pretraining) on draws 0 and 1, each against that control; then the per-phrase bits split by whether the sentence
# has a relation word, paired, and the figure. About 110 minutes on a quiet 2-core Zen 3. Run from the repository root, after session 86's run.sh (which makes
# runs/frz_s0, runs/frz_s1 and runs/demo, session 85's recipe at seed 0).
set -euo pipefail
. .venv/bin/activate
here=docs/grounding_demo/frozen_v4l_s88
bash launch/pretrain.sh masking.ablate_image=true engine.run_dir=runs/noimg_s88                  # the control
bash launch/pretrain.sh engine.seed=1 data.seed=1 model.fast_rcnn.freeze_res3=false \
  model.fast_rcnn.freeze_res4=false engine.run_dir=runs/unfrz_s1                                 # session 85's, seed 1
bash launch/pretrain.sh engine.seed=2 data.seed=2 engine.run_dir=runs/frz_s2                     # the default, seed 2
v4l() { python -m diagnostics.ablation "$@" --config launch/configs/heldout_demo.yaml 'sweep=[]'; }
v4l --model frz_s0=runs/frz_s0/export --model control=runs/noimg_s88/export --reference control --out runs/v4l_s88
v4l --model s85_s0=runs/demo/export --model frz_s1=runs/frz_s1/export --model control=runs/noimg_s88/export \
  --reference control --out runs/v4l2_s88
v4l --model unfrz_s1=runs/unfrz_s1/export --out runs/v4l3_s88
v4l --model frz_s2=runs/frz_s2/export --out runs/v4l4_s88
mkdir -p runs/v4l_all_s88
cp runs/v4l_s88/per_example_frz_s0.npz runs/v4l2_s88/per_example_{s85_s0,frz_s1,control}.npz \
  runs/v4l3_s88/per_example_unfrz_s1.npz runs/v4l4_s88/per_example_frz_s2.npz runs/v4l_all_s88/
python docs/grounding_demo/v4l_by_form.py --dir runs/v4l_all_s88 --reference control --pair s85_s0:frz_s0 \
  --pair unfrz_s1:frz_s1 --pair frz_s0:frz_s1
cp runs/v4l_all_s88/paired_by_form.json "$here/"
for d in v4l_s88:v4l_frz_s0 v4l2_s88:v4l_s85_frz_s1 v4l3_s88:v4l_unfrz_s1 v4l4_s88:v4l_frz_s2; do
  mkdir -p "$here/${d#*:}" && cp runs/"${d%%:*}"/results.{md,json} runs/"${d%%:*}"/*.png "$here/${d#*:}/"
done
cp runs/noimg_s88/grounding/grounding.json "$here/control.grounding.json"
cp runs/noimg_s88/detector_drift.json "$here/control.drift.json"
cp runs/unfrz_s1/grounding/grounding.json "$here/unfrz_s1.grounding.json"
cp runs/unfrz_s1/detector_drift.json "$here/unfrz_s1.drift.json"
cp runs/frz_s2/grounding/grounding.json "$here/frz_s2.grounding.json"
cp runs/frz_s2/detector_drift.json "$here/frz_s2.drift.json"
python docs/grounding_demo/frozen_v4l_s88/plot.py
