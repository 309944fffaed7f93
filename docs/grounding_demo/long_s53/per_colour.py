"""V4L all - none split by the colour word a held-out phrase names (docs/ABLATION.md, session 53): from
control_leak.py's `--dump` files, one row per model and region-word variant, with each cell's interval from the
clustered bootstrap by image. The colour the detector gives the ablation's fill is the colour whose phrases lose
nothing when the image is replaced by it.

    python docs/grounding_demo/long_s53/per_colour.py OUT.md LABEL=DUMP.npz [LABEL=DUMP.npz ...]
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.categories import CATEGORIES  # noqa: E402
from diagnostics.statistics import clustered_bootstrap  # noqa: E402

COLOURS = CATEGORIES["colour"]


def cell(values: np.ndarray, clusters: np.ndarray) -> str:
    s = clustered_bootstrap(values, clusters, resamples=1000, seed=0)
    lo, hi = s["ci95"]
    return f"{s['mean']:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def splits(path: Path) -> list[np.ndarray]:
    """Per colour, then for no colour word: which of the dump's phrases name it."""
    words = [str(w).split() for w in np.load(path)["words"]]
    named = [np.array([c in w for w in words]) for c in COLOURS]
    return named + [~np.any(named, axis=0)]


def rows(label: str, path: Path) -> list[str]:
    d, masks = np.load(path), splits(path)
    clusters = d["image_id"]
    out = []
    for variant in sorted({k.split("__")[0] for k in d.files if k.endswith("__all")}):
        diff = d[f"{variant}__all"] - d[f"{variant}__none"]
        cells = [cell(diff, clusters)] + [cell(diff[m], clusters[m]) for m in masks]
        out.append(f"| {label} | {variant} | " + " | ".join(cells) + " |")
    return out


def main() -> None:
    out, specs = Path(sys.argv[1]), [a.split("=", 1) for a in sys.argv[2:]]
    counts = [int(m.sum()) for m in splits(Path(specs[0][1]))]
    header = ("| model | region words | all phrases | " + " | ".join(f"{c} ({n})" for c, n in zip(
        (*COLOURS, "no colour word"), counts)) + " |")
    lines = ["### V4L all - none (bits) by the colour word the phrase names, 95% interval by image", "", header,
             "|" + "---|" * (len(COLOURS) + 4)]
    for label, path in specs:
        lines += rows(label, Path(path))
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
