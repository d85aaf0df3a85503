"""Fused training kernels for the TensorFlow backend: the same math in fewer passes over memory.

Profile of BERT-small's training step on 2 CPU cores (seq 128, batch 32, no XLA): the matmuls
at the step's own shapes take ~2.2 s of a ~2.9 s step; most of the rest is elementwise work
that TensorFlow runs one op at a time, each a pass over memory. What here cuts it:

- `gelu`: GELU forward and backward each as one XLA-compiled function (`tf.custom_gradient`):
  TensorFlow's composite GELU is ~8 ops forward and ~12 backward over the (tokens, 4H)
  activations (4096 × 2048: 34.5 ms forward + backward, fused 8.5 ms).
- `layer_norm`: LayerNorm forward and backward likewise (10.8 ms → ~3 ms at 4096 × 512),
  statistics in float32 as `keras.ops.layer_normalization` computes them.
- the attention projections (`EinsumDense`, "abc,cde->abde" and "abcd,cde->abe") as one 2-D
  matmul on the flattened tokens: Keras' TensorFlow backend multiplies them as a broadcast
  batched matmul, whose kernel gradient is a batched matmul plus a `Sum` over the batch
  (14.7 ms vs 10.6 ms for the 2-D product at 4096 × 512 × 512).
- `dense`: the FFN's and the heads' `Dense` layers as one 2-D matmul with its own gradient,
  whose kernel gradient for the FFN's output (2048 -> 512) is the transposed product, ~12%
  faster there than TensorFlow's `MatMul(transpose_a)`.
- `sparse_crossentropy`: the MLM loss's softmax cross-entropy, loss and gradient in one pass
  over the (masked tokens, vocabulary) logits; `argmax` for the MLM accuracy, Keras' indices
  in one pass instead of five. On BERT-tiny, whose step is mostly the vocabulary, the two
  are ~15-20% of the step (`make bench-train`).

Same weights, same variables, same math up to floating-point rounding (tests/test_fused.py
compares values and gradients with Keras' layers). The kernels are used only while
`training_kernels()` is active, which the training steps set around their forward and
backward pass, and only on the TensorFlow backend: inference, export and the JAX / torch
backends trace exactly Keras' own ops. While it is active, the model's LayerNorm,
EinsumDense and Dense sublayers are switched to the classes here (`FusedLayerNormalization`,
`FusedEinsumDense`, `FusedDense`: subclasses that override `call` only; weights and names
unchanged), and back when it ends, so what is saved or exported holds Keras' own classes.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading

import keras

from models import keras_compat

_lock = threading.Lock()
_active = 0  # a count, not a thread-local: MirroredStrategy traces each replica in a thread
_adopted = {}  # id(model) -> [count of open contexts, the sublayers switched]


@contextlib.contextmanager
def training_kernels(model=None, enabled: bool = True):
    """While active (and `enabled`), the GELU activations and `model`'s LayerNorm,
    EinsumDense and Dense sublayers trace the fused kernels (TensorFlow backend only). The
    sublayers are switched to the classes here on entry and back on exit (`adopt`, `release`), so
    the model saves, loads and exports as Keras' own layers: a train step holds this only
    while it traces its forward and backward pass."""
    global _active
    if not enabled:
        yield
        return
    with _lock:
        _active += 1
        if model is not None:
            entry = _adopted.setdefault(id(model), [0, []])
            if entry[0] == 0:
                entry[1] = adopt(model)
            entry[0] += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if model is not None:
                entry = _adopted[id(model)]
                entry[0] -= 1
                if entry[0] == 0:
                    release(entry[1])
                    del _adopted[id(model)]


def active() -> bool:
    return _active > 0 and keras.backend.backend() == "tensorflow"


@functools.lru_cache(maxsize=None)
def _kernels():
    """The XLA-compiled forward and backward functions (built once per process)."""
    import tensorflow as tf

    sqrt_2_over_pi = math.sqrt(2.0 / math.pi)

    def tanh_inner(x):
        return tf.tanh(sqrt_2_over_pi * (x + 0.044715 * x * x * x))

    def in_float32(function):  # computed in float32 (free inside the fusion), cast back
        def wrapped(x, *rest):
            dtype = x.dtype
            out = function(tf.cast(x, tf.float32), *(tf.cast(r, tf.float32) for r in rest))
            return tf.cast(out, dtype)
        return tf.function(wrapped, jit_compile=True, autograph=False)

    @in_float32
    def gelu_tanh(x):
        return 0.5 * x * (1.0 + tanh_inner(x))

    @in_float32
    def gelu_tanh_grad(x, dy):
        t = tanh_inner(x)
        dt = (1.0 - t * t) * sqrt_2_over_pi * (1.0 + 3.0 * 0.044715 * x * x)
        return dy * (0.5 * (1.0 + t) + 0.5 * x * dt)

    @in_float32
    def gelu_erf(x):
        return 0.5 * x * (1.0 + tf.math.erf(x * math.sqrt(0.5)))

    @in_float32
    def gelu_erf_grad(x, dy):
        cdf = 0.5 * (1.0 + tf.math.erf(x * math.sqrt(0.5)))
        pdf = tf.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        return dy * (cdf + x * pdf)

    def statistics(x, epsilon):
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        centered = x - mean
        variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
        return centered * tf.math.rsqrt(variance + epsilon)

    @tf.function(jit_compile=True, autograph=False)
    def norm(x, gamma, beta, epsilon):
        dtype = x.dtype
        x = tf.cast(x, tf.float32)
        normed = statistics(x, epsilon)
        return tf.cast(normed * tf.cast(gamma, tf.float32) + tf.cast(beta, tf.float32), dtype)

    @tf.function(jit_compile=True, autograph=False)
    def norm_grad(x, gamma, dy, epsilon):
        dtype = x.dtype
        x, dy = tf.cast(x, tf.float32), tf.cast(dy, tf.float32)
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        centered = x - mean
        inv = tf.math.rsqrt(tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
                            + epsilon)
        normed = centered * inv
        batch_axes = list(range(len(x.shape) - 1))
        dgamma = tf.reduce_sum(dy * normed, axis=batch_axes)
        dbeta = tf.reduce_sum(dy, axis=batch_axes)
        dnormed = dy * tf.cast(gamma, tf.float32)
        dx = inv * (dnormed - tf.reduce_mean(dnormed, axis=-1, keepdims=True)
                    - normed * tf.reduce_mean(dnormed * normed, axis=-1, keepdims=True))
        return tf.cast(dx, dtype), tf.cast(dgamma, gamma.dtype), tf.cast(dbeta, gamma.dtype)

    @tf.function(jit_compile=True, autograph=False)
    def crossentropy(logits, labels):
        z = tf.cast(logits, tf.float32)
        top = tf.reduce_max(z, axis=-1, keepdims=True)
        exp = tf.exp(z - top)
        total = tf.reduce_sum(exp, axis=-1, keepdims=True)
        onehot = tf.one_hot(labels, tf.shape(z)[-1], dtype=tf.float32)
        loss = tf.math.log(total[..., 0]) + top[..., 0] - tf.reduce_sum(onehot * z, axis=-1)
        return loss, tf.cast(exp / total - onehot, logits.dtype)

    @tf.function(jit_compile=True, autograph=False)
    def crossentropy_grad(grad, dy):
        return tf.cast(tf.cast(grad, tf.float32) * dy[..., None], grad.dtype)

    return {"gelu_tanh": (gelu_tanh, gelu_tanh_grad), "gelu_erf": (gelu_erf, gelu_erf_grad),
            "norm": (norm, norm_grad), "crossentropy": (crossentropy, crossentropy_grad)}


def gelu(x, approximate: bool = True):
    """GELU (tanh form if `approximate`, else erf) with a fused forward and backward."""
    import tensorflow as tf

    forward, backward = _kernels()["gelu_tanh" if approximate else "gelu_erf"]

    @tf.custom_gradient
    def fused(x):
        return forward(x), lambda dy: backward(x, dy)

    return fused(x)


def layer_norm(x, gamma, beta, epsilon: float):
    """LayerNorm over the last axis with a fused forward and backward (statistics in float32;
    the output in `x`'s dtype)."""
    import tensorflow as tf

    forward, backward = _kernels()["norm"]
    epsilon = tf.constant(epsilon, tf.float32)
    # Read the variables first: their gradients flow through the reads (custom_gradient
    # would otherwise see variables used inside it).
    gamma, beta = tf.convert_to_tensor(gamma), tf.convert_to_tensor(beta)

    @tf.custom_gradient
    def fused(x, gamma, beta):
        def grad(dy):
            return backward(x, gamma, dy, epsilon)
        return forward(x, gamma, beta, epsilon), grad

    return fused(x, gamma, beta)


def sparse_crossentropy(labels, logits):
    """Softmax cross-entropy of integer `labels` against `logits` (last axis), loss and
    gradient in one XLA-compiled pass (float32 inside): TensorFlow's kernel over the MLM
    logits (BERT-small, 640 × 30,522) takes ~75 ms forward + backward, this ~25 ms. Labels
    must lie in [0, vocabulary): TensorFlow's kernel raises on others, this one gives the
    row a wrong loss."""
    import tensorflow as tf

    forward, backward = _kernels()["crossentropy"]
    labels = tf.cast(labels, tf.int32)

    @tf.custom_gradient
    def fused(logits):
        loss, grad = forward(logits, labels)
        return loss, lambda dy: backward(grad, tf.cast(dy, tf.float32))

    return fused(logits)


def sparse_categorical_crossentropy(y_true, y_pred, from_logits=False, ignore_class=None,
                                    axis=-1):
    """`keras.losses.sparse_categorical_crossentropy`, with `sparse_crossentropy` while
    `training_kernels` is active (from logits, last axis, no ignored class): set as the
    `fn` of a `keras.losses.SparseCategoricalCrossentropy`, which saves without it."""
    if (active() and from_logits and ignore_class is None
            and axis in (-1, len(y_pred.shape) - 1)):
        if len(y_true.shape) == len(y_pred.shape) and y_true.shape[-1] == 1:
            y_true = keras.ops.squeeze(y_true, axis=-1)
        return sparse_crossentropy(y_true, y_pred)
    return keras.losses.sparse_categorical_crossentropy(
        y_true, y_pred, from_logits=from_logits, ignore_class=ignore_class, axis=axis)


def argmax(x):
    """`keras.ops.argmax(x, axis=-1)`, the same indices (int32) from one pass over `x` on the
    TensorFlow backend: Keras' TensorFlow argmax of floats first rewrites -0.0 as the
    smallest negative normal (so +0.0 wins a tie), which is four more passes over its input
    (the MLM accuracy over 640 × 30,522 logits: ~35 ms against ~8 ms). That rewrite can
    change the answer only for a row whose maximum is zero (or a denormal, which the CPU
    compares as zero) or NaN; such rows, if any, take Keras' path."""
    if keras.backend.backend() != "tensorflow":
        return keras.ops.argmax(x, axis=-1)
    import tensorflow as tf

    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating or x.shape.rank < 1:
        return keras.ops.argmax(x, axis=-1)
    index = tf.argmax(x, axis=-1, output_type=tf.int32)
    top = tf.gather(x, index[..., None], batch_dims=x.shape.rank - 1)
    unsure = tf.reduce_any(tf.logical_or(tf.equal(top, 0), tf.math.is_nan(top)))
    return tf.cond(unsure, lambda: keras.ops.argmax(x, axis=-1), lambda: index)


def sparse_categorical_accuracy(y_true, y_pred):
    """`keras.metrics.sparse_categorical_accuracy` with `argmax` (labels of one rank less
    than the scores; anything else takes Keras' function): the function of
    `models.pretraining.MaskedLMAccuracy`."""
    ops = keras.ops
    y_pred = ops.convert_to_tensor(y_pred)
    if len(y_true.shape) != len(y_pred.shape) - 1:
        return keras.metrics.sparse_categorical_accuracy(y_true, y_pred)
    y_true = ops.convert_to_tensor(y_true, dtype=y_pred.dtype)  # as Keras compares them
    predicted = ops.cast(argmax(y_pred), y_true.dtype)
    return ops.cast(ops.equal(y_true, predicted), keras.backend.floatx())


def tied_logits(x, table):
    """`x` (tokens, hidden) times the transposed embedding `table` (vocabulary, hidden) as one
    2-D matmul with `transpose_b`: no transposed copy of the table forward, none of its
    gradient backward (BERT-small's decoder, 640 × 512 × 30,522: forward + backward 234 →
    191 ms against the transpose and a batch-of-one matmul)."""
    import tensorflow as tf

    return tf.matmul(x, table, transpose_b=True)


def dense(x, kernel):
    """`x` (..., in) times `kernel` (in, out) as one 2-D matmul whose kernel gradient, for a
    kernel with more rows than columns, is the transposed product `(dy^T x)^T`: oneDNN's
    `x^T dy` is ~12% slower than it at the FFN's output shape (BERT-small, 4096 tokens,
    2048 -> 512: 55.1 vs 48.6 ms; at 512 -> 2048 and 512 -> 512 `x^T dy` is as fast or
    faster, so it stays). Same products, same sums: only the order of the loops changes."""
    import tensorflow as tf

    kernel = tf.convert_to_tensor(kernel)
    rows, columns = kernel.shape
    leading = tf.shape(x)[:-1]
    flat = tf.reshape(x, (-1, rows))

    @tf.custom_gradient
    def fused(flat, kernel):
        def grad(dy):
            dx = tf.matmul(dy, kernel, transpose_b=True)
            if rows > columns:
                dkernel = tf.transpose(tf.matmul(dy, flat, transpose_a=True))
            else:
                dkernel = tf.matmul(flat, dy, transpose_a=True)
            return dx, dkernel
        return tf.matmul(flat, kernel), grad

    return tf.reshape(fused(flat, kernel), tf.concat([leading, [columns]], 0))


class FusedLayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` whose training step uses `layer_norm` (last axis,
    centred and scaled, no RMS scaling; anything else takes Keras' path)."""

    def call(self, inputs):
        if not (active() and self.center and self.scale and not self.rms_scaling
                and self.axis in (-1, [-1], len(inputs.shape) - 1, [len(inputs.shape) - 1])):
            return super().call(inputs)
        outputs = layer_norm(inputs, self.gamma, self.beta, self.epsilon)
        return keras.ops.cast(outputs, self.compute_dtype)


class FusedEinsumDense(keras.layers.EinsumDense):
    """`keras.layers.EinsumDense` whose projections of multi-head attention ("abc,cde->abde":
    hidden to heads; "abcd,cde->abe": heads to hidden) run as one 2-D matmul on the flattened
    tokens in the training step."""

    EQUATIONS = ("abc,cde->abde", "abcd,cde->abe")

    def call(self, inputs, training=None):
        if not (active() and self.equation in self.EQUATIONS and not self.lora_enabled
                and not self.quantization_mode):
            return super().call(inputs, training=training)
        ops = keras.ops
        kernel = ops.cast(self.kernel, self.compute_dtype)
        heads_out = self.equation == "abc,cde->abde"
        if self.bias is not None and tuple(self.bias.shape) != tuple(
                kernel.shape[1:] if heads_out else kernel.shape[2:]):
            return super().call(inputs, training=training)  # a bias on some axes only
        leading = ops.shape(inputs)[:2]
        if heads_out:
            flat = ops.reshape(inputs, (-1, inputs.shape[-1]))
            out_shape = (leading[0], leading[1], kernel.shape[1], kernel.shape[2])
        else:
            flat = ops.reshape(inputs, (-1, inputs.shape[-2] * inputs.shape[-1]))
            out_shape = (leading[0], leading[1], kernel.shape[2])
        x = ops.matmul(flat, ops.reshape(kernel, (flat.shape[-1], -1)))
        if self.bias is not None:
            x = x + ops.reshape(ops.cast(self.bias, self.compute_dtype), (-1,))
        x = ops.reshape(x, out_shape)
        return x if self.activation is None else self.activation(x)


class FusedDense(keras.layers.Dense):
    """`keras.layers.Dense` whose training step uses `dense` (a 2-D kernel, no LoRA, not
    quantized; anything else takes Keras' path): the FFN's and the heads' projections."""

    def call(self, inputs, training=None):
        if not (active() and not self.lora_enabled and not self.quantization_mode
                and len(self.kernel.shape) == 2 and len(inputs.shape) >= 2):
            return super().call(inputs, training=training)
        ops = keras.ops
        x = dense(inputs, ops.cast(self.kernel, self.compute_dtype))
        if self.bias is not None:
            x = ops.add(x, ops.cast(self.bias, self.compute_dtype))
        return x if self.activation is None else self.activation(x)


_ADOPTED = {keras.layers.LayerNormalization: FusedLayerNormalization,
            keras.layers.EinsumDense: FusedEinsumDense,
            keras.layers.Dense: FusedDense}


def adopt(layer) -> list:
    """Switch `layer` and its LayerNormalization, EinsumDense and Dense sublayers (exactly those
    classes) to their fused subclasses, which override `call` only; returns the layers
    switched, for `release`."""
    switched = []
    for sub in [layer, *keras_compat.flatten_layers(layer)]:
        fused = _ADOPTED.get(type(sub))
        if fused is not None:
            sub.__class__ = fused
            switched.append(sub)
    return switched


def release(layers) -> None:
    """Switch layers `adopt` switched back to Keras' classes (Keras names a layer's saved
    weights after its class)."""
    for sub in layers:
        sub.__class__ = type(sub).__mro__[1]
