"""The tokenizer contract of `models.tokenizer` in TensorFlow ops, and BERT's input packer.

`TokenizerLayer` (a keras-hub `WordPieceTokenizer`) applies the rules of `models.tokenizer`
with TensorFlow and tf-text ops only, so it runs in tf.data and inside every exported
SavedModel; `TextPreprocessor` packs its ids into `[CLS] A [SEP] (B [SEP])` inputs. Both give
the ids of `models.tokenizer.Tokenizer` (tests/test_tokenizer.py holds them to it).

How the graph follows the rules (the character classes are this Python's, written out as
explicit RE2 classes, so RE2's and ICU's own Unicode versions do not matter):

- clean: one `regex_replace` of the `delete` class;
- uncased: `tf.strings.lower` (ICU: full case mapping and the final sigma, as `str.lower`),
  then NFD (`tf_text.normalize_utf8`), then a `regex_replace` of the Mn class. Texts holding a
  character where this ICU disagrees with Python (a capital sigma, an unassigned character, a
  letter newer than ICU's tables: found once per process by running both on every code
  point) take a slower path for those texts only: the sigmas are decided by regex with
  Python's cased/case-ignorable classes, and the disagreeing characters are mapped by a table
  of Python's results instead of ICU;
- words: `regex_replace`s turn non-ASCII whitespace into spaces and put spaces around
  punctuation/CJK characters (and special tokens, when recognized), then `tf.strings.split`;
- WordPiece: `tf_text.FastWordpieceTokenizer`, after words over 200 characters became [UNK].
"""

from __future__ import annotations

import functools
import unicodedata

import keras
import keras_hub
import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from models import tokenizer as rules


@functools.cache
def graph_tables() -> dict:
    """RE2 patterns and ICU corrections for the graph, computed once per process."""
    classes = rules.character_classes()

    def cls(*names):
        return rules.regex_class(tuple(r for n in names for r in classes[n]), "re2")

    chars = [chr(cp) for a, b in ((0, 0xD7FF), (0xE000, 0x10FFFF)) for cp in range(a, b + 1)]
    icu = tf_text.normalize_utf8(tf.strings.lower(tf.constant(chars), encoding="utf-8"),
                                 "NFD").numpy()
    unassigned = {cp for a, b in classes["unassigned"] for cp in range(a, b + 1)}
    fixes = {}
    for char, got in zip(chars, icu):
        if ord(char) in unassigned or char in "\x00\u03a3":
            continue
        want = unicodedata.normalize("NFD", char.lower())
        if got.decode("utf-8") != want:
            fixes[char] = want
            assert unicodedata.combining(char) == 0, hex(ord(char))
    protect = rules.regex_class(rules._ranges(set(map(ord, fixes)) | unassigned), "re2")
    cased, ignorable = cls("cased"), cls("case_ignorable")
    not_context = f"[^{cased[1:-1]}{ignorable[1:-1]}]"  # neither cased nor case-ignorable
    return {
        "delete": cls("delete"),
        "wide_space": rules.regex_class(tuple(
            (a, b) for a, b in classes["space"] if a > 127), "re2"),  # beyond ASCII's
        "mark": cls("mark"),
        "split": cls("punctuation", "cjk"),
        "slow": "(?s).*(?:\u03a3|" + protect + ").*",
        "protect": protect,
        "final_sigma": f"({cased}{ignorable}*)\u03a3({ignorable}*(?:{not_context}|$))",
        "fixes": fixes,
    }


def _lower_icu(text):
    return tf_text.normalize_utf8(tf.strings.lower(text, encoding="utf-8"), "NFD")


def _lower_exact(text, tables, fix_table):
    """`str.lower` then NFD of each string, where ICU cannot be trusted (the slow path)."""
    text = tf.strings.regex_replace(text, tables["final_sigma"], "\\1\u03c2\\2")
    text = tf.strings.regex_replace(text, "\u03a3", "\u03c3")
    pieces = tf_text.regex_split(text, tables["protect"], tables["protect"])
    flat = pieces.flat_values
    protected = tf.strings.regex_full_match(flat, tables["protect"])
    mapped = fix_table.lookup(flat)
    mapped = tf.where(mapped == "", flat, mapped)  # an unassigned character stays itself
    flat = tf.where(protected, mapped, _lower_icu(flat))
    return tf.strings.reduce_join(pieces.with_flat_values(flat), axis=-1)


def lower_and_decompose(text, tables, fix_table):
    """Rule 3 before the marks go: lowercase + NFD, exactly as Python, for a (batch,) tensor."""
    slow = tf.strings.regex_full_match(text, tables["slow"])
    out = _lower_icu(text)
    index = tf.where(slow)
    exact = _lower_exact(tf.gather_nd(text, index), tables, fix_table)
    return tf.tensor_scatter_nd_update(out, index, exact)


@keras.saving.register_keras_serializable(package="bert_pipeline")
class TokenizerLayer(keras_hub.tokenizers.WordPieceTokenizer):
    """`models.tokenizer`'s rules in TensorFlow ops: strings (batch,) → ragged ids.

    Takes the arguments of keras-hub's `WordPieceTokenizer`; `lowercase` implies stripping
    accents (rule 3), `special_tokens_in_strings` turns on rule 6.

        >>> layer = TokenizerLayer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "ab", "##c"],
        ...                        lowercase=True)
        >>> layer(tf.constant(["ABC ÅB", "[MASK]"])).to_list()
        [[5, 6, 5], [1, 1, 1]]
    """

    def __init__(self, vocabulary=None, lowercase=False, special_tokens_in_strings=False,
                 sequence_length=None, dtype="int32", **kwargs):
        kwargs.pop("strip_accents", None)
        kwargs.pop("oov_token", None)
        super().__init__(vocabulary=vocabulary, sequence_length=sequence_length,
                         lowercase=lowercase, strip_accents=lowercase, oov_token="[UNK]",
                         special_tokens_in_strings=special_tokens_in_strings, dtype=dtype,
                         **kwargs)

    def _set_vocabulary_tf(self):
        # Rule 5 counts characters: words over MAX_WORD_CHARS are replaced before this, so
        # the byte limit (4 bytes a character at most) never decides.
        self._fast_word_piece = tf_text.FastWordpieceTokenizer(
            vocab=self.vocabulary, token_out_type=self.compute_dtype,
            suffix_indicator=rules.SUFFIX, unknown_token=self.oov_token,
            max_bytes_per_word=4 * rules.MAX_WORD_CHARS, no_pretokenization=True,
            support_detokenization=True)
        tables = graph_tables()
        keys = list(tables["fixes"]) or ["\x00"]
        values = list(tables["fixes"].values()) or [""]
        self._fix_table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(keys, values), default_value="")

    def _special_pattern(self):
        if not self.special_tokens_in_strings:
            return None
        present = [t for t in rules.SPECIAL_TOKENS if t in self._token_to_id_map]
        return rules.special_tokens_pattern(present)

    def words(self, text):
        """Rules 1-4 (and 6): (batch,) strings → ragged (batch, words) strings."""
        tables = graph_tables()
        special = self._special_pattern()
        text = tf.strings.regex_replace(text, tables["delete"], "")
        if self.lowercase:
            if special is None:
                text = lower_and_decompose(text, tables, self._fix_table)
            else:  # special tokens keep their capitals
                parts = tf_text.regex_split(text, special, special)
                flat = parts.flat_values
                lowered = lower_and_decompose(flat, tables, self._fix_table)
                flat = tf.where(tf.strings.regex_full_match(flat, special), flat, lowered)
                text = tf.strings.reduce_join(parts.with_flat_values(flat), axis=-1)
            text = tf.strings.regex_replace(text, tables["mark"], "")
        # Whitespace other than ASCII's becomes a space, punctuation/CJK characters (and special
        # tokens) get a space on each side, then `tf.strings.split` splits on ASCII whitespace
        # (faster than one RE2 split, and than a replacement with capture groups).
        own = tables["split"] if special is None else f"{special}|{tables['split']}"
        text = tf.strings.regex_replace(text, tables["wide_space"], " ")
        text = tf.strings.regex_replace(text, own, " \\0 ")
        words = tf.strings.split(text)
        flat = words.flat_values
        too_long = tf.strings.length(flat, unit="UTF8_CHAR") > rules.MAX_WORD_CHARS
        return words.with_flat_values(tf.where(too_long, self.oov_token, flat))

    def tokenize(self, inputs):
        self._check_vocabulary()
        self._maybe_initialized_tf()
        text = inputs if isinstance(inputs, tf.Tensor) else tf.convert_to_tensor(inputs)
        unbatched = text.shape.rank == 0
        if unbatched:
            text = tf.expand_dims(text, 0)
        tokens = self._fast_word_piece.tokenize(self.words(text)).merge_dims(-2, -1)
        if self.sequence_length:
            tokens = tokens.to_tensor(shape=[None, self.sequence_length])
        if unbatched:
            tokens = tf.squeeze(tokens, 0)
        return tokens

    def compute_output_spec(self, input_spec):
        return keras.KerasTensor(input_spec.shape + (self.sequence_length,),
                                 dtype=self.compute_dtype)


class TextPreprocessor:
    """Raw strings → BERT inputs, in TensorFlow ops (usable in tf.data and in a SavedModel).

    `preprocessor(text)` or `preprocessor(text, text_pair)` with string tensors of shape
    (batch,) returns {"token_ids", "segment_ids", "padding_mask"}, int32 (batch, seq_length):
    `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, segment ids 0 for the first part and 1 for the
    second, truncated round-robin (the longer side loses tokens first) and padded with [PAD].
    The same object makes the training features and runs inside the exported SavedModel,
    so serving tokenizes exactly as training did.

    A SavedModel that serves it must track `tokenizer` and `packer` (keras layers holding the
    vocabulary table); `pipeline.serving.export.export_text_model` does.
    """

    def __init__(self, vocab: list[str], lowercase: bool, seq_length: int):
        self.vocab = list(vocab)
        self.lowercase = lowercase
        self.seq_length = seq_length
        self.tokenizer = TokenizerLayer(self.vocab, lowercase=lowercase)
        self.cls_id, self.sep_id = self.vocab.index("[CLS]"), self.vocab.index("[SEP]")
        self.pad_id, self.unk_id = self.vocab.index("[PAD]"), self.vocab.index("[UNK]")
        self.packer = keras_hub.layers.MultiSegmentPacker(
            sequence_length=seq_length, start_value=self.cls_id, end_value=self.sep_id,
            pad_value=self.pad_id, truncate="round_robin")

    def __call__(self, text, text_pair=None):
        segments = (self.tokenizer(text),) if text_pair is None else (
            self.tokenizer(text), self.tokenizer(text_pair))
        token_ids, segment_ids = self.packer(segments)  # (batch, seq) each
        return {"token_ids": tf.cast(token_ids, tf.int32),
                "segment_ids": tf.cast(segment_ids, tf.int32),
                "padding_mask": tf.cast(token_ids != self.pad_id, tf.int32)}

    def functions(self) -> dict:
        """tf.functions over string batches ("single", "pair": the features; "tokenize": ragged
        ids), traced once per preprocessor, not per call: `features`, `tokenize_words` and the
        raw-text SavedModels (pipeline/serving/export.py) call them."""
        if getattr(self, "_traced", None) is None:
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
        if not texts:
            return {k: np.zeros((0, self.seq_length), np.int32)
                    for k in ("token_ids", "segment_ids", "padding_mask")}
        fns = self.functions()
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
        out: list[list[int]] = []
        tokenize = self.functions()["tokenize"]
        for start in range(0, len(words), batch_size):
            ragged = tokenize(tf.constant(list(words[start:start + batch_size])))
            ids = ragged.flat_values.numpy().tolist()
            splits = ragged.row_splits.numpy().tolist()
            out.extend(ids[a:b] for a, b in zip(splits[:-1], splits[1:]))
        return out
