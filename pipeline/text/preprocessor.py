"""The in-graph text preprocessor of fine-tuning and serving, and the basic word split.

`TextPreprocessor`, TensorFlow ops only (keras-hub's
WordPieceTokenizer + MultiSegmentPacker: `[CLS] A [SEP] (B [SEP])`, segment ids 0/1,
round-robin truncation to `max_seq_length`). The same object runs in the tf.data pipeline that
makes the training features and inside the exported SavedModel, so serving tokenizes exactly
as training did.

`basic_tokens` splits text into words and punctuation with character offsets (QA answers
are mapped back to them).
"""

from __future__ import annotations

import re

import numpy as np


class TextPreprocessor:
    """Raw strings → BERT inputs, in TensorFlow ops (usable in tf.data and in a SavedModel).

    `preprocessor(text)` or `preprocessor(text, text_pair)` with string tensors of shape
    (batch,) returns {"token_ids", "segment_ids", "padding_mask"}, int32 (batch, seq_length):
    `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, segment ids 0 for the first part and 1 for the
    second, truncated round-robin (the longer side loses tokens first) and padded with [PAD].

    A SavedModel that serves it must track `tokenizer` and `packer` (keras layers holding the
    vocabulary table); `pipeline.serving.export.export_text_model` does.
    """

    def __init__(self, vocab: list[str], lowercase: bool, seq_length: int):
        import keras_hub

        self.vocab = list(vocab)
        self.lowercase = lowercase
        self.seq_length = seq_length
        self.tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=self.vocab, lowercase=lowercase, strip_accents=lowercase,
            oov_token="[UNK]")
        self.cls_id, self.sep_id = self.vocab.index("[CLS]"), self.vocab.index("[SEP]")
        self.pad_id, self.unk_id = self.vocab.index("[PAD]"), self.vocab.index("[UNK]")
        self.packer = keras_hub.layers.MultiSegmentPacker(
            sequence_length=seq_length, start_value=self.cls_id, end_value=self.sep_id,
            pad_value=self.pad_id, truncate="round_robin")

    def __call__(self, text, text_pair=None):
        import tensorflow as tf

        segments = (self.tokenizer(text),) if text_pair is None else (
            self.tokenizer(text), self.tokenizer(text_pair))
        token_ids, segment_ids = self.packer(segments)  # (batch, seq) each
        return {"token_ids": tf.cast(token_ids, tf.int32),
                "segment_ids": tf.cast(segment_ids, tf.int32),
                "padding_mask": tf.cast(token_ids != self.pad_id, tf.int32)}

    def _functions(self):
        """tf.functions over string batches, traced once per preprocessor (not per call)."""
        if getattr(self, "_traced", None) is None:
            import tensorflow as tf

            spec = tf.TensorSpec([None], tf.string)
            self._traced = {
                "single": tf.function(lambda t: self(t), input_signature=[spec]),
                "pair": tf.function(lambda t, p: self(t, p), input_signature=[spec, spec]),
                "tokenize": tf.function(lambda w: self.tokenizer(w), input_signature=[spec]),
            }
        return self._traced

    def features(self, texts: list[str], pairs: list[str] | None = None,
                 batch_size: int = 1024) -> dict:
        """Numpy features for lists of strings (graph-mode batches: fast)."""
        import tensorflow as tf

        if not texts:
            return {k: np.zeros((0, self.seq_length), np.int32)
                    for k in ("token_ids", "segment_ids", "padding_mask")}
        fns = self._functions()
        parts = []
        for start in range(0, len(texts), batch_size):
            text = tf.constant(list(texts[start:start + batch_size]))
            if pairs is None:
                out = fns["single"](text)
            else:
                out = fns["pair"](text, tf.constant(list(pairs[start:start + batch_size])))
            parts.append({k: v.numpy() for k, v in out.items()})
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def tokenize_words(self, words: list[str], batch_size: int = 8192) -> list[list[int]]:
        """Word-piece ids of each string (a word, or any text), in one batched call per chunk."""
        import tensorflow as tf

        out: list[list[int]] = []
        tokenize = self._functions()["tokenize"]
        for start in range(0, len(words), batch_size):
            ragged = tokenize(tf.constant(list(words[start:start + batch_size])))
            ids = ragged.flat_values.numpy().tolist()
            splits = ragged.row_splits.numpy().tolist()
            out.extend(ids[a:b] for a, b in zip(splits[:-1], splits[1:]))
        return out


# ---------------------------------------------------------------------------
# Extractive QA features (SQuAD, with doc stride)
# ---------------------------------------------------------------------------
_BASIC_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def basic_tokens(text: str) -> list[tuple[str, int, int]]:
    """Words and single punctuation marks with their character spans (BERT's basic split).

    >>> basic_tokens("Hi, you.")
    [('Hi', 0, 2), (',', 2, 3), ('you', 4, 7), ('.', 7, 8)]
    """
    return [(m.group(), m.start(), m.end()) for m in _BASIC_TOKEN.finditer(text)]
