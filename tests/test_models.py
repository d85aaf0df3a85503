"""Tests for models/: sizes, keras-hub weight compatibility, heads, losses, save/load, export, fit.

Small models only, except the size checks for base/large, which build with zero
initializers (the count does not depend on the initializer; TruncatedNormal on
335M parameters alone takes ~20 s on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

import models.bert
from models import BertEncoder, BertPretrainer, build_pretrainer, mlm_loss, nsp_loss, presets

REPO_ROOT = Path(__file__).resolve().parents[1]
VOCAB = 200
SEQ = 16
NUM_MASKED = 4
SMALL = dict(max_sequence_length=32)


# --- shared helpers ---------------------------------------------------------------------------


def make_batch(batch=4, seq=SEQ, num_masked=NUM_MASKED, vocab=VOCAB, seed=0, dtype="int32"):
    """Random (x, y, sample_weight) in the structure `BertPretrainer.fit` takes."""
    rng = np.random.default_rng(seed)
    padding_mask = np.ones((batch, seq), dtype)
    padding_mask[:, seq - 3 :] = 0  # the last three positions are padding
    segment_ids = np.zeros((batch, seq), dtype)
    segment_ids[:, seq // 2 : seq - 3] = 1
    x = {
        "token_ids": rng.integers(1, vocab, (batch, seq)).astype(dtype) * padding_mask,
        "segment_ids": segment_ids,
        "padding_mask": padding_mask,
        "mask_positions": rng.integers(1, seq - 3, (batch, num_masked)).astype(dtype),
    }
    mlm_weights = np.ones((batch, num_masked), "float32")
    mlm_weights[:, -1] = 0.0  # one padded prediction slot per row
    y = {
        "mlm": rng.integers(0, vocab, (batch, num_masked)).astype(dtype),
        "nsp": rng.integers(0, 2, (batch, 1)).astype(dtype),
    }
    sample_weight = {"mlm": mlm_weights, "nsp": np.ones((batch, 1), "float32")}
    return x, y, sample_weight


def encoder_inputs(x):
    return {k: x[k] for k in ("token_ids", "segment_ids", "padding_mask")}


def assert_outputs_close(a, b, atol=1e-6):
    assert set(a) == set(b)
    for key in a:
        np.testing.assert_allclose(np.asarray(a[key]), np.asarray(b[key]), rtol=0, atol=atol)


def expected_encoder_params(vocab, layers, hidden, intermediate, positions=512, segments=2):
    """BERT encoder parameter count, by hand."""
    embeddings = (vocab + positions + segments) * hidden + 2 * hidden  # + LayerNorm
    attention = 4 * (hidden * hidden + hidden)  # q, k, v, output projections
    feed_forward = hidden * intermediate + intermediate + intermediate * hidden + hidden
    layer = attention + feed_forward + 2 * (2 * hidden)  # two LayerNorms
    pooler = hidden * hidden + hidden
    return embeddings + layers * layer + pooler


def expected_head_params(vocab, hidden):
    mlm = hidden * hidden + hidden + 2 * hidden + vocab  # dense, LayerNorm, output bias (tied)
    nsp = hidden * 2 + 2
    return mlm + nsp


@pytest.fixture(scope="module")
def pretrainer():
    keras.utils.set_random_seed(0)
    return build_pretrainer(VOCAB, "tiny", **SMALL)


# --- encoder ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name, published", [("base", 110e6), ("large", 335e6)])
def test_published_sizes(monkeypatch, name, published):
    monkeypatch.setattr(models.bert, "bert_kernel_initializer", lambda stddev=0.02: "zeros")
    size = presets.PRESETS[name]
    encoder = BertEncoder.from_preset_name(name, presets.GOOGLE_VOCAB_SIZE)
    expected = expected_encoder_params(
        presets.GOOGLE_VOCAB_SIZE, size["num_layers"], size["hidden_dim"], size["intermediate_dim"]
    )
    assert encoder.count_params() == expected
    assert abs(expected - published) / published < 0.01
    if name == "base":
        assert expected == 109_482_240  # keras-hub's bert_base_en_uncased backbone


def test_pretrainer_params_are_encoder_plus_heads():
    model = build_pretrainer(8000, "tiny")
    size = presets.PRESETS["tiny"]
    hidden = size["hidden_dim"]
    encoder = expected_encoder_params(8000, size["num_layers"], hidden, size["intermediate_dim"])
    assert model.backbone.count_params() == encoder
    assert model.count_params() == encoder + expected_head_params(8000, hidden)


def test_hidden_not_divisible_by_heads_raises():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        BertEncoder(vocabulary_size=10, num_layers=1, num_heads=3, hidden_dim=64, intermediate_dim=32)


def test_unknown_preset_and_activation_raise():
    with pytest.raises(ValueError, match="Unknown preset"):
        BertEncoder.from_preset_name("huge", vocabulary_size=10)
    with pytest.raises(ValueError, match="Unknown activation"):
        BertEncoder.from_preset_name("tiny", vocabulary_size=10, activation="swish")


def test_encoder_config_round_trip():
    encoder = BertEncoder.from_preset_name(
        "tiny", VOCAB, activation="gelu", layer_norm_epsilon=1e-6, **SMALL
    )
    config = encoder.get_config()
    assert config["activation"] == "gelu" and config["layer_norm_epsilon"] == 1e-6
    clone = BertEncoder.from_config(config)
    assert clone.get_config() == config
    assert clone.transformer_layers[0]._feedforward_layer_norm.epsilon == 1e-6
    assert clone.embeddings_layer_norm.epsilon == 1e-6


def test_initializer_range_sets_the_spread_of_every_matrix():
    """model.initializer_range: the truncated normal of every kernel and embedding (BERT's
    0.02 by default), the heads' too; kept in the config."""
    def spreads(model):
        return {w.path: float(np.std(np.asarray(w))) for w in model.weights
                if len(w.shape) >= 2 and "bias" not in w.path}

    default = BertPretrainer(BertEncoder.from_preset_name("tiny", VOCAB, **SMALL))
    wide = BertPretrainer(BertEncoder.from_preset_name("tiny", VOCAB, initializer_range=0.08,
                                                       **SMALL))
    assert wide.backbone.get_config()["initializer_range"] == 0.08
    assert set(spreads(default)) == set(spreads(wide)) and len(spreads(wide)) >= 10
    for path, std in spreads(default).items():  # truncated at 2 sigma: std = 0.88 sigma
        assert std == pytest.approx(0.02 * 0.88, rel=0.15), path
    for path, std in spreads(wide).items():
        assert std == pytest.approx(0.08 * 0.88, rel=0.15), path
    assert any("mlm_head" in path for path in spreads(wide))


def test_weights_from_keras_hub_backbone():
    """Same layer names as keras-hub's BertBackbone: copied weights give the same outputs
    with the tanh GELU, and different outputs with the exact GELU."""
    keras.utils.set_random_seed(1)
    size = dict(num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=64)
    hub = keras_hub.models.BertBackbone(vocabulary_size=VOCAB, **size, **SMALL)
    # Larger-than-init weights, so the two GELU forms differ clearly.
    rng = np.random.default_rng(1)
    hub.set_weights([rng.normal(0.0, 0.3, w.shape).astype("float32") for w in hub.get_weights()])
    x, _, _ = make_batch()
    reference = hub(encoder_inputs(x))

    for activation, should_match in (("gelu_approximate", True), ("gelu", False)):
        ours = BertEncoder(vocabulary_size=VOCAB, **size, activation=activation, **SMALL)
        assert {layer.name for layer in ours.layers} == {layer.name for layer in hub.layers}
        for layer in hub.layers:
            if layer.weights:
                ours.get_layer(layer.name).set_weights(layer.get_weights())
        outputs = ours(encoder_inputs(x))
        if should_match:
            assert_outputs_close(outputs, reference, atol=1e-6)
        else:
            diff = np.abs(np.asarray(outputs["sequence_output"]) - np.asarray(reference["sequence_output"]))
            assert diff.max() > 1e-4


# --- pretrainer ------------------------------------------------------------------------------


def test_forward_shapes(pretrainer):
    x, _, _ = make_batch(batch=3)
    outputs = pretrainer(x)
    assert set(outputs) == {"mlm", "nsp"}
    assert tuple(outputs["mlm"].shape) == (3, NUM_MASKED, VOCAB)
    assert tuple(outputs["nsp"].shape) == (3, 2)
    assert isinstance(pretrainer, keras_hub.models.Task)


def test_tied_decoder_shares_embedding():
    keras.utils.set_random_seed(2)
    model = build_pretrainer(VOCAB, "tiny", **SMALL)
    embedding = model.backbone.token_embedding
    assert model.mlm_head.token_embedding is embedding
    # No separate (hidden, vocab) output kernel anywhere.
    assert not [w for w in model.weights if tuple(w.shape) == (128, VOCAB)]

    x, _, _ = make_batch()
    before = model(x)
    # Change only the embedding rows of ids absent from the input: the encoder's
    # outputs stay the same, so only those vocabulary columns of the MLM logits move.
    # (A random change: a constant shift would vanish against the zero-mean LayerNorm output.)
    unused = np.setdiff1d(np.arange(VOCAB), x["token_ids"])
    table = embedding.embeddings.numpy()
    table[unused] += np.random.default_rng(2).normal(0.0, 0.5, (len(unused), table.shape[1]))
    embedding.embeddings.assign(table)
    after = model(x)

    np.testing.assert_array_equal(np.asarray(after["nsp"]), np.asarray(before["nsp"]))
    used = np.setdiff1d(np.arange(VOCAB), unused)
    mlm_before, mlm_after = np.asarray(before["mlm"]), np.asarray(after["mlm"])
    np.testing.assert_allclose(mlm_after[..., used], mlm_before[..., used], rtol=0, atol=1e-6)
    assert np.abs(mlm_after[..., unused] - mlm_before[..., unused]).min() > 1e-4


def test_keras_save_load_identical(pretrainer, tmp_path):
    x, _, _ = make_batch(seed=3)
    path = tmp_path / "pretrainer.keras"
    pretrainer.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, BertPretrainer)
    assert isinstance(loaded.backbone, BertEncoder)
    assert loaded.mlm_head.token_embedding is loaded.backbone.token_embedding
    assert loaded.backbone.get_config() == pretrainer.backbone.get_config()
    assert_outputs_close(loaded(x), pretrainer(x), atol=0)


def test_saved_model_export(pretrainer, tmp_path):
    x, _, _ = make_batch(seed=4)
    path = str(tmp_path / "saved_model")
    pretrainer.export(path, format="tf_saved_model", verbose=False)
    restored = tf.saved_model.load(path)
    serve = restored.signatures["serving_default"]
    outputs = serve(**{k: tf.constant(v) for k, v in x.items()})
    assert_outputs_close({k: outputs[k] for k in ("mlm", "nsp")}, pretrainer(x), atol=1e-5)


def test_mlm_loss_is_weighted_mean():
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(2, 3, 7)).astype("float32")
    labels = rng.integers(0, 7, (2, 3))
    weights = np.array([[1, 1, 0], [1, 0, 0]], "float32")
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    per_token = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    expected = (per_token * weights).sum() / weights.sum()
    got = float(mlm_loss()(labels, logits, sample_weight=weights))
    assert got == pytest.approx(expected, rel=1e-5)
    # Labels in padded slots (weight 0) do not matter.
    labels[0, 2] = (labels[0, 2] + 1) % 7
    assert float(mlm_loss()(labels, logits, sample_weight=weights)) == pytest.approx(got, rel=1e-6)
    assert float(nsp_loss()(np.array([[1]]), np.array([[0.0, 0.0]]), np.ones((1, 1)))) == pytest.approx(
        np.log(2), rel=1e-5
    )


def test_fit_decreases_loss_and_resumes_from_keras_file(tmp_path):
    """The batch structure the tf.data reader yields: (x, y, sample_weight) dicts, int64 ids."""
    keras.utils.set_random_seed(6)
    model = build_pretrainer(VOCAB, "tiny", num_layers=1, dropout=0.0, **SMALL)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss={"mlm": mlm_loss(), "nsp": nsp_loss()},
        weighted_metrics={"mlm": ["sparse_categorical_accuracy"], "nsp": ["sparse_categorical_accuracy"]},
    )
    x, y, sample_weight = make_batch(batch=8, dtype="int64")
    dataset = tf.data.Dataset.from_tensors((x, y, sample_weight)).repeat(6)
    history = model.fit(dataset, epochs=3, verbose=0).history
    assert history["loss"][-1] < history["loss"][0]
    assert history["mlm_loss"][-1] < history["mlm_loss"][0]
    assert {"mlm_sparse_categorical_accuracy", "nsp_sparse_categorical_accuracy"} <= set(history)

    # The optimizer state travels in the .keras file, so training resumes.
    path = tmp_path / "trained.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations) == 18
    for saved, restored in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(restored), np.asarray(saved))
    assert loaded.loss["mlm"].reduction == "mean_with_sample_weight"


def test_mixed_precision():
    model = build_pretrainer(VOCAB, "tiny", num_layers=1, dtype="mixed_bfloat16", **SMALL)
    model.compile(run_eagerly=True)  # the dtype logic is the same traced; tracing costs ~10 s
    assert model.backbone.dtype_policy.compute_dtype == "bfloat16"
    assert all(w.dtype == "float32" for w in model.weights)
    x, y, sample_weight = make_batch()
    outputs = model(x)
    assert outputs["mlm"].dtype == "float32" and outputs["nsp"].dtype == "float32"
    logs = model.train_on_batch(x, y, sample_weight=sample_weight, return_dict=True)
    assert np.isfinite(logs["loss"])
    logs = model.test_on_batch(x, y, sample_weight=sample_weight, return_dict=True)
    assert np.isfinite(logs["loss"])


MIRRORED_SCRIPT = textwrap.dedent(
    """
    import json
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
    import keras
    from models import build_pretrainer
    from tests.test_models import make_batch

    keras.utils.set_random_seed(7)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = build_pretrainer(200, "tiny", num_layers=1, dropout=0.0, max_sequence_length=32)
        model.compile(optimizer=keras.optimizers.Adam(1e-3))
    x, y, sample_weight = make_batch(batch=8, dtype="int64")
    dataset = tf.data.Dataset.from_tensors((x, y, sample_weight)).repeat(4)
    history = model.fit(dataset, epochs=3, verbose=0).history
    print(json.dumps({"replicas": strategy.num_replicas_in_sync, "loss": history["loss"]}))
    """
)


def test_fit_under_mirrored_strategy_with_two_cpu_devices():
    # Logical devices must be configured before TensorFlow initialises: own process.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-c", MIRRORED_SCRIPT],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["replicas"] == 2
    assert report["loss"][-1] < report["loss"][0]
