"""ALBERT options of BertEncoder: factorized embeddings (`embedding_dim`), cross-layer sharing
(`share_layers`), their config keys, converters, FLOPs, and an ALBERT-style pipeline run
(corpus → vocab → data with SOP → pretrain) with configs/albert_tiny.yaml."""

from __future__ import annotations

import json

import keras
import mlflow
import numpy as np
import pytest

from models import BertEncoder, BertPretrainer, convert
from models.flops import forward_flops_per_sequence
from models.heads import BertClassifier, freeze_backbone
from pipeline import artifacts, cli
from pipeline import config as config_lib

# vocab, layers, hidden, FF, embedding, positions, segments
V, L, H, I, E, P, S = 100, 3, 32, 64, 8, 16, 2


def albert(embedding_dim=E, share_layers=True, num_layers=L, dropout=0.0):
    return BertEncoder(vocabulary_size=V, num_layers=num_layers, num_heads=2, hidden_dim=H,
                       intermediate_dim=I, max_sequence_length=P, num_segments=S,
                       embedding_dim=embedding_dim, share_layers=share_layers, dropout=dropout)


def batch(seed=0, n=2, seq=8):
    rng = np.random.default_rng(seed)
    return {"token_ids": rng.integers(1, V, (n, seq)).astype("int32"),
            "segment_ids": np.repeat([[0] * (seq // 2) + [1] * (seq // 2)], n, 0).astype("int32"),
            "padding_mask": np.ones((n, seq), "int32"),
            "mask_positions": np.array([[1, 3]] * n, "int32")}


def encoder_part(x):
    return {k: x[k] for k in ("token_ids", "segment_ids", "padding_mask")}


# --- counts by hand ----------------------------------------------------------------------------
def layer_params(h, i):
    return 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * (2 * h)


def test_factorized_and_shared_parameter_counts():
    embeddings = (V + P + S) * E + 2 * E  # tables of width E + their LayerNorm
    projection = E * H + H
    pooler = H * H + H
    assert albert().count_params() == embeddings + projection + layer_params(H, I) + pooler
    # Unshared: L layers; unfactorized: tables of width H and no projection.
    assert albert(share_layers=False).count_params() == (
        embeddings + projection + L * layer_params(H, I) + pooler)
    assert albert(embedding_dim=None, share_layers=False).count_params() == (
        (V + P + S) * H + 2 * H + L * layer_params(H, I) + pooler)
    # MLM head: transform H -> E (+ LayerNorm of E), output bias V; decoder tied (E x V).
    model = BertPretrainer(albert(), compile=False)
    mlm = H * E + E + 2 * E + V
    nsp = H * 2 + 2
    assert model.count_params() == albert().count_params() + mlm + nsp
    assert tuple(model.mlm_head._intermediate_dense.kernel.shape) == (H, E)
    assert model.mlm_head.token_embedding is model.backbone.token_embedding
    assert not [w for w in model.weights if tuple(w.shape) in ((E, V), (H, V))]


def test_default_is_bert_and_embedding_dim_equal_to_hidden_adds_nothing():
    bert = albert(embedding_dim=None, share_layers=False)
    same = albert(embedding_dim=H, share_layers=False)
    names = [layer.name for layer in bert.layers]
    assert names == [layer.name for layer in same.layers]
    assert "embedding_projection" not in names
    assert [f"transformer_layer_{i}" for i in range(L)] == [l.name for l in bert.transformer_layers]
    assert bert.get_config()["embedding_dim"] is None and bert.get_config()["share_layers"] is False


def test_shared_layer_is_one_object_applied_every_time():
    encoder = albert()
    assert len(encoder.transformer_layers) == L
    assert all(layer is encoder.transformer_layers[0] for layer in encoder.transformer_layers)
    assert sum(1 for w in encoder.weights if "transformer_layer" in w.path) == 16  # one layer's
    # Applied L times: 1 layer applied 3 times differs from the same layer applied once.
    one = albert(num_layers=1)
    one.set_weights(encoder.get_weights())
    x = encoder_part(batch())
    diff = np.abs(np.asarray(encoder(x)["sequence_output"]) - np.asarray(one(x)["sequence_output"]))
    assert diff.max() > 1e-3


def test_config_round_trip_and_keras_file_identical(tmp_path):
    keras.utils.set_random_seed(3)
    model = BertPretrainer(albert(), compile=False)
    config = model.backbone.get_config()
    assert config["embedding_dim"] == E and config["share_layers"] is True
    clone = BertEncoder.from_config(config)
    assert clone.get_config() == config and clone.count_params() == model.backbone.count_params()
    path = tmp_path / "albert.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, compile=False)
    assert loaded.backbone.embedding_dim == E and loaded.backbone.share_layers is True
    assert loaded.backbone.transformer_layers[0] is loaded.backbone.transformer_layers[-1]
    assert loaded.mlm_head.token_embedding is loaded.backbone.token_embedding
    x = batch(seed=4)
    for key in ("mlm", "nsp"):
        np.testing.assert_array_equal(np.asarray(loaded(x)[key]), np.asarray(model(x)[key]))


def test_training_updates_the_shared_layer_once_per_step():
    keras.utils.set_random_seed(5)
    model = BertPretrainer(albert(), compile=False)
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    x = batch(seed=5, n=4)
    y = {"mlm": np.array([[5, 6]] * 4), "nsp": np.array([[0], [1], [0], [1]])}
    w = {"mlm": np.ones((4, 2), "float32"), "nsp": np.ones((4, 1), "float32")}
    shared = model.backbone.transformer_layers[0]
    before = np.asarray(shared._feedforward_output_dense.kernel).copy()
    projection = np.asarray(model.backbone.embeddings_projection.kernel).copy()
    model.train_on_batch(x, y, sample_weight=w)
    assert np.abs(np.asarray(shared._feedforward_output_dense.kernel) - before).max() > 0
    assert np.abs(np.asarray(model.backbone.embeddings_projection.kernel) - projection).max() > 0


def test_bad_embedding_dim_raises():
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ValueError, match="embedding_dim"):
            albert(embedding_dim=bad)


def test_attention_inspection_uses_the_projection():
    from pipeline.inspection import probes

    keras.utils.set_random_seed(6)
    encoder = albert()
    x = encoder_part(batch(seed=6))
    hidden, attention = probes.encoder_trace(encoder, x)
    assert hidden[0].shape[-1] == H and len(hidden) == L + 1 and attention.shape[1] == L
    np.testing.assert_allclose(hidden[-1], np.asarray(encoder(x)["sequence_output"]), atol=1e-5)


def test_freeze_all_but_last_n_refuses_shared_layers():
    classifier = BertClassifier(albert(), num_classes=2)
    with pytest.raises(ValueError, match="share_layers"):
        freeze_backbone(classifier.backbone, "all_but_last_n", 1)
    freeze_backbone(classifier.backbone, "encoder")
    assert not classifier.backbone.trainable


# --- converters, FLOPs, config -----------------------------------------------------------------
def test_converters_refuse_or_report_albert(tmp_path):
    model = BertPretrainer(albert(), compile=False)
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(99)]
    vocab[1:6] = ["[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]
    with pytest.raises(convert.ConversionError,
                       match="ALBERT options.*embedding_dim=8.*share_layers"):
        convert.export_huggingface(model, vocab, tmp_path / "hf")
    assert not (tmp_path / "hf" / "model.safetensors").exists()
    bert = BertPretrainer(albert(embedding_dim=None, share_layers=False), compile=False)
    mismatches = {k: (a, b) for k, a, b in convert.architecture_mismatches(
        convert.architecture_of(model), convert.architecture_of(bert))}
    assert mismatches == {"embedding_dim": (E, H), "share_layers": (True, False)}
    # A Hugging Face / Google architecture dict has neither key: it is plain BERT.
    hf_style = {k: v for k, v in convert.architecture_of(bert).items()
                if k not in ("embedding_dim", "share_layers")}
    assert convert.architecture_mismatches(convert.architecture_of(bert), hf_style) == []


def test_flops_count_the_projection_and_the_smaller_decoder():
    sizes = dict(num_layers=L, hidden_dim=H, intermediate_dim=I, vocabulary_size=V, seq_length=8,
                 num_predictions=2)
    bert = forward_flops_per_sequence(**sizes)
    factorized = forward_flops_per_sequence(**sizes, embedding_dim=E)
    # + 2·S·E·H for the projection; MLM 2·P·(H·E + E·V) instead of 2·P·(H·H + H·V).
    assert factorized - bert == 2 * 8 * E * H + 2 * 2 * (H * E + E * V) - 2 * 2 * (H * H + H * V)
    assert forward_flops_per_sequence(**sizes, embedding_dim=H) == bert


@pytest.mark.parametrize("value, message", [
    ("0", "out of range"), ("129", "out of range"), ("abc", "null or an integer"),
    ("1.5", "null or an integer")])
def test_config_rejects_bad_embedding_size(value, message):
    with pytest.raises(config_lib.ConfigError, match=f"model.embedding_size.*{message}"):
        config_lib.load(None, [f"model.embedding_size={value}"])


def test_config_accepts_albert_keys():
    assert config_lib.load(None).model.embedding_size is None
    assert config_lib.load(None, ["model.embedding_size=null"]).model.embedding_size is None
    config = config_lib.load("configs/albert_tiny.yaml")
    assert (config.model.embedding_size, config.model.share_layers, config.data.objective) == (
        16, True, "sop")
    with pytest.raises(config_lib.ConfigError, match="model.embedding_size = 64.*1 to the hidden "
                                                     "size 32"):
        config_lib.load("configs/albert_tiny.yaml", ["model.embedding_size=64"])
    with pytest.raises(config_lib.ConfigError, match="model.share_layers"):
        config_lib.load(None, ["model.share_layers=3"])


# --- the pipeline, end to end ------------------------------------------------------------------
@pytest.mark.slow
def test_albert_pipeline_end_to_end(tmp_path, corpus_dir, capsys):
    """corpus → vocab → data (SOP) → pretrain with configs/albert_tiny.yaml, tracked in MLflow."""
    args = [f"run_dir={tmp_path / 'run'}", f"corpus.path={corpus_dir}/*.txt",
            f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            "tracking.experiment=albert"]
    assert cli.main(["all", "--config", "configs/albert_tiny.yaml", *args]) == 0
    capsys.readouterr()
    paths = artifacts.Artifacts(tmp_path / "run")
    stats = json.loads(paths.data_stats.read_text())
    assert stats["train"]["objective"] == "sop"
    assert stats["train"]["sop_swapped"] > 0 and stats["train"]["sop_in_order"] > 0
    evaluation = json.loads(paths.pretrain_eval.read_text())
    assert evaluation["step"] == 6 and np.isfinite(evaluation["eval_mlm_loss"])

    model = keras.saving.load_model(str(paths.model_keras), compile=False)
    backbone = model.backbone
    assert (backbone.embedding_dim, backbone.share_layers, backbone.num_layers) == (16, True, 3)
    assert backbone.token_embedding.output_dim == 16
    vocab = len(paths.vocab_file.read_text(encoding="utf-8").splitlines())
    e, h, i = 16, 32, 64
    expected = ((vocab + 64 + 2) * e + 2 * e + e * h + h + layer_params(h, i) + h * h + h
                + h * e + e + 2 * e + vocab + h * 2 + 2)
    assert model.count_params() == expected

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("albert")
    run = next(r for r in client.search_runs([experiment.experiment_id])
               if r.data.tags.get("pipeline.stage") == "pretrain")
    assert run.data.metrics["params_total"] == expected
    assert run.data.params["model.embedding_size"] == "16"
    logged = {a.path for a in client.list_artifacts(run.info.run_id, "params")}
    assert logged == {"params/params.json", "params/params.txt"}
    local = client.download_artifacts(run.info.run_id, "params/params.json", str(tmp_path))
    breakdown = json.loads(open(local, encoding="utf-8").read())
    assert breakdown["total"] == expected
    assert [layer["applied_at"] for layer in breakdown["layers"]] == [[0, 1, 2]]
