"""tf.data input for pretraining: sharded TFRecords → batches the pretrainer consumes.

Records are parsed with the one schema module the Beam writer uses
(`beam_jobs.schema`). Each batch is `(x, y, sample_weight)`:

    x  = {"token_ids", "segment_ids", "padding_mask", "mask_positions"}   int32
    y  = {"mlm": masked_lm_ids int32 (batch, P), "nsp": next_sentence_labels int32 (batch,)}
    sw = {"mlm": masked_lm_weights float32 (batch, P), "nsp": ones (batch,)}

Training data: files listed in a seeded random order, read in parallel
(interleave), shuffled, repeated forever, batched with a fixed size, parsed
per batch (vectorised) and prefetched. Evaluation data: one ordered pass.
"""

from __future__ import annotations

import tensorflow as tf

from beam_jobs import schema


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
                        shuffle_buffer: int = 10_000) -> tf.data.Dataset:
    files = tf.io.gfile.glob(pattern)
    if not files:
        raise FileNotFoundError(f"no TFRecord files match {pattern}; run `make data` first")
    spec = schema.parse_spec(max_seq_length, max_predictions_per_seq)
    dataset = tf.data.Dataset.from_tensor_slices(sorted(files))
    if training:
        dataset = dataset.shuffle(len(files), seed=seed).repeat()
    dataset = dataset.interleave(
        tf.data.TFRecordDataset, cycle_length=min(len(files), 8),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if training:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    dataset = dataset.batch(batch_size, drop_remainder=training)
    dataset = dataset.map(lambda records: to_model_inputs(tf.io.parse_example(records, spec)),
                          num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)
