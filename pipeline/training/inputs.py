"""tf.data input for pretraining: sharded TFRecords → batches the pretrainer consumes.

Records are parsed with the one schema module the Beam writer uses
(`beam_jobs.schema`). Each batch is `(x, y, sample_weight)`:

    x  = {"token_ids", "segment_ids", "padding_mask", "mask_positions"}   int32
    y  = {"mlm": masked_lm_ids int32 (batch, P), "nsp": next_sentence_labels int32 (batch,)}
    sw = {"mlm": masked_lm_weights float32 (batch, P), "nsp": ones (batch,)}

Training data: files listed in a seeded random order, read in parallel
(interleave), shuffled, repeated forever, batched with a fixed size, parsed
per batch (vectorised) and prefetched. Evaluation data: one ordered pass.

Dynamic masking (`masking=DynamicMasking(...)`, for records written with
`data.masking: dynamic`, i.e. unmasked): every batch is masked as it is read,
with the rule of the Beam job (google-research/bert's): per sequence
min(P, max(1, round(length × masked_lm_prob))) positions, never [CLS], [SEP] or
padding; each becomes [MASK] 80%, a random id 10%, itself 10%; with
`whole_word`, a token and its "##" pieces are masked together and a word that
would exceed the count is skipped. The randomness is stateless, seeded by
(masking.seed, index of the batch since the dataset started), so a run is
reproducible and every epoch sees new masks.

    >>> import numpy as np
    >>> m = DynamicMasking(vocab_size=50, mask_id=4, special_ids=(0, 2, 3))
    >>> ids = np.array([[2, 10, 11, 12, 13, 14, 15, 3, 20, 21, 3, 0]])
    >>> out = mask_features({"input_ids": ids, "input_mask": (ids > 0).astype(int)}, m, 5, 0)
    >>> int(out["masked_lm_weights"].numpy().sum())  # round(11 * 0.15) = 2
    2
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from beam_jobs import schema


@dataclasses.dataclass(frozen=True)
class DynamicMasking:
    """How tf.data masks unmasked records (see the module docstring)."""

    vocab_size: int
    mask_id: int
    special_ids: tuple  # never masked: [CLS], [SEP], [PAD] (padding is never masked anyway)
    masked_lm_prob: float = 0.15
    whole_word: bool = False
    continuation_ids: tuple = ()  # ids of "##" pieces (whole-word masking)
    seed: int = 0
    max_predictions_per_seq: int = 0  # 0: the records' max_predictions_per_seq

    @classmethod
    def from_vocab(cls, vocab_file: str, masked_lm_prob: float = 0.15, whole_word: bool = False,
                   seed: int = 0, max_predictions_per_seq: int = 0) -> "DynamicMasking":
        """The special ids looked up by token string in a vocab.txt (any tf.io.gfile path)."""
        from models.tokenizer import read_vocab

        vocab = read_vocab(vocab_file, lambda name: tf.io.gfile.GFile(name, "rb"))
        ids = {token: i for i, token in enumerate(vocab)}
        missing = [t for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]") if t not in ids]
        if missing:
            raise ValueError(f"vocab file {vocab_file} has no {', '.join(missing)} token(s)")
        return cls(vocab_size=len(vocab), mask_id=ids["[MASK]"],
                   special_ids=(ids["[CLS]"], ids["[SEP]"], ids["[PAD]"]),
                   masked_lm_prob=masked_lm_prob, whole_word=whole_word,
                   continuation_ids=tuple(i for i, t in enumerate(vocab) if t.startswith("##")),
                   seed=seed, max_predictions_per_seq=max_predictions_per_seq)


def mask_features(features: dict, masking: DynamicMasking, max_predictions_per_seq: int,
                  batch_index) -> dict:
    """Masks a parsed batch: returns `features` with input_ids masked and masked_lm_positions,
    masked_lm_ids, masked_lm_weights set. Deterministic in (masking.seed, batch_index)."""
    input_ids = tf.cast(features["input_ids"], tf.int64)                    # (B, L)
    real = tf.cast(features["input_mask"], tf.bool)                         # (B, L)
    batch, length = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
    predictions = max_predictions_per_seq
    seed = tf.stack([tf.cast(masking.seed, tf.int64), tf.cast(batch_index, tf.int64)])
    seeds = tf.random.experimental.stateless_split(seed, num=4)

    special = tf.constant(masking.special_ids, tf.int64)
    candidate = real & ~tf.reduce_any(input_ids[..., None] == special, axis=-1)   # (B, L)
    # Words: a candidate starts a new word unless (whole-word) it is a "##" piece right
    # after another candidate.
    word_start = candidate
    if masking.whole_word and masking.continuation_ids:
        table = tf.scatter_nd(tf.constant(masking.continuation_ids, tf.int64)[:, None],
                              tf.ones([len(masking.continuation_ids)], tf.bool),
                              [masking.vocab_size])
        is_piece = tf.gather(table, tf.clip_by_value(input_ids, 0, masking.vocab_size - 1))
        previous = tf.pad(candidate[:, :-1], [[0, 0], [1, 0]])
        word_start = candidate & ~(is_piece & previous)
    word_id = tf.cumsum(tf.cast(word_start, tf.int32), axis=1) - 1           # (B, L)
    word_id = tf.where(candidate, word_id, length - 1)  # non-candidates: a dummy slot
    num_words = tf.reduce_sum(tf.cast(word_start, tf.int32), axis=1)         # (B,)
    word_length = tf.math.bincount(word_id, weights=tf.cast(candidate, tf.int32),
                                   minlength=length, maxlength=length, axis=-1)  # (B, L)
    # How many tokens to predict (Python's round and tf.round both round half to even).
    total = tf.reduce_sum(tf.cast(real, tf.float32), axis=1)
    count = tf.cast(tf.round(total * masking.masked_lm_prob), tf.int32)
    count = tf.minimum(predictions, tf.maximum(1, count))                     # (B,)

    # Words in a random order (slots past num_words last), then greedily taken while they
    # fit in `count` (a word that does not fit is skipped, as in the reference).
    word_slots = tf.range(length)[None, :] < num_words[:, None]
    scores = tf.where(word_slots, tf.random.stateless_uniform([batch, length], seeds[0]), 2.0)
    order = tf.argsort(scores, axis=1, stable=True)                          # (B, W)
    sorted_length = tf.gather(word_length, order, batch_dims=1) * tf.cast(
        tf.gather(word_slots, order, batch_dims=1), tf.int32)
    if masking.whole_word:
        def take(selected, lengths):  # one word (of each row) at a time
            fits = (selected + lengths <= count) & (lengths > 0)
            return selected + tf.where(fits, lengths, 0)

        running = tf.transpose(
            tf.scan(take, tf.transpose(sorted_length), tf.zeros_like(count)))  # (B, W)
        taken_sorted = running > tf.pad(running[:, :-1], [[0, 0], [1, 0]])
    else:  # one token per word: the first `count` words
        taken_sorted = (tf.cumsum(sorted_length, axis=1) <= count[:, None]) & (sorted_length > 0)
    taken_word = tf.gather(taken_sorted, tf.argsort(order, axis=1), batch_dims=1)  # by word id
    chosen = candidate & tf.gather(taken_word, word_id, batch_dims=1)        # (B, L)

    # The chosen positions in increasing order, padded with 0 (weight 0).
    position = tf.broadcast_to(tf.range(length)[None, :], [batch, length])
    keyed = tf.sort(tf.where(chosen, position, length), axis=1)[:, :predictions]
    weights = keyed < length                                                  # (B, P)
    positions = tf.where(weights, keyed, 0)
    labels = tf.where(weights, tf.gather(input_ids, positions, batch_dims=1), 0)

    # 80% [MASK], 10% random id, 10% unchanged.
    branch = tf.random.stateless_uniform([batch, predictions], seeds[1])
    random_ids = tf.random.stateless_uniform([batch, predictions], seeds[2], 0,
                                             masking.vocab_size, dtype=tf.int64)
    replacement = tf.where(branch < 0.8, tf.constant(masking.mask_id, tf.int64),
                           tf.where(branch < 0.9, labels, random_ids))
    hit = tf.one_hot(positions, length, on_value=True, off_value=False) & weights[..., None]
    replaced = tf.reduce_any(hit, axis=1)                                     # (B, L)
    new_ids = tf.reduce_sum(tf.where(hit, replacement[..., None], tf.zeros_like(hit, tf.int64)),
                            axis=1)
    features = dict(features)
    features["input_ids"] = tf.where(replaced, new_ids, input_ids)
    features["masked_lm_positions"] = tf.cast(positions, tf.int64)
    features["masked_lm_ids"] = labels
    features["masked_lm_weights"] = tf.cast(weights, tf.float32)
    return features


def to_model_inputs(features: dict):
    """Parsed schema features → (x, y, sample_weight) as the pretrainer expects."""
    x = {
        "token_ids": tf.cast(features["input_ids"], tf.int32),
        "segment_ids": tf.cast(features["segment_ids"], tf.int32),
        "padding_mask": tf.cast(features["input_mask"], tf.int32),
        "mask_positions": tf.cast(features["masked_lm_positions"], tf.int32),
    }
    y = {
        "mlm": tf.cast(features["masked_lm_ids"], tf.int32),
        "nsp": tf.cast(features[schema.LABEL_FEATURE][:, 0], tf.int32),
    }
    sample_weight = {
        "mlm": features["masked_lm_weights"],
        "nsp": tf.ones_like(features["masked_lm_weights"][:, 0]),
    }
    return x, y, sample_weight


def pretraining_dataset(pattern: str, batch_size: int, max_seq_length: int,
                        max_predictions_per_seq: int, training: bool, seed: int = 0,
                        shuffle_buffer: int = 10_000,
                        masking: DynamicMasking | None = None) -> tf.data.Dataset:
    """Batches of (x, y, sample_weight) from the TFRecords matching `pattern`.

    `masking`: mask each batch here (records written with data.masking: dynamic);
    None (default): use the masks stored in the records.
    """
    files = tf.io.gfile.glob(pattern)
    if not files:
        raise FileNotFoundError(f"no TFRecord files match {pattern}; run `make data` first")
    spec = parse_spec(max_seq_length, max_predictions_per_seq)
    dataset = tf.data.Dataset.from_tensor_slices(sorted(files))
    if training:
        dataset = dataset.shuffle(len(files), seed=seed).repeat()
    dataset = dataset.interleave(
        tf.data.TFRecordDataset, cycle_length=min(len(files), 8),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if training:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    dataset = dataset.batch(batch_size, drop_remainder=training)
    if masking is None:
        dataset = dataset.map(lambda records: to_model_inputs(tf.io.parse_example(records, spec)),
                              num_parallel_calls=tf.data.AUTOTUNE)
    else:
        predictions = masking.max_predictions_per_seq or max_predictions_per_seq
        dataset = dataset.enumerate().map(
            lambda index, records: to_model_inputs(mask_features(
                tf.io.parse_example(records, spec), masking, predictions, index)),
            num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


# ---------------------------------------------------------------------------
# The TensorFlow side of beam_jobs/schema.py: tf.train.Example encoding and parsing
# ---------------------------------------------------------------------------
def serialize(instance: dict, max_seq_length: int, max_predictions_per_seq: int) -> bytes:
    """One instance (unpadded lists are fine) -> a serialized tf.train.Example."""
    padded = schema.pad_instance(instance, max_seq_length, max_predictions_per_seq)
    feature = {}
    for name, values in padded.items():
        if name in schema.FLOAT_FEATURES:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
        else:
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    # Features are a protobuf map whose wire order otherwise depends on the process's hash
    # seed: deterministic encoding makes equal instances equal records on every worker.
    return example.SerializeToString(deterministic=True)


def parse_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """The `tf.io.parse_example` spec for records written by `serialize`."""
    spec = {}
    for name, length in schema.feature_lengths(max_seq_length, max_predictions_per_seq).items():
        dtype = tf.float32 if name in schema.FLOAT_FEATURES else tf.int64
        spec[name] = tf.io.FixedLenFeature([length], dtype)
    return spec

