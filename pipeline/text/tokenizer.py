"""`Tokenizer`: the tokenizer contract (`models.preprocessor.TokenizerLayer`) over a vocab.txt
with BERT's [CLS] A [SEP] (B [SEP]) inputs, used by the inspection tools (fill-mask, nsp,
attention, embed) and the review plots.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from models.tokenizer import read_vocab

from pipeline.text.vocab import TextError

REQUIRED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


TRACE_ABOVE = 256  # texts per tokenizer call above which the tokenizer runs as a tf.function


# ---------------------------------------------------------------------------
# Tokenizer: the contract's WordPiece, [CLS] A [SEP] (B [SEP]) inputs.
# ---------------------------------------------------------------------------
class Tokenizer:
    """The contract's tokenizer over a vocab.txt; a literal "[MASK]" in text is the [MASK] id.

    (So are "[CLS]", "[SEP]", "[PAD]" and "[UNK]"; anything else in brackets is split
    into pieces as usual, e.g. "[mask]" is "[", "mask", "]".)

    The special tokens are looked up by string, so any vocab layout works
    (Google's puts [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103).
    Uncased (`lowercase=True`) also strips accents, as the data stage does.

    ```python
    tokenizer = Tokenizer.from_vocab("runs/default/vocab/vocab.txt")
    inputs = tokenizer.encode([("Hello [MASK].", None)], max_length=512)
    tokenizer.tokens(inputs["token_ids"][0])  # ['[CLS]', 'hello', '[MASK]', '.', '[SEP]']
    ```
    """

    def __init__(self, vocab_file: str | Path, lowercase: bool = True):
        import tensorflow as tf

        from models.preprocessor import TokenizerLayer

        path = Path(vocab_file)
        if not path.is_file():
            raise TextError(f"vocab file {path} not found; pass --vocab PATH (the vocab.txt the "
                            f"model was trained with)")
        # Lines split as keras-hub splits a vocab file, so ids agree with the data stage's.
        self.vocab = read_vocab(path)
        self.vocab_file = path
        self.lowercase = lowercase
        index: dict[str, int] = {}
        for i, token in enumerate(self.vocab):
            index.setdefault(token, i)
        missing = [t for t in REQUIRED_TOKENS if t not in index]
        if missing:
            raise TextError(f"vocab file {path} has no {', '.join(missing)} token(s); a BERT vocab "
                            f"needs all of {', '.join(REQUIRED_TOKENS)}")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            index[t] for t in REQUIRED_TOKENS)
        self._layer = TokenizerLayer(self.vocab, lowercase=lowercase,
                                     special_tokens_in_strings=True)
        self._traced = None  # tf.function of the layer, made for the first large batch
        self._tf = tf

    @classmethod
    def from_vocab(cls, vocab_file: str | Path, lowercase: bool | None = None) -> "Tokenizer":
        """`lowercase=None` reads it from the `vocab.json` beside the vocab (uncased if there is none)."""
        if lowercase is None:
            meta = Path(vocab_file).parent / "vocab.json"
            lowercase = True
            if meta.is_file():
                lowercase = bool(json.loads(meta.read_text(encoding="utf-8")).get("lowercase", True))
        return cls(vocab_file, lowercase)

    def __len__(self) -> int:
        return len(self.vocab)

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        """[text] -> [[wordpiece id, ...]] (no [CLS]/[SEP])."""
        if not texts:
            return []
        # Eager calls cost ~1 ms for a few texts; tracing costs seconds but then runs ~10x
        # faster, which pays off for large batches (embed over a file).
        tokenize = self._layer
        if len(texts) > TRACE_ABOVE:
            if self._traced is None:
                self._traced = self._tf.function(
                    self._layer, input_signature=[self._tf.TensorSpec([None], self._tf.string)])
            tokenize = self._traced
        ragged = tokenize(self._tf.constant(list(texts)))  # (texts, (tokens))
        flat = ragged.flat_values.numpy().tolist()
        splits = ragged.row_splits.numpy().tolist()
        return [flat[start:end] for start, end in zip(splits[:-1], splits[1:])]

    def tokens(self, ids) -> list[str]:
        return [self.vocab[int(i)] for i in ids]

    def encode(self, pairs: Sequence[tuple[str, str | None]], max_length: int,
               truncate: bool = False, first: int = 0) -> dict[str, np.ndarray]:
        """[(A, B or None)] -> `[CLS] A [SEP] (B [SEP])` inputs padded to the longest, (batch, seq) int32.

        Returns {"token_ids", "segment_ids" (0 for [CLS] A [SEP], 1 for B [SEP]),
        "padding_mask" (1 = real token)}. A sequence longer than `max_length`
        raises InspectError, or with `truncate` loses tokens from the end of the
        longer sentence. `first` numbers the texts in that message (first + 1, ...).
        """
        a_ids = self.ids([a for a, _ in pairs])
        b_texts = [(i, b) for i, (_, b) in enumerate(pairs) if b is not None]
        b_ids: list[list[int] | None] = [None] * len(pairs)
        for (i, _), ids in zip(b_texts, self.ids([b for _, b in b_texts])):
            b_ids[i] = ids
        rows = []
        for n, (a, b) in enumerate(zip(a_ids, b_ids)):
            specials = 2 if b is None else 3
            length = len(a) + len(b or []) + specials
            if length > max_length:
                if not truncate:
                    which = f"text {first + n + 1}" if len(pairs) > 1 or first else "the text"
                    raise TextError(
                        f"{which} is {length} tokens with [CLS]/[SEP], but the model takes at most "
                        f"{max_length}; shorten it")
                a, b = list(a), (list(b) if b is not None else None)
                while len(a) + len(b or []) + specials > max_length:
                    (b if b is not None and len(b) > len(a) else a).pop()
            ids = [self.cls_id, *a, self.sep_id]
            segments = [0] * len(ids)
            if b is not None:
                ids += [*b, self.sep_id]
                segments += [1] * (len(b) + 1)
            rows.append((ids, segments))
        seq = max(len(ids) for ids, _ in rows)
        token_ids = np.full((len(rows), seq), self.pad_id, "int32")
        segment_ids = np.zeros((len(rows), seq), "int32")
        padding_mask = np.zeros((len(rows), seq), "int32")
        for i, (ids, segments) in enumerate(rows):
            token_ids[i, :len(ids)] = ids
            segment_ids[i, :len(ids)] = segments
            padding_mask[i, :len(ids)] = 1
        return {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}
