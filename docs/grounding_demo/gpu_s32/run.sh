#!/usr/bin/env bash
# Session 32, one device call: demo_long (the grounded recipe) with the CNN at 0.01 of the LR and its matched
# control (masking.ablate_image=true), plus demo_long at 0.1 on the same seeds and batches: one GPU, one rank each,
# 8 + 8 per step (the CPU runs' global batch, 2 ranks x (4 + 4)), fp32 as the CPU recipe; then the cross-modal
# diagnostic (all held-out phrases; colour words only for the pair) on each export.
# The script that ran is this file at commit 525fcbb; its steps now live in ../gpu_s33/run.sh (session 33 made the
# runs a parameter), which this calls with session 32's runs and deadlines. Carry .dev (../gpu_s32/prepare_carry.sh).
exec env RUNS="m001=0.01 m001_control=0.01:ablate m01=0.1" SHED_RUN= COLOUR_RUNS="m001 m001_control" \
  DEADLINE_TRAIN="${DEADLINE_TRAIN:-455}" DEADLINE_DIAG="${DEADLINE_DIAG:-560}" OUT="${OUT:-/tmp/out_s32}" \
  bash "$(dirname "${BASH_SOURCE[0]}")/../gpu_s33/run.sh" "$@"
