"""Long-document classification: one BERT pass per window, window predictions aggregated.

A document longer than the encoder's positions is cut into overlapping windows of word pieces
(`pipeline/text/windows.py`), each packed `[CLS] window [SEP]`; the model sees a whole document
per example and is trained end to end on the document's label:

| aggregation | what                                                                  |
|-------------|-----------------------------------------------------------------------|
| `mean`      | the classifier on each window's pooled [CLS]; mean of the window logits |
| `max`       | the same, max over windows of each class's logit                      |
| `attention` | a learned attention over the windows' pooled [CLS] vectors (score =     |
|             | v·tanh(W h + b), softmax over the real windows), classifier on the sum  |

Inputs: token_ids, segment_ids, padding_mask (batch, windows, seq) and window_mask
(batch, windows), 1 for a real window. Output: `{"logits": (batch, num_classes)}`, so the
losses, metrics and evaluation of `BertClassifier` apply unchanged (per document).
With a single window every aggregation reduces to `BertClassifier` on that window.
"""

from __future__ import annotations

import keras
from keras import ops

from models.bert import SERIALIZATION_PACKAGE, bert_kernel_initializer
from models.heads import ENCODER_INPUTS, _BackboneModel, _head_dtype

AGGREGATIONS = ("mean", "max", "attention")
WINDOW_INPUTS = ENCODER_INPUTS + ("window_mask",)
_NEG = -1e9


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class FlattenWindows(keras.layers.Layer):
    """(batch, windows, seq) -> (batch · windows, seq)."""

    def call(self, x):
        return ops.reshape(x, (-1, ops.shape(x)[-1]))

    def compute_output_shape(self, shape):
        return (None, shape[-1])


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class UnflattenWindows(keras.layers.Layer):
    """(batch · windows, d), reference (batch, windows) -> (batch, windows, d)."""

    def call(self, x, reference):
        shape = ops.shape(reference)
        return ops.reshape(x, (shape[0], shape[1], x.shape[-1]))

    def compute_output_shape(self, x_shape, reference_shape=None):
        return (None, None, x_shape[-1])


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class MaskedWindowPooling(keras.layers.Layer):
    """Mean or max over the real windows: (batch, windows, c), (batch, windows) -> (batch, c).

    >>> import numpy as np
    >>> x = np.array([[[1.0, 0.0], [3.0, -4.0], [100.0, 100.0]]], "float32")
    >>> m = np.array([[1, 1, 0]])
    >>> MaskedWindowPooling("mean")(x, m).numpy().tolist(), MaskedWindowPooling("max")(x, m).numpy().tolist()
    ([[2.0, -2.0]], [[3.0, 0.0]])
    """

    def __init__(self, mode="mean", **kwargs):
        super().__init__(**kwargs)
        if mode not in ("mean", "max"):
            raise ValueError(f"mode = {mode!r}; choose mean or max")
        self.mode = mode

    def call(self, x, window_mask):
        mask = ops.expand_dims(ops.cast(window_mask, x.dtype), -1)  # (batch, windows, 1)
        if self.mode == "mean":
            return ops.sum(x * mask, axis=1) / ops.maximum(ops.sum(mask, axis=1), 1.0)
        return ops.max(ops.where(mask > 0, x, ops.full_like(x, _NEG)), axis=1)

    def compute_output_shape(self, x_shape, window_mask_shape=None):
        return (x_shape[0], x_shape[-1])

    def get_config(self):
        return {**super().get_config(), "mode": self.mode}


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class WindowAttentionPooling(keras.layers.Layer):
    """Additive attention over window vectors: score_w = v·tanh(W h_w + b), softmax over the
    real windows, output Σ_w α_w h_w. (batch, windows, d), (batch, windows) -> (batch, d)."""

    def __init__(self, units=64, **kwargs):
        super().__init__(**kwargs)
        self.units = int(units)
        self.projection = keras.layers.Dense(self.units, activation="tanh",
                                             kernel_initializer=bert_kernel_initializer(),
                                             dtype=self.dtype_policy, name="projection")
        self.score = keras.layers.Dense(1, use_bias=False,
                                        kernel_initializer=bert_kernel_initializer(),
                                        dtype=self.dtype_policy, name="score")

    def build(self, x_shape, window_mask_shape=None):
        self.projection.build(x_shape)
        self.score.build(tuple(x_shape[:-1]) + (self.units,))

    def weights_of(self, x, window_mask):
        """The attention weights (batch, windows); 0 on padded windows."""
        scores = ops.squeeze(self.score(self.projection(x)), -1)  # (batch, windows)
        scores = ops.cast(scores, "float32")
        scores = ops.where(ops.cast(window_mask, "bool"), scores, ops.full_like(scores, _NEG))
        return ops.softmax(scores, axis=-1)

    def call(self, x, window_mask):
        weights = ops.cast(self.weights_of(x, window_mask), x.dtype)
        return ops.sum(x * ops.expand_dims(weights, -1), axis=1)

    def compute_output_shape(self, x_shape, window_mask_shape=None):
        return (x_shape[0], x_shape[-1])

    def get_config(self):
        return {**super().get_config(), "units": self.units}


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class BertWindowClassifier(_BackboneModel):
    """Document classification over windows (see the module docstring).

    Args:
        backbone: a `models.bert.BertEncoder`.
        num_classes: int, >= 2.
        aggregation: "mean" | "max" (of the window logits) | "attention" (over the windows'
            pooled [CLS] vectors).
        dropout: float, on the pooled vectors before the classifier.
        attention_units: int, width of the attention layer.
    """

    def __init__(self, backbone, num_classes, aggregation="mean", dropout=0.1,
                 attention_units=64, **kwargs):
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation = {aggregation!r}; choose one of "
                             f"{', '.join(AGGREGATIONS)}")
        # === Layers ===
        self.backbone = backbone
        self.flatten = FlattenWindows(name="flatten_windows")
        self.unflatten = UnflattenWindows(name="unflatten_windows")
        self.output_dropout = keras.layers.Dropout(dropout, name="classifier_dropout")
        self.output_dense = keras.layers.Dense(
            num_classes, kernel_initializer=bert_kernel_initializer(),
            dtype=_head_dtype(backbone), name="logits")
        if aggregation == "attention":
            self.aggregate = WindowAttentionPooling(attention_units, dtype=_head_dtype(backbone),
                                                    name="window_attention")
        else:
            self.aggregate = MaskedWindowPooling(aggregation, name=f"window_{aggregation}")
        # === Functional Model ===
        inputs = {name: keras.Input(shape=(None, None), dtype="int32", name=name)
                  for name in ENCODER_INPUTS}
        inputs["window_mask"] = keras.Input(shape=(None,), dtype="int32", name="window_mask")
        flat = {name: self.flatten(inputs[name]) for name in ENCODER_INPUTS}  # (b·w, seq)
        pooled = backbone(flat)["pooled_output"]  # (b·w, hidden)
        windows = self.unflatten(pooled, inputs["window_mask"])  # (b, w, hidden)
        windows = self.output_dropout(windows)
        if aggregation == "attention":
            document = self.aggregate(windows, inputs["window_mask"])  # (b, hidden)
            logits = self.output_dense(document)  # (b, classes)
        else:
            window_logits = self.output_dense(windows)  # (b, w, classes)
            logits = self.aggregate(window_logits, inputs["window_mask"])  # (b, classes)
        logits = keras.layers.Identity(name="document_logits")(logits)
        super().__init__(inputs=inputs, outputs={"logits": logits}, **kwargs)
        # === Config ===
        self.num_classes = num_classes
        self.aggregation = aggregation
        self.dropout = dropout
        self.attention_units = attention_units

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes,
                "aggregation": self.aggregation, "dropout": self.dropout,
                "attention_units": self.attention_units}
