"""`PythonPreprocessor`: the in-graph `models.preprocessor.TextPreprocessor` in pure Python.

Same interface as far as the fine-tuning features use it (`features`, `tokenize_words`,
`seq_length`, `cls_id`, `sep_id`, `pad_id`, `unk_id`), same ids: WordPiece by the tokenizer
contract (`models.tokenizer.Tokenizer`, the rules the in-graph tokenizer follows), packed as
`[CLS] A [SEP] (B [SEP])` with keras-hub's round-robin truncation. No TensorFlow, so Beam
workers can make fine-tuning features (beam_jobs/finetune_data.py);
tests/test_finetune_records.py checks it against the in-graph preprocessor.
"""

from __future__ import annotations

import numpy as np

from models.tokenizer import Tokenizer


def round_robin(lengths: list[int], budget: int) -> list[int]:
    """How many ids each segment keeps: one at a time to each segment that still has some,
    in turn, until `budget` is spent (tf_text.RoundRobinTrimmer, keras-hub's "round_robin")."""
    kept = [0] * len(lengths)
    while budget > 0 and any(k < n for k, n in zip(kept, lengths)):
        for i, n in enumerate(lengths):
            if budget > 0 and kept[i] < n:
                kept[i] += 1
                budget -= 1
    return kept


class PythonPreprocessor:
    """Raw strings → BERT inputs (numpy int32) without TensorFlow."""

    def __init__(self, vocab: list[str], lowercase: bool, seq_length: int):
        self.vocab = list(vocab)
        self.lowercase = lowercase
        self.seq_length = seq_length
        self.tokenizer = Tokenizer(self.vocab, lowercase)
        index = self.tokenizer.index
        self.cls_id, self.sep_id = index["[CLS]"], index["[SEP]"]
        self.pad_id, self.unk_id = index["[PAD]"], index["[UNK]"]

    def tokenize_words(self, words: list[str]) -> list[list[int]]:
        """Word-piece ids of each string (a word, or any text)."""
        return self.tokenizer.tokenize(list(words))

    def pack(self, segments: list[list[int]]) -> tuple[list[int], list[int]]:
        """([CLS] A [SEP] (B [SEP]) ids, segment ids), truncated round-robin, unpadded."""
        kept = round_robin([len(s) for s in segments], self.seq_length - 1 - len(segments))
        ids, types = [self.cls_id], [0]
        for i, (segment, k) in enumerate(zip(segments, kept)):
            ids += list(segment[:k]) + [self.sep_id]
            types += [i] * (k + 1)
        return ids, types

    def features(self, texts: list[str], pairs: list[str] | None = None) -> dict:
        """{"token_ids", "segment_ids", "padding_mask"}: int32 (len(texts), seq_length)."""
        n, seq = len(texts), self.seq_length
        token_ids = np.full((n, seq), self.pad_id, np.int32)
        segment_ids = np.zeros((n, seq), np.int32)
        firsts = self.tokenize_words(texts)
        seconds = self.tokenize_words(pairs) if pairs is not None else None
        for i, first in enumerate(firsts):
            ids, types = self.pack([first] if seconds is None else [first, seconds[i]])
            token_ids[i, :len(ids)] = ids
            segment_ids[i, :len(types)] = types
        return {"token_ids": token_ids, "segment_ids": segment_ids,
                "padding_mask": (token_ids != self.pad_id).astype(np.int32)}
