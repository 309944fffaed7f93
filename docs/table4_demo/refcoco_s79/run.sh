#!/usr/bin/env bash
# RefCOCO+'s detected track at 15 training images on the large val (docs/FINETUNE.md, session 79): where it loses
# what the gt track gets, and why pretraining's gain is not there. The finetunes are session 78's pipeline with
# TRACK=detected (runs/refcoco_s78/<arm>/detected); here the saved models of both tracks (the on arm, seeds 0-2) are
# scored again on box sets between the two (boxsets.py: the detections less their false positives; the exact gt
# boxes plus the false positives), and every scoring is split by outcome (detected_errors.py) and by kind.
#   bash docs/table4_demo/refcoco_s79/run.sh    RUNS (runs/refcoco_s78/on), OUT (runs/refcoco_s79), SEEDS ("0 1 2"),
#                                                MODELS ("gt detected": the models trained on each track), SETS
#                                                ("dets objects_only gt_and_false": the box sets scored),
#                                                STEPS ("boxsets score report"), REPORTS (this folder; the off
#                                                arm's: RUNS=runs/refcoco_s78/off REPORTS=$here/off)
set -euo pipefail
cd "$(dirname "$0")/../../.."
here=docs/table4_demo/refcoco_s79
reports="${REPORTS:-$here}"
runs="${RUNS:-runs/refcoco_s78/on}"
out="${OUT:-runs/refcoco_s79}"
big=data/demo_val4000/raw/refcoco+
seeds="${SEEDS:-0 1 2}"
declare -A dets=([dets]="$big/dets.json" [objects_only]="$out/boxsets/objects_only.json"
                 [gt_and_false]="$out/boxsets/gt_and_false.json")
declare -A trained=([gt]="$runs" [detected]="$runs/detected")
for step in ${STEPS:-boxsets score report}; do
  case "$step" in
    boxsets)
      python "$here/boxsets.py" --data "$big" --out "$out/boxsets" > "$here/boxsets.json" ;;
    score)  # $RUNS[/detected]/refcoco_val4000_<set>/img15_s<seed>/<row>; the detected models on dets are session 78's
      for model in ${MODELS:-gt detected}; do
        for set in ${SETS:-dets objects_only gt_and_false}; do
          [ "$model/$set" = detected/dets ] && continue
          OUT="${trained[$model]}" TRACK=detected LARGE="refcoco_val4000_$set" DETS="${dets[$set]}" N=15 \
            SEEDS="$seeds" STEPS=large bash docs/table4_demo/refcoco_s77/run.sh
        done
      done ;;
    report)
      mkdir -p "$reports"
      glob="$runs/refcoco_val4000/img15_s[$(echo $seeds | tr -d ' ')]"  # the gt track itself, these seeds
      python docs/table4_demo/vcr_s70/kind_pair.py --task refcoco --records "$big/refs(unc).p" \
        --base "$glob/none/predictions_val.json" --row "$glob/pretrained/predictions_val.json" \
        --out "$reports/by_kind_gt_trained_on_gt.json" > /dev/null
      for model in ${MODELS:-gt detected}; do
        for set in dets objects_only gt_and_false; do
          large=$([ "$model/$set" = detected/dets ] && echo refcoco_val4000 || echo "refcoco_val4000_$set")
          glob="${trained[$model]}/$large/img15_s[$(echo $seeds | tr -d ' ')]"
          ls $glob/none/predictions_val.json > /dev/null 2>&1 || continue
          python docs/table4_demo/refcoco_s79/detected_errors.py --data "$big" --dets "${dets[$set]}" \
            --base "$glob/none/predictions_val.json" --row "$glob/pretrained/predictions_val.json" \
            --out "$reports/errors_${model}_trained_on_$set.json" > /dev/null
        done
      done
      python "$here/plot.py" "$reports" ;;
  esac
done
