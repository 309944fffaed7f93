#!/usr/bin/env bash
# Session 90 (docs/ABLATION.md): the quick start as it stands (session 89's code) on another machine class, a 2-core
# Intel Xeon with AVX-512 and AMX: the README's command on a fresh checkout (timed), its matched control (grey images,
# the same seed, warm-up, schedule and batches), V4L over all 2,363 held-out phrases against it, and two more
# pretraining draws; the step-300 checkpoints; the same three draws with the LR cut for the last 40 steps, its control
# and V4L. About 100 minutes on that machine. Run from the repository root of a checkout whose runs/ holds no
# demo run yet.
set -euo pipefail
here=docs/grounding_demo/intel_s90
python3 -m venv .venv && . .venv/bin/activate && pip install -q -e ".[demo]"
# the README's command as it was (seed 0; since this session's cut it takes 'optim.decay_steps=[]' to run it)
time bash launch/pretrain.sh 'optim.decay_steps=[]'
bash launch/pretrain.sh masking.ablate_image=true engine.run_dir=runs/noimg_s90 'optim.decay_steps=[]'  # its control
python -m diagnostics.ablation --model demo=runs/demo/export --model control=runs/noimg_s90/export \
  --reference control --config launch/configs/heldout_demo.yaml 'sweep=[]' --out runs/v4l_s90
for d in 1 2; do
  bash launch/pretrain.sh engine.seed=$d data.seed=$d engine.run_dir=runs/z0_s$d 'optim.decay_steps=[]'
done
mkdir -p "$here/v4l"
cp runs/v4l_s90/results.{md,json} runs/v4l_s90/*.png "$here/v4l/"
cp runs/demo/grounding/grounding.json "$here/s0.grounding.json"
cp runs/demo/detector_drift.json "$here/s0.drift.json"
for d in 1 2; do
  cp runs/z0_s$d/grounding/grounding.json "$here/s$d.grounding.json"
  cp runs/z0_s$d/detector_drift.json "$here/s$d.drift.json"
done
cp runs/noimg_s90/grounding/grounding.json "$here/control.grounding.json"
cp runs/noimg_s90/detector_drift.json "$here/control.drift.json"
# the step-300 checkpoints of seeds 0 and 2 (keep_checkpoints: 2 leaves 300 and 330), on the same 100 images
python docs/grounding_demo/intel_s90/ckpt_export.py runs/demo 300 runs/s0_300
python docs/grounding_demo/intel_s90/ckpt_export.py runs/z0_s2 300 runs/s2_300
python -m diagnostics.grounding --model s2_300=runs/s2_300 --model s0_300=runs/s0_300 \
  --config launch/configs/heldout_demo.yaml --out runs/g300 max_images=100
cp runs/g300/grounding.md "$here/step300.grounding.md"; cp runs/g300/grounding.json "$here/step300.grounding.json"
# the same three draws with the LR cut to 0.1 for the last 40 steps (the default since this session: decay_steps
# [-40]; run here as the override [290], the same milestone), its matched control, V4L against it, the figure
for d in 0 1 2; do
  bash launch/pretrain.sh engine.seed=$d data.seed=$d engine.run_dir=runs/cut_s$d 'optim.decay_steps=[290]'
  cp runs/cut_s$d/grounding/grounding.json "$here/cut_s$d.grounding.json"
  cp runs/cut_s$d/detector_drift.json "$here/cut_s$d.drift.json"
done
bash launch/pretrain.sh masking.ablate_image=true engine.run_dir=runs/noimg_cut_s90 'optim.decay_steps=[290]'
cp runs/noimg_cut_s90/grounding/grounding.json "$here/control_cut.grounding.json"
python -m diagnostics.ablation --model cut=runs/cut_s0/export --model control=runs/noimg_cut_s90/export \
  --reference control --config launch/configs/heldout_demo.yaml 'sweep=[]' --out runs/v4l_cut_s90
mkdir -p "$here/v4l_cut"
cp runs/v4l_cut_s90/results.{md,json} runs/v4l_cut_s90/*.png "$here/v4l_cut/"
python "$here/plot.py"
