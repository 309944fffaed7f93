"""V4L all - none split against a text-only reader (docs/ABLATION.md, session 53): a model that ignored an ablated
image perfectly would score `all` as a model that never could read the image scores its phrases, so

    all - none = (reference none - none)  +  (all - reference none)
                  what the image tells it     what it overpays on the ablated input

per phrase, paired (the same held-out phrases in the same order), each mean with its interval from the bootstrap
clustered by image. The reference is a control's control_leak.py `--dump` (its `live__none`).

    python docs/grounding_demo/long_s53/information.py OUT.md REF_LABEL=REFERENCE.npz LABEL=DUMP.npz [...]
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.statistics import clustered_bootstrap  # noqa: E402


def cell(values: np.ndarray, clusters: np.ndarray) -> str:
    s = clustered_bootstrap(values, clusters, resamples=2000, seed=0)
    lo, hi = s["ci95"]
    return f"{s['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def main() -> None:
    out, (ref_label, ref_path) = Path(sys.argv[1]), sys.argv[2].split("=", 1)
    reference, specs = np.load(ref_path), [a.split("=", 1) for a in sys.argv[3:]]
    ref_none = reference["live__none"]
    lines = ["### V4L all - none against a text-only reader (bits per phrase word-piece, 95% interval by image)", "",
             f"reference: {ref_label} (its none {np.nanmean(ref_none):.4f} bits)", "",
             "| model | none | all - none | information: reference none - none | overpayment: all - reference none |",
             "|---|---|---|---|---|"]
    for label, path in specs:
        d = np.load(path)
        if list(d["words"]) != list(reference["words"]) or not np.array_equal(d["image_id"], reference["image_id"]):
            raise ValueError(f"{path}: not the reference's phrases in its order")
        clusters = d["image_id"]
        none, ablated = d["live__none"], d["live__all"]
        lines.append(f"| {label} | {np.nanmean(none):.4f} | {cell(ablated - none, clusters)} | "
                     f"{cell(ref_none - none, clusters)} | {cell(ablated - ref_none, clusters)} |")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
