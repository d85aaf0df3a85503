"""The BERT encoder: keras-hub's `BertBackbone` with activation and LayerNorm epsilon as config.

`BertEncoder` has the same layers, the same layer names and the same wiring as
`keras_hub.models.BertBackbone`, so weights move between the two layer by layer
(`dst.get_layer(name).set_weights(src.get_layer(name).get_weights())`). Two
things keras-hub hard-codes are arguments here:

- `activation`: `"gelu_approximate"` is the tanh form of GELU, as Google's
  original BERT code and keras-hub use; `"gelu"` is the exact erf form that
  Hugging Face configs with `hidden_act: "gelu"` use; `"relu"` is also accepted.
  Match it to the checkpoint you import (the tanh form costs ~4.5e-3 max abs
  difference on a real Hugging Face checkpoint, the matched one ~2.6e-6).
- `layer_norm_epsilon`: 1e-12 as in BERT.

Two ALBERT options (Lan et al. 2019), both off by default (then the model is BERT):

- `embedding_dim` (factorized embedding parameterization): the token, position and
  segment embeddings and their LayerNorm have width E, and a Dense E -> H
  (`embedding_projection`) after the embedding dropout feeds the Transformer, as in
  keras-hub's `AlbertBackbone`. The vocabulary table costs V·E instead of V·H. `None`
  (or E = H) means no projection: exactly BERT's layers.
- `share_layers` (cross-layer parameter sharing): one `TransformerEncoder`
  (`transformer_layer_shared`) is applied `num_layers` times; `transformer_layers`
  lists it `num_layers` times (the same object), so code that walks the layers still
  sees every application.

Only Keras 3 / keras-hub layers and `keras.ops` are used (no `tf.*`), so the
model also runs with `KERAS_BACKEND=jax` or `torch`; inside a TensorFlow training
step that asks for them, the GELUs use `models.fused`'s kernels (the same math).

    >>> import numpy as np
    >>> from models.bert import BertEncoder
    >>> encoder = BertEncoder.from_preset_name("tiny", vocabulary_size=100)
    >>> outputs = encoder({
    ...     "token_ids": np.ones((2, 8), "int32"),
    ...     "segment_ids": np.zeros((2, 8), "int32"),
    ...     "padding_mask": np.ones((2, 8), "int32"),
    ... })
    >>> tuple(outputs["sequence_output"].shape), tuple(outputs["pooled_output"].shape)
    ((2, 8, 128), (2, 128))
"""

from __future__ import annotations

import keras
import keras_hub

from models import fused, presets

SERIALIZATION_PACKAGE = "bert_pipeline"
INITIALIZER_STDDEV = 0.02


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
def gelu_approximate(x):
    """GELU, tanh approximation (Google BERT, keras-hub): 0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))."""
    if fused.active():  # a training step on TensorFlow: one fused pass each way
        return fused.gelu(x, approximate=True)
    return keras.activations.gelu(x, approximate=True)


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
def gelu_exact(x):
    """GELU, exact erf form (Hugging Face `hidden_act: "gelu"`): x·Φ(x)."""
    if fused.active():
        return fused.gelu(x, approximate=False)
    return keras.activations.gelu(x, approximate=False)


ACTIVATIONS = {
    "gelu_approximate": gelu_approximate,
    "gelu": gelu_exact,
    "relu": keras.activations.relu,
}


def get_activation(name: str):
    """The activation function for a config name (one of `ACTIVATIONS`)."""
    if name not in ACTIVATIONS:
        raise ValueError(
            f"Unknown activation {name!r}; expected one of {sorted(ACTIVATIONS)}."
        )
    return ACTIVATIONS[name]


def bert_kernel_initializer(stddev: float = INITIALIZER_STDDEV):
    """BERT's initializer: truncated normal with stddev 0.02."""
    return keras.initializers.TruncatedNormal(stddev=stddev)


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class BertEncoder(keras_hub.models.Backbone):
    """A BERT encoder (embeddings, post-LN Transformer stack, [CLS] pooler).

    Same layers and layer names as `keras_hub.models.BertBackbone`; the
    feed-forward activation and the LayerNorm epsilon are configurable.

    Args:
        vocabulary_size: int. Size of the token vocabulary.
        num_layers: int. Number of Transformer layers.
        num_heads: int. Attention heads per layer; must divide `hidden_dim`.
        hidden_dim: int. Width of the embeddings, Transformer and pooler.
        intermediate_dim: int. Width of the feed-forward layer inside each
            Transformer layer (4 × hidden in the published sizes).
        dropout: float. Dropout on embeddings, attention and feed-forward.
        max_sequence_length: int. Number of learned position embeddings.
        num_segments: int. Number of segment (token type) ids.
        activation: str. `"gelu_approximate"` (tanh GELU, Google / keras-hub),
            `"gelu"` (exact erf GELU, Hugging Face) or `"relu"`.
        layer_norm_epsilon: float. Epsilon of every LayerNormalization.
        embedding_dim: None or int. Width E of the embeddings (ALBERT's factorized
            embeddings, projected to `hidden_dim`); None = `hidden_dim` (BERT).
        share_layers: bool. One Transformer layer's weights for all `num_layers`
            layers (ALBERT's cross-layer sharing).
        dtype: None, a dtype name or a `keras.DTypePolicy`, e.g.
            `"mixed_bfloat16"` for mixed precision (variables stay float32).

    Inputs (a dict, each `(batch, sequence)` int32):
        token_ids, segment_ids, padding_mask (1 = real token, 0 = padding).

    Outputs (a dict):
        sequence_output: `(batch, sequence, hidden_dim)`.
        pooled_output: `(batch, hidden_dim)`, tanh dense on the [CLS] position.

    Example:
    ```python
    import numpy as np
    from models.bert import BertEncoder

    encoder = BertEncoder(
        vocabulary_size=1000, num_layers=2, num_heads=2, hidden_dim=64,
        intermediate_dim=256, max_sequence_length=32, activation="gelu",
    )
    outputs = encoder({
        "token_ids": np.random.randint(0, 1000, size=(2, 16)),
        "segment_ids": np.zeros((2, 16), "int32"),
        "padding_mask": np.ones((2, 16), "int32"),
    })
    outputs["sequence_output"].shape  # (2, 16, 64)

    # The published sizes from models.presets:
    base = BertEncoder.from_preset_name("base", vocabulary_size=30522)
    base.count_params()  # 109,482,240
    ```
    """

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        dropout=0.1,
        max_sequence_length=512,
        num_segments=2,
        activation="gelu_approximate",
        layer_norm_epsilon=1e-12,
        embedding_dim=None,
        share_layers=False,
        initializer_range=INITIALIZER_STDDEV,
        dtype=None,
        **kwargs,
    ):
        if hidden_dim % num_heads != 0:
            raise ValueError(
                f"hidden_dim must be divisible by num_heads; received "
                f"hidden_dim={hidden_dim}, num_heads={num_heads} "
                f"({hidden_dim} % {num_heads} = {hidden_dim % num_heads})."
            )
        if embedding_dim is not None and (
            isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int)
            or embedding_dim < 1
        ):
            raise ValueError(
                f"embedding_dim must be None (= hidden_dim) or a positive integer; "
                f"received embedding_dim={embedding_dim!r}."
            )
        activation_fn = get_activation(activation)
        width = hidden_dim if embedding_dim is None else embedding_dim

        # === Layers ===
        self.token_embedding = keras_hub.layers.ReversibleEmbedding(
            input_dim=vocabulary_size,
            output_dim=width,
            embeddings_initializer=bert_kernel_initializer(initializer_range),
            dtype=dtype,
            name="token_embedding",
        )
        self.position_embedding = keras_hub.layers.PositionEmbedding(
            sequence_length=max_sequence_length,
            initializer=bert_kernel_initializer(initializer_range),
            dtype=dtype,
            name="position_embedding",
        )
        self.segment_embedding = keras.layers.Embedding(
            input_dim=num_segments,
            output_dim=width,
            embeddings_initializer=bert_kernel_initializer(initializer_range),
            dtype=dtype,
            name="segment_embedding",
        )
        self.embeddings_add = keras.layers.Add(dtype=dtype, name="embeddings_add")
        self.embeddings_layer_norm = keras.layers.LayerNormalization(
            axis=-1,
            epsilon=layer_norm_epsilon,
            dtype=dtype,
            name="embeddings_layer_norm",
        )
        self.embeddings_dropout = keras.layers.Dropout(
            dropout, dtype=dtype, name="embeddings_dropout"
        )
        # ALBERT: E -> H after the embedding block (keras-hub AlbertBackbone's placement).
        self.embeddings_projection = None
        if width != hidden_dim:
            self.embeddings_projection = keras.layers.Dense(
                hidden_dim,
                kernel_initializer=bert_kernel_initializer(initializer_range),
                dtype=dtype,
                name="embedding_projection",
            )

        def transformer_layer(name):
            return keras_hub.layers.TransformerEncoder(
                intermediate_dim=intermediate_dim,
                num_heads=num_heads,
                dropout=dropout,
                activation=activation_fn,
                layer_norm_epsilon=layer_norm_epsilon,
                kernel_initializer=bert_kernel_initializer(initializer_range),
                normalize_first=False,  # post-LN, as in BERT
                dtype=dtype,
                name=name,
            )

        if share_layers:
            # One set of weights, applied num_layers times (the same object in every slot).
            shared = transformer_layer("transformer_layer_shared")
            self.transformer_layers = [shared] * num_layers
        else:
            self.transformer_layers = [
                transformer_layer(f"transformer_layer_{i}") for i in range(num_layers)
            ]
        self.pooled_dense = keras.layers.Dense(
            hidden_dim,
            kernel_initializer=bert_kernel_initializer(initializer_range),
            activation="tanh",
            dtype=dtype,
            name="pooled_dense",
        )

        # === Functional Model ===
        token_id_input = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        segment_id_input = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
        padding_mask_input = keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        tokens = self.token_embedding(token_id_input)  # (batch, seq, E); E = hidden for BERT
        positions = self.position_embedding(tokens)  # (batch, seq, E)
        segments = self.segment_embedding(segment_id_input)  # (batch, seq, E)
        x = self.embeddings_add((tokens, positions, segments))
        x = self.embeddings_layer_norm(x)
        x = self.embeddings_dropout(x)
        if self.embeddings_projection is not None:
            x = self.embeddings_projection(x)  # (batch, seq, hidden)
        for transformer_layer in self.transformer_layers:
            x = transformer_layer(x, padding_mask=padding_mask_input)
        sequence_output = x  # (batch, seq, hidden)
        cls_token_index = 0
        pooled_output = self.pooled_dense(x[:, cls_token_index, :])  # (batch, hidden)
        super().__init__(
            inputs={
                "token_ids": token_id_input,
                "segment_ids": segment_id_input,
                "padding_mask": padding_mask_input,
            },
            outputs={
                "sequence_output": sequence_output,
                "pooled_output": pooled_output,
            },
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.max_sequence_length = max_sequence_length
        self.num_segments = num_segments
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.embedding_dim = embedding_dim
        self.share_layers = bool(share_layers)
        self.initializer_range = float(initializer_range)
        self.cls_token_index = cls_token_index

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "num_layers": self.num_layers,
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout,
                "max_sequence_length": self.max_sequence_length,
                "num_segments": self.num_segments,
                "activation": self.activation,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "embedding_dim": self.embedding_dim,
                "share_layers": self.share_layers,
                "initializer_range": self.initializer_range,
            }
        )
        return config

    @classmethod
    def from_preset_name(cls, name: str, vocabulary_size: int, **overrides) -> "BertEncoder":
        """Builds a randomly initialised encoder of a size in `models.presets.PRESETS`.

        `overrides` replace preset fields or set any other constructor argument
        (`dropout`, `max_sequence_length`, `activation`, `dtype`, ...).

        >>> BertEncoder.from_preset_name("tiny", vocabulary_size=100).num_layers
        2
        """
        if name not in presets.PRESETS:
            raise ValueError(
                f"Unknown preset {name!r}; expected one of {list(presets.PRESETS)}."
            )
        kwargs = {**presets.PRESETS[name], **overrides}
        return cls(vocabulary_size=vocabulary_size, **kwargs)
