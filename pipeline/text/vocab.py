"""Reading a WordPiece vocab.txt, and the error every text input raises.

`read_vocab` reads one with the tokenizer contract's one reader (`models.tokenizer.
read_vocab`: lines split as keras-hub's WordPieceTokenizer does, trailing whitespace
dropped), so ids agree with the data stage's, the converters' and the in-graph tokenizer's,
and says what is wrong with the file as a `TextError`; `vocab_lowercase` reads the casing the
vocab stage recorded in vocab.json beside it; `write_beside_model` puts both beside a model
file, so that the model can be started from in any run directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from models import tokenizer

REQUIRED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")


class TextError(ValueError):
    """A vocab or text input that cannot be used; the message names it and how to fix it.

    The fine-tuning data errors and the inspection tools' errors are kinds of it.
    """


def read_vocab(vocab_file) -> list[str]:
    """vocab.txt → tokens in id order (`models.tokenizer.read_vocab`); TextError if it is
    missing, not UTF-8 or lacks a special token."""
    path = Path(vocab_file)
    if not path.is_file():
        raise TextError(f"vocab file {path} not found; run `make vocab` (or set "
                        f"finetune.vocab_file)")
    try:
        vocab = tokenizer.read_vocab(path)
    except ValueError as err:
        raise TextError(str(err)) from None
    missing = [t for t in REQUIRED_TOKENS if t not in vocab]
    if missing:
        raise TextError(f"vocab file {path} lacks {', '.join(missing)}")
    return vocab


def vocab_lowercase(vocab_file, default: bool) -> bool:
    """Whether the vocab is uncased, from the vocab stage's vocab.json beside it if present."""
    meta = Path(vocab_file).with_name("vocab.json")
    if meta.is_file():
        try:
            return bool(json.loads(meta.read_text())["lowercase"])
        except (KeyError, ValueError):
            pass
    return default


def write_beside_model(vocab_file, lowercase: bool, folder) -> None:
    """vocab.txt (a copy of `vocab_file`) and vocab.json (its casing, and the other fields of
    the vocab.json beside `vocab_file`) in `folder`, beside a model.keras written there: the
    model then carries its vocabulary and casing to any run that starts from it
    (`finetune.init_from`, `model.init_from`)."""
    folder = Path(folder)
    meta = {}
    source_meta = Path(vocab_file).with_name("vocab.json")
    if source_meta.is_file():
        try:
            meta = dict(json.loads(source_meta.read_text(encoding="utf-8")))
        except ValueError:
            meta = {}
    meta["lowercase"] = bool(lowercase)
    if Path(vocab_file).resolve() != (folder / "vocab.txt").resolve():
        shutil.copyfile(vocab_file, folder / "vocab.txt")
    (folder / "vocab.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
