# Sourced by the table4_demo scripts that score a trained finetune again on data/demo_val4000's large held-out split
# (session 77's pipeline): score_large TASK TRAINED_RUN NEW_RUN_DIR OVERRIDES...
score_large() {  # task, trained run, new run dir, then the overrides that point its eval split at $big
  local task="$1" src="$2" dir="$3"; shift 3
  [ -f "$dir/run.json" ] && ls "$dir"/metrics_val*.json > /dev/null 2>&1 && return 0
  mkdir -p "$dir"
  ln -sfn "$(realpath "$src/model")" "$dir/model"
  # the trained run's record with the large split's paths: what the reports read the questions or refs from
  python - "$src/run.json" "$dir/run.json" "$@" <<'PY'
import json, sys
record = json.load(open(sys.argv[1]))
for override in sys.argv[3:]:
    key, value = override.split("=", 1)
    *path, last = key.split(".")
    node = record["config"]
    for part in path:
        node = node[part]
    node[last] = value
json.dump(record, open(sys.argv[2], "w"), indent=1)
PY
  python -m "finetune.$task" --config "launch/configs/${task}_demo.yaml" --eval-only engine.run_dir="$dir" "$@"
}
