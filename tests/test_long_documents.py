"""Long-document classification: the shared window function, the window features, each
aggregation on hand-made numbers, config validation, and a tiny model that can only learn its
fixture by looking beyond the first window (compared with the truncating model on the same
data)."""

from __future__ import annotations

import contextlib
import io
import math
import random

import keras
import numpy as np
import pytest

from models.bert import BertEncoder
from models.heads import BertClassifier
from models.window_heads import BertWindowClassifier, MaskedWindowPooling, WindowAttentionPooling
from pipeline import config as config_lib
from pipeline.finetuning import train as finetuning
from pipeline.serving import export
from pipeline.text import windows
from pipeline.tools import predictor

from tests.test_finetune_data import WORDS, write_vocab


# --- the window function -----------------------------------------------------------------------
@pytest.mark.parametrize("n,window,stride", [(1, 4, 2), (4, 4, 2), (5, 4, 2), (10, 4, 3),
                                             (37, 14, 7), (100, 8, 8), (9, 3, 5), (50, 10, 1)])
def test_spans_cover_every_token_overlap_by_window_minus_stride_and_count(n, window, stride):
    spans = windows.spans(n, window, stride)
    covered = set()
    for start, length in spans:
        assert 1 <= length <= window
        covered.update(range(start, start + length))
    assert covered == set(range(n))  # every piece, nothing beyond the end
    assert spans[-1][0] + spans[-1][1] == n
    step = min(stride, window)  # a stride longer than the window is clamped: nothing skipped
    for (s0, l0), (s1, _) in zip(spans, spans[1:]):
        assert s1 - s0 == step
        assert (s0 + l0) - s1 == window - step  # overlap
    assert len(spans) == 1 + math.ceil(max(n - window, 0) / step)


def test_spans_edge_cases_cap_and_errors():
    assert windows.spans(0, 4, 2) == [(0, 0)]  # an empty context still has one (empty) window
    assert windows.spans(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    assert windows.spans(10, 4, 3, max_windows=2) == [(0, 4), (3, 4)]
    with pytest.raises(ValueError, match="stride = 0"):
        windows.spans(10, 4, 0)
    with pytest.raises(ValueError, match="window = 0"):
        windows.spans(10, 0, 2)


def test_is_max_context_picks_the_window_with_most_context():
    spans = windows.spans(10, 4, 2)  # (0..3) (2..5) (4..7) (6..9)
    # piece 3: 0 pieces of context on one side in window 0, 1 in window 1 -> window 1
    assert windows.is_max_context(spans, 3, 1) and not windows.is_max_context(spans, 3, 0)
    assert windows.is_max_context(spans, 5, 2) and windows.is_max_context(spans, 9, 3)
    # a tie (piece 3 at the edge of both (0..3) and (3..6)) goes to the earlier window
    assert windows.is_max_context(windows.spans(10, 4, 3), 3, 0)


def test_document_windows_rows_masks_and_tail_coverage():
    ids = [list(range(10, 10 + 30)), [10, 11], list(range(10, 10 + 60))]
    f = windows.document_windows(ids, seq_length=12, stride=5, max_windows=4, cls_id=1, sep_id=2,
                                 pad_id=0)
    assert f["token_ids"].shape == (3, 4, 12) and f["window_mask"].shape == (3, 4)
    # 30 pieces, windows of 10 every 5: starts 0, 5, 10, 15, 20 -> 5 windows, capped at 4.
    assert f["n_windows"].tolist() == [4, 1, 4] and f["truncated_documents"] == 2
    assert f["window_mask"].tolist() == [[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert f["token_ids"][0, 1].tolist() == [1] + list(range(15, 25)) + [2]
    assert f["token_ids"][1, 0].tolist() == [1, 10, 11, 2] + [0] * 8
    assert f["token_ids"][1, 2].tolist() == [1, 2] + [0] * 10  # unused row: a valid [CLS] [SEP]
    assert (f["padding_mask"] == (f["token_ids"] != 0)).all() and not f["segment_ids"].any()
    # Uncapped, every piece of a long document is in some window.
    g = windows.document_windows(ids[:1], 12, 5, max_windows=16, cls_id=1, sep_id=2, pad_id=0)
    seen = set(g["token_ids"][0][g["window_mask"][0] == 1].ravel().tolist()) - {0, 1, 2}
    assert seen == set(ids[0]) and g["truncated_documents"] == 0


def test_graph_windows_equal_the_numpy_windows(tmp_path):
    """`tf_text_windows` (in the SavedModel) == `text_windows` (training), edge cases included."""
    import tensorflow as tf

    from models import preprocessor

    pre = preprocessor.TextPreprocessor(write_vocab(tmp_path / "vocab.txt"), True, 12)
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(n)) for n in (0, 1, 10, 11, 23, 80)]
    texts.append("Paris, London! xyzzy the cat")  # punctuation and an unknown word
    for stride in (1, 3, 10):
        for max_windows in (1, 3, 8):
            graph = tf.function(lambda t: windows.tf_text_windows(pre, t, stride, max_windows))
            got = {k: v.numpy() for k, v in graph(tf.constant(texts)).items()}
            want = windows.text_windows(texts, pre, stride, max_windows)
            for key in windows.WINDOW_FEATURES:
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"{key} {stride} "
                                                                           f"{max_windows}")


def test_window_model_export_serves_raw_text(tmp_path):
    from models import preprocessor

    pre = preprocessor.TextPreprocessor(write_vocab(tmp_path / "vocab.txt"), True, 12)
    keras.utils.set_random_seed(1)
    backbone = BertEncoder(vocabulary_size=len(pre.vocab), num_layers=1, num_heads=2,
                           hidden_dim=16, intermediate_dim=32, max_sequence_length=12)
    model = BertWindowClassifier(backbone, 2, "attention")
    export.export_window_model(model, pre, tmp_path / "saved", ["x", "y"], stride=4,
                               max_windows=3)
    texts = ["the cat sat " * n for n in (1, 4, 9)]
    assert export.check_window_export(tmp_path / "saved", model, pre, texts, 4, 3) < 1e-5
    from tests.unicode_stress import assert_saved_model_tokenizes_by_the_contract

    assert_saved_model_tokenizes_by_the_contract(tmp_path / "saved", pre.vocab, True, n=500)
    with pytest.raises(ValueError, match="window stride 11"):
        export.export_window_model(model, pre, tmp_path / "bad", ["x", "y"], 11, 3)


# --- the aggregations on hand-made numbers --------------------------------------------------------
def test_mean_and_max_of_window_logits_by_hand():
    logits = np.array([[[2.0, -1.0], [4.0, 3.0], [50.0, 50.0]],
                       [[-3.0, 1.0], [7.0, 0.0], [-1.0, 5.0]]], "float32")
    mask = np.array([[1, 1, 0], [1, 1, 1]], "int32")
    mean = np.asarray(MaskedWindowPooling("mean")(logits, mask))
    high = np.asarray(MaskedWindowPooling("max")(logits, mask))
    np.testing.assert_allclose(mean, [[3.0, 1.0], [1.0, 2.0]], atol=1e-6)
    np.testing.assert_allclose(high, [[4.0, 3.0], [7.0, 5.0]], atol=1e-6)  # padded 50 ignored


def test_attention_pooling_by_hand():
    layer = WindowAttentionPooling(units=1)
    x = np.array([[[1.0, 10.0], [-2.0, 20.0], [3.0, 30.0]]], "float32")
    mask = np.array([[1, 1, 0]], "int32")
    layer(x, mask)  # build
    # score_w = 2 · tanh(0.5 · x_w0 + 0.1): the second feature plays no part in the score.
    layer.projection.set_weights([np.array([[0.5], [0.0]], "float32"), np.array([0.1], "float32")])
    layer.score.set_weights([np.array([[2.0]], "float32")])
    scores = 2 * np.tanh(0.5 * x[0, :2, 0] + 0.1)
    alpha = np.exp(scores) / np.exp(scores).sum()
    expected = alpha @ x[0, :2]
    np.testing.assert_allclose(np.asarray(layer.weights_of(x, mask))[0], [*alpha, 0.0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(layer(x, mask))[0], expected, rtol=1e-5)


@pytest.fixture(scope="module")
def small_backbone():
    keras.utils.set_random_seed(0)
    return BertEncoder(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=16,
                       intermediate_dim=32, max_sequence_length=12, dropout=0.0)


def _window_inputs(rng, docs=3, n_windows=3, seq=12):
    x = {"token_ids": rng.integers(10, 50, (docs, n_windows, seq)).astype("int32"),
         "segment_ids": np.zeros((docs, n_windows, seq), "int32"),
         "padding_mask": np.ones((docs, n_windows, seq), "int32"),
         "window_mask": np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0]], "int32")}
    x["padding_mask"][:, :, 9:] = 0
    return x


def test_window_classifier_equals_per_window_classifier_then_mean_or_max(small_backbone):
    """The windowed model = BertClassifier on each window, then the masked mean / max."""
    x = _window_inputs(np.random.default_rng(0))
    single = BertClassifier(small_backbone, 3, dropout=0.0)
    for aggregation, reduce in (("mean", np.mean), ("max", np.max)):
        model = BertWindowClassifier(small_backbone, 3, aggregation, dropout=0.0)
        single.output_dense.set_weights(model.output_dense.get_weights())
        got = np.asarray(model(x)["logits"])
        for d in range(3):
            real = x["window_mask"][d] == 1
            per_window = np.asarray(single({k: x[k][d][real] for k in
                                            ("token_ids", "segment_ids", "padding_mask")})["logits"])
            np.testing.assert_allclose(got[d], reduce(per_window, axis=0), atol=1e-5)


def test_window_attention_classifier_saves_and_ignores_padded_windows(small_backbone, tmp_path):
    x = _window_inputs(np.random.default_rng(1))
    model = BertWindowClassifier(small_backbone, 2, "attention", dropout=0.0)
    before = np.asarray(model(x)["logits"])
    y = {k: v.copy() for k, v in x.items()}
    y["token_ids"][1, 1:] = 7  # change only padded windows
    np.testing.assert_allclose(np.asarray(model(y)["logits"]), before, atol=1e-6)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras", compile=False)
    np.testing.assert_allclose(np.asarray(loaded(x)["logits"]), before, atol=1e-6)


# --- config --------------------------------------------------------------------------------------
def test_long_document_config_validation_names_key_value_and_allowed():
    with pytest.raises(config_lib.ConfigError, match=r"finetune.long_doc_aggregation = 'sum'.*"
                                                     r"none, mean, max, attention"):
        config_lib.load(None, ["finetune.long_doc_aggregation=sum"])
    with pytest.raises(config_lib.ConfigError, match=r"finetune.window_stride = 0 .*>= 1"):
        config_lib.load(None, ["finetune.window_stride=0"])
    with pytest.raises(config_lib.ConfigError, match=r"finetune.max_windows = 0 .*>= 1"):
        config_lib.load(None, ["finetune.max_windows=0"])
    with pytest.raises(config_lib.ConfigError, match=r"window_stride = 200 .*<= 126"):
        config_lib.load(None, ["finetune.long_doc_aggregation=mean", "finetune.window_stride=200"])
    with pytest.raises(config_lib.ConfigError, match=r"long_doc_aggregation = 'max' applies to "
                                                     r"single-text classification only"):
        config_lib.load(None, ["finetune.long_doc_aggregation=max", "finetune.task=regression",
                               "finetune.dataset=csv", "finetune.train_file=x.csv"])
    config = config_lib.load(None, ["finetune.long_doc_aggregation=attention",
                                    "finetune.window_stride=32", "finetune.max_windows=4"])
    assert (config.finetune.window_stride, config.finetune.max_windows) == (32, 4)


# --- learning from the tail of long documents ---------------------------------------------------
FILLER = [w for w in WORDS if w not in ("paris", "london")][:20]
KEYWORD = {"north": "paris", "south": "london"}
HEAD, TAIL = 24, 16  # the label word fills the last 16 pieces only; a window holds 14


def _document(rng, label):
    return " ".join([rng.choice(FILLER) for _ in range(HEAD)] + [KEYWORD[label]] * TAIL)


def _write(path, n, seed):
    rng = random.Random(seed)
    labels = (["north", "south"] * n)[:n]
    path.write_text("text,label\n" + "".join(f"{_document(rng, l)},{l}\n" for l in labels))


@pytest.fixture(scope="module")
def tail_fixture(tmp_path_factory):
    folder = tmp_path_factory.mktemp("long_docs")
    vocab = write_vocab(folder / "vocab.txt")
    keras.utils.set_random_seed(0)
    BertEncoder(vocabulary_size=len(vocab), num_layers=1, num_heads=2, hidden_dim=32,
                intermediate_dim=64, max_sequence_length=64, dropout=0.0).save(
        folder / "encoder.keras")
    _write(folder / "train.csv", 80, 1)
    _write(folder / "test.csv", 40, 2)
    return folder


def _config(folder, tmp_path, aggregation):
    return config_lib.load(None, [
        f"run_dir={tmp_path}/run", f"finetune.init_from={folder}/encoder.keras",
        f"finetune.vocab_file={folder}/vocab.txt", "finetune.dataset=csv",
        f"finetune.train_file={folder}/train.csv", f"finetune.test_file={folder}/test.csv",
        "finetune.max_seq_length=16", "finetune.batch_size=8", "finetune.epochs=6",
        "finetune.learning_rate=0.005", "finetune.dropout=0.0", "finetune.baselines=false",
        "finetune.register_model=false", f"finetune.long_doc_aggregation={aggregation}",
        "finetune.window_stride=7", "finetune.max_windows=5", f"finetune.name=tail_{aggregation}"])


def _run(config, write_outputs=False):
    with contextlib.redirect_stdout(io.StringIO()):
        return finetuning.fine_tune(config, write_outputs=write_outputs)


def test_fixture_label_words_lie_beyond_the_first_window_and_windows_reach_them(tail_fixture):
    from models import preprocessor
    from pipeline.text import vocab as vocab_lib

    pre = preprocessor.TextPreprocessor(vocab_lib.read_vocab(tail_fixture / "vocab.txt"), True, 16)
    rng = random.Random(0)
    texts = [_document(rng, "north"), _document(rng, "south")]
    first = pre.features(texts)["token_ids"]  # what the truncating model sees
    keys = {pre.vocab.index("paris"), pre.vocab.index("london")}
    assert not keys & set(first.ravel().tolist())
    f = windows.text_windows(texts, pre, stride=7, max_windows=5)
    assert f["truncated_documents"] == 0 and f["n_windows"].tolist() == [5, 5]
    assert (f["token_ids"][:, 0] == first).all()  # window 0 == the truncated input
    for d, key in enumerate(("paris", "london")):
        assert pre.vocab.index(key) in f["token_ids"][d, -1]


@pytest.mark.slow
def test_windowed_model_learns_what_the_truncated_model_cannot(tail_fixture, tmp_path):
    """Same data, same encoder, same steps: the truncated model sees only filler (chance), the
    windowed one (mean of window logits) learns the label word in the documents' tail."""
    truncated = _run(_config(tail_fixture, tmp_path, "none"))
    windowed = _run(_config(tail_fixture, tmp_path, "mean"), write_outputs=True)
    assert truncated["test"]["accuracy"] <= 0.7
    assert windowed["test"]["accuracy"] >= 0.9
    assert windowed["test"]["macro_f1"] >= 0.9
    # Scored per document: one prediction per test document (40), not per window (200).
    from pipeline.artifacts import FinetuneArtifacts

    out = FinetuneArtifacts(windowed["output_dir"])
    assert len(out.test_predictions.read_text().splitlines()) == 40
    assert sum(sum(row) for row in windowed["test"]["confusion_matrix"]) == 40
    # The raw-text SavedModel makes the same windows in the graph: same probabilities.
    assert windowed["export_max_abs_diff"] < 1e-5
    texts = [_document(random.Random(5), "north"), _document(random.Random(6), "south")]
    loaded = predictor.Predictor(windowed["output_dir"])
    rows = loaded.texts(texts)  # through the SavedModel
    assert [r["label"] for r in rows] == ["north", "south"]
    keras_rows = loaded.task.classify_windows(loaded, texts)  # the .keras model + numpy windows
    assert [r["label"] for r in keras_rows] == ["north", "south"] and keras_rows[0]["windows"] == 5
    for a, b in zip(rows, keras_rows):
        assert a["scores"] == pytest.approx(b["scores"], abs=1e-5)


@pytest.mark.slow  # ~25 s of CPU each: the other two aggregations trained the same way
@pytest.mark.parametrize("aggregation", ["max", "attention"])
def test_max_and_attention_aggregations_learn_the_tail(tail_fixture, tmp_path, aggregation):
    result = _run(_config(tail_fixture, tmp_path, aggregation))
    assert result["test"]["accuracy"] >= 0.9
