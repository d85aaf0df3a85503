"""models/params.py: parameter breakdown per component / per layer, checked against counts
worked out by hand from the BERT formulas; ALBERT sharing and factorized embeddings; fine-tuning
heads; the `python -m pipeline params` tool."""

from __future__ import annotations

import json

import keras
import pytest

import models.bert
import models.pretraining
from models import BertEncoder, BertPretrainer, presets
from models.heads import (
    BertBiEncoderTrainer,
    BertClassifier,
    BertRegressor,
    BertSentenceEncoder,
    BertSpanExtractor,
)
from models.params import ParamsError, main, parameter_breakdown
from pipeline import cli


def tiny_pretrainer(vocab=8000, **overrides):
    return BertPretrainer(BertEncoder.from_preset_name("tiny", vocab, **overrides), compile=False)


def components(breakdown):
    return {c.name: c.count for c in breakdown.components}


def test_tiny_pretrainer_by_hand():
    V, H, I, L, P, S = 8000, 128, 512, 2, 512, 2
    b = parameter_breakdown(tiny_pretrainer(V))
    c = components(b)
    assert c["token embeddings"].weights == V * H == 1_024_000
    assert c["position embeddings"].weights == P * H == 65_536
    assert c["segment embeddings"].weights == S * H == 256
    assert c["embedding LayerNorm"].layer_norm == 2 * H == 256
    assert "embedding projection (E -> H)" not in c
    assert len(b.layers) == L and [layer.applied_at for layer in b.layers] == [[0], [1]]
    for layer in b.layers:
        parts = layer.parts
        for name in ("query", "key", "value", "attention_output"):
            assert (parts[name].weights, parts[name].biases) == (H * H, H)  # 16,384 + 128
        assert parts["attention_layer_norm"].layer_norm == 2 * H
        assert (parts["ff_intermediate"].weights, parts["ff_intermediate"].biases) == (H * I, I)
        assert (parts["ff_output"].weights, parts["ff_output"].biases) == (I * H, H)
        assert parts["ff_layer_norm"].layer_norm == 2 * H
        assert layer.count.total == 4 * (H * H + H) + 2 * H * I + I + H + 4 * H == 198_272
    assert c["pooler"].total == H * H + H == 16_512
    assert c["MLM transform dense"].total == H * H + H
    assert c["MLM transform LayerNorm"].layer_norm == 2 * H
    assert c["MLM output bias (decoder tied to token embeddings)"].biases == V
    assert c["NSP / SOP head"].total == H * 2 + 2
    expected = ((V + P + S) * H + 2 * H + L * 198_272 + (H * H + H)
                + (H * H + H + 2 * H + V) + (2 * H + 2))
    assert b.total == expected == b.model.count_params() == 1_528_130
    assert b.trainable == b.total
    summary = b.summary()
    assert summary["embeddings"] == (V + P + S) * H + 2 * H
    assert summary["heads"] == H * H + H + 2 * H + V + 2 * H + 2
    assert summary["per_layer"] == 198_272


def test_base_by_hand_and_feed_forward_ratios(monkeypatch):
    # Zero initializers: the counts do not depend on them and building is much faster.
    monkeypatch.setattr(models.bert, "bert_kernel_initializer", lambda stddev=0.02: "zeros")
    monkeypatch.setattr(models.pretraining, "bert_kernel_initializer", lambda stddev=0.02: "zeros")
    V, H, I, L = presets.GOOGLE_VOCAB_SIZE, 768, 3072, 12
    model = BertPretrainer(BertEncoder.from_preset_name("base", V), compile=False)
    b = parameter_breakdown(model)
    embeddings = (V + 512 + 2) * H + 2 * H
    qkv = 3 * (H * H + H)
    layer = qkv + (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H
    pooler = H * H + H
    encoder = embeddings + L * layer + pooler
    assert encoder == 109_482_240  # BERT-Base, as keras-hub's bert_base_en_uncased
    assert b.summary()["transformer_layers"] == L * layer == 85_054_464
    assert b.summary()["embeddings"] == embeddings == 23_837_184
    assert b.total == encoder + (H * H + H + 2 * H + V) + (2 * H + 2) == model.count_params()
    r = b.ratios
    # Weights only: FF 2·H·I = 2·768·3072 vs QKV 3·H² and QKV + output 4·H².
    assert r["ff_over_qkv"] == pytest.approx(2 * 768 * 3072 / (3 * 768 * 768))
    assert r["ff_over_qkv"] == pytest.approx(8 / 3)
    assert r["ff_over_attention"] == pytest.approx(2.0)
    assert r["ff_over_qkv_with_biases"] == pytest.approx(
        (2 * H * I + I + H) / (3 * H * H + 3 * H))
    assert r["ff_over_attention_with_biases"] == pytest.approx(
        (2 * H * I + I + H) / (4 * H * H + 4 * H))
    table = b.format_table()
    assert "2.667 weights only" in table and "2.000 weights only" in table
    assert f"{b.total:,}" in table


def test_albert_shared_layer_counted_once_and_factorized_embeddings():
    V, H, I, E, L = 8000, 128, 512, 64, 2
    model = tiny_pretrainer(V, embedding_dim=E, share_layers=True)
    b = parameter_breakdown(model)
    c = components(b)
    assert c["token embeddings"].weights == V * E
    assert c["position embeddings"].weights == 512 * E
    assert c["segment embeddings"].weights == 2 * E
    assert c["embedding LayerNorm"].layer_norm == 2 * E
    assert (c["embedding projection (E -> H)"].weights,
            c["embedding projection (E -> H)"].biases) == (E * H, H)
    # One set of layer weights, applied at both positions.
    assert len(b.layers) == 1 and b.layers[0].applied_at == list(range(L))
    layer = 4 * (H * H + H) + 2 * H * I + I + H + 4 * H
    assert b.summary()["transformer_layers"] == layer
    # MLM transform outputs E (decoder tied to the E-wide token table).
    assert c["MLM transform dense"].total == H * E + E
    assert c["MLM transform LayerNorm"].layer_norm == 2 * E
    expected = ((V + 512 + 2) * E + 2 * E + E * H + H + layer + H * H + H
                + H * E + E + 2 * E + V + 2 * H + 2)
    assert b.total == expected == model.count_params()
    unshared = parameter_breakdown(tiny_pretrainer(V, embedding_dim=E))
    assert unshared.total - b.total == (L - 1) * layer
    assert b.to_dict()["architecture"]["share_layers"] is True


def test_fine_tuning_models_and_bare_encoder():
    V, H = 500, 128
    encoder_total = parameter_breakdown(BertEncoder.from_preset_name("tiny", V)).total
    assert encoder_total == BertEncoder.from_preset_name("tiny", V).count_params()
    cases = [
        (lambda e: BertClassifier(e, num_classes=3), {"task head logits": H * 3 + 3}),
        (lambda e: BertRegressor(e), {"task head score_dense": H + 1}),
        (lambda e: BertSpanExtractor(e), {"task head span_logits": H * 2 + 2}),
        (lambda e: BertBiEncoderTrainer(BertSentenceEncoder(e)), {}),
    ]
    for build, heads in cases:
        model = build(BertEncoder.from_preset_name("tiny", V))
        b = parameter_breakdown(model)
        got = {c.name: c.count.total for c in b.components if c.group == "heads"}
        assert got == heads, type(model).__name__
        assert b.total == encoder_total + sum(heads.values()) == model.count_params()
    frozen = BertClassifier(BertEncoder.from_preset_name("tiny", V), num_classes=2)
    frozen.backbone.trainable = False
    b = parameter_breakdown(frozen)
    assert b.trainable == H * 2 + 2 and b.summary()["non_trainable"] == encoder_total


def test_not_a_bert_model_raises():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ParamsError, match="no BERT encoder"):
        parameter_breakdown(model)


def test_cli_preset_json_and_table(capsys):
    V, H = 1000, 128
    assert cli.main(["params", "--preset", "tiny", "--vocab-size", str(V), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == "BertPretrainer"
    assert report["embeddings"] == (V + 512 + 2) * H + 2 * H
    assert report["ratios"]["ff_over_attention"] == pytest.approx(2.0)
    assert main(["params", "--preset", "tiny", "--vocab-size", str(V), "--embedding-size", "32",
                 "--share-layers"]) == 0
    table = capsys.readouterr().out
    assert "embedding projection (E -> H)" in table and "layers 0-1 (2x)" in table


def test_cli_model_file_and_bad_input(tmp_path, capsys):
    model = BertClassifier(BertEncoder.from_preset_name("tiny", 300, max_sequence_length=64),
                           num_classes=4)
    path = tmp_path / "classifier.keras"
    model.save(path)
    assert cli.main(["params", "--model", str(path)]) == 0
    out = capsys.readouterr().out
    assert "task head logits" in out and f"{model.count_params():,}" in out
    assert main(["params", "--model", str(tmp_path / "missing.keras")]) == 2
    assert "not a .keras file" in capsys.readouterr().err
    assert main(["params", "--preset", "tiny", "--embedding-size", "500"]) == 2
    assert "between 1 and the hidden size 128" in capsys.readouterr().err
    assert main(["params", "--model", str(path), "--share-layers"]) == 2
