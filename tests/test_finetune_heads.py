"""models/heads.py: every task model builds, has its stable dict outputs, survives .keras
save/load and from_config(get_config()); pooling and the in-batch-negatives loss by hand."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

from models import heads
from models.bert import BertEncoder

VOCAB, SEQ = 50, 8


def tiny_encoder():
    return BertEncoder(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=16,
                       intermediate_dim=32, max_sequence_length=SEQ, dropout=0.0)


def inputs(prefix=""):
    rng = np.random.default_rng(0)
    mask = np.array([[1] * 8, [1] * 5 + [0] * 3, [1] * 2 + [0] * 6], "int32")
    return {prefix + "token_ids": rng.integers(1, VOCAB, (3, SEQ)).astype("int32") * mask,
            prefix + "segment_ids": np.zeros((3, SEQ), "int32"),
            prefix + "padding_mask": mask}


CASES = [
    (heads.BertClassifier, dict(num_classes=3), {"logits": (3, 3)}),
    (heads.BertRegressor, {}, {"score": (3,)}),
    (heads.BertTokenClassifier, dict(num_classes=4), {"logits": (3, SEQ, 4)}),
    (heads.BertSpanExtractor, {}, {"start_logits": (3, SEQ), "end_logits": (3, SEQ)}),
    (heads.BertSentenceEncoder, {}, {"embedding": (3, 16)}),
]


@pytest.mark.parametrize("cls,kwargs,shapes", CASES, ids=[c[0].__name__ for c in CASES])
def test_task_model_outputs_save_load_and_config(tmp_path, cls, kwargs, shapes):
    model = cls(tiny_encoder(), **kwargs)
    x = inputs()
    out = model(x)
    assert {k: tuple(v.shape) for k, v in out.items()} == shapes
    model.save(tmp_path / "m.keras")
    reloaded = keras.models.load_model(tmp_path / "m.keras")
    assert type(reloaded) is cls and isinstance(reloaded.backbone, BertEncoder)
    for key in out:
        np.testing.assert_allclose(np.asarray(reloaded(x)[key]), np.asarray(out[key]), atol=1e-6)
    clone = cls.from_config(model.get_config())
    assert clone.count_params() == model.count_params()
    assert {k: v for k, v in clone.get_config().items() if k != "backbone"} == \
        {k: v for k, v in model.get_config().items() if k != "backbone"}


def test_span_logits_mask_padding_and_embeddings_are_unit_length():
    x = inputs()
    span = heads.BertSpanExtractor(tiny_encoder())(x)
    assert np.all(np.asarray(span["start_logits"])[1, 5:] < -1000)
    embedding = np.asarray(heads.BertSentenceEncoder(tiny_encoder())(x)["embedding"])
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=-1), 1.0, atol=1e-5)


def test_mean_pooling_and_in_batch_negatives_by_hand():
    sequence = np.array([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]], "float32")
    pooled = heads.MeanPooling()(sequence, np.array([[1, 1, 0]]))
    np.testing.assert_allclose(np.asarray(pooled), [[2.0, 3.0]])
    # rows: logsumexp(2, 0) − 2 = log(1 + e⁻²); logsumexp(1, 3) − 3 = log(1 + e⁻²)
    s = np.array([[2.0, 0.0], [1.0, 3.0]], "float32")
    loss = heads.InBatchNegativesLoss()(np.zeros(2), s)
    assert float(loss) == pytest.approx(math.log(1 + math.exp(-2)), rel=1e-5)
    similarity = heads.CosineSimilarityMatrix(scale=10.0)(np.array([[1.0, 0.0], [0.0, 2.0]]),
                                                          np.array([[3.0, 0.0], [1.0, 1.0]]))
    np.testing.assert_allclose(np.asarray(similarity),
                               [[10.0, 10 / math.sqrt(2)], [0.0, 10 / math.sqrt(2)]], atol=1e-5)


def test_bi_encoder_trainer_shares_the_encoder_and_reloads(tmp_path):
    encoder = heads.BertSentenceEncoder(tiny_encoder())
    trainer = heads.BertBiEncoderTrainer(encoder, scale=20.0)
    x = {**inputs("a_"), **inputs("b_")}
    similarity = np.asarray(trainer(x)["similarity"])
    assert similarity.shape == (3, 3)
    np.testing.assert_allclose(np.diag(similarity), 20.0, atol=1e-3)  # same text both sides
    assert trainer.count_params() == encoder.count_params()  # one encoder, used twice
    trainer.save(tmp_path / "t.keras")
    reloaded = keras.models.load_model(tmp_path / "t.keras")
    np.testing.assert_allclose(np.asarray(reloaded(x)["similarity"]), similarity, atol=1e-5)


def test_freeze_backbone_strategies():
    def trainable(strategy, n=1):
        backbone = tiny_encoder()
        heads.freeze_backbone(backbone, strategy, n)
        return {w.path.split("/")[0] for w in backbone.trainable_weights}

    assert "token_embedding" in trainable("none")
    assert trainable("encoder") == set()
    assert trainable("all_but_last_n", 1) == {"transformer_layer_1", "pooled_dense"}
    assert trainable("all_but_last_n", 2) == {"transformer_layer_0", "transformer_layer_1",
                                              "pooled_dense"}
    with pytest.raises(ValueError, match="unknown freeze strategy"):
        heads.freeze_backbone(tiny_encoder(), "half")
    with pytest.raises(ValueError, match="num_classes must be >= 2"):
        heads.BertClassifier(tiny_encoder(), 1)
