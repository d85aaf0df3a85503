"""THE TFRecord contract for pretraining instances (Google BERT's feature names and types).

The Beam writer (`beam_jobs.pretraining_data`, records encoded by
`beam_jobs.example_encoder`) and the tf.data reader (`pipeline.training.inputs`, which also
has the TensorFlow encoder `serialize` and the parse spec) both import this module, so the
two cannot drift apart. It imports neither TensorFlow nor Beam, so the Beam workers need no
TensorFlow (checked by import-linter).

    input_ids             int64[max_seq_length]           token ids, 0-padded
    input_mask            int64[max_seq_length]           1 = real token, 0 = padding
    segment_ids           int64[max_seq_length]           0 = [CLS] A [SEP], 1 = B [SEP]
    masked_lm_positions   int64[max_predictions_per_seq]  positions of the masked tokens
    masked_lm_ids         int64[max_predictions_per_seq]  the original ids at those positions
    masked_lm_weights     float[max_predictions_per_seq]  1.0 for a real prediction, 0.0 padding
    next_sentence_labels  int64[1]                        0 = B follows A, 1 = B is random
                                                          (SOP: 0 = in order, 1 = swapped)

    >>> pad_instance(dict(input_ids=[101, 7, 102], input_mask=[1, 1, 1], segment_ids=[0, 0, 0],
    ...     masked_lm_positions=[1], masked_lm_ids=[7], masked_lm_weights=[1.0],
    ...     next_sentence_labels=[0]), 4, 2)["masked_lm_weights"]
    [1.0, 0.0]
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
