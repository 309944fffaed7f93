#!/usr/bin/env bash
# Cross-modal input ablation diagnostic (diagnostics/ablation.py; `--help` lists everything).
# With no arguments: the demo's pretrained model (runs/demo/export, from `bash launch/pretrain.sh`) on
# the demo's held-out images in Flickr30k Entities format; results under runs/demo/ablation. With arguments, they go to `python -m diagnostics.ablation` as given:
#   bash launch/ablation.sh --model vl=runs/a/export --model no-mrc=runs/b/export --text-baseline bert/ \
#       --out runs/ablation flickr_root=flickr30k_entities images=flickr30k-images boxes=f30k_boxes.jsonl \
#       class_names=vg_classes.json short_side=600 long_side=1000
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ $# -eq 0 ]; then
  if [ ! -f runs/demo/export/model.safetensors ]; then
    echo "launch/ablation.sh: no runs/demo/export/model.safetensors; run 'bash launch/pretrain.sh' first" >&2
    exit 2
  fi
  python -m shards.demo --out data/demo  # adds the Flickr30k-format files to a corpus built before them
  set -- --model demo=runs/demo/export --config launch/configs/heldout_demo.yaml --out runs/demo/ablation \
    max_examples=400
fi
exec python -m diagnostics.ablation "$@"
