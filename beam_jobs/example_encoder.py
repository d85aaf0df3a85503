"""tf.train.Example records without TensorFlow: `ExampleEncoder` writes the protobuf bytes of an
instance directly, byte-identical to TensorFlow's deterministic serialization (schema.py).
"""

from __future__ import annotations

import struct

from beam_jobs.instances import TrainingInstance


# ---------------------------------------------------------------------------
# tf.train.Example bytes without TensorFlow
# ---------------------------------------------------------------------------
def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class ExampleEncoder:
    """Instance -> serialized tf.train.Example, byte-identical to `schema.serialize`
    (deterministic protobuf encoding: map entries sorted by key), with no TensorFlow.

    An Example is `features {feature {key: "input_ids" value {int64_list {value: [...]}}} ...}`:
    length-delimited fields all the way down, int64 values as packed varints, floats as
    packed little-endian 32-bit values. The fixed-size features (input_mask, segment_ids,
    masked_lm_weights, next_sentence_labels) have a constant header, precomputed here.
    """

    INT64, FLOAT = 3, 2  # Feature's field numbers for int64_list and float_list

    def __init__(self, max_seq_length: int, max_predictions_per_seq: int, vocab_size: int):
        seq, pred = max_seq_length, max_predictions_per_seq
        self.max_seq_length, self.max_predictions = seq, pred
        self._varints = [_varint(i) for i in range(max(vocab_size, seq, 2, 1 << 14))]
        self._heads: dict = {}  # (key, payload length) -> header
        one, zero = struct.pack("<f", 1.0), struct.pack("<f", 0.0)
        # Headers of the features whose payload length is fixed.
        self._mask_head = self._header(b"input_mask", self.INT64, seq)
        self._segment_head = self._header(b"segment_ids", self.INT64, seq)
        self._weights = [self._header(b"masked_lm_weights", self.FLOAT, 4 * pred)
                         + one * k + zero * (pred - k) for k in range(pred + 1)]
        self._labels = [self._header(b"next_sentence_labels", self.INT64, 1) + bytes([label])
                        for label in (0, 1)]

    @staticmethod
    def _header(key: bytes, field: int, payload_length: int) -> bytes:
        """Bytes of one map entry of Features up to its payload (values) of this length."""
        values_head = b"\x0a" + _varint(payload_length)               # Int64List / FloatList
        feature_length = len(values_head) + payload_length
        feature_head = bytes([field << 3 | 2]) + _varint(feature_length)   # Feature
        entry = b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(
            len(feature_head) + feature_length)                          # map entry
        entry_length = len(entry) + len(feature_head) + len(values_head) + payload_length
        return b"\x0a" + _varint(entry_length) + entry + feature_head + values_head

    def _ints(self, key: bytes, values, length: int) -> bytes:
        payload = b"".join(map(self._varints.__getitem__, values)) + b"\x00" * (
            length - len(values))
        head = self._heads.get((key, len(payload)))
        if head is None:
            head = self._heads[key, len(payload)] = self._header(key, self.INT64, len(payload))
        return head + payload

    def _length(self, n: int) -> bytes:
        return self._varints[n] if n < len(self._varints) else _varint(n)

    def encode(self, token_ids, a_length: int, masked_lm_positions, masked_lm_ids,
               label: int) -> bytes:
        """The padded features of one instance -> serialized Example bytes."""
        seq, pred = self.max_seq_length, self.max_predictions
        n, k = len(token_ids), len(masked_lm_positions)
        if n > seq or k > pred:
            raise ValueError(f"instance of {n} tokens / {k} predictions exceeds {seq} / {pred}")
        features = b"".join((  # sorted by key, as deterministic serialization orders a map
            self._ints(b"input_ids", token_ids, seq),
            self._mask_head, b"\x01" * n, b"\x00" * (seq - n),
            self._ints(b"masked_lm_ids", masked_lm_ids, pred),
            self._ints(b"masked_lm_positions", masked_lm_positions, pred),
            self._weights[k],
            self._labels[label],
            self._segment_head, b"\x00" * a_length, b"\x01" * (n - a_length),
            b"\x00" * (seq - n),
        ))
        return b"\x0a" + self._length(len(features)) + features

    def encode_instance(self, instance: TrainingInstance) -> bytes:
        return self.encode(instance.token_ids, instance.a_length, instance.masked_lm_positions,
                           instance.masked_lm_ids, instance.label)


# ---------------------------------------------------------------------------
# Any fixed-shape features (the fine-tuning records of beam_jobs/finetune_data.py)
# ---------------------------------------------------------------------------
_SMALL = 1 << 16  # ids, positions and labels: their varints looked up, not computed
_SMALL_VARINTS = [_varint(i) for i in range(_SMALL)]


def encode_features(features: dict) -> bytes:
    """{key: ("int64" | "float", flat values)} -> serialized tf.train.Example bytes (keys in
    sorted order, as deterministic serialization writes a map; negative int64 values as
    64-bit two's complement varints, as protobuf writes them)."""
    entries = []
    for key in sorted(features):
        kind, values = features[key]
        if kind == "int64":
            field = ExampleEncoder.INT64
            payload = b"".join(_SMALL_VARINTS[v] if 0 <= v < _SMALL else
                               _varint(int(v) & 0xFFFFFFFFFFFFFFFF) for v in values)
        elif kind == "float":
            field = ExampleEncoder.FLOAT
            payload = struct.pack(f"<{len(values)}f", *values)
        else:
            raise ValueError(f"feature {key!r}: kind {kind!r} is not int64 or float")
        values_message = b"\x0a" + _varint(len(payload)) + payload  # Int64List / FloatList
        feature = bytes([field << 3 | 2]) + _varint(len(values_message)) + values_message
        name = key.encode("utf-8")
        entry = b"\x0a" + _varint(len(name)) + name + b"\x12" + _varint(len(feature)) + feature
        entries.append(b"\x0a" + _varint(len(entry)) + entry)  # Features.feature (map)
    body = b"".join(entries)
    return b"\x0a" + _varint(len(body)) + body  # Example.features
