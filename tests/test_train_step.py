"""The pretraining train step, BertPretrainer's own train_step / test_step: gradient
accumulation against the large batch, the NSP weight, steps per execution, mixed precision,
XLA, the non-finite-loss guard, saving and loading the model with its step, where the step runs
in XLA, and the optimised step (fused kernels) against the reference step.

The data and configs are tests/test_training.py's (synthetic TFRecords, configs/test_tiny.yaml);
`fit_blocks` runs the stage's building blocks without the stage around them.
"""

from __future__ import annotations

import dataclasses
import functools

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_training import (
    PREDICTIONS,
    PROJECT,
    SEQ,
    Killed,
    die_after_checkpoint,
    no_export,
    tiny_config,
    write_pretraining_data,
)

import models
from models import fused, keras_compat
from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.stages import pretrain
from pipeline.training import callbacks, checkpoints, inputs, loop, pretrainer


def fit_blocks(config, vocabulary_size, batches, updates):
    """The stage's building blocks on `batches` for `updates` optimizer updates."""
    tc = config.train
    keras.utils.set_random_seed(7)
    model = pretrainer.build_model(config, vocabulary_size)
    optimizer = pretrainer.build_optimizer(tc)
    pretrainer.compile_model(model, optimizer, tc.jit_compile, tc.steps_per_execution,
                             nsp_weight=pretrainer.nsp_weight(config))
    optimizer.build(model.trainable_variables)
    logger = callbacks.StepLogger(tc.log_every, updates, tc.batch_size, SEQ, to_mlflow=False,
                                  examples_per_update=tc.batch_size * tc.grad_accum_steps)
    model.fit(batches.repeat(), steps_per_epoch=updates * tc.grad_accum_steps, epochs=1,
              callbacks=[logger], shuffle=False, verbose=0)
    return model, logger.history


def ordered_batches(run_dir, batch_size):
    paths = artifacts.Artifacts(run_dir)
    return inputs.pretraining_dataset(paths.shard_pattern("train"), batch_size, SEQ, PREDICTIONS,
                                      training=False).map(pretrainer.normalize_mlm_weights)


def test_grad_accumulation_matches_the_large_batch(tmp_path, optimizer="adamw"):
    """2 micro-batches of 4 accumulated = one batch of 8: same updates, LR, grad norm, clipping."""
    vocabulary_size = write_pretraining_data(tmp_path / "run", full_weights=True)
    # clipnorm 0.5 is below every gradient norm here: clipping is active on every update.
    args = ["train.steps=3", "train.warmup_steps=1", "train.clipnorm=0.5",
            f"train.optimizer={optimizer}"]
    large = tiny_config(tmp_path / "run", *args, "train.batch_size=8")
    accumulated = tiny_config(tmp_path / "run", *args, "train.batch_size=4",
                              "train.grad_accum_steps=2")
    model_a, history_a = fit_blocks(large, vocabulary_size, ordered_batches(tmp_path / "run", 8), 3)
    model_b, history_b = fit_blocks(accumulated, vocabulary_size,
                                    ordered_batches(tmp_path / "run", 4), 3)

    # train.steps counts optimizer updates: 3 updates from 6 micro-batches.
    assert checkpoints.global_step(model_a) == checkpoints.global_step(model_b) == 3
    assert [s for s, _ in history_a] == [s for s, _ in history_b] == [1, 2, 3]  # once per update
    for (_, a), (_, b) in zip(history_a, history_b):
        assert a["grad_norm"] > 0.5  # so the clipping did something
        np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-4)
        np.testing.assert_allclose(b["learning_rate"], a["learning_rate"], rtol=1e-6)
    # The schedule is in updates: warmup 1, linear decay to 0 at update 3.
    assert [round(m["learning_rate"] / 1e-3, 6) for _, m in history_a] == [1.0, 0.5, 0.0]
    for a, b in zip(model_a.get_weights(), model_b.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=2e-6)


@pytest.mark.slow
def test_nsp_weight_scales_the_sentence_loss(tmp_path):
    """train.nsp_weight w: the total loss is MLM + w × NSP; w = 0 (or data.objective: mlm) is
    MLM only, with no NSP accuracy (the head is not trained); NSP's own loss is still shown."""
    vocabulary_size = write_pretraining_data(tmp_path / "run")
    for overrides, weight in (([], 1.0), (["train.nsp_weight=0.5"], 0.5),
                              (["train.nsp_weight=0"], 0.0), (["data.objective=mlm"], 0.0)):
        config = tiny_config(tmp_path / "run", "train.steps=2", *overrides)
        _, history = fit_blocks(config, vocabulary_size, ordered_batches(tmp_path / "run", 4), 2)
        for _, logs in history:
            assert logs["nsp_loss"] > 0.1, overrides
            np.testing.assert_allclose(logs["loss"], logs["mlm_loss"] + weight * logs["nsp_loss"],
                                       rtol=1e-5)
            assert ("nsp_accuracy" in logs) == (weight > 0), overrides


@pytest.mark.slow
def test_steps_per_execution_trains_the_same_updates(tmp_path):
    """train.steps_per_execution = 3 (3 micro-batches per compiled call, here with 2 of them
    accumulated per update): the same 6 updates and weights as one batch per call; the
    callbacks see every third batch."""
    vocabulary_size = write_pretraining_data(tmp_path / "run", full_weights=True)
    args = ["train.steps=6", "train.warmup_steps=1", "train.batch_size=4",
            "train.grad_accum_steps=2", "train.checkpoint_every=3", "train.log_every=3",
            "train.heldout_every=3"]
    one = tiny_config(tmp_path / "run", *args)
    three = tiny_config(tmp_path / "run", *args, "train.steps_per_execution=3")
    model_a, history_a = fit_blocks(one, vocabulary_size, ordered_batches(tmp_path / "run", 4), 6)
    model_b, history_b = fit_blocks(three, vocabulary_size, ordered_batches(tmp_path / "run", 4),
                                    6)
    assert checkpoints.global_step(model_a) == checkpoints.global_step(model_b) == 6
    assert [s for s, _ in history_a] == [s for s, _ in history_b] == [3, 6]  # log_every 3
    for (_, a), (_, b) in zip(history_a, history_b):
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-4)
        np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-4)
    for a, b in zip(model_a.get_weights(), model_b.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=2e-6)
    with pytest.raises(config_lib.ConfigError, match=r"train.steps_per_execution = 4: "
                       r"train.checkpoint_every × train.grad_accum_steps = 3 × 2"):
        tiny_config(tmp_path / "run", *args, "train.steps_per_execution=4")


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_trains_with_finite_loss(tmp_path, precision):
    vocabulary_size = write_pretraining_data(tmp_path / "run")
    config = tiny_config(tmp_path / "run", "train.steps=3", "train.warmup_steps=1",
                         f"train.precision={precision}")
    model, history = fit_blocks(config, vocabulary_size, ordered_batches(tmp_path / "run", 8), 3)
    assert model.backbone.dtype_policy.compute_dtype == precision.replace("mixed_", "")
    assert all(w.dtype == "float32" for w in model.weights)  # variables stay float32
    if precision == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert checkpoints.global_step(model) == 3
    for _, metrics in history:
        assert np.isfinite(metrics["loss"]) and 5.0 < metrics["loss"] < 8.0
        assert 0.1 < metrics["grad_norm"] < 50  # unscaled (float16: loss scale 2**15 removed)


@pytest.mark.slow
def test_xla_compiled_steps_match_plain_ones(tmp_path):
    vocabulary_size = write_pretraining_data(tmp_path / "run")
    runs = {}
    for jit in ("false", "true"):
        config = tiny_config(tmp_path / "run", "train.steps=2", "train.warmup_steps=1",
                             f"train.jit_compile={jit}")
        model, history = fit_blocks(config, vocabulary_size, ordered_batches(tmp_path / "run", 8),
                                    2)
        assert model.jit_compile is (jit == "true")
        runs[jit] = [m["loss"] for _, m in history]
    np.testing.assert_allclose(runs["true"], runs["false"], rtol=1e-4)


def test_non_finite_loss_stops_without_overwriting_the_last_checkpoint(tmp_path, monkeypatch):
    no_export(monkeypatch)
    write_pretraining_data(tmp_path / "run")
    paths = artifacts.Artifacts(tmp_path / "run")
    config = tiny_config(tmp_path / "run", "train.steps=8", "train.checkpoint_every=1",
                         "train.warmup_steps=0", "train.clipnorm=0")
    revive = die_after_checkpoint(monkeypatch, lambda ckpt: checkpoints.global_step(ckpt.model) == 2)
    with pytest.raises(Killed):
        pretrain.run(config)
    revive()
    assert checkpoints.latest_checkpoint(paths.checkpoint_dir)[0] == 2
    before = (paths.checkpoint_dir / "ckpt-00000002.weights.h5").read_bytes()
    # The resumed run's optimizer takes an absurd learning rate (the settings check sees the
    # same config): the weights overflow, the loss becomes NaN.
    build = loop.build_optimizer
    absurd = dataclasses.replace(config.train, learning_rate=1.0e38)
    monkeypatch.setattr(loop, "build_optimizer", lambda tc: build(absurd))
    with pytest.raises(pretrainer.PretrainError) as err:
        pretrain.run(config)
    message = str(err.value)
    assert "training stopped at step" in message and "not finite" in message
    for knob in ("train.learning_rate", "train.clipnorm", "train.precision"):
        assert knob in message
    bad_step = int(message.split("training stopped at step ")[1].split(":")[0])
    last_good, path = checkpoints.latest_checkpoint(paths.checkpoint_dir)
    assert 2 <= last_good < bad_step  # nothing written at or after the bad step
    assert f"{path.name} (step {last_good}) is kept" in message
    assert (paths.checkpoint_dir / "ckpt-00000002.weights.h5").read_bytes() == before
    assert not paths.model_keras.exists()


def test_the_step_is_the_model_class_own_and_the_model_saves_and_loads(tmp_path):
    """BertPretrainer's own train_step / test_step (nothing patched onto an instance in
    pipeline/ or models/): a model trained with gradient accumulation saves as .keras and as
    a .weights.h5 checkpoint; `keras.saving.load_model` gives the same outputs, step and an
    optimizer that trains on with the same step, and the checkpoint loads into a freshly
    built model (as a resume does) with the same weights and step."""
    sources = [p for package in ("pipeline", "models") for p in (PROJECT / package).rglob("*.py")]
    assert not [p for p in sources if "MethodType" in p.read_text(encoding="utf-8")]
    vocabulary_size = write_pretraining_data(tmp_path / "run")
    config = tiny_config(tmp_path / "run", "train.steps=2", "train.warmup_steps=1",
                         "train.batch_size=4", "train.grad_accum_steps=2")
    batches = ordered_batches(tmp_path / "run", 4)
    model, history = fit_blocks(config, vocabulary_size, batches, 2)
    assert {"train_step", "test_step"} <= set(vars(models.BertPretrainer))
    assert not {"train_step", "test_step"} & set(vars(model))
    assert all(logs["grad_norm"] > 0 for _, logs in history)
    x, _, _ = next(iter(batches))
    expected = keras.ops.convert_to_numpy(model(x, training=False)["mlm"])

    model.save(str(tmp_path / "model.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "model.keras"))
    assert type(loaded) is models.BertPretrainer
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x, training=False)["mlm"]),
                               expected, atol=1e-6)
    assert checkpoints.global_step(loaded) == 2
    assert keras_compat.sums_gradients_itself(loaded.optimizer)
    loaded.run_eagerly = True  # the same step, without tracing it again
    logs = loaded.fit(batches.take(2), verbose=0).history  # 2 micro-batches: one update
    assert checkpoints.global_step(loaded) == 3
    assert np.isfinite(logs["loss"][-1]) and logs["grad_norm"][-1] > 0

    checkpoint = tmp_path / "ckpt-00000002.weights.h5"
    model.save_weights(str(checkpoint))
    keras.utils.set_random_seed(99)  # other initial weights
    fresh = pretrainer.build_model(config, vocabulary_size)
    optimizer = pretrainer.build_optimizer(config.train)
    pretrainer.compile_model(fresh, optimizer)
    optimizer.build(fresh.trainable_variables)
    fresh.prebuild(batches.element_spec)
    assert checkpoints.weights_digest(fresh) != checkpoints.weights_digest(model)
    fresh.load_weights(str(checkpoint))
    assert checkpoints.weights_digest(fresh) == checkpoints.weights_digest(model)
    assert checkpoints.global_step(fresh) == 2


def test_jit_compile_auto_is_xla_for_one_replica_only():
    class Replicas:
        def __init__(self, n):
            self.num_replicas_in_sync = n

    one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
    assert pretrainer.resolve_jit_compile("auto", tf.distribute.get_strategy()) is True
    assert pretrainer.resolve_jit_compile("auto", one_device) is True
    assert pretrainer.resolve_jit_compile("auto", Replicas(2)) == "auto"  # Keras: off
    assert pretrainer.resolve_jit_compile("true", Replicas(2)) is True
    assert pretrainer.resolve_jit_compile("false", one_device) is False
    # bfloat16 on a CPU: the step outside XLA (oneDNN's bfloat16 kernels), its update inside.
    assert not tf.config.list_logical_devices("GPU")
    assert pretrainer.resolve_jit_compile("auto", one_device, "mixed_bfloat16") is False
    assert pretrainer.resolve_jit_compile("true", one_device, "mixed_bfloat16") is True
    assert pretrainer.xla_optimizer("auto", one_device, "mixed_bfloat16") is True
    assert pretrainer.xla_optimizer("false", one_device, "mixed_bfloat16") is False
    assert pretrainer.xla_optimizer("auto", one_device, "float32") is False
    assert pretrainer.xla_optimizer("auto", Replicas(2), "mixed_bfloat16") is False
    # With the fused kernels (train.fused_kernels, the default): float32 on a CPU as well.
    fused = dict(fused_kernels=True)
    assert pretrainer.resolve_jit_compile("auto", one_device, "float32", **fused) is False
    assert pretrainer.resolve_jit_compile("true", one_device, "float32", **fused) is True
    assert pretrainer.xla_optimizer("auto", one_device, "float32", **fused) is True
    assert pretrainer.xla_optimizer("auto", Replicas(2), "float32", **fused) is False
    assert pretrainer.resolve_jit_compile("auto", Replicas(2), "float32", **fused) is False


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_the_optimised_step_trains_as_the_reference_step(tmp_path, monkeypatch, precision):
    """50 updates of the optimised step (our tied MLM head, in the compute dtype; the fused
    GELU, LayerNorm and MLM cross-entropy kernels and 2-D attention projections of
    models/fused.py; on a CPU the step outside XLA and the update and gradient norm inside;
    dropout 0.1, the same masks in both)
    against the reference (keras-hub's MaskedLMHead, Keras' own layers and plain update, no
    XLA) from the same weights on the same batches: the same losses and weights within float
    rounding."""
    import keras_hub

    vocabulary_size = write_pretraining_data(tmp_path / "run", train_files=1,
                                             records_per_file=64)
    config = tiny_config(tmp_path / "run", "train.steps=50", "train.warmup_steps=5",
                         "train.log_every=1", f"train.precision={precision}",
                         "train.jit_compile=auto", "model.dropout=0.1")  # the same masks
    batches = ordered_batches(tmp_path / "run", 8)
    traced = []  # the fused kernels the train steps trace (models/fused.py)
    kernels = {"gelu", "layer_norm", "tied_logits", "sparse_crossentropy"}
    for name in kernels:
        original = getattr(fused, name)
        monkeypatch.setattr(fused, name, functools.partial(
            lambda original, name, *a, **k: traced.append(name) or original(*a, **k),
            original, name))
    optimised, history_o = fit_blocks(config, vocabulary_size, batches, 50)
    assert optimised.fused_kernels and optimised.xla_update and not optimised.jit_compile
    assert set(traced) == kernels
    # Keras' own classes again once the step is traced (what checkpoints save).
    assert type(optimised.backbone.embeddings_layer_norm) is keras.layers.LayerNormalization
    traced.clear()

    monkeypatch.setattr(models.pretraining, "TiedMaskedLMHead", keras_hub.layers.MaskedLMHead)
    reference_config = dataclasses.replace(
        config, train=dataclasses.replace(config.train, jit_compile="false",
                                          fused_kernels=False))
    reference, history_r = fit_blocks(reference_config, vocabulary_size, batches, 50)
    assert type(reference.mlm_head) is keras_hub.layers.MaskedLMHead
    assert not reference.jit_compile and not reference.xla_update
    assert not reference.fused_kernels and not traced

    loss_o = np.array([logs["loss"] for _, logs in history_o])
    loss_r = np.array([logs["loss"] for _, logs in history_r])
    assert len(loss_o) == len(loss_r) == 50
    assert loss_r[-5:].mean() < loss_r[:5].mean() - 0.3  # it learned something
    # float32: the same math, other kernels (XLA); bfloat16: the vocabulary projection now
    # rounds to bfloat16 too (the reference multiplied in float32).
    tolerance = 2e-4 if precision == "float32" else 3e-2
    np.testing.assert_allclose(loss_o, loss_r, atol=tolerance, rtol=0)
    for a, b in zip(optimised.trainable_weights, reference.trainable_weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b),
                                   atol=50 * tolerance, err_msg=a.path)
