"""Does the detector bound visible masked RoI classification? (docs/ABLATION.md, session 61)

The grounding table's `visible` MRC split classifies each held-out region with every region and word in view; its
target is the box file's class. The model's region token carries the names its own Fast R-CNN gives that region
(region words), so a model that reads its region copies the detector's class, right or wrong. This splits the
visible split by whether the export's detector names the region right (its top class = the box file's class), and
reports how often the MRC head agrees with the detector: high agreement with accuracy below target says the
detector is the bound; low agreement says the transformer or the head loses what the token carries. It also splits
off the regions drawn under the grey cloth (`scenes.jsonl`'s `covered`): their class is not in the image, so they
test the caption, not vision (the grounding table scores covered shape words apart for the same reason; its MRC
`visible` split counts these regions in, and since session 84 splits them off too, as `visible_in_view` /
`visible_covered`, by what the captions say: the `_captions` columns here, beside the scene file's).

    python docs/grounding_demo/mrc_vs_detector.py EXPORT [EXPORT ...] [--out FILE.md] [max_images=100]
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, ".")
from diagnostics.ablation import feature_extractor  # noqa: E402
from diagnostics.config import GroundingConfig  # noqa: E402
from diagnostics.grounding import GroundingEval  # noqa: E402
from diagnostics.statistics import clustered_bootstrap  # noqa: E402
from model.config import load_config  # noqa: E402
from model.export import load_pretrained  # noqa: E402
from model.vl_bert import assemble_text  # noqa: E402
from shards.collate import pad_ids  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402

HELD_OUT = "launch/configs/heldout_demo.yaml"


def measure(path: str, overrides: list[str]) -> dict:
    cfg = load_config(GroundingConfig, HELD_OUT, ["max_images=100", *overrides])
    model = load_pretrained(path).eval()
    tokenizer = load_tokenizer(path)
    ev = GroundingEval(cfg, tokenizer, feature_extractor(model, "cpu"))
    vb, mcfg = model.vl_bert, model.cfg
    # the scenes the held-out images were drawn from, one line per image in image-id order: which objects are under
    # the grey cloth (their class is not in the image; the caption may still name them)
    scenes = [json.loads(line) for line in (Path(cfg.flickr_root).parent / "scenes.jsonl").read_text().splitlines()]
    det_ok, mrc_ok, agree, covered, said_covered, cluster = [], [], [], [], [], []
    with torch.no_grad():
        for k, item in enumerate(ev.data.images):
            scene = scenes[int(item.image_id)]
            assert Path(scene["image"]).stem == item.image_id, (scene["image"], item.image_id)
            image, boxes, _ = ev.data.load(item)
            app, boxes_norm = ev._visual(vb, image, boxes, None, "cpu")
            det = vb.fast_rcnn.object_classifier(app[0, 1:]).argmax(-1)  # [N]
            n, m = len(boxes), len(item.sentences)
            ids, valid = pad_ids([s.ids for s in item.sentences])
            inp, types, mask = assemble_text(ids, valid, cls_id=mcfg.cls_token_id, sep_id=mcfg.sep_token_id,
                                             pad_id=mcfg.pad_token_id)
            out = vb(inp, mask, types, boxes=boxes.unsqueeze(0).expand(m, -1, -1),
                     box_mask=torch.ones(m, n, dtype=torch.bool),
                     visual_input=(app.expand(m, -1, -1), boxes_norm.expand(m, -1, -1)))
            pred = model.masked_roi_classification(out.region_hidden[:, 1:]).argmax(-1)  # [S, N]
            gold = item.classes.unsqueeze(0).expand(m, -1)
            det_ok += (det == item.classes).unsqueeze(0).expand(m, -1).flatten().tolist()
            mrc_ok += (pred == gold).flatten().tolist()
            agree += (pred == det.unsqueeze(0)).flatten().tolist()
            covered += [o["covered"] for o in scene["objects"]] * m
            said_covered += item.covered.repeat(m).tolist()  # GroundingData's flags, read from the captions
            cluster += [k] * (m * n)
    det_ok, mrc_ok, agree, covered, said_covered, cluster = (np.asarray(v) for v in (det_ok, mrc_ok, agree, covered,
                                                                                     said_covered, cluster))

    def stat(values, where):
        b = clustered_bootstrap(values[where].astype(float), cluster[where])
        return {"mean": b["mean"], "ci95": b["ci95"], "n": int(where.sum())}

    everything = np.ones_like(det_ok, dtype=bool)
    return {"export": path, "detector_right": stat(det_ok, everything), "mrc_visible": stat(mrc_ok, everything),
            "mrc_given_detector_right": stat(mrc_ok, det_ok), "mrc_given_detector_wrong": stat(mrc_ok, ~det_ok),
            "mrc_agrees_with_detector": stat(agree, everything), "covered_fraction": stat(covered, everything),
            "detector_right_in_view": stat(det_ok, ~covered), "mrc_visible_in_view": stat(mrc_ok, ~covered),
            "mrc_visible_covered": stat(mrc_ok, covered),
            "detector_right_in_view_captions": stat(det_ok, ~said_covered),
            "mrc_visible_in_view_captions": stat(mrc_ok, ~said_covered),
            "mrc_visible_covered_captions": stat(mrc_ok, said_covered)}


def fmt(s: dict) -> str:
    return f"{s['mean']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}] (n={s['n']})"


args = sys.argv[1:]
out_path = None
if "--out" in args:
    at = args.index("--out")
    out_path = Path(args[at + 1])
    del args[at:at + 2]
exports = [a for a in args if "=" not in a]
overrides = [a for a in args if "=" in a]
torch.set_num_threads(1)
results = [measure(p, overrides) for p in exports]
keys = ["detector_right", "mrc_visible", "mrc_given_detector_right", "mrc_given_detector_wrong",
        "mrc_agrees_with_detector", "covered_fraction", "detector_right_in_view", "mrc_visible_in_view",
        "mrc_visible_covered", "detector_right_in_view_captions", "mrc_visible_in_view_captions",
        "mrc_visible_covered_captions"]
lines = ["| export | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
lines += ["| " + r["export"] + " | " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in results]
print("\n".join(lines))
if out_path is not None:
    out_path.write_text("\n".join(lines) + "\n")
    out_path.with_suffix(".json").write_text(json.dumps(results, indent=1))
