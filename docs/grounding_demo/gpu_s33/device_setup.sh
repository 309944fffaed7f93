# Sourced (not run) from the repository root by the device scripts: installs what the device image lacks from the
# carried .dev (built by docs/grounding_demo/gpu_s32/prepare_carry.sh; SKIP_SETUP=1 on a machine that has it all),
# picks the accelerator and checks the imports. Defines `log` (prefixed with $LOG_TAG and the seconds since T0).
T0=${T0:-$SECONDS}
log() { echo "[${LOG_TAG:-device} $((SECONDS - T0)) s] $*"; }
export PYTHONUNBUFFERED=1
if [ -z "${SKIP_SETUP:-}" ]; then
  if [ ! -d /tmp/site/deepspeed ]; then  # a warm machine keeps /tmp/site from the call before
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .dev/whl/*.whl || { log "pip install failed"; exit 3; }
    python3 .dev/restore_minilm.py /tmp/site || exit 3
  fi
  export PYTHONPATH="/tmp/site:$PWD" PATH="/tmp/site/bin:$PATH"
fi
python3 -c "import torch; print(torch.cuda.is_available())" | grep -q True && export DS_ACCELERATOR=cuda
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv 2>/dev/null
nproc
python3 -c "
import torch, torchvision, transformers, deepspeed, webdataset, sys
print(sys.version.split()[0], torch.__version__, torchvision.__version__, transformers.__version__, deepspeed.__version__,
      torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')
import pretrain.run, diagnostics.ablation, pretrain.detector, finetune.vqa
from shards.tokenizer import load_tokenizer
print(load_tokenizer(None).tokenize('a red hexagon'))" || { log "import check failed"; exit 3; }
log "setup done"
