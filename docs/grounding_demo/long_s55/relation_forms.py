"""Relation words by what they need from the image (docs/ABLATION.md, session 55). The grounding table's `relation`
category mixes two forms the shapes-world captions use:
- `pair`: "the red circle left of the blue square": the masked word compares two named objects' positions;
- `image`: "the red circle on the left among ...": one named object's position against the image's middle.
Each relation word is masked alone (diagnostics.grounding: every piece -> [MASK], right when the argmax gives it back),
with the image and ablated (every region the average region), on the held-out images, 95% intervals by image. Text
alone reads the axis ("of" follows left/right, not above/below), so a reader without the image sits near 0.5 on
both forms; a perfect-vision reader is at 1 (the generator writes the relation the two centres show most clearly).

    python docs/grounding_demo/long_s55/relation_forms.py OUT.md --config launch/configs/heldout_demo.yaml \
        LABEL=EXPORT_DIR ... [--images 200]
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from diagnostics.ablation import feature_extractor  # noqa: E402
from diagnostics.config import GroundingConfig  # noqa: E402
from diagnostics.grounding import GroundingEval  # noqa: E402
from diagnostics.statistics import clustered_bootstrap, format_interval  # noqa: E402
from model.config import load_config  # noqa: E402
from model.export import load_pretrained  # noqa: E402
from shards.flickr30k_entities import parse_sentences  # noqa: E402
from shards.tokenizer import load_tokenizer  # noqa: E402

FORMS = ("pair", "image")


def relabel(ev: GroundingEval) -> dict:
    """Each relation word's category becomes relation_pair or relation_image, read from the sentence's words (the
    files GroundingData parsed, in its order); returns the counts."""
    root = Path(ev.cfg.flickr_root)
    counts = dict.fromkeys(FORMS, 0)
    for item in ev.data.images:
        parsed = parse_sentences(root / "Sentences" / f"{item.image_id}.txt")
        if len(parsed) != len(item.sentences):
            raise ValueError(f"{item.image_id}: {len(parsed)} sentences on file, {len(item.sentences)} evaluated")
        for sentence, words in zip(item.sentences, parsed):
            new = []
            for i, cat in sentence.categories:
                if cat == "relation":
                    form = "image" if i > 0 and words.words[i - 1].lower() == "the" else "pair"
                    counts[form] += 1
                    cat = f"relation_{form}"
                new.append((i, cat))
            sentence.categories = new
    return counts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("models", nargs="+", metavar="LABEL=EXPORT")
    p.add_argument("--config", required=True)
    p.add_argument("--images", type=int, default=200)
    args = p.parse_args()
    cfg = load_config(GroundingConfig, args.config, [f"max_images={args.images}"])
    rows = []
    for spec in args.models:
        label, _, path = spec.partition("=")
        model = load_pretrained(path).eval()
        ev = GroundingEval(cfg, load_tokenizer(path), feature_extractor(model, "cpu"))
        counts = relabel(ev)
        w = ev(model, "cpu")["words"]
        boot = {"resamples": cfg.bootstrap, "seed": cfg.seed}
        for form in FORMS:
            sel = w["category"] == f"relation_{form}"
            cells = [clustered_bootstrap(w[c][sel], w["cluster"][sel], **boot) for c in ("image", "ablated")]
            diff = clustered_bootstrap(w["image"][sel] - w["ablated"][sel], w["cluster"][sel], **boot)
            rows.append(f"| {label} | {form} | {counts[form]} ({len(np.unique(w['cluster'][sel]))}) | "
                        + " | ".join(format_interval(c) for c in cells) + f" | {format_interval(diff)} |")
        print(rows[-2] + "\n" + rows[-1], flush=True)
    text = (f"### Relation words by form ({args.images} held-out images; masked alone, 95% interval by image)\n\n"
            "`pair`: X left of / above Y (two objects' positions); `image`: X on the left / right (one object's, "
            "against the image's middle)\n\n"
            "| model | form | words (images) | image | ablated | image - ablated |\n|---|---|---|---|---|---|\n"
            + "\n".join(rows) + "\n")
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
