"""Session 33: demo_long's CNN LR multiplier against its matched controls, from the runs' eval.jsonl and
detector_drift.json (one H100, one warm-up, same seeds and batches).

    python docs/grounding_demo/gpu_s33/multiplier_plot.py [DIR]     # DIR: this folder; writes DIR/multiplier.png

Left: the periodic cross-modal diagnostic's V4L all - none (32 held-out phrases every 160 steps: noisy, the
end-of-run full diagnostic is the figure to quote). Right: the detector's held-out object accuracy after
pretraining, model and control, against the warm-up's.
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MULTIPLIERS = (("m001", 0.01), ("m003", 0.03), ("m01", 0.1))
COLOURS = {"m001": "tab:blue", "m003": "tab:green", "m01": "tab:red"}


def periodic(run: Path) -> tuple[list[int], list[float]]:
    rows = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "xmodal/v4l_all_minus_none" in r]
    return [r["step"] for r in rows], [r["xmodal/v4l_all_minus_none"] for r in rows]


def main() -> None:
    here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8))
    warmup = None
    for name, mult in MULTIPLIERS:
        for suffix, style in (("", "-o"), ("_control", "--")):
            run = here / f"long_{name}{suffix}"
            if not run.is_dir():
                continue
            steps, values = periodic(run)
            ax.plot(steps, values, style, color=COLOURS[name], alpha=1 if not suffix else 0.6,
                    label=f"CNN at {mult}" + (" control" if suffix else ""))
            drift = json.loads((run / "detector_drift.json").read_text())
            warmup = drift["warm_up"]["object_accuracy"]
            bx.bar(f"{mult}{' control' if suffix else ''}", drift["after"]["object_accuracy"],
                   color=COLOURS[name], alpha=1 if not suffix else 0.5)
    ax.axhline(0, color="grey", lw=0.8)
    ax.axhline(1, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("step")
    ax.set_ylabel("bits (target >= 1 dotted)")
    ax.set_title("periodic V4L all - none (32 phrases)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    if warmup is not None:
        bx.axhline(warmup, color="black", lw=0.8, ls="--", label=f"warm-up {warmup:.3f}")
        bx.legend(fontsize=7)
    bx.set_ylim(0, 1)
    bx.set_title("detector object accuracy after (827 held-out boxes)")
    bx.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(here / "multiplier.png", dpi=110)
    print(f"wrote {here / 'multiplier.png'}")


if __name__ == "__main__":
    main()
