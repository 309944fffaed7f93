"""Are the detector's soft class/colour distributions what limits the grounded recipe? (docs/ABLATION.md,
session 12). Evaluates an export's grounding with its Fast R-CNN classifiers' logits multiplied by T (T > 1:
sharper distributions, so each region's word embedding is nearer its top class's and colour's name) and
nothing else changed. If held-out colour accuracy rises with T, the names' softness limits it; if not, the
transformer does.

    python docs/grounding_demo/sharpen_names.py runs/demo_long/export [T ...] [max_images=100]
"""

import sys

import torch

sys.path.insert(0, ".")
from diagnostics.ablation import feature_extractor  # noqa: E402
from diagnostics.config import GroundingConfig  # noqa: E402
from diagnostics.grounding import GroundingEval, table  # noqa: E402
from model.config import load_config  # noqa: E402
from model.export import load_pretrained  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402

HELD_OUT = "launch/configs/heldout_demo.yaml"  # the demo's held-out images (run from the repository root)

path = sys.argv[1]
temps = [float(a) for a in sys.argv[2:] if "=" not in a] or [1.0, 3.0, 10.0]
overrides = [a for a in sys.argv[2:] if "=" in a]
torch.set_num_threads(2)
cfg = load_config(GroundingConfig, HELD_OUT, ["max_images=100", *overrides])  # the demo's held-out split
summaries = {}
for t in temps:
    model = load_pretrained(path).eval()
    fr = model.vl_bert.fast_rcnn
    with torch.no_grad():
        for head in (fr.object_classifier, fr.attribute_classifier):
            if head is not None:
                head.weight.mul_(t)
                head.bias.mul_(t)
    ev = GroundingEval(cfg, load_tokenizer(path), feature_extractor(model, "cpu"))
    summaries[f"logits x {t:g}"] = ev.summarise(ev(model, "cpu", progress=False))
print(table(summaries))
