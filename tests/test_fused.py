"""models/fused.py: the fused training kernels compute what Keras' layers compute (values and
gradients), only inside `training_kernels()`, and leave weights, names and configs alone."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from models import fused
from models.bert import BertEncoder, gelu_approximate, gelu_exact


def values_and_grads(fn, inputs, weights=()):
    """fn(*inputs) and the gradients of sum(fn · a fixed random cotangent) with respect to
    the inputs and `weights`, traced in one tf.function (as a train step traces them)."""
    @tf.function
    def run(*xs):
        with tf.GradientTape() as tape:
            tape.watch(xs)
            y = fn(*xs)
            cotangent = tf.random.stateless_normal(tf.shape(y), (1, 2), dtype=y.dtype)
            total = tf.reduce_sum(tf.cast(y * cotangent, tf.float32))
        return [y] + tape.gradient(total, list(xs) + list(weights))
    return [np.asarray(tf.cast(t, tf.float32)) for t in run(*inputs)]


def compare(fn, inputs, weights=(), atol=2e-5):
    reference = values_and_grads(fn, inputs, weights)
    with fused.training_kernels():
        assert fused.active()
        got = values_and_grads(fn, inputs, weights)
    assert not fused.active()
    assert len(got) == len(reference)
    for a, b in zip(got, reference):
        np.testing.assert_allclose(a, b, atol=atol * max(1.0, np.abs(b).max()), rtol=0)


def test_gelu_forms_match_keras():
    x = tf.random.stateless_normal((64, 96), (3, 4)) * 3.0
    compare(gelu_approximate, [x])
    compare(gelu_exact, [x])


@pytest.mark.parametrize("dtype, atol", [("float32", 2e-5), ("mixed_bfloat16", 3e-2)])
def test_layer_norm_matches_keras(dtype, atol):
    layer = keras.layers.LayerNormalization(epsilon=1e-12, dtype=dtype)
    layer.build((4, 16, 32))
    layer.gamma.assign(np.linspace(0.5, 1.5, 32))
    layer.beta.assign(np.linspace(-0.2, 0.2, 32))
    assert fused.adopt(layer) == [layer] and type(layer) is fused.FusedLayerNormalization
    x = tf.random.stateless_normal((4, 16, 32), (5, 6)) * 2.0 + 0.5
    x = tf.cast(x, layer.compute_dtype)
    compare(layer, [x], layer.trainable_weights, atol=atol)


def test_attention_projections_match_keras():
    attention = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)
    attention.build((2, 10, 32), (2, 10, 32))
    assert len(fused.adopt(attention)) == 4  # query, key, value, output
    for w in attention.trainable_weights:  # non-zero biases
        w.assign(tf.random.stateless_normal(w.shape, (7, 8)) * 0.1)
    x = tf.random.stateless_normal((2, 10, 32), (9, 10))
    compare(lambda x: attention(x, x), [x], attention.trainable_weights)


@pytest.mark.parametrize("dtype, atol", [("float32", 2e-5), ("mixed_bfloat16", 3e-2)])
@pytest.mark.parametrize("units, features", [(8, 48), (48, 8), (16, 16)])
def test_dense_matches_keras_both_kernel_gradient_orders(dtype, atol, units, features):
    """More rows than columns takes the transposed kernel gradient, the others Keras' order;
    a 3-D input (batch, tokens, features) and a GELU activation as the FFN has."""
    layer = keras.layers.Dense(units, activation=gelu_approximate, dtype=dtype)
    layer.build((3, 5, features))
    layer.bias.assign(np.linspace(-0.3, 0.3, units))
    assert fused.adopt(layer) == [layer] and type(layer) is fused.FusedDense
    x = tf.cast(tf.random.stateless_normal((3, 5, features), (11, 12)), layer.compute_dtype)
    compare(layer, [x], layer.trainable_weights, atol=atol)
    fused.release([layer])
    assert type(layer) is keras.layers.Dense


def test_tied_logits_match_a_matmul_with_the_transposed_table():
    table = tf.random.stateless_normal((50, 16), (11, 12))
    x = tf.random.stateless_normal((12, 16), (13, 14))
    np.testing.assert_allclose(fused.tied_logits(x, table), x.numpy() @ table.numpy().T,
                               atol=1e-5)


@pytest.mark.parametrize("dtype, atol", [("float32", 2e-5), ("bfloat16", 3e-2)])
def test_crossentropy_matches_keras_and_runs_fused_only_while_active(dtype, atol, monkeypatch):
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    loss.fn = fused.sparse_categorical_crossentropy  # as pretrainer.compile_model sets it
    labels = tf.constant(np.random.default_rng(0).integers(0, 300, (6, 5)))
    logits = tf.cast(tf.random.stateless_normal((6, 5, 300), (15, 16)) * 4.0, dtype)
    calls = []
    kernel = fused.sparse_crossentropy
    monkeypatch.setattr(fused, "sparse_crossentropy", lambda *a: calls.append(1) or kernel(*a))
    compare(lambda z: loss(labels, z), [logits], atol=atol)
    assert len(calls) == 1  # traced once, inside training_kernels() only
    assert keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=None).get_config() == (
        loss.get_config())  # saves as Keras' own loss


def test_argmax_and_accuracy_match_keras_on_zeros_denormals_and_nans():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(7, 3, 50)).astype("float32")
    scores[0, 0] = -np.abs(scores[0, 0]); scores[0, 0, [4, 9]] = [-0.0, 0.0]  # max ±0: tie
    scores[1, 1] = -np.abs(scores[1, 1]); scores[1, 1, 3] = -0.0  # max -0.0 only
    scores[2, 2] = -np.abs(scores[2, 2]); scores[2, 2, [5, 6]] = [-1e-40, 1e-41]  # denormals
    scores[3, 0, 7] = np.nan
    scores[4, 1, 0] = np.nan  # NaN first
    for x in (scores, scores[5:], np.where(np.isnan(scores), 0, scores).astype("bfloat16")):
        x = tf.constant(x)
        expected = keras.ops.argmax(x, axis=-1)
        np.testing.assert_array_equal(fused.argmax(x), expected)
        np.testing.assert_array_equal(tf.function(fused.argmax)(x), expected)
        labels = tf.constant(np.asarray(expected) * (rng.random(expected.shape) < 0.5))
        np.testing.assert_array_equal(fused.sparse_categorical_accuracy(labels, x),
                                      keras.metrics.sparse_categorical_accuracy(labels, x))


def test_training_kernels_switch_the_layers_only_while_active():
    def build():
        keras.utils.set_random_seed(0)
        return BertEncoder(vocabulary_size=40, num_layers=2, num_heads=2, hidden_dim=16,
                           intermediate_dim=32, max_sequence_length=8, dropout=0.0)

    plain, model = build(), build()
    inputs = {"token_ids": np.arange(16).reshape(2, 8) % 40,
              "segment_ids": np.zeros((2, 8), "int32"), "padding_mask": np.ones((2, 8), "int32")}
    expected = plain(inputs)["sequence_output"]
    classes = [type(layer) for layer in model._flatten_layers()]

    def xla_calls():
        graph = tf.function(lambda: model(inputs)["sequence_output"]).get_concrete_function().graph
        return [op for op in graph.get_operations() if op.type in (
            "PartitionedCall", "StatefulPartitionedCall") and op.get_attr("_XlaMustCompile")]

    assert not xla_calls()
    with fused.training_kernels(model):
        norms = [la for la in model._flatten_layers()
                 if type(la) is fused.FusedLayerNormalization]
        projections = [la for la in model._flatten_layers()
                       if type(la) is fused.FusedEinsumDense]
        denses = [la for la in model._flatten_layers() if type(la) is fused.FusedDense]
        assert len(norms) == 2 * 2 + 1 and len(projections) == 2 * 4  # per layer; embeddings
        assert len(denses) == 2 * 2 + 1  # the FFN's two per layer; the pooler
        with fused.training_kernels(model):  # nested (a replica thread each): still switched
            pass
        assert type(norms[0]) is fused.FusedLayerNormalization
        assert xla_calls()  # the fused norms and GELUs
        np.testing.assert_allclose(model(inputs)["sequence_output"], expected, atol=1e-5)
    # Keras' classes again (what is saved), the same weights, and Keras' ops bit for bit.
    assert [type(layer) for layer in model._flatten_layers()] == classes
    assert [w.path for w in model.weights] == [w.path for w in plain.weights]
    np.testing.assert_array_equal(model(inputs)["sequence_output"], expected)
    assert not xla_calls()
    with fused.training_kernels(model, enabled=False):
        assert not fused.active() and not xla_calls()
