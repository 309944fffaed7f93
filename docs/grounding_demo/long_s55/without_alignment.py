"""How much of a model's grounding goes through the region-word alignment? (docs/ABLATION.md, session 55.) The
grounding table of an export twice on the same held-out images: as trained (each word takes the region words of
the regions its embedding names, `region_word_alignment`) and with the alignment off at evaluation (the words take
none; the region tokens keep their names, so a word can still find its object by attention). What the second row
keeps is what the model reads from the region tokens through its layers; an input it never trained on, so the
drop bounds the alignment's share from above.

    python docs/grounding_demo/long_s55/without_alignment.py OUT.md --config launch/configs/heldout_demo.yaml \
        LABEL=EXPORT_DIR ... [--images 100]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.ablation import feature_extractor  # noqa: E402
from diagnostics.config import GroundingConfig  # noqa: E402
from diagnostics.grounding import GroundingEval, table  # noqa: E402
from model.config import load_config  # noqa: E402
from model.export import load_pretrained  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("models", nargs="+", metavar="LABEL=EXPORT")
    p.add_argument("--config", required=True)
    p.add_argument("--images", type=int, default=100)
    args = p.parse_args()
    cfg = load_config(GroundingConfig, args.config, [f"max_images={args.images}"])
    summaries = {}
    for spec in args.models:
        label, _, path = spec.partition("=")
        model = load_pretrained(path).eval()
        if model.vl_bert.cfg.region_word_alignment is None:
            raise SystemExit(f"{path}: trained without region_word_alignment; nothing to turn off")
        ev = GroundingEval(cfg, load_tokenizer(path), feature_extractor(model, "cpu"))
        summaries[f"{label}: aligned"] = ev.summarise(ev(model, "cpu", progress=False))
        model.vl_bert.cfg.region_word_alignment = None  # read per forward pass (`VLBert.embed`)
        summaries[f"{label}: no alignment"] = ev.summarise(ev(model, "cpu", progress=False))
    text = (f"# Grounding with and without the region-word alignment at evaluation ({args.images} held-out images)\n\n"
            + table(summaries))
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
