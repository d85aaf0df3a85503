"""models/keras_compat.py: every Keras, keras-hub and TensorFlow private the project relies on
is still there with the shape it is used with (inspect) and still does what the project
counts on (tiny models). A test here failing after an upgrade names the private to revisit.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from models import keras_compat
from models.bert import BertEncoder
from models.pretraining import BertPretrainer
from pipeline import artifacts

PROJECT = artifacts.PROJECT_ROOT


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def tiny_pretrainer() -> BertPretrainer:
    keras.utils.set_random_seed(0)
    encoder = BertEncoder(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8,
                          intermediate_dim=16, max_sequence_length=8, dropout=0.0)
    return BertPretrainer(encoder)


def tiny_batch(batch=4, seq=8, masked=2):
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, 30, (batch, seq)).astype("int32"),
         "segment_ids": np.zeros((batch, seq), "int32"),
         "padding_mask": np.ones((batch, seq), "int32"),
         "mask_positions": rng.integers(1, seq, (batch, masked)).astype("int32")}
    y = {"mlm": rng.integers(0, 30, (batch, masked)).astype("int32"),
         "nsp": rng.integers(0, 2, (batch, 1)).astype("int32")}
    w = {"mlm": np.ones((batch, masked), "float32"), "nsp": np.ones((batch, 1), "float32")}
    return x, y, w


def test_trainer_privates_keep_their_signatures():
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    from keras.src.losses import loss as loss_module
    from keras.src.trainers.trainer import Trainer

    assert parameters(Trainer._symbolic_build) == ["self", "iterator", "data_batch"]
    assert parameters(TensorFlowTrainer._maybe_symbolic_build) == [
        "self", "iterator", "data_batch"]
    assert parameters(loss_module.unscale_loss_for_distribution) == ["value"]
    assert parameters(keras.Model.compute_loss) == [
        "self", "x", "y", "y_pred", "sample_weight", "training"]
    assert parameters(keras.utils.unpack_x_y_sample_weight) == ["data"]


def test_prebuild_builds_everything_and_fit_skips_its_own_build(monkeypatch):
    """After `prebuild` the compiled loss, metrics and optimizer are built and Keras' fit
    under a strategy does not build again from a batch; without it, it does (so the hook
    PrebuiltModel overrides is still the one fit calls)."""
    x, y, w = tiny_batch()
    spec = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(4).element_spec
    calls = {}
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    for prebuilt in (True, False):
        with strategy.scope():
            model = tiny_pretrainer()
            model.compile(optimizer=keras.optimizers.SGD(0.1), run_eagerly=True)
        if prebuilt:
            model.prebuild(spec)
            assert model.optimizer.built
            assert model._compile_metrics.built and model._compile_loss.built
        seen = []
        build = model._symbolic_build
        monkeypatch.setattr(model, "_symbolic_build",
                            lambda *a, seen=seen, build=build, **k: seen.append(1) or build(*a, **k))
        data = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(4)
        model.fit(data, epochs=1, verbose=0)
        calls[prebuilt] = len(seen)
    assert calls == {True: 0, False: 1}


def test_loss_tracker_is_what_keras_reports_as_loss():
    model = tiny_pretrainer()
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    tracker = keras_compat.loss_tracker(model)
    assert tracker is model._loss_tracker  # the metric Keras' own steps update
    x, y, w = tiny_batch()
    logs = model.train_on_batch(x, y, w, return_dict=True)
    np.testing.assert_allclose(logs["loss"], float(tracker.result()), rtol=1e-6)
    assert logs["loss"] > 0


def test_optimizer_privates_keep_their_shape():
    from keras.src.backend.tensorflow.optimizer import TFOptimizer
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    assert parameters(TFOptimizer._all_reduce_sum_gradients) == ["self", "grads_and_vars"]
    assert parameters(BaseOptimizer._get_variable_index) == ["self", "variable"]
    assert parameters(BaseOptimizer._use_weight_decay) == ["self", "variable"]


def test_variable_index_and_weight_decay_exclusion():
    a = keras.Variable(np.ones((2, 3), "float32"), name="kernel")
    b = keras.Variable(np.ones((3,), "float32"), name="bias")
    optimizer = keras.optimizers.AdamW(0.1, weight_decay=0.1)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    optimizer.build([a, b])
    assert [keras_compat.variable_index(optimizer, v) for v in (a, b)] == [0, 1]
    assert optimizer._momentums[1].shape == b.shape  # the index of its moment variables
    assert keras_compat.uses_weight_decay(optimizer, a)
    assert not keras_compat.uses_weight_decay(optimizer, b)


def test_accumulated_gradient_holds_the_micro_batches_of_the_update():
    """Keras keeps the sum of the update's earlier micro-batch gradients; the last one is
    averaged in and the update applied (what BertPretrainer.gradient_norm assumes)."""
    g1, g2 = np.array([1.0, -2.0], "float32"), np.array([3.0, 0.5], "float32")
    accumulating = keras.Variable(np.zeros(2, "float32"))
    once = keras.Variable(np.zeros(2, "float32"))
    optimizer = keras.optimizers.SGD(1.0, gradient_accumulation_steps=2)
    optimizer.build([accumulating])
    optimizer.apply([g1], [accumulating])
    np.testing.assert_allclose(keras_compat.accumulated_gradient(optimizer, accumulating), g1)
    np.testing.assert_allclose(accumulating.numpy(), 0.0)  # no update yet
    optimizer.apply([g2], [accumulating])
    np.testing.assert_allclose(keras_compat.accumulated_gradient(optimizer, accumulating), 0.0)
    keras.optimizers.SGD(1.0).apply([(g1 + g2) / 2], [once])
    np.testing.assert_allclose(accumulating.numpy(), once.numpy())
    assert keras_compat.accumulated_gradient(keras.optimizers.SGD(1.0), once) is None


def test_masked_lm_head_parts_are_the_layers_its_call_uses():
    embedding = keras_hub.layers.ReversibleEmbedding(30, 8)
    embedding.build((None, None))
    head = keras_hub.layers.MaskedLMHead(vocabulary_size=30, token_embedding=embedding,
                                         activation=None)
    sequence = np.random.default_rng(1).normal(size=(2, 5, 8)).astype("float32")
    positions = np.array([[0, 3], [4, 1]], "int32")
    expected = keras.ops.convert_to_numpy(head(sequence, mask_positions=positions))
    dense, layer_norm, bias = keras_compat.masked_lm_head_parts(head)
    assert isinstance(dense, keras.layers.Dense)
    assert isinstance(layer_norm, keras.layers.LayerNormalization)
    assert tuple(bias.shape) == (30,)
    gathered = np.take_along_axis(sequence, positions[..., None], axis=1)
    hidden = keras.ops.convert_to_numpy(layer_norm(dense(gathered)))
    manual = hidden @ keras.ops.convert_to_numpy(embedding.embeddings).T + bias.numpy()
    np.testing.assert_allclose(manual, expected, atol=1e-5)


def test_flatten_layers_walks_every_sublayer_but_itself():
    inner = keras.Sequential([keras.layers.Dense(2), keras.layers.LayerNormalization()])
    inputs = keras.Input((3,))
    outer = keras.Model(inputs, keras.layers.Dense(1)(inner(inputs)))
    layers = keras_compat.flatten_layers(outer)
    assert outer not in layers and inner in layers
    assert {type(layer).__name__ for layer in layers} >= {"Dense", "LayerNormalization"}
    assert sum(isinstance(layer, keras.layers.Dense) for layer in layers) == 2


def test_subclass_hooks_are_still_there():
    tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary=["[PAD]", "[UNK]", "a", "##b"], oov_token="[UNK]")
    instances = {"keras_hub.tokenizers.WordPieceTokenizer": tokenizer}
    assert set(instances) == set(keras_compat.SUBCLASS_HOOKS)
    for owner, names in keras_compat.SUBCLASS_HOOKS.items():
        for name in names:
            assert hasattr(instances[owner], name), f"{owner}.{name}"
    assert parameters(type(tokenizer)._set_vocabulary_tf) == ["self"]


def test_load_weights_skipping_keeps_the_optimizer_fresh(tmp_path):
    trained, fresh = tiny_pretrainer(), tiny_pretrainer()
    for model in (trained, fresh):
        model.compile(optimizer=keras.optimizers.Adam(0.01))
        model.optimizer.build(model.trainable_variables)
    trained.optimizer.iterations.assign(5)
    slots = [v for v in trained.optimizer.variables if "iteration" not in v.path
             and "learning_rate" not in v.path]
    for variable in slots + trained.trainable_variables[:2]:
        variable.assign(np.full(variable.shape, 0.5, variable.dtype))
    path = tmp_path / "ckpt.weights.h5"
    trained.save_weights(str(path))
    keras_compat.load_weights_skipping(fresh, path, skip=[fresh.optimizer])
    for a, b in zip(trained.weights, fresh.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert int(fresh.optimizer.iterations.numpy()) == 0
    assert not any(np.any(v.numpy()) for v in fresh.optimizer.variables
                   if "iteration" not in v.path and "learning_rate" not in v.path)
    fresh.load_weights(str(path))  # without skipping, the optimizer state comes too
    assert int(fresh.optimizer.iterations.numpy()) == 5


def test_multi_worker_mode_private_exists_and_is_false_without_a_cluster():
    from tensorflow.python.distribute.collective_all_reduce_strategy import (
        CollectiveAllReduceExtended,
    )

    assert parameters(CollectiveAllReduceExtended._in_multi_worker_mode) == ["self"]
    assert keras_compat.in_multi_worker_mode(tf.distribute.get_strategy()) is False
    assert keras_compat.in_multi_worker_mode(tf.distribute.MirroredStrategy(["/cpu:0"])) is False


def test_onednn_switch_is_readable():
    from tensorflow.python.util import _pywrap_util_port

    assert callable(_pywrap_util_port.IsMklEnabled)
    # models/__init__.py turns oneDNN on before TensorFlow loads unless the user said 0.
    expected = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1") != "0"
    assert keras_compat.onednn_enabled() is expected


def test_missing_private_is_named(monkeypatch):
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    monkeypatch.delattr(TFOptimizer, "_all_reduce_sum_gradients")
    with pytest.raises(keras_compat.KerasCompatError, match="_all_reduce_sum_gradients is gone"):
        keras_compat.gradients_summed_by_step(keras.optimizers.SGD(0.1))


TWO_REPLICAS = r"""
import json, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from models import keras_compat
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
out = {"determinism_before": keras_compat.op_determinism_enabled()}

def per_replica(fn):
    values = strategy.run(fn)
    return [float(v) for v in strategy.experimental_local_results(values)]

# Keras divides each replica's compiled loss by the replica count; unscale undoes it.
loss = keras.losses.MeanSquaredError()
out["scaled"] = per_replica(lambda: loss(tf.constant([[2.0], [2.0]]), tf.zeros((2, 1))))
out["unscaled"] = per_replica(
    lambda: keras_compat.unscale_loss_for_distribution(tf.constant(1.0)))

# Replica r hands gradient r + 1 to SGD(1.0): Keras all-reduces them (1 + 2 = 3) unless
# gradients_summed_by_step says the step did it already (each replica applies its own).
for summed in (False, True):
    with strategy.scope():
        w = keras.Variable(0.0)
        optimizer = keras.optimizers.SGD(1.0)
        optimizer.build([w])
    if summed:
        keras_compat.gradients_summed_by_step(optimizer)
    out[f"sums_itself_{summed}"] = keras_compat.sums_gradients_itself(optimizer)

    def apply():
        rid = tf.distribute.get_replica_context().replica_id_in_sync_group
        optimizer.apply([tf.cast(rid, "float32") + 1.0], [w])
        return tf.constant(0.0)

    tf.function(lambda: strategy.run(apply))()
    out[f"w_summed_{summed}"] = [float(v) for v in w.value.values]
tf.config.experimental.enable_op_determinism()
out["determinism_after"] = keras_compat.op_determinism_enabled()
print(json.dumps(out))
"""


def test_replica_scaling_all_reduce_switch_and_determinism_on_two_replicas():
    """On two logical CPUs (a fresh process: devices are set before TensorFlow starts)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(PROJECT))
    result = subprocess.run([sys.executable, "-c", TWO_REPLICAS], cwd=PROJECT, env=env,
                            capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["scaled"] == [2.0, 2.0]  # (2 - 0)² = 4, halved on each of 2 replicas
    assert out["unscaled"] == [2.0, 2.0]
    assert out["w_summed_False"] == [-3.0, -3.0]  # Keras summed: 1 + 2
    assert out["w_summed_True"] == [-1.0, -2.0]  # not summed again by the optimizer
    assert (out["sums_itself_False"], out["sums_itself_True"]) == (False, True)
    assert (out["determinism_before"], out["determinism_after"]) == (False, True)
