"""How well a given vocab covers a corpus: the share of its WordPiece pieces that are [UNK].

A published checkpoint's vocab (`vocab.from_file`, set by `model.init_from`) was made for its
own language and text. Continued on a corpus in another language or script, most pieces are
[UNK] and the model learns to predict [UNK]. `unknown_share` tokenizes a sample of one input
file (its first `max_lines` lines with text, at most `SAMPLE_CHARS` characters) by the
project's tokenizer (models/tokenizer.py)
and counts them; the vocab stage warns, naming the file, above `WARN_SHARE`.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> (folder / "vocab.txt").write_text("[PAD]\\n[UNK]\\n[CLS]\\n[SEP]\\n[MASK]\\nthe\\ncat\\n.\\n")
    41
    >>> (folder / "text.txt").write_text("The cat.\\nΗ γάτα.\\n")
    17
    >>> share, pieces = unknown_share(folder / "vocab.txt", True, folder / "text.txt")
    >>> round(share, 4), pieces  # "η", "γατα" are [UNK]; "the", "cat", ".", "." are not
    (0.3333, 6)
"""

from __future__ import annotations

import json
from pathlib import Path

from models.tokenizer import Tokenizer
from pipeline.text.sources import read_lines
from pipeline.text.vocab import read_vocab

WARN_SHARE = 0.05  # above this share of [UNK] pieces, the vocab stage warns
SAMPLE_LINES = 2000
SAMPLE_CHARS = 200_000  # and at most this much text of each (documents of 50 KB a line exist)
MAX_FILES = 50  # the input files sampled


def unknown_share(vocab_file, lowercase: bool, path, corpus_format: str = "google",
                  text_key: str = "text", max_lines: int = SAMPLE_LINES) -> tuple[float, int]:
    """(share of [UNK] among the pieces, pieces counted) of the first `max_lines` lines with
    text (at most SAMPLE_CHARS characters) of `path` (plain, .gz or .bz2; with `corpus_format` jsonl, each record's
    `text_key`) under `vocab_file`."""
    tokenizer = Tokenizer(read_vocab(vocab_file), lowercase=lowercase)
    texts, chars = [], 0
    for _, line in read_lines(Path(path)):
        if corpus_format == "jsonl":
            try:
                line = str(json.loads(line).get(text_key) or "")
            except (ValueError, AttributeError):
                continue
        if line.strip():
            texts.append(line[:SAMPLE_CHARS - chars])
            chars += len(texts[-1])
        if len(texts) >= max_lines or chars >= SAMPLE_CHARS:
            break
    pieces = [i for ids in tokenizer.tokenize(texts) for i in ids]
    if not pieces:
        return 0.0, 0
    return sum(i == tokenizer.unk_id for i in pieces) / len(pieces), len(pieces)


def input_shares(vocab_file, lowercase: bool, paths, corpus_format: str = "google",
                 text_key: str = "text") -> dict:
    """{path: (share of [UNK], pieces counted)} of the first `MAX_FILES` of `paths` that
    have text (`unknown_share` of each)."""
    shares = {}
    for path in list(paths)[:MAX_FILES]:
        share, pieces = unknown_share(vocab_file, lowercase, path, corpus_format, text_key)
        if pieces:
            shares[str(path)] = (share, pieces)
    return shares
