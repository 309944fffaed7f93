#!/usr/bin/env bash
# Session 89 (docs/ABLATION.md): the quick start at ZeRO-0 with a thread per CPU rank and one MLM head call. The
# README's first command on a clean clone (timed), its matched control (grey images, the same seed, warm-up, schedule
# and batches), V4L over all 2,363 held-out phrases against it, and two more pretraining draws. About 90 minutes on a
# quiet 2-core Zen 3. Run from the repository root of a clone whose runs/ holds no demo run yet.
set -euo pipefail
here=docs/grounding_demo/zero0_s89
python3 -m venv .venv && . .venv/bin/activate && pip install -q -e ".[demo]"
# the README's command then, seed 0 (since session 90's LR cut it takes 'optim.decay_steps=[]'), and its matched control
bash launch/pretrain.sh engine.run_dir=runs/z0_s0 'optim.decay_steps=[]'
bash launch/pretrain.sh masking.ablate_image=true engine.run_dir=runs/noimg_s89 'optim.decay_steps=[]'
v4l() { python -m diagnostics.ablation "$@" --config launch/configs/heldout_demo.yaml 'sweep=[]'; }
v4l --model z0_s0=runs/z0_s0/export --model control=runs/noimg_s89/export --reference control --out runs/v4l_s89
for d in 1 2; do
  bash launch/pretrain.sh engine.seed=$d data.seed=$d engine.run_dir=runs/z0_s$d 'optim.decay_steps=[]'
done
mkdir -p "$here/v4l_z0_s0"
cp runs/v4l_s89/results.{md,json} runs/v4l_s89/*.png "$here/v4l_z0_s0/"
for r in z0_s0 z0_s1 z0_s2; do
  cp runs/$r/grounding/grounding.json "$here/$r.grounding.json"
  cp runs/$r/detector_drift.json "$here/$r.drift.json"
done
cp runs/noimg_s89/grounding/grounding.json "$here/control.grounding.json"
cp runs/noimg_s89/detector_drift.json "$here/control.drift.json"
