#!/usr/bin/env bash
# The paired reports and the figure for docs/table4_demo/lowdata_s62/run.sh's runs (OUT, default runs/lowdata).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-runs/lowdata}"
here=docs/table4_demo/lowdata_s62
paired=docs/table4_demo/refcoco_start/paired.py
# each report only from runs that are there: a checkout without them keeps the committed reports
if [ -d "$out/vqa" ]; then
  for n in ${VQA_SIZES:-15 50 150}; do
    python "$paired" --task vqa --runs "$out/vqa" --images "$n" --base none --row pretrained > "$here/vqa_img$n.json"
  done
fi
if [ -d "$out/refcoco" ]; then
  python "$paired" --runs "$out/refcoco" --images 15 --base none --row pretrained > "$here/refcoco_img15.json"
fi
if [ -d "$out/refcoco_detected" ]; then
  python "$paired" --runs "$out/refcoco_detected" --images 15 --base none --row pretrained \
    > "$here/refcoco_detected_img15.json"
fi
if [ -d "$out/refcoco_detected_noalign" ]; then
  python "$paired" --runs "$out/refcoco_detected_noalign" --images 15 --base none --row pretrained \
    > "$here/refcoco_detected_noalign_img15.json"
fi
# VCR's runs from one pair of exports at a time: session 63's (session 62's exports) are vcr_img150.json, session 65's
# (session 64's exports) VCR_REPORT=vcr_img150_s65.json, session 70's (the relation-name channel on, session 69's exports)
# OUT=runs/lowdata_s70 VCR_REPORT=vcr_img150_s70.json
if [ -d "$out/vcr" ]; then
  python "$paired" --task vcr --runs "$out/vcr" --images 150 --base none --row pretrained \
    > "$here/${VCR_REPORT:-vcr_img150.json}"
fi
python "$here/plot.py"
