"""Text-only corpora -> WebDataset tar shards of WordPiece chunks of at most 64 tokens.

Input: BooksCorpus-style folders (one book per .txt file) and Wikipedia-style dumps (articles
separated by blank lines, or one article per line). A chunk gathers consecutive sentences of one
document while they fit; a sentence longer than the limit is cut at word boundaries (never inside a
word's word-pieces, unless the word alone is longer than the limit). Each sample is `key.json` with
`input_ids` (no special tokens), `text` and `source` (file:line).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from .caption_inputs import expand_paths
from .sink import ShardSink
from .skips import SkipLog
from .tokenizer import load_tokenizer

# A sentence ends at . ! or ? (optionally followed by closing quotes/brackets) before whitespace and
# an upper-case letter, digit or opening quote. Good enough for books and encyclopaedic prose;
# abbreviations like "Mr. Smith" split, which only makes a chunk boundary slightly early.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    text = " ".join(text.split())
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def iter_books(folder: str | Path) -> Iterator[tuple[str, str]]:
    """(where, document) per book: one .txt file is one document."""
    files = sorted(Path(folder).rglob("*.txt"))
    if not files:
        raise FileNotFoundError(f"{folder}: no .txt books found")
    for path in files:
        yield f"{path}:1", path.read_text(encoding="utf-8", errors="replace")


def iter_wiki(pattern: str, one_per_line: bool = False) -> Iterator[tuple[str, str]]:
    """(where, article) from dumps with articles separated by blank lines (or one per line)."""
    for path in expand_paths(pattern):
        with open(path, encoding="utf-8", errors="replace") as f:
            buf: list[str] = []
            start = 1
            for lineno, line in enumerate(f, 1):
                if one_per_line:
                    if line.strip():
                        yield f"{path}:{lineno}", line
                    continue
                if line.strip():
                    if not buf:
                        start = lineno
                    buf.append(line)
                elif buf:
                    yield f"{path}:{start}", "".join(buf)
                    buf = []
            if buf:
                yield f"{path}:{start}", "".join(buf)


def chunk_document(sentence_ids: list[list[int]], is_continuation: list[bool], max_tokens: int) -> list[list[int]]:
    """Greedy packing of consecutive sentences into chunks of at most `max_tokens` ids.

    is_continuation[i] is True when token i of the flattened document continues a word ("##" piece);
    long sentences are cut only where it is False, so whole-word masking never sees half a word.
    """
    chunks: list[list[int]] = []
    current: list[int] = []
    offset = 0
    for ids in sentence_ids:
        cont = is_continuation[offset: offset + len(ids)]
        offset += len(ids)
        if len(current) + len(ids) <= max_tokens:
            current += ids
            continue
        if current:
            chunks.append(current)
            current = []
        while len(ids) > max_tokens:
            cut = max_tokens
            while cut > 0 and cont[cut]:
                cut -= 1
            cut = cut or max_tokens  # one word longer than the limit: cut it anyway
            chunks.append(ids[:cut])
            ids, cont = ids[cut:], cont[cut:]
        current = list(ids)
    if current:
        chunks.append(current)
    return chunks


def write_text_shards(documents: Iterator[tuple[str, str]], out_dir: str, *, tokenizer, max_tokens: int = 64,
                      skips: SkipLog, prefix: str = "text", max_count: int = 20000,
                      max_bytes: int = 256 << 20, progress: bool = True) -> dict:
    sink = ShardSink(out_dir, prefix, max_count=max_count, max_bytes=max_bytes, kind="text",
                     meta={"max_tokens": max_tokens, "tokenizer_vocab_size": tokenizer.vocab_size})
    index = 0
    for where, doc in tqdm(documents, desc=f"text -> {out_dir}", unit="doc", disable=not progress):
        sentences = split_sentences(doc)
        if not sentences:
            skips.skip("empty document", where)
            continue
        encoded = tokenizer(sentences, add_special_tokens=False)["input_ids"]
        flat = [t for ids in encoded for t in ids]
        tokens = tokenizer.convert_ids_to_tokens(flat)
        continuation = [t.startswith("##") for t in tokens]
        for chunk in chunk_document(encoded, continuation, max_tokens):
            record = {"input_ids": chunk, "text": tokenizer.decode(chunk), "source": where}
            sink.write({"__key__": f"{index:09d}", "json": json.dumps(record).encode("utf-8")})
            index += 1
        skips.ok()
    return sink.close(skips.as_dict())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--books", action="append", default=[], help="BooksCorpus-style folder (one book per .txt)")
    p.add_argument("--wiki", action="append", default=[], help="Wikipedia-style dump files (glob/brace pattern)")
    p.add_argument("--wiki-one-per-line", action="store_true", help="dump has one article per line")
    p.add_argument("--tokenizer", help="local BERT tokenizer directory (default: packaged all-MiniLM-L6-v2)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", required=True)
    p.add_argument("--prefix", default="text")
    p.add_argument("--max-count", type=int, default=20000)
    p.add_argument("--max-size-mb", type=float, default=256)
    args = p.parse_args(argv)
    if not args.books and not args.wiki:
        p.error("give at least one --books folder or --wiki dump")

    def documents():
        for folder in args.books:
            yield from iter_books(folder)
        for pattern in args.wiki:
            yield from iter_wiki(pattern, args.wiki_one_per_line)

    skips = SkipLog("documents")
    manifest = write_text_shards(documents(), args.out, tokenizer=load_tokenizer(args.tokenizer),
                                 max_tokens=args.max_tokens, skips=skips, prefix=args.prefix,
                                 max_count=args.max_count, max_bytes=int(args.max_size_mb * (1 << 20)))
    print(f"{manifest['total']} chunks in {len(manifest['shards'])} shards under {args.out}", file=sys.stderr)
    print(skips.summary(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
