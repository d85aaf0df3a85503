"""Fine-tuning models: task heads on a `BertEncoder` (or any backbone with the same outputs).

Every model here is a functional `keras.Model` with dict inputs and dict outputs of stable
names, registered for `.keras` saving, with a complete `get_config`:

| model                 | outputs (inputs: token_ids, segment_ids, padding_mask)  |
|-----------------------|---------------------------------------------------------|
| `BertClassifier`      | logits (batch, num_classes), on pooled [CLS]            |
| `BertRegressor`       | score (batch,), on pooled [CLS]                         |
| `BertTokenClassifier` | logits (batch, seq, num_classes)                        |
| `BertSpanExtractor`   | start_logits, end_logits (batch, seq)                   |
| `BertSentenceEncoder` | embedding (batch, hidden): mean pooling, L2-normalised  |
| `BertBiEncoderTrainer`| similarity (batch, batch); inputs a_* and b_* per side  |

Sentence-pair classification is `BertClassifier` on packed `[CLS] A [SEP] B [SEP]` inputs
(segment ids 0 for A, 1 for B); the packing is the preprocessor's job, not the model's.

The heads compute in the variable dtype (float32 under a "mixed_*" policy), so logits come
out float32. Only keras layers and `keras.ops` are used: the models run on any backend.
The backbone is reachable as `model.backbone` (freezing, weight transfer).

Example:
```python
import numpy as np
from models.bert import BertEncoder
from models.heads import BertClassifier

backbone = BertEncoder(vocabulary_size=100, num_layers=1, num_heads=2, hidden_dim=32,
                       intermediate_dim=64, max_sequence_length=16)
model = BertClassifier(backbone, num_classes=3)
outputs = model({"token_ids": np.ones((2, 8), "int32"),
                 "segment_ids": np.zeros((2, 8), "int32"),
                 "padding_mask": np.ones((2, 8), "int32")})
outputs["logits"].shape  # (2, 3)
```
"""

from __future__ import annotations

import keras
from keras import ops

from models.bert import SERIALIZATION_PACKAGE, bert_kernel_initializer

ENCODER_INPUTS = ("token_ids", "segment_ids", "padding_mask")


def _head_dtype(backbone):
    return keras.DTypePolicy(backbone.dtype_policy.variable_dtype)


def _inputs(prefix: str = "") -> dict:
    return {name: keras.Input(shape=(None,), dtype="int32", name=prefix + name)
            for name in ENCODER_INPUTS}


class _BackboneModel(keras.Model):
    """Shared config plumbing: the backbone is serialised inside the model's config."""

    def get_config(self):
        return {
            "backbone": keras.layers.serialize(self.backbone),
            "name": self.name,
            "trainable": self.trainable,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("backbone"), dict):
            config["backbone"] = keras.layers.deserialize(config["backbone"])
        return cls(**config)


# ---------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------
@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class MeanPooling(keras.layers.Layer):
    """Mean of the token vectors over real (unpadded) positions: (batch, seq, d) -> (batch, d).

    >>> import numpy as np
    >>> x = np.array([[[1.0], [3.0], [100.0]]], "float32")
    >>> float(MeanPooling()(x, np.array([[1, 1, 0]]))[0, 0])
    2.0
    """

    def call(self, sequence, padding_mask):
        mask = ops.cast(ops.expand_dims(padding_mask, -1), sequence.dtype)  # (batch, seq, 1)
        total = ops.sum(sequence * mask, axis=1)  # (batch, d)
        count = ops.maximum(ops.sum(mask, axis=1), 1.0)  # (batch, 1)
        return total / count

    def compute_output_shape(self, sequence_shape, padding_mask_shape=None):
        return (sequence_shape[0], sequence_shape[-1])


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class L2Normalize(keras.layers.Layer):
    """x / ||x||₂ along the last axis (cosine similarity becomes a dot product)."""

    def call(self, x):
        return x / ops.maximum(ops.sqrt(ops.sum(x * x, axis=-1, keepdims=True)), 1e-12)


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class SpanLogits(keras.layers.Layer):
    """Start and end logits of an answer span: Dense(2) per token; padding gets -10,000.

    (batch, seq, hidden), (batch, seq) -> (start (batch, seq), end (batch, seq)).
    """

    def __init__(self, kernel_initializer=None, **kwargs):
        super().__init__(**kwargs)
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer or bert_kernel_initializer())
        self.dense = keras.layers.Dense(2, kernel_initializer=self.kernel_initializer,
                                        dtype=self.dtype_policy, name="span_dense")

    def build(self, sequence_shape, padding_mask_shape=None):
        self.dense.build(sequence_shape)

    def call(self, sequence, padding_mask):
        logits = ops.cast(self.dense(sequence), "float32")  # (batch, seq, 2)
        penalty = (1.0 - ops.cast(padding_mask, "float32")) * -10_000.0  # (batch, seq)
        return logits[..., 0] + penalty, logits[..., 1] + penalty

    def compute_output_shape(self, sequence_shape, padding_mask_shape=None):
        return (sequence_shape[:2], sequence_shape[:2])

    def get_config(self):
        config = super().get_config()
        config["kernel_initializer"] = keras.initializers.serialize(self.kernel_initializer)
        return config


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class CosineSimilarityMatrix(keras.layers.Layer):
    """scale · cos(a_i, b_j) for all pairs in a batch: (batch, d), (batch, d) -> (batch, batch)."""

    def __init__(self, scale=20.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = float(scale)

    def call(self, a, b):
        a = a / ops.maximum(ops.sqrt(ops.sum(a * a, axis=-1, keepdims=True)), 1e-12)
        b = b / ops.maximum(ops.sqrt(ops.sum(b * b, axis=-1, keepdims=True)), 1e-12)
        return self.scale * ops.matmul(a, ops.transpose(b))

    def compute_output_shape(self, a_shape, b_shape=None):
        return (a_shape[0], a_shape[0])

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class InBatchNegativesLoss(keras.losses.Loss):
    """Multiple-negatives ranking loss (Sentence-BERT): softmax cross-entropy of each row of the
    similarity matrix against its diagonal, i.e. b_i is a's positive and every other b_j in the
    batch a negative. `y_true` is ignored (pass zeros).

    >>> import numpy as np
    >>> s = np.array([[10.0, 0.0], [0.0, 10.0]], "float32")
    >>> round(float(InBatchNegativesLoss()(np.zeros(2), s)), 4)
    0.0
    """

    def __init__(self, name="in_batch_negatives", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        y_pred = ops.cast(y_pred, "float32")  # (batch, batch)
        return ops.logsumexp(y_pred, axis=-1) - ops.diagonal(y_pred)  # (batch,)


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------
@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class BertClassifier(_BackboneModel):
    """Sequence (or sentence-pair) classification: dropout + Dense(num_classes) on pooled [CLS].

    Args:
        backbone: a `models.bert.BertEncoder`.
        num_classes: int, >= 2.
        dropout: float. Dropout on the pooled output before the classifier.

    Outputs: `{"logits": (batch, num_classes)}` (unnormalised; softmax gives probabilities).
    """

    def __init__(self, backbone, num_classes, dropout=0.1, **kwargs):
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}; for one output use "
                             f"BertRegressor")
        # === Layers ===
        self.backbone = backbone
        self.output_dropout = keras.layers.Dropout(dropout, name="classifier_dropout")
        self.output_dense = keras.layers.Dense(
            num_classes, kernel_initializer=bert_kernel_initializer(),
            dtype=_head_dtype(backbone), name="logits")
        # === Functional Model ===
        inputs = _inputs()
        pooled = backbone(inputs)["pooled_output"]  # (batch, hidden)
        logits = self.output_dense(self.output_dropout(pooled))  # (batch, num_classes)
        super().__init__(inputs=inputs, outputs={"logits": logits}, **kwargs)
        # === Config ===
        self.num_classes = num_classes
        self.dropout = dropout

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "dropout": self.dropout}


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class BertRegressor(_BackboneModel):
    """Sentence(-pair) regression (STS-B style): dropout + Dense(1) on pooled [CLS].

    Outputs: `{"score": (batch,)}`.
    """

    def __init__(self, backbone, dropout=0.1, **kwargs):
        # === Layers ===
        self.backbone = backbone
        self.output_dropout = keras.layers.Dropout(dropout, name="regressor_dropout")
        self.output_dense = keras.layers.Dense(
            1, kernel_initializer=bert_kernel_initializer(), dtype=_head_dtype(backbone),
            name="score_dense")
        self.squeeze = keras.layers.Reshape((), name="score")
        # === Functional Model ===
        inputs = _inputs()
        pooled = backbone(inputs)["pooled_output"]  # (batch, hidden)
        score = self.squeeze(self.output_dense(self.output_dropout(pooled)))  # (batch,)
        super().__init__(inputs=inputs, outputs={"score": score}, **kwargs)
        # === Config ===
        self.dropout = dropout

    def get_config(self):
        return {**super().get_config(), "dropout": self.dropout}


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class BertTokenClassifier(_BackboneModel):
    """Token classification (NER, POS): dropout + Dense(num_classes) on every token.

    Train with labels on the first word piece of each word and sample weight 0 elsewhere.
    Outputs: `{"logits": (batch, seq, num_classes)}`.
    """

    def __init__(self, backbone, num_classes, dropout=0.1, **kwargs):
        # === Layers ===
        self.backbone = backbone
        self.output_dropout = keras.layers.Dropout(dropout, name="token_dropout")
        self.output_dense = keras.layers.Dense(
            num_classes, kernel_initializer=bert_kernel_initializer(),
            dtype=_head_dtype(backbone), name="logits")
        # === Functional Model ===
        inputs = _inputs()
        sequence = backbone(inputs)["sequence_output"]  # (batch, seq, hidden)
        logits = self.output_dense(self.output_dropout(sequence))  # (batch, seq, num_classes)
        super().__init__(inputs=inputs, outputs={"logits": logits}, **kwargs)
        # === Config ===
        self.num_classes = num_classes
        self.dropout = dropout

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "dropout": self.dropout}


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class BertSpanExtractor(_BackboneModel):
    """Extractive QA (SQuAD): start and end logits over the tokens of `[CLS] question [SEP]
    context [SEP]`; position 0 ([CLS]) stands for "no answer" (SQuAD v2).

    Outputs: `{"start_logits": (batch, seq), "end_logits": (batch, seq)}`, padding at -10,000.
    """

    def __init__(self, backbone, **kwargs):
        # === Layers ===
        self.backbone = backbone
        self.span_logits = SpanLogits(dtype=_head_dtype(backbone), name="span_logits")
        # === Functional Model ===
        inputs = _inputs()
        sequence = backbone(inputs)["sequence_output"]  # (batch, seq, hidden)
        start, end = self.span_logits(sequence, inputs["padding_mask"])  # (batch, seq) each
        # Identity layers give the outputs their stable names.
        start = keras.layers.Identity(name="start_logits")(start)
        end = keras.layers.Identity(name="end_logits")(end)
        super().__init__(inputs=inputs, outputs={"start_logits": start, "end_logits": end},
                         **kwargs)


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class BertSentenceEncoder(_BackboneModel):
    """Sentence embeddings (Sentence-BERT): mean of the token vectors over real tokens,
    L2-normalised when `normalize` (then a dot product is the cosine similarity).

    Outputs: `{"embedding": (batch, hidden)}`.
    """

    def __init__(self, backbone, normalize=True, **kwargs):
        # === Layers ===
        self.backbone = backbone
        self.pooling = MeanPooling(dtype=_head_dtype(backbone), name="mean_pooling")
        self.normalizer = L2Normalize(name="l2_normalize") if normalize else None
        # === Functional Model ===
        inputs = _inputs()
        sequence = backbone(inputs)["sequence_output"]  # (batch, seq, hidden)
        embedding = self.pooling(sequence, inputs["padding_mask"])  # (batch, hidden)
        if self.normalizer is not None:
            embedding = self.normalizer(embedding)
        embedding = keras.layers.Identity(name="embedding")(embedding)
        super().__init__(inputs=inputs, outputs={"embedding": embedding}, **kwargs)
        # === Config ===
        self.normalize = normalize

    def get_config(self):
        return {**super().get_config(), "normalize": self.normalize}


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class BertBiEncoderTrainer(keras.Model):
    """Trains a `BertSentenceEncoder` on (a, b) pairs with in-batch negatives.

    Both sides go through the same encoder (shared weights). Inputs are the encoder's three
    inputs prefixed `a_` and `b_`; the output `{"similarity": (batch, batch)}` holds
    scale · cos(a_i, b_j). Compile with `InBatchNegativesLoss()` and any `y` (ignored).

    Args:
        encoder: a `BertSentenceEncoder`.
        scale: float. Multiplies the cosine similarities before the softmax (20, as
            Sentence-BERT's MultipleNegativesRankingLoss).
    """

    def __init__(self, encoder, scale=20.0, **kwargs):
        # === Layers ===
        self.encoder = encoder
        self.similarity = CosineSimilarityMatrix(scale, name="similarity")
        # === Functional Model ===
        a, b = _inputs("a_"), _inputs("b_")
        a_embedding = encoder({k: a[k] for k in ENCODER_INPUTS})["embedding"]  # (batch, hidden)
        b_embedding = encoder({k: b[k] for k in ENCODER_INPUTS})["embedding"]  # (batch, hidden)
        similarity = self.similarity(a_embedding, b_embedding)  # (batch, batch)
        super().__init__(inputs={**{"a_" + k: v for k, v in a.items()},
                                 **{"b_" + k: v for k, v in b.items()}},
                         outputs={"similarity": similarity}, **kwargs)
        # === Config ===
        self.scale = float(scale)

    @property
    def backbone(self):
        return self.encoder.backbone

    def get_config(self):
        return {"encoder": keras.layers.serialize(self.encoder), "scale": self.scale,
                "name": self.name, "trainable": self.trainable}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("encoder"), dict):
            config["encoder"] = keras.layers.deserialize(config["encoder"])
        return cls(**config)


def freeze_backbone(backbone, strategy: str, trainable_last_n: int = 1) -> None:
    """Sets which backbone layers train.

    - `"none"`: everything trains (the usual fine-tuning);
    - `"encoder"`: the whole backbone is frozen, only the task head trains;
    - `"all_but_last_n"`: embeddings and all but the last `trainable_last_n` Transformer layers
      are frozen; the last n layers and the [CLS] pooler train.
    """
    if strategy == "none":
        backbone.trainable = True
        return
    if strategy == "encoder":
        backbone.trainable = False
        return
    if strategy != "all_but_last_n":
        raise ValueError(f"unknown freeze strategy {strategy!r}; expected none, encoder or "
                         f"all_but_last_n")
    layers = backbone.transformer_layers
    if getattr(backbone, "share_layers", False):
        raise ValueError("freeze = all_but_last_n cannot train only the last layers of an encoder "
                         "with model.share_layers (ALBERT): all its layers are one set of "
                         "weights; use freeze = none or encoder")
    if not 1 <= trainable_last_n <= len(layers):
        raise ValueError(f"trainable_last_n = {trainable_last_n} but the backbone has "
                         f"{len(layers)} Transformer layers; choose 1..{len(layers)}")
    backbone.trainable = True
    keep = {id(layer) for layer in layers[len(layers) - trainable_last_n:]}
    keep.add(id(backbone.pooled_dense))
    for layer in backbone.layers:
        if not isinstance(layer, keras.layers.InputLayer):
            layer.trainable = id(layer) in keep
