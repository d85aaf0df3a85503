"""THE TFRecord contract for pretraining instances (Google BERT's feature names and types).

The Beam writer (`beam_jobs.pretraining_data`) and the tf.data reader
(`pipeline.inputs`) both import this module, so the two cannot drift apart.
It imports TensorFlow only for `tf.train.Example` and the parse spec; no Beam.

    input_ids             int64[max_seq_length]           token ids, 0-padded
    input_mask            int64[max_seq_length]           1 = real token, 0 = padding
    segment_ids           int64[max_seq_length]           0 = [CLS] A [SEP], 1 = B [SEP]
    masked_lm_positions   int64[max_predictions_per_seq]  positions of the masked tokens
    masked_lm_ids         int64[max_predictions_per_seq]  the original ids at those positions
    masked_lm_weights     float[max_predictions_per_seq]  1.0 for a real prediction, 0.0 padding
    next_sentence_labels  int64[1]                        0 = B follows A, 1 = B is random
                                                          (SOP: 0 = in order, 1 = swapped)

    >>> from beam_jobs import schema
    >>> record = schema.serialize(dict(
    ...     input_ids=[101, 7, 102, 0], input_mask=[1, 1, 1, 0], segment_ids=[0, 0, 0, 0],
    ...     masked_lm_positions=[1], masked_lm_ids=[7], masked_lm_weights=[1.0],
    ...     next_sentence_labels=[0]), max_seq_length=4, max_predictions_per_seq=2)
    >>> schema.parse_numpy(record, 4, 2)["masked_lm_positions"].tolist()
    [1, 0]
"""

from __future__ import annotations

SEQUENCE_FEATURES = ("input_ids", "input_mask", "segment_ids")
PREDICTION_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
LABEL_FEATURE = "next_sentence_labels"
FLOAT_FEATURES = ("masked_lm_weights",)
FEATURE_NAMES = SEQUENCE_FEATURES + PREDICTION_FEATURES + (LABEL_FEATURE,)

NSP_IS_NEXT = 0
NSP_IS_RANDOM = 1

# File names inside a data directory (the artifact module builds full paths).
TRAIN_PREFIX = "train"
EVAL_PREFIX = "eval"
SHARD_SUFFIX = ".tfrecord"


def feature_lengths(max_seq_length: int, max_predictions_per_seq: int) -> dict[str, int]:
    lengths = {name: max_seq_length for name in SEQUENCE_FEATURES}
    lengths.update({name: max_predictions_per_seq for name in PREDICTION_FEATURES})
    lengths[LABEL_FEATURE] = 1
    return lengths


def pad_instance(instance: dict, max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """Pads every feature of `instance` with zeros to its fixed length; refuses overlong ones."""
    padded = {}
    for name, length in feature_lengths(max_seq_length, max_predictions_per_seq).items():
        values = list(instance[name])
        if len(values) > length:
            raise ValueError(f"feature {name} has {len(values)} values, more than {length}")
        zero = 0.0 if name in FLOAT_FEATURES else 0
        padded[name] = values + [zero] * (length - len(values))
    return padded


def serialize(instance: dict, max_seq_length: int, max_predictions_per_seq: int) -> bytes:
    """One instance (unpadded lists are fine) -> a serialized tf.train.Example."""
    import tensorflow as tf

    padded = pad_instance(instance, max_seq_length, max_predictions_per_seq)
    feature = {}
    for name, values in padded.items():
        if name in FLOAT_FEATURES:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
        else:
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    # Features are a protobuf map whose wire order otherwise depends on the process's hash
    # seed: deterministic encoding makes equal instances equal records on every worker.
    return example.SerializeToString(deterministic=True)


def parse_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """The `tf.io.parse_example` spec for records written by `serialize`."""
    import tensorflow as tf

    spec = {}
    for name, length in feature_lengths(max_seq_length, max_predictions_per_seq).items():
        dtype = tf.float32 if name in FLOAT_FEATURES else tf.int64
        spec[name] = tf.io.FixedLenFeature([length], dtype)
    return spec


def parse_numpy(record: bytes, max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """Parses one record into numpy arrays (for tests and inspection)."""
    import tensorflow as tf

    parsed = tf.io.parse_single_example(record, parse_spec(max_seq_length, max_predictions_per_seq))
    return {name: value.numpy() for name, value in parsed.items()}
