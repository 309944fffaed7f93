"""Session 90: an export directory from a stage-0 DeepSpeed checkpoint of a finished pretraining run, to evaluate a
step before the last with the diagnostics (the run's export with the checkpoint's weights; its config, tokenizer and
preprocessing are the run's). Checked on the last checkpoint, which gives the export's weights exactly (0.0).
    python docs/grounding_demo/intel_s90/ckpt_export.py RUN_DIR STEP OUT_DIR"""
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from train.engine import STAGE0_MODEL_FILE  # noqa: E402

run, step, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
ckpt = run / "checkpoints" / f"step_{step:07d}" / STAGE0_MODEL_FILE
sd = torch.load(ckpt, map_location="cpu", weights_only=True)["module"]
shutil.copytree(run / "export", out, dirs_exist_ok=True)
ref = load_file(str(run / "export" / "model.safetensors"))
new = {k.removeprefix("model."): v for k, v in sd.items()}
missing, extra = set(ref) - set(new), set(new) - set(ref)  # extra: the MLM decoder, tied to the word embeddings
print("missing", len(missing), sorted(missing)[:5], "extra", len(extra), sorted(extra)[:5])
new = {k: new[k].float().contiguous() for k in ref}
diff = max(float((new[k] - ref[k]).abs().max()) for k in ref)
print("max |ckpt - export| over tensors", diff)
save_file(new, str(out / "model.safetensors"))
(out / "verify.json").unlink(missing_ok=True)
