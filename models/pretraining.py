"""BERT pretraining model: masked-LM head tied to the token embedding + next-sentence head.

`BertPretrainer` is a `keras_hub.models.Task` (like `keras_hub.models.BertMaskedLM`)
wrapping a `models.bert.BertEncoder`:

    inputs  {"token_ids", "segment_ids", "padding_mask"}: (batch, seq) int
            {"mask_positions"}:                           (batch, num_masked) int
    outputs {"mlm": (batch, num_masked, vocabulary_size) logits,
             "nsp": (batch, 2) logits}

The MLM head is keras-hub's `MaskedLMHead` (dense + activation + LayerNorm, then
the transposed token embedding, plus its own output bias), with the encoder's
activation and LayerNorm epsilon, as in Google's `get_masked_lm_output`. The NSP
head is `Dense(2)` on the pooled [CLS] output. It is also usable for SOP labels.

## What `model.fit` expects (Keras 3.15)

`fit` takes batches `(x, y, sample_weight)`, each a dict; the `y` and
`sample_weight` dicts are keyed by output name, and `sample_weight` must hold
BOTH keys (Keras resolves each output's weight by its path, so a dict that
lacks "nsp" raises a KeyError; `None` cannot travel through tf.data):

    x = {
        "token_ids":      int32/int64 (batch, seq)          # input_ids
        "segment_ids":    int32/int64 (batch, seq)          # segment_ids
        "padding_mask":   int32/int64 (batch, seq)          # input_mask
        "mask_positions": int32/int64 (batch, num_masked)   # masked_lm_positions
    }
    y = {
        "mlm": int32/int64 (batch, num_masked)              # masked_lm_ids
        "nsp": int32/int64 (batch, 1)                       # next_sentence_labels
    }
    sample_weight = {
        "mlm": float32 (batch, num_masked)                  # masked_lm_weights
        "nsp": float32 (batch, 1)                           # ones_like(next_sentence_labels)
    }

(int64 straight from `tf.io.parse_example` is accepted; the functional inputs are
int32 and Keras casts. "nsp" labels/weights of shape (batch,) work too.)

The MLM loss uses the reduction `"mean_with_sample_weight"`:
sum(loss × weight) / sum(weight), i.e. the mean over real predictions only,
as in Google's and Model Garden's pretraining code. Under a `tf.distribute`
strategy each replica divides by its own sum of weights and Keras averages the
replicas, which equals the global weighted mean when replicas hold the same
number of real predictions (close enough otherwise). Compile with
`weighted_metrics` (not `metrics`) so padded prediction slots do not count.

Mixed precision: pass `dtype="mixed_bfloat16"` / `"mixed_float16"` to the
encoder (`build_pretrainer(..., dtype="mixed_bfloat16")`). The encoder and the
tied vocabulary projection compute in 16 bits; the two heads' own small layers
compute in the variable dtype (float32), so both logits come out float32.
(keras-hub 0.32's `BertMaskedLM` fails under "mixed_bfloat16" on TensorFlow:
its `MaskedLMHead` adds a float32 bias to bfloat16 logits. And its tied
projection, `ReversibleEmbedding(reverse=True)`, multiplies in float32 whenever
its input is float32, whatever the embedding's compute dtype: `TiedMaskedLMHead`
casts both sides to that dtype, so the largest matmul of a small BERT uses the
bfloat16 units.)

## The train step (TensorFlow backend)

`BertPretrainer.train_step` is Keras' step plus what large-batch BERT training needs
between the backward pass and the update: the gradients are densified (the position and
segment embeddings give IndexedSlices) and summed over the replicas here, before the
optimizer sees them (its own all-reduce is turned off, `keras_compat.gradients_summed_by_step`),
so that `global_clipnorm` clips the global batch's gradient, not each replica's; the
log `grad_norm` is the norm of the gradient the next update uses (unscaled, averaged over
accumulated micro-batches, before clipping: what a NaN guard reads beside `loss`). Gradient
accumulation (`gradient_accumulation_steps`), mixed-precision loss scaling
(`LossScaleOptimizer`) and the compiled loss weights (e.g. the NSP weight) are the
optimizer's and Keras' own. `compile(fused_kernels=True)` traces the forward and backward
pass with models/fused.py's kernels; `compile(xla_update=True)` XLA-compiles the update (and
the norm) alone. On JAX and torch the model trains with Keras' own step.

Example:
```python
import numpy as np
from models.pretraining import build_pretrainer

model = build_pretrainer(vocabulary_size=1000, preset="tiny", max_sequence_length=64)
batch, seq, num_masked = 4, 16, 3
x = {
    "token_ids": np.random.randint(0, 1000, (batch, seq)),
    "segment_ids": np.zeros((batch, seq), "int32"),
    "padding_mask": np.ones((batch, seq), "int32"),
    "mask_positions": np.random.randint(1, seq, (batch, num_masked)),
}
y = {"mlm": np.random.randint(0, 1000, (batch, num_masked)),
     "nsp": np.random.randint(0, 2, (batch, 1))}
sample_weight = {"mlm": np.ones((batch, num_masked), "float32"),
                 "nsp": np.ones((batch, 1), "float32")}
model.fit(x, y, sample_weight=sample_weight, epochs=1)   # compiled by default
model.save("pretrainer.keras")
```
"""

from __future__ import annotations

import functools

import keras
import keras_hub
from keras import ops

from models import fused, keras_compat
from models.bert import (
    INITIALIZER_STDDEV,
    SERIALIZATION_PACKAGE,
    BertEncoder,
    bert_kernel_initializer,
    get_activation,
)

MLM_OUTPUT = "mlm"
NSP_OUTPUT = "nsp"


def mlm_loss() -> keras.losses.Loss:
    """Masked-LM loss: sparse CE from logits, sum(loss × weight) / sum(weight)."""
    return keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="mean_with_sample_weight", name="mlm_loss"
    )


def nsp_loss() -> keras.losses.Loss:
    """Next-sentence (or sentence-order) loss: sparse CE from logits, weighted mean."""
    return keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="mean_with_sample_weight", name="nsp_loss"
    )


def pretraining_losses() -> dict:
    """`{"mlm": mlm_loss(), "nsp": nsp_loss()}` for `compile(loss=...)`."""
    return {MLM_OUTPUT: mlm_loss(), NSP_OUTPUT: nsp_loss()}


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class MaskedLMAccuracy(keras.metrics.MeanMetricWrapper):
    """`keras.metrics.SparseCategoricalAccuracy`'s values from `fused.argmax`: the same
    indices in one pass over the MLM logits instead of five (models/fused.py)."""

    def __init__(self, name="accuracy", dtype=None):
        super().__init__(fn=fused.sparse_categorical_accuracy, name=name, dtype=dtype)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype}


def pretraining_metrics() -> dict:
    """Accuracy per head, for `compile(weighted_metrics=...)`."""
    return {
        MLM_OUTPUT: [MaskedLMAccuracy(name="accuracy")],
        NSP_OUTPUT: [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    }


class TiedMaskedLMHead(keras_hub.layers.MaskedLMHead):
    """keras-hub's `MaskedLMHead` (same weights, same math) whose tied projection runs in the
    token embedding's compute dtype, as one batched matmul.

    keras-hub's head hands its float32 LayerNorm output to `ReversibleEmbedding(reverse=True)`,
    which then multiplies in float32 under "mixed_bfloat16" too (it casts only when given a
    `reverse_dtype`). Here both sides are cast to the embedding's compute dtype (float32 under
    "float32": nothing changes) and the (batch·masked, hidden) × (hidden, vocabulary) product
    is a batch of one, which TensorFlow's CPU kernels hand to oneDNN's blocked matmul (the
    plain 2-D product goes to its slower GEMM call). BERT-small, seq 128, 20 masks, 2 cores
    with AVX512_BF16: forward + backward 1.97 → ~1.7 s (`make bench-train`).
    """

    def call(self, inputs, mask_positions):
        dense, layer_norm, bias = keras_compat.masked_lm_head_parts(self)
        x = ops.take_along_axis(inputs, ops.expand_dims(mask_positions, axis=-1), axis=1)
        x = layer_norm(dense(x))
        embedding = self.token_embedding
        dtype = embedding.compute_dtype
        kernel = ops.cast(embedding.embeddings, dtype)  # (vocabulary, hidden)
        batch, masked = ops.shape(x)[0], ops.shape(x)[1]
        if fused.active():  # a training step on TensorFlow: no transposed copy of the table
            logits = fused.tied_logits(ops.reshape(ops.cast(x, dtype), (-1, x.shape[-1])), kernel)
        else:
            flat = ops.reshape(ops.cast(x, dtype), (1, -1, ops.shape(x)[-1]))
            logits = ops.matmul(flat, ops.expand_dims(ops.transpose(kernel), 0))
        logits = ops.reshape(logits, (batch, masked, self.vocabulary_size))
        outputs = ops.cast(logits, self.compute_dtype) + bias
        return outputs if self.activation is None else self.activation(outputs)


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class BertPretrainer(keras_compat.PrebuiltModel, keras_hub.models.Task):
    """BERT with the masked-LM and next-sentence-prediction heads.

    Args:
        backbone: a `models.bert.BertEncoder`.
        preprocessor: must be `None` (inputs arrive already tokenized and
            masked from the TFRecords); kept for the `Task` config contract.
        compile: bool. If True (default), compile with `pretraining_losses()`,
            `pretraining_metrics()` and Adam(1e-4); recompile to change them (and the
            step's `fused_kernels` / `xla_update`).

    Example:
    ```python
    import numpy as np
    from models.bert import BertEncoder
    from models.pretraining import BertPretrainer

    encoder = BertEncoder.from_preset_name("tiny", vocabulary_size=1000)
    model = BertPretrainer(encoder)
    outputs = model({
        "token_ids": np.ones((2, 16), "int32"),
        "segment_ids": np.zeros((2, 16), "int32"),
        "padding_mask": np.ones((2, 16), "int32"),
        "mask_positions": np.array([[1, 2, 3]] * 2),
    })
    outputs["mlm"].shape, outputs["nsp"].shape  # (2, 3, 1000), (2, 2)
    ```
    """

    backbone_cls = BertEncoder
    preprocessor_cls = None
    fused_kernels = False  # compile(fused_kernels=...): models/fused.py in the train step
    xla_update = False  # compile(xla_update=...): the update XLA-compiled, the step not
    _compiled_update = None

    def __init__(self, backbone, preprocessor=None, **kwargs):
        if preprocessor is not None:
            raise ValueError("BertPretrainer takes no preprocessor; pass preprocessed inputs.")

        # The heads compute in the variable dtype (float32 under "mixed_*"
        # policies): the logits come out float32 and keras-hub's MaskedLMHead,
        # which adds its float32 bias to compute-dtype logits, does not fail on
        # TensorFlow. The vocabulary projection still runs in the token
        # embedding's compute dtype (the embedding layer casts its input).
        head_dtype = keras.DTypePolicy(backbone.dtype_policy.variable_dtype)

        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.mlm_head = TiedMaskedLMHead(
            vocabulary_size=backbone.vocabulary_size,
            token_embedding=backbone.token_embedding,  # decoder tied to the input embedding
            intermediate_activation=get_activation(backbone.activation),
            layer_norm_epsilon=backbone.layer_norm_epsilon,
            kernel_initializer=bert_kernel_initializer(
                getattr(backbone, "initializer_range", INITIALIZER_STDDEV)),
            dtype=head_dtype,
            name="mlm_head",
        )
        self.nsp_head = keras.layers.Dense(
            2,
            kernel_initializer=bert_kernel_initializer(
                getattr(backbone, "initializer_range", INITIALIZER_STDDEV)),
            dtype=head_dtype,
            name="nsp_head",
        )

        # === Functional Model ===
        inputs = {
            **backbone.input,
            "mask_positions": keras.Input(shape=(None,), dtype="int32", name="mask_positions"),
        }
        backbone_outputs = backbone(backbone.input)
        mlm_logits = self.mlm_head(  # (batch, num_masked, vocabulary_size)
            backbone_outputs["sequence_output"], inputs["mask_positions"]
        )
        nsp_logits = self.nsp_head(backbone_outputs["pooled_output"])  # (batch, 2)
        super().__init__(
            inputs=inputs,
            outputs={MLM_OUTPUT: mlm_logits, NSP_OUTPUT: nsp_logits},
            **kwargs,
        )

        # === Config ===
        # Everything is in the backbone's config; `Task.get_config` serialises
        # {"backbone", "preprocessor", "name"} and `Task.from_config` rebuilds it.

    def compile(
        self,
        optimizer="auto",
        loss="auto",
        *,
        weighted_metrics="auto",
        fused_kernels=False,
        xla_update=False,
        **kwargs,
    ):
        """`keras.Model.compile` with pretraining defaults for "auto" arguments.

        "auto" gives Adam(1e-4), `pretraining_losses()` and
        `pretraining_metrics()` (weighted, so padded prediction slots are ignored).
        `fused_kernels`: the train step traces models/fused.py's kernels (TensorFlow).
        `xla_update`: the optimizer's update and the gradient norm run as one XLA
        function while the step itself is not compiled (TensorFlow; for `jit_compile=False`).
        Neither is saved with the model: they say how this process trains.
        """
        if optimizer == "auto":
            optimizer = keras.optimizers.Adam(1e-4)
        if loss == "auto":
            loss = pretraining_losses()
        if weighted_metrics == "auto":
            weighted_metrics = pretraining_metrics()
        super().compile(optimizer=optimizer, loss=loss, weighted_metrics=weighted_metrics, **kwargs)
        self.fused_kernels, self.xla_update = bool(fused_kernels), bool(xla_update)
        self._compiled_update = None  # built for this optimizer on the first step
        if keras.backend.backend() == "tensorflow" and self.optimizer is not None:
            keras_compat.gradients_summed_by_step(self.optimizer)  # train_step sums them

    def prebuild(self, element_spec):
        """Builds the model, its compiled losses and metrics and the optimizer from a
        dataset's `element_spec`, before `fit` / `evaluate` (TensorFlow backend).

        Under a strategy Keras' fit/evaluate otherwise pull a first batch and
        `strategy.reduce` it to build them, which fails for dict batches under
        MultiWorkerMirroredStrategy (Keras 3.15); after this, that build is skipped.
        """
        with self.distribute_strategy.scope():
            keras_compat.symbolic_build(self, element_spec)
        self.mark_prebuilt()

    # === Head warm-up ===
    HEADS = ("mlm_head", "nsp_head")

    def train_heads_only(self, heads=HEADS) -> None:
        """Freezes the encoder and the heads not in `heads` (names of `HEADS`): only the named
        heads train. The encoder's token embedding is the MLM decoder's weight (tied), so it
        stays fixed too: the MLM head learns its transform, LayerNorm and output bias. A
        frozen variable gets no update at all (no weight decay either). The step is traced
        again at the next `fit`."""
        for head in (self.mlm_head, self.nsp_head):
            head.trainable = head.name in heads
        self.backbone.trainable = False
        self.backbone.token_embedding.trainable = False  # the head tracks it as well
        self._trainables_changed()

    def train_everything(self) -> None:
        """Undoes `train_heads_only`: every layer trains (and is saved trainable)."""
        for layer in (self.mlm_head, self.nsp_head, self.backbone):
            layer.trainable = True
        self.backbone.token_embedding.trainable = True
        self._trainables_changed()

    def _trainables_changed(self) -> None:
        self._compiled_update = None  # captured the old list of variables
        if getattr(self, "train_function", None) is not None:
            self.make_train_function(force=True)

    # === The train and test steps ===
    def train_step(self, *args, **kwargs):
        """One micro-batch: forward and backward pass, gradients summed over the replicas,
        the optimizer's update (or accumulation), metrics plus `grad_norm` (TensorFlow;
        Keras' own step on the other backends)."""
        if keras.backend.backend() != "tensorflow":
            return super().train_step(*args, **kwargs)
        import tensorflow as tf

        (data,) = args
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape, fused.training_kernels(self, self.fused_kernels):
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                     training=True)
            keras_compat.loss_tracker(self).update_state(
                keras_compat.unscale_loss_for_distribution(loss),
                sample_weight=tf.shape(x["token_ids"])[0])
            scaled_loss = self.optimizer.scale_loss(loss)
        variables = self.trainable_weights
        grads = tape.gradient(scaled_loss, variables)
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                 for g in grads]
        grads = self._sum_over_replicas(grads)
        grad_norm = self.gradient_norm(grads, variables)
        self._apply_update(grads, variables)
        logs = self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        logs["grad_norm"] = grad_norm
        return self._reducible(logs)

    def test_step(self, *args, **kwargs):
        logs = super().test_step(*args, **kwargs)
        return self._reducible(logs) if keras.backend.backend() == "tensorflow" else logs

    @staticmethod
    def _sum_over_replicas(grads):
        """Each replica's gradient summed over the replicas (each replica's loss is already
        divided by the replica count: the sum is the global batch's gradient)."""
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return grads
        grads = list(grads)
        present = [i for i, g in enumerate(grads) if g is not None]
        reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, [grads[i] for i in present])
        for i, g in zip(present, reduced):
            grads[i] = g
        return grads

    def gradient_norm(self, grads, variables):
        """Global norm of the (unscaled, accumulated) gradient the optimizer is about to see;
        with `xla_update` as one XLA function where nothing is scaled or accumulated (the
        sums of squares fuse into one pass over each gradient)."""
        import tensorflow as tf

        optimizer, scale = self.optimizer, None
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            scale = optimizer.dynamic_scale
            optimizer = optimizer.inner_optimizer
        elif optimizer.loss_scale_factor:
            scale = optimizer.loss_scale_factor
        accum = optimizer.gradient_accumulation_steps
        if self.xla_update and scale is None and not accum:
            present = [g for g in grads if g is not None]
            return _compiled_norm()(present) if present else tf.constant(0.0)
        squares = []
        for g, v in zip(grads, variables):
            if g is None:
                continue
            g = tf.cast(g, tf.float32)
            if scale is not None:
                g = g / tf.cast(scale, tf.float32)
            if accum:
                stored = keras_compat.accumulated_gradient(optimizer, v)
                g = (g + tf.cast(stored, tf.float32)) / accum
            squares.append(tf.reduce_sum(tf.square(g)))
        return tf.sqrt(tf.add_n(squares)) if squares else tf.constant(0.0)

    def _apply_update(self, grads, variables):
        """`optimizer.apply`, XLA-compiled with `xla_update` (the step stays outside XLA)."""
        if not self.xla_update:
            return self.optimizer.apply(grads, variables)
        if self._compiled_update is None:
            import tensorflow as tf

            # The variables are captured, not passed: tf.function cannot trace Keras
            # variables as arguments. They are the trainable weights, the same every step.
            optimizer, weights = self.optimizer, list(variables)
            self._compiled_update = tf.function(
                lambda grads: optimizer.apply(grads, weights), jit_compile=True,
                autograph=False)
        return self._compiled_update(grads)

    def _reducible(self, logs):
        """Under a multi-worker cluster, every log value as shape (1,).

        Keras 3.15 reduces a step's outputs over the workers with
        `strategy.reduce(MEAN, value, axis=0)`, which fails for the scalars every metric
        returns; with a leading axis of 1 it is the mean over the workers.
        """
        if not keras_compat.in_multi_worker_mode(self.distribute_strategy):
            return logs
        import tensorflow as tf

        return {k: tf.reshape(v, [1]) for k, v in logs.items()}

    # keras-hub 0.32's PipelineModel.train_on_batch / test_on_batch pass `y` and
    # `sample_weight` through one flat `convert_to_tensor`, which fails for the
    # dicts this model trains on. There is no preprocessor, so Keras' own methods
    # are equivalent.
    def train_on_batch(self, x, y=None, sample_weight=None, **kwargs):
        return keras.Model.train_on_batch(self, x, y, sample_weight, **kwargs)

    def test_on_batch(self, x, y=None, sample_weight=None, **kwargs):
        return keras.Model.test_on_batch(self, x, y, sample_weight, **kwargs)

    def compile_from_config(self, config):
        """Recompiles from a saved `.keras` file (optimizer, losses, metrics).

        Keras skips this for models that override `compile()`, which would drop
        the optimizer state on `load_model`; rebuilding the optimizer here lets
        its saved variables (step count, Adam moments) load, so training resumes.
        """
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if self.built:
            self.optimizer.build(self.trainable_variables)


@functools.cache
def _compiled_norm():
    """sqrt(sum of squares) over a list of gradients, as one XLA function (TensorFlow)."""
    import tensorflow as tf

    return tf.function(
        lambda grads: tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float32)))
                                        for g in grads])),
        jit_compile=True, autograph=False)


def build_pretrainer(vocabulary_size: int, preset: str = "tiny", **overrides) -> BertPretrainer:
    """`BertPretrainer` over `BertEncoder.from_preset_name(preset, vocabulary_size, **overrides)`.

    `overrides` go to the encoder (sizes, `dropout`, `max_sequence_length`,
    `activation`, `layer_norm_epsilon`, `dtype`). Call it inside
    `strategy.scope()` to place the variables for a distribution strategy.

    >>> build_pretrainer(100, "tiny", max_sequence_length=32).backbone.hidden_dim
    128
    """
    encoder = BertEncoder.from_preset_name(preset, vocabulary_size, **overrides)
    return BertPretrainer(encoder)
