"""Session 58's figure: held-out colour and shape words per MRC variant of the quick start (330 steps, seed 0
unless named), 95% intervals clustered by image, from each run's grounding.json.

    python docs/grounding_demo/quickstart_s58/plot.py
"""

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from docs.grounding_demo.word_bars import word_bars  # noqa: E402

here = Path(__file__).resolve().parent
demo = here.parent
RUNS = [("default", demo / "quickstart_s56/corners_330"),
        ("no MRC", demo / "quickstart_s57/no_mrc_330"),
        ("no MRC, seed 1", demo / "quickstart_s57/no_mrc_330_seed1"),
        ("zeroing, no loss", here / "mrc_weight_1e-6_330"),
        ("loss, no zeroing", here / "mrc_zero_fraction_0_330"),
        ("MRC p 0.05", here / "mrc_probability_0.05_330"),
        ("conditional 0.25", here / "conditional_0.25_330"),
        ("+ colour MRC", here / "mrc_attribute_shards_330"),
        ("MRC from step 165", here / "mrc_from_step_165_330"),
        ("default, seed 1", demo / "quickstart_s57/default_330_seed1"),
        ("zeroing, no loss, seed 1", here / "mrc_weight_1e-6_330_seed1"),
        ("loss, no zeroing, seed 1", here / "mrc_zero_fraction_0_330_seed1")]


def main() -> None:
    fig, ax = plt.subplots(figsize=(11, 4.2))
    word_bars(ax, RUNS)
    ax.set_title("The quick start's MRC, one piece at a time (330 steps; dotted: chance)")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(here / "mrc_parts.png", dpi=120)


if __name__ == "__main__":
    main()
