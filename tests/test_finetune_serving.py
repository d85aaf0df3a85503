"""`python -m pipeline sweep` end to end, and the raw-string SavedModels of token classification
and extractive QA (word splitting, WordPiece, packing and span search inside the graph) checked
against the in-memory model with the Python-side tokenization. Tiny fixtures of
tests/test_finetune.py (a 1-layer, hidden-32 encoder, a 40-token vocab)."""

from __future__ import annotations

import json
import random

import mlflow
import numpy as np
import pytest

from pipeline import artifacts, cli
from pipeline.finetuning import task_model, tasks

from tests.unicode_stress import assert_saved_model_tokenizes_by_the_contract
from tests.test_finetune import ANIMALS, PLACES, encoder_files, quiet, sentence, sqlite_mlflow  # noqa: F401 - fixtures


@pytest.mark.slow
def test_sweep_cli_runs_the_grid_nested_and_reports_the_argmax(tmp_path, encoder_files,
                                                               sqlite_mlflow):
    """`python -m pipeline sweep`: exit 0; a stage run nested in the pipeline run, one child run
    per grid point with its own params; the best point = the argmax of the children's validation
    metric as MLflow has it (regression: Pearson, continuous, so the two points differ)."""
    rng = random.Random(5)
    rows = ["text\tscore"]
    for _ in range(40):
        text = sentence(rng, ANIMALS + PLACES)
        rows.append(f"{text}\t{float(sum(w in text.lower() for w in ANIMALS))}")
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    uri, experiment = sqlite_mlflow
    model, vocab = encoder_files
    config_file = tmp_path / "sweep.yaml"
    config_file.write_text(
        f"run_dir: {tmp_path}/run\n"
        f"tracking: {{tracking_uri: '{uri}', experiment: t}}\n"
        f"finetune:\n  task: regression\n  dataset: tsv\n  train_file: {tmp_path}/train.tsv\n"
        f"  text_column: text\n  label_column: score\n  init_from: {model}\n"
        f"  vocab_file: {vocab}\n  max_seq_length: 24\n  batch_size: 8\n  epochs: 1\n"
        f"  name: sw\n  baselines: false\n")
    with quiet() as out:
        code = cli.main(["sweep", "--config", str(config_file),
                         'finetune.sweep=["learning_rate=1e-4,3e-3"]'])
    assert code == cli.EXIT_OK

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([experiment])
    by_id = {r.info.run_id: r for r in runs}
    stage = [r for r in runs if r.data.tags.get("pipeline.stage") == "sweep"]
    assert len(stage) == 1
    stage = stage[0]
    pipeline_parent = by_id[stage.data.tags["mlflow.parentRunId"]]
    assert pipeline_parent.data.tags["stage.sweep"] == "ran"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == stage.info.run_id]
    assert len(children) == 2
    assert sorted(float(c.data.params["finetune.learning_rate"]) for c in children) == [1e-4, 3e-3]
    values = {c.info.run_id: c.data.metrics["validation_pearson"] for c in children}
    assert len(set(values.values())) == 2
    best_id = max(values, key=values.get)
    assert stage.data.tags["sweep.best_run_id"] == best_id
    assert float(stage.data.params["best.learning_rate"]) == \
        float(by_id[best_id].data.params["finetune.learning_rate"])
    assert stage.data.metrics["best_validation_pearson"] == pytest.approx(values[best_id])
    summary = json.loads(artifacts.Artifacts(f"{tmp_path}/run").finetune("sw").sweep.read_text())
    assert summary["best"]["mlflow_run_id"] == best_id
    best_lr = summary["best"]["point"]["learning_rate"]
    printed = out.getvalue()
    assert f"sweep: best learning_rate={best_lr}: validation pearson" in printed
    assert f"sweep        best learning_rate={best_lr}: validation_pearson" in printed
    assert best_id in printed


# ---------------------------------------------------------------------------
# Raw-string SavedModels for token classification and QA
# ---------------------------------------------------------------------------
def _task_model(encoder_files, kind, *args, seed=0, scale=30.0):
    """A task model on the fixture encoder, its head scaled up so the labels and spans are far
    from ties (a random head at BERT's 0.02 init gives near-equal logits)."""
    import keras

    from models import heads

    keras.utils.set_random_seed(seed)
    backbone = task_model.load_backbone(encoder_files[0])
    model = getattr(heads, kind)(backbone, *args, **({"dropout": 0.0} if args else {}))
    scaled = [layer for layer in model.layers if layer.name in ("logits", "span_logits")]
    assert len(scaled) == 1
    scaled[0].set_weights([w * scale for w in scaled[0].get_weights()])
    return model


def _softmax(x):
    x = x - x.max(-1, keepdims=True)
    return np.exp(x) / np.exp(x).sum(-1, keepdims=True)


TAG_TEXTS = [
    "the cat sat over the red house .",
    "The DOG, ran!  under\ta  big\u00a0tree",           # punctuation glued to words, odd spaces
    "zebra paris's unknownword road",                   # [UNK] and several pieces in one word
    "",                                                 # no words
    " ".join(["the big red house"] * 8),                # longer than max_seq_length: words cut
    "\u0301 cats",                                     # a word with no word pieces -> [UNK]
]


@pytest.mark.slow
def test_token_classification_saved_model_equals_python_tokenization(tmp_path, encoder_files):
    from pipeline.finetuning import features as features_lib
    from pipeline.finetuning import readers
    from pipeline.serving import export
    from models import preprocessor
    from pipeline.text import vocab as vocab_lib
    from pipeline.tools import predict

    labels = ["B-ANI", "B-LOC", "O"]
    model = _task_model(encoder_files, "BertTokenClassifier", len(labels))
    pre = preprocessor.TextPreprocessor(vocab_lib.read_vocab(encoder_files[1]), True, 16)
    folder = tmp_path / "tagger"  # a model folder with the SavedModel only (no model.keras)
    tasks.get("token_classification").export(model, pre, folder / "saved_model",
                                             {"labels": labels, "pair": False})
    (folder / "task.json").write_text(json.dumps({"task": "token_classification",
                                                  "labels": labels, "pair": False}))
    rows = export.run_token_model(export.load_saved_model(folder / "saved_model"), TAG_TEXTS,
                                  batch_size=4)  # two batches of different widths
    assert_saved_model_tokenizes_by_the_contract(folder / "saved_model", pre.vocab, True, 500)

    examples = [readers.TokenExample(t.split(), []) for t in TAG_TEXTS]
    features = features_lib.token_features(examples, pre, None)
    assert features["truncated_words"] > 0  # the long text is cut
    logits = np.asarray(model.predict({k: features[k] for k in task_model.INPUTS},
                                      verbose=0)["logits"])
    tags = features_lib.token_predictions(logits, features, examples, labels, "O")
    probs = _softmax(logits.astype(np.float64))
    assert [r["words"] for r in rows] == [e.words for e in examples]
    assert [r["labels"] for r in rows] == tags
    assert len({t for r in rows for t in r["labels"]}) > 1  # not one constant label
    for i, (row, positions) in enumerate(zip(rows, features["word_positions"])):
        expected = [probs[i, p].max() for p in positions]
        expected += [0.0] * (len(row["words"]) - len(positions))  # cut words: fallback, 0
        np.testing.assert_allclose(row["scores"], expected, atol=1e-5)

    # `python -m pipeline predict` serves it from the SavedModel (there is no .keras to load).
    with quiet() as out:
        assert predict.main(["predict", "--model", str(folder), "--text", TAG_TEXTS[1]]) == 0
    row = json.loads(out.getvalue())
    assert row["tags"] == [[w, t] for w, t in zip(rows[1]["words"], rows[1]["labels"])]


QA = [
    ("where was the cat?", "The cat sat near the river. A dog ran over the hill."),
    ("who ran?", "Über café: the dog, the bird and the cat ran (over) the road!"),
    ("what?", ""),                                                     # no context
    ("where is the big red house of the old city?",                    # several windows
     " ".join(f"the {w} sat near the house of {w}." for w in
              ("cat", "dog", "bird", "river", "hill", "road", "city", "tree"))),
    ("", "a cat."),                                                    # no question -> [UNK]
]


@pytest.mark.slow
def test_question_answering_saved_model_equals_python_tokenization(tmp_path, encoder_files,
                                                                   sqlite_mlflow):
    """SQuAD v2 rules (one export: ~30 s); the threshold is set so that on this fixture some
    questions keep their best span and some give it up for the null answer."""
    from pipeline.finetuning import features as features_lib
    from pipeline.finetuning import readers
    from pipeline.serving import export, mlflow_model
    from models import preprocessor
    from pipeline.text import vocab as vocab_lib
    from pipeline.tools import predict, predictor

    options = {"max_query_length": 6, "doc_stride": 5, "n_best": 10, "max_answer_length": 8,
               "version_2": True, "null_score_threshold": -5.5}
    model = _task_model(encoder_files, "BertSpanExtractor", seed=1)
    pre = preprocessor.TextPreprocessor(vocab_lib.read_vocab(encoder_files[1]), True, 24)
    folder = tmp_path / "qa"  # a model folder with the SavedModel only (no model.keras)
    tasks.get("question_answering").export(model, pre, folder / "saved_model", options)
    (folder / "task.json").write_text(json.dumps({"task": "question_answering", "labels": None,
                                                  "pair": False, **options}))
    rows = export.run_qa_model(export.load_saved_model(folder / "saved_model"),
                               [q for q, _ in QA], [c for _, c in QA], batch_size=3)
    assert_saved_model_tokenizes_by_the_contract(folder / "saved_model", pre.vocab, True, 500)

    examples = [readers.QAExample(str(i), q, c, []) for i, (q, c) in enumerate(QA)]
    features = features_lib.qa_features(examples, pre, options["max_query_length"], options["doc_stride"])
    assert max(np.bincount(features["example_index"])) >= 3  # the long context: many windows
    out = model.predict({k: features[k] for k in task_model.INPUTS}, verbose=0)
    scores = {}
    answers = features_lib.qa_predictions(examples, features, out, options, scores=scores)
    assert [r["answer"] for r in rows] == [answers[e.qid] for e in examples]
    assert sum(bool(r["answer"]) for r in rows) >= 2  # spans found, in several windows too
    assert any(r["score"] > -np.inf and not r["answer"] for r in rows)  # the null answer won
    for i, (row, (_, context)) in enumerate(zip(rows, QA)):
        best, null = scores[str(i)]
        assert row["score"] == pytest.approx(best, abs=1e-5) or row["score"] == best == -np.inf
        assert row["null_score"] == pytest.approx(null, abs=1e-5)
        if row["answer"]:
            assert context[row["start"]:row["end"]] == row["answer"]
        else:
            assert row["start"] == row["end"] == -1

    # `predict` from the folder (SavedModel) and from the MLflow registry (pyfunc over it).
    assert predictor.Predictor(folder).answer([QA[1][0]], [QA[1][1]]) == [
        {"question": QA[1][0], **rows[1]}]
    uri, experiment = sqlite_mlflow
    with mlflow.start_run(experiment_id=experiment):
        _, version = mlflow_model.log_to_mlflow(folder, json.loads((folder / "task.json").read_text()),
                                                "bert-qa-test")
    with quiet() as out:
        assert predict.main(["predict", "--model", f"models:/bert-qa-test/{version}",
                             "--tracking-uri", uri, "--question", QA[0][0],
                             "--context", QA[0][1]]) == 0
    row = json.loads(out.getvalue())
    assert row["answer"] == rows[0]["answer"] and row["start"] == rows[0]["start"]
    assert row["score"] == pytest.approx(rows[0]["score"], abs=1e-6)
