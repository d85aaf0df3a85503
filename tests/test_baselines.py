"""The classical baselines (pipeline/finetuning/baselines.py) on tiny data: each task's runs,
their settings are chosen on the validation split and never on test, a split too small to
choose on falls back to defaults with a warning, the cap on training examples, sparse
features, and the margin against the strongest baseline."""

from __future__ import annotations

import dataclasses
import logging
import random
from types import SimpleNamespace

import pytest
from scipy import sparse

from pipeline.config.sections import FinetuneConfig
from pipeline.finetuning import baselines, tasks
from pipeline.finetuning.readers import QAExample, TextExample, TokenExample

TOPICS = {"a": "alpha beta gamma delta".split(), "b": "omega sigma tau rho".split()}
NOISE = "the of and to in is was for on it he she".split()


def noisy_topic_splits(seed: int, sizes=(120, 40, 40)):
    """Two topics told apart by a few words among many common ones, a quarter of the labels
    flipped: the C that validation picks is not always the one test would."""
    rng = random.Random(seed)

    def example():
        label = rng.choice("ab")
        words = [rng.choice(TOPICS[label]) if rng.random() < 0.15 else rng.choice(NOISE)
                 for _ in range(6)]
        if rng.random() < 0.25:
            label = "b" if label == "a" else "a"
        return TextExample(" ".join(words), label=label)

    return [[example() for _ in range(n)] for n in sizes]


def task_data(train, validation, test, metric, labels=None, pair=False):
    return SimpleNamespace(train=train, validation=validation, tests={"test": test}, test=test,
                           labels=labels, pair=pair, metric=metric)


def classify(data, **fc):
    return tasks.get("classification", dataclasses.replace(FinetuneConfig(), **fc)).baselines(
        data, 0)


FAMILIES = ("tfidf_lr", "tfidf_svm", "tfidf_char_svm")


def test_classification_settings_are_chosen_on_validation_never_on_test():
    train, validation, test = noisy_topic_splits(1)
    chosen = classify(task_data(train, validation, test, "accuracy", ["a", "b"]))
    # The same run choosing on the test split instead picks other settings on this data...
    on_test = classify(task_data(train, test, test, "accuracy", ["a", "b"]))
    assert [chosen[f]["chosen"] for f in FAMILIES] != [on_test[f]["chosen"] for f in FAMILIES]
    # ...and the test labels do not move the choice: flipped, the same settings are chosen.
    flipped = [dataclasses.replace(e, label="b" if e.label == "a" else "a") for e in test]
    again = classify(task_data(train, validation, flipped, "accuracy", ["a", "b"]))
    for family in FAMILIES:
        assert again[family]["chosen"] == chosen[family]["chosen"]
        assert again[family]["validation"] == chosen[family]["validation"]
        assert again[family]["accuracy"] == pytest.approx(1 - chosen[family]["accuracy"])
    assert set(chosen) == {"majority", "bow_lr", *FAMILIES}
    assert chosen["bow_lr"]["chosen"] == "C=1, counts (fixed)"


def test_a_validation_split_too_small_to_choose_on_falls_back_to_defaults(caplog):
    train, validation, test = noisy_topic_splits(2)
    for small in (validation[:6], [e for e in validation if e.label == "a"]):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pipeline"):
            out = classify(task_data(train, small, test, "accuracy", ["a", "b"]))
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "the validation split has" in warnings[0]
        assert ("fewer than 10" in warnings[0]) == (len(small) == 6)
        assert out["tfidf_svm"]["chosen"] == "C=1 (default)" and "validation" not in out[
            "tfidf_svm"]
        assert out["tfidf_lr"]["chosen"] == "C=10 (default)"


def test_pairs_regression_and_the_training_cap(caplog):
    train, validation, test = noisy_topic_splits(3)
    as_pair = lambda split: [TextExample("what topic", e.text, e.label) for e in split]
    out = classify(task_data(as_pair(train), as_pair(validation), as_pair(test), "accuracy",
                             ["a", "b"], pair=True))
    assert out["tfidf_svm"]["accuracy"] > out["majority"]["accuracy"]
    features = baselines.TextFeatures("word", pair=True)
    x = features.fit_transform(as_pair(train))
    assert sparse.issparse(x) and x.shape[0] == len(train)

    def scored(split):  # the score counts the topic's words: a regression TF-IDF can learn
        return [TextExample(e.text, None, float(sum(w in TOPICS["a"] for w in e.text.split())))
                for e in split]

    fc = dataclasses.replace(FinetuneConfig(), task="regression", baseline_max_train=50)
    with caplog.at_level(logging.INFO, logger="pipeline"):
        out = tasks.get("regression", fc).baselines(
            task_data(scored(train), scored(validation), scored(test), "pearson"), 0)
    assert set(out) == {"mean", "bow_ridge", "tfidf_ridge"}
    assert out["tfidf_ridge"]["pearson"] > 0.8 and out["tfidf_ridge"]["chosen"].startswith(
        "alpha=")
    assert any("baselines train on 50 of the 120" in r.getMessage() for r in caplog.records)


def tagged(rng, n):
    """Sentences whose tags follow from the word's shape and its neighbour: a CRF learns them,
    the per-word most frequent tag cannot (a word's tag depends on the word before it)."""
    out = []
    for _ in range(n):
        words, tags = [], []
        for _ in range(rng.randint(4, 8)):
            word = rng.choice(["run", "walk", "Paris", "Rome", "12", "fast", "the"])
            tag = ("NUM" if word.isdigit() else "PROPN" if word.istitle() else
                   "DET" if word == "the" else
                   "NOUN" if words and words[-1] == "the" else "VERB")
            words.append(word)
            tags.append(tag)
        out.append(TokenExample(words, tags))
    return out


def test_token_classification_crf_beats_the_per_word_baseline():
    rng = random.Random(4)
    data = task_data(tagged(rng, 150), tagged(rng, 30), tagged(rng, 30), "f1",
                     ["DET", "NOUN", "NUM", "PROPN", "VERB"])
    fc = dataclasses.replace(FinetuneConfig(), task="token_classification",
                             baseline_crf_iterations=8)
    out = tasks.get("token_classification", fc).baselines(data, 0)
    assert set(out) == {"majority", "most_frequent_tag", "crf"}
    assert out["crf"]["f1"] > out["most_frequent_tag"]["f1"] + 0.05
    assert out["crf"]["chosen"].startswith("averaged perceptron, ")
    assert "validation" in out["crf"]
    lbfgs = dataclasses.replace(fc, baseline_crf_algorithm="lbfgs", baseline_crf_iterations=50)
    out = tasks.get("token_classification", lbfgs).baselines(data, 0)
    assert out["crf"]["chosen"].startswith("L-BFGS, c1=0.1, c2=")
    assert out["crf"]["f1"] > out["most_frequent_tag"]["f1"] + 0.05


def test_semantic_search_bm25_beside_tfidf():
    rng = random.Random(5)
    topics = ["river boat fish water", "mountain snow climb peak", "market price trade coin",
              "garden flower seed soil", "engine wheel road speed", "violin concert music note"]

    def pairs(n):
        out = []
        for i in range(n):
            words = rng.choice(topics).split()
            out.append(TextExample(f"{rng.choice(words)} {i + 10}",  # bm25s: 2+ characters
                                   f"a passage about {' '.join(words)} number {i + 10}"))
        return out

    data = task_data(pairs(30), pairs(12), pairs(12), "mrr")
    fc = dataclasses.replace(FinetuneConfig(), task="semantic_search")
    out = tasks.get("semantic_search", fc).baselines(data, 0)
    assert set(out) == {"tfidf", "bm25"}
    assert out["bm25"]["mrr"] == pytest.approx(1.0)  # the number names its own passage
    assert out["bm25"]["chosen"].startswith("k1=")


CONTEXT = ("The old harbour of Valdra was built by fishermen in 1620 . Its lighthouse stands "
           "on the northern cliff and guides ships past the reef .")


def qa_examples(n, start=0, impossible=False):
    questions = [("Who built the old harbour of Valdra ?", "fishermen"),
                 ("What stands on the northern cliff ?", "lighthouse")]
    out = []
    for i in range(start, start + n):
        question, answer = questions[i % 2]
        if impossible:
            out.append(QAExample(f"x{i}", "What colour is the mayor's car ?", CONTEXT, [], True))
        else:
            out.append(QAExample(f"q{i}", question, CONTEXT,
                                 [(answer, CONTEXT.index(answer))]))
    return out


def test_question_answering_sliding_window_floor_v1_and_v2():
    data = task_data(qa_examples(10), qa_examples(12, 10), qa_examples(12, 30), "f1")
    v1 = dataclasses.replace(FinetuneConfig(), task="question_answering")
    out = tasks.get("question_answering", v1).baselines(data, 0)["sliding_window"]
    assert out["f1"] == pytest.approx(100.0) and out["chosen"].startswith("span<=")
    mixed = lambda start: qa_examples(6, start) + qa_examples(6, start, impossible=True)
    v2 = dataclasses.replace(v1, version_2=True)
    out = tasks.get("question_answering", v2).baselines(
        task_data(mixed(0), mixed(20), mixed(40), "f1"), 0)["sliding_window"]
    assert "no answer under" in out["chosen"] and out["NoAns_f1"] > 0 and out["HasAns_f1"] > 0


def test_the_margin_is_against_the_strongest_baseline_and_loud_when_the_model_loses():
    rows = {"majority": {"macro_f1": 0.2}, "tfidf_svm": {"macro_f1": 0.616, "chosen": "C=1"},
            "bow_lr": {"macro_f1": 0.587}, "random_init": {"macro_f1": 0.4}}
    line, margin, name = baselines.margin_line(0.680, rows, "macro_f1", 100.0)
    assert line == "model 0.680 vs best baseline tfidf_svm 0.616 (+6.4)"
    assert name == "tfidf_svm" and margin == pytest.approx(6.4)
    line, margin, _ = baselines.margin_line(0.569, rows, "macro_f1", 100.0)
    assert "LOSES" in line and margin == pytest.approx(-4.7)
    # QA: EM / F1 are in percent already
    line, margin, _ = baselines.margin_line(55.0, {"sliding_window": {"f1": 20.5}}, "f1", 1.0)
    assert margin == pytest.approx(34.5) and "(+34.5)" in line
    assert baselines.margin_line(0.5, {}, "f1", 100.0) == (None, None, None)
