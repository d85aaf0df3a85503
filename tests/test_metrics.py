"""pipeline/finetuning/metrics.py against values computed by hand (and scikit-learn / scipy)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.finetuning import metrics


def test_accuracy_confusion_and_macro_f1_by_hand():
    y_true, y_pred = [0, 1, 1, 2], [0, 1, 2, 2]
    assert metrics.accuracy(y_true, y_pred) == 0.75
    assert metrics.confusion_matrix(y_true, y_pred).tolist() == [[1, 0, 0], [0, 1, 1], [0, 0, 1]]
    # class 0: F1 1; class 1: tp 1, fn 1 -> 2/3; class 2: tp 1, fp 1 -> 2/3
    np.testing.assert_allclose(metrics.f1_per_class(y_true, y_pred), [1, 2 / 3, 2 / 3])
    assert metrics.macro_f1(y_true, y_pred) == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
    # A class absent from both gold and predictions does not count (scikit-learn's default).
    assert metrics.macro_f1([0, 5, 5, 9], [0, 5, 9, 9]) == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
    # Binary F1 of the positive class: tp 1, fp 1, fn 1 -> 2 / (2 + 1 + 1)
    assert metrics.binary_f1([1, 1, 0, 0], [1, 0, 1, 0]) == pytest.approx(0.5)
    assert metrics.binary_f1([0, 0], [0, 0]) == 0.0


def test_matthews_corrcoef_by_hand():
    # Binary: TP 1, FN 1, TN 2, FP 0 -> (1·2 − 0·1) / sqrt(1·2·2·3)
    assert metrics.matthews_corrcoef([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(2 / math.sqrt(12))
    # Multi-class (Gorodkin): c = 2, s = 4, t = [2, 1, 1], p = [1, 1, 2]
    # (c·s − t·p) / sqrt((s² − p·p)(s² − t·t)) = (8 − 5) / sqrt(10 · 10) = 0.3
    assert metrics.matthews_corrcoef([0, 1, 2, 0], [0, 2, 2, 1]) == pytest.approx(0.3)
    assert metrics.matthews_corrcoef([1, 1, 1], [1, 1, 1]) == 0.0  # undefined -> 0
    assert metrics.matthews_corrcoef([0, 1], [0, 1]) == pytest.approx(1.0)


def test_classification_metrics_agree_with_scikit_learn():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    y_true, y_pred = rng.integers(0, 5, 200), rng.integers(0, 5, 200)
    y_pred[:80] = y_true[:80]
    assert metrics.macro_f1(y_true, y_pred) == pytest.approx(
        sklearn_metrics.f1_score(y_true, y_pred, average="macro"))
    assert metrics.matthews_corrcoef(y_true, y_pred) == pytest.approx(
        sklearn_metrics.matthews_corrcoef(y_true, y_pred))
    np.testing.assert_array_equal(metrics.confusion_matrix(y_true, y_pred, 5),
                                  sklearn_metrics.confusion_matrix(y_true, y_pred))


def test_pearson_and_spearman_by_hand():
    # dx = [-1, 0, 1], dy = [-7/3, -1/3, 8/3]: Σdxdy = 5, Σdx² = 2, Σdy² = 114/9
    assert metrics.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(2 * 114 / 9))
    # Ties share the mean rank: x ranks [1, 2.5, 2.5, 4], y ranks [1, 3, 2, 4] -> 4.5 / sqrt(4.5·5)
    assert metrics.average_ranks([1, 2, 2, 3]).tolist() == [1.0, 2.5, 2.5, 4.0]
    assert metrics.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert metrics.spearman([1, 2, 3, 4], [10, 20, 30, 1000]) == pytest.approx(1.0)
    assert metrics.pearson([1, 1, 1], [1, 2, 3]) == 0.0
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 6, 50), rng.normal(size=50)
    assert metrics.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)


def test_conll_entity_f1_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    # gold chunks PER(0-1), LOC(3), ORG(0); predicted PER(0-1), ORG(3), ORG(0): 2 of 3 correct
    r = metrics.conll_f1(gold, pred)
    assert (r["precision"], r["recall"]) == (pytest.approx(2 / 3), pytest.approx(2 / 3))
    assert r["f1"] == pytest.approx(2 / 3)
    assert r["token_accuracy"] == pytest.approx(5 / 6)
    # A boundary error makes the chunk wrong: B-PER B-PER is two chunks, not PER(0-1).
    r = metrics.conll_f1([["B-PER", "I-PER"]], [["B-PER", "B-PER"]])
    assert (r["precision"], r["recall"], r["f1"]) == (0.0, 0.0, 0.0)
    # IOB1: I- starts a chunk, B- only separates two adjacent chunks of one type.
    assert metrics.conll_chunks(["I-PER", "I-PER", "B-PER", "O", "I-LOC"]) == {
        ("PER", 0, 1), ("PER", 2, 2), ("LOC", 4, 4)}
    # IOBES
    assert metrics.conll_chunks(["S-PER", "B-LOC", "E-LOC", "O"]) == {("PER", 0, 0), ("LOC", 1, 2)}
    # Predicting nothing: precision 0 (no chunks found), recall 0.
    assert metrics.conll_f1([["B-PER"]], [["O"]])["f1"] == 0.0
    assert metrics.is_chunk_tagset(["O", "B-PER", "I-PER"])
    assert not metrics.is_chunk_tagset(["nn", "vb"])


def test_squad_normalisation_em_and_f1_by_hand():
    assert metrics.normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert metrics.normalize_answer("an apple, a pear") == "apple pear"
    assert metrics.squad_exact_match("Denver Broncos.", "the denver broncos") == 1.0
    # prediction [denver, broncos, won] vs gold [denver, broncos]: P 2/3, R 1 -> F1 0.8
    assert metrics.squad_f1("the Denver Broncos won", "Denver Broncos") == pytest.approx(0.8)
    assert metrics.squad_f1("Carolina", "Denver Broncos") == 0.0
    # v1: best over the gold answers; v2: an empty gold is matched only by "".
    gold = {"q1": ["Denver Broncos", "Broncos"], "q2": ["Santa Clara"], "q3": []}
    predictions = {"q1": "the Broncos", "q2": "Clara", "q3": ""}
    r = metrics.squad_evaluate(gold, predictions)
    # EM: q1 1, q2 0, q3 1; F1: q1 1, q2 P 1 R 1/2 -> 2/3, q3 1
    assert r["exact_match"] == pytest.approx(100 * 2 / 3)
    assert r["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1) / 3)
    assert r["HasAns_exact_match"] == pytest.approx(50.0)
    assert r["NoAns_exact_match"] == pytest.approx(100.0)
    assert metrics.squad_evaluate({"q": ["x"]}, {})["f1"] == 0.0  # unanswered counts as wrong


def test_retrieval_metrics_by_hand():
    ranked = [["a", "b", "c"], ["x", "y", "z"], ["p", "q", "r"]]
    relevant = [{"b"}, {"z", "q"}, {"p"}]
    # recall@2: 1, 0, 1 -> 2/3 ; recall@3: 1, 1/2, 1
    assert metrics.recall_at_k(ranked, relevant, 2) == pytest.approx(2 / 3)
    assert metrics.recall_at_k(ranked, relevant, 3) == pytest.approx(2.5 / 3)
    # MRR: 1/2, 1/3, 1
    assert metrics.mean_reciprocal_rank(ranked, relevant) == pytest.approx((1 / 2 + 1 / 3 + 1) / 3)


def test_metrics_reject_bad_input():
    with pytest.raises(ValueError, match="shape"):
        metrics.accuracy([0, 1], [0])
    with pytest.raises(ValueError, match="no examples"):
        metrics.accuracy([], [])
    with pytest.raises(ValueError, match="gold tags"):
        metrics.conll_f1([["O", "O"]], [["O"]])
