"""The finetune stage end to end on tiny fixtures: every task trains a 1-layer, hidden-32 encoder a
few steps; the raw-text export is checked against the in-memory model; predict, sweep, MLflow.

The fixtures are written here: a 40-token vocab, labelled CSV/TSV/JSONL/CoNLL/SQuAD files, and
a randomly initialised encoder saved as .keras (as the pretrain stage would leave it).
"""

from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path

import keras
import mlflow
import numpy as np
import pytest

from models import heads, preprocessor
from models.bert import BertEncoder
from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.finetuning import sweep as sweep_lib
from pipeline.finetuning import task_model, tasks
from pipeline.finetuning import train as finetuning
from pipeline.serving import export
from pipeline.text import vocab as vocab_lib
from pipeline.tools import predict, predictor

from tests import unicode_stress as stress
from tests.test_finetune_data import WORDS, write_vocab

ANIMALS = ["cat", "dog", "bird"]
PLACES = ["house", "tree", "river", "hill", "road", "city"]


@pytest.fixture(scope="module")
def encoder_files(tmp_path_factory):
    """(encoder .keras, vocab.txt): what `make pretrain` leaves, in miniature."""
    folder = tmp_path_factory.mktemp("pretrained")
    vocab = write_vocab(folder / "vocab.txt")
    keras.utils.set_random_seed(0)
    encoder = BertEncoder(vocabulary_size=len(vocab), num_layers=1, num_heads=2, hidden_dim=32,
                          intermediate_dim=64, max_sequence_length=64, dropout=0.0)
    encoder.save(folder / "encoder.keras")
    return folder / "encoder.keras", folder / "vocab.txt"


def sentence(rng, topic_words):
    words = [rng.choice(topic_words)] + [rng.choice(WORDS[:12]) for _ in range(rng.randint(2, 5))]
    rng.shuffle(words)
    return " ".join(words).capitalize() + "."


def make_config(tmp_path, encoder_files, *overrides):
    model, vocab = encoder_files
    return config_lib.load(None, [
        f"run_dir={tmp_path}/run", f"finetune.init_from={model}", f"finetune.vocab_file={vocab}",
        "finetune.max_seq_length=24", "finetune.batch_size=8", "finetune.epochs=2",
        "finetune.learning_rate=0.001", "finetune.registered_model=bert-test", *overrides])


def quiet():
    return contextlib.redirect_stdout(io.StringIO())


@pytest.fixture
def sqlite_mlflow(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    yield uri, experiment
    mlflow.set_tracking_uri(None)


@pytest.mark.slow
def test_classification_end_to_end_export_predict_and_registry(tmp_path, encoder_files,
                                                               sqlite_mlflow):
    """Single-sentence classification: train, evaluate, baselines, confusion matrix, export,
    MLflow model + registry, and `predict` on raw text == the in-memory model."""
    rng = random.Random(0)
    rows = ["text,label"] + [f"{sentence(rng, ANIMALS if i % 2 else PLACES)},"
                             f"{'animal' if i % 2 else 'place'}" for i in range(80)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    config = make_config(tmp_path, encoder_files, "finetune.dataset=csv",
                         f"finetune.train_file={tmp_path}/train.csv", "finetune.name=topic")
    uri, experiment = sqlite_mlflow
    with mlflow.start_run(experiment_id=experiment) as run:
        results = finetuning.fine_tune(config)
    out = results["output_dir"]
    paths = artifacts.Artifacts(config.run_dir).finetune("topic")
    assert out == str(paths.dir)
    for path in (paths.model_keras, paths.saved_model, paths.task_json, paths.vocab_file,
                 paths.splits, paths.metrics, paths.confusion_matrix, paths.test_predictions):
        assert path.exists(), path
    # 10% validation + 10% test per label: 64 training rows / batch 8, two epochs
    assert results["history"][-1]["step"] == 2 * 8
    for split in ("validation", "test"):
        assert set(results[split]) >= {"accuracy", "macro_f1", "mcc", "f1"}
    assert set(results["baselines"]) == {"majority", "bow_lr", "tfidf_lr", "tfidf_svm",
                                         "tfidf_char_svm", "random_init"}
    assert set(results["baselines"]["random_init"]) >= {"accuracy", "macro_f1"}
    assert results["baselines"]["majority"]["accuracy"] == pytest.approx(0.5)
    # The margin against the strongest baseline on the selection metric, in points.
    best = results["best_baseline"]
    strongest = max(v["accuracy"] for v in results["baselines"].values())
    assert best["metric"] == "accuracy" and best["value"] == strongest
    assert best["margin_points"] == pytest.approx(
        round((results["test"]["accuracy"] - strongest) * 100, 2))
    assert results["export_max_abs_diff"] < 1e-5
    assert np.asarray(results["test"]["confusion_matrix"]).sum() == 8

    # MLflow: metrics, artifacts, the pyfunc model, a registered version with the champion alias.
    client = mlflow.MlflowClient()
    logged = client.get_run(run.info.run_id)
    assert {"test_accuracy", "validation_macro_f1", "baseline_bow_lr_test_accuracy",
            "baseline_tfidf_svm_test_accuracy", "baseline_random_init_test_accuracy",
            "val_macro_f1", "margin_vs_best_baseline"} <= set(logged.data.metrics)
    assert logged.data.metrics["margin_vs_best_baseline"] == best["margin_points"]
    assert logged.data.tags["finetune.best_baseline"] == best["name"]
    names = {a.path for a in client.list_artifacts(run.info.run_id, "finetune")}
    assert "finetune/confusion_matrix.png" in names and "finetune/splits.json" in names
    version = client.get_model_version_by_alias("bert-test", "champion")
    assert str(version.version) == "1"

    # The exported model on raw strings == the in-memory (reloaded .keras) model.
    texts = ["The cat ran over the hill.", "A big red house!", "zebra unknown words"]
    serve = export.load_saved_model(paths.saved_model)
    exported = export.run_saved_model(serve, texts)
    model = keras.models.load_model(paths.model_keras)
    pre = preprocessor.TextPreprocessor(vocab_lib.read_vocab(paths.vocab_file), True, 24)
    logits = np.asarray(model.predict(pre.features(texts), verbose=0)["logits"])
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(exported["scores"], probs, atol=1e-5)
    labels = json.loads(paths.task_json.read_text())["labels"]
    assert list(exported["label"]) == [labels[i] for i in probs.argmax(-1)]
    stress.assert_saved_model_tokenizes_by_the_contract(paths.saved_model, pre.vocab, True)

    # python -m pipeline predict, from the folder and from the registry.
    (tmp_path / "in.txt").write_text("\n".join(texts[:2]) + "\n")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert predict.main(["predict", "--model", out, "--text", texts[0], "--file",
                             str(tmp_path / "in.txt")]) == 0
    rows = [json.loads(line) for line in buffer.getvalue().splitlines()]
    assert [r["text"] for r in rows] == [texts[0], *texts[:2]]
    assert rows[0]["scores"][rows[0]["label"]] == pytest.approx(float(probs[0].max()), abs=1e-5)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert predict.main(["predict", "--model", "models:/bert-test/1", "--tracking-uri", uri,
                             "--text", texts[1]]) == 0
    row = json.loads(buffer.getvalue())
    assert row["label"] == labels[int(probs[1].argmax())]
    assert row[f"score_{row['label']}"] == pytest.approx(float(probs[1].max()), abs=1e-5)

    # python -m pipeline serve: the champion over HTTP answers what `predict` printed; a
    # malformed request is a 400 with its reason.
    answer, bad = serve_and_post(uri, "models:/bert-test@champion", texts[1])
    assert answer == {"predictions": [{k: v for k, v in row.items() if k != "text"}]}
    assert bad[0] == 400 and "JSON" in bad[1]


def serve_and_post(uri: str, model: str, text: str):
    """Starts `python -m pipeline serve` on a free loopback port, posts `text`, then a
    malformed body; returns (the answer, (status, reason) of the malformed one)."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "serve", "--model", model, "--port", str(port),
         "--tracking-uri", uri], start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    base = f"http://127.0.0.1:{port}"

    def post(body: bytes):
        request = urllib.request.Request(f"{base}/invocations", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    try:
        deadline = time.time() + 240
        while True:
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            try:
                with urllib.request.urlopen(f"{base}/ping", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            assert time.time() < deadline, "the server did not answer /ping in 240 s"
            time.sleep(2)
        answer = post(json.dumps({"dataframe_records": [{"text": text}]}).encode())
        try:
            post(b"not json")
            bad = (200, "")
        except urllib.error.HTTPError as err:
            bad = (err.code, json.loads(err.read())["message"])
        return answer, bad
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.mark.slow
def test_sentence_pair_regression_export(tmp_path, encoder_files):
    """[CLS] A [SEP] B [SEP] inputs with a regression head (Pearson/Spearman); the exported
    two-input signature equals the in-memory model. (Pair classification is the classifier of
    the test above on these pair features.)"""
    rng = random.Random(1)
    rows = ["q\td\tscore"]
    for _ in range(40):
        a, b = sentence(rng, ANIMALS), sentence(rng, ANIMALS + PLACES)
        rows.append(f"{a}\t{b}\t{4.0 if any(w in b.lower() for w in ANIMALS) else 1.0}")
    (tmp_path / "pairs.tsv").write_text("\n".join(rows) + "\n")
    config = make_config(tmp_path, encoder_files, "finetune.task=regression",
                         "finetune.dataset=tsv", f"finetune.train_file={tmp_path}/pairs.tsv",
                         "finetune.text_column=q", "finetune.text_pair_column=d",
                         "finetune.label_column=score", "finetune.epochs=1", "finetune.name=sts",
                         "finetune.random_init_baseline=false")  # (the classification test's)
    with quiet():
        results = finetuning.fine_tune(config)
    assert set(results["test"]) == {"pearson", "spearman", "mse"}
    assert set(results["baselines"]) == {"mean", "bow_ridge", "tfidf_ridge"}
    assert results["export_max_abs_diff"] < 1e-5
    folder = results["output_dir"]
    assert json.loads((Path(folder) / "task.json").read_text())["pair"] is True
    p = predictor.Predictor(folder)
    out = p.texts(["A cat sat.", "A cat sat.", "The dog ran."], ["The dog ran.", "The dog ran.",
                                                                 "A cat sat."])
    assert out[0]["score"] == out[1]["score"] != out[2]["score"]  # the order of A and B matters
    args = type("Args", (), dict(model=folder, text=["x"], text_pair=[], file=None,
                                 documents=None, query=[], question=[], context=[]))()
    with pytest.raises(ValueError, match="text pairs"):
        predict._predict(args)


@pytest.mark.slow
def test_token_classification_first_piece_labels(tmp_path, encoder_files):
    rng = random.Random(2)
    lines = []
    for _ in range(40):
        words = [rng.choice(WORDS[:20]) for _ in range(rng.randint(3, 7))]
        for w in words:
            tag = "B-ANI" if w in ANIMALS else ("B-LOC" if w in PLACES else "O")
            lines.append(f"{w} {tag}")
        lines.append("")
    (tmp_path / "ner.conll").write_text("\n".join(lines))
    config = make_config(tmp_path, encoder_files, "finetune.task=token_classification",
                         "finetune.dataset=conll", f"finetune.train_file={tmp_path}/ner.conll",
                         "finetune.name=ner", "finetune.random_init_baseline=false")
    with quiet():
        results = finetuning.fine_tune(config)
    assert set(results["test"]) == {"precision", "recall", "f1", "token_accuracy"}
    assert set(results["baselines"]) == {"majority", "most_frequent_tag", "crf"}
    # The per-word baseline learns this fixture exactly (a tag is a function of the word).
    assert results["baselines"]["most_frequent_tag"]["f1"] == pytest.approx(1.0)
    # The raw-string SavedModel (in-graph word split) == the .keras model + Python tokenization.
    assert results["export_mismatches"] == 0 and results["export_max_abs_diff"] < 1e-5
    rows = predictor.Predictor(results["output_dir"]).texts(["the cat sat", "river"])
    assert [w for w, _ in rows[0]["tags"]] == ["the", "cat", "sat"]
    assert {t for r in rows for _, t in r["tags"]} <= {"O", "B-ANI", "B-LOC"}


@pytest.mark.slow
def test_question_answering_squad_v2(tmp_path, encoder_files):
    rng = random.Random(3)
    paragraphs = []
    for i in range(12):
        place = rng.choice(PLACES)
        context = f"{sentence(rng, ANIMALS)} The {rng.choice(ANIMALS)} sat near the {place}. " \
                  f"{sentence(rng, PLACES)}"
        start = context.index(f"the {place}.") + 4
        qas = [{"id": f"q{i}", "question": "where was it?",
                "answers": [{"text": place, "answer_start": start}]},
               {"id": f"n{i}", "question": "who saw London?", "answers": [], "is_impossible": True}]
        paragraphs.append({"context": context, "qas": qas})
    squad = {"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]}
    (tmp_path / "squad.json").write_text(json.dumps(squad))
    config = make_config(tmp_path, encoder_files, "finetune.task=question_answering",
                         "finetune.dataset=squad", f"finetune.train_file={tmp_path}/squad.json",
                         "finetune.version_2=true", "finetune.max_query_length=6",
                         "finetune.doc_stride=8", "finetune.name=qa",
                         "finetune.random_init_baseline=false")  # (not checked here)
    with quiet():
        results = finetuning.fine_tune(config)
    assert {"exact", "f1", "total", "best_f1", "best_f1_thresh"} <= set(results["test"])
    assert 0 <= results["test"]["f1"] <= 100
    # The raw-string SavedModel (in-graph windows, n-best search) == the Python-side answers.
    assert results["export_mismatches"] == 0 and results["export_max_abs_diff"] < 1e-5
    rows = predictor.Predictor(results["output_dir"]).answer(["where?"], ["The cat sat near a tree."])
    assert isinstance(rows[0]["answer"], str)


@pytest.mark.slow  # ~30-60 s: two-tower training + export; the heads and metrics have fast tests
def test_semantic_search_bi_encoder_and_search_command(tmp_path, encoder_files):
    rng = random.Random(4)
    rows = [{"query": f"{a} {b}", "doc": f"the {a} saw the {b} ."}
            for a in ANIMALS for b in PLACES for _ in range(2)]
    rng.shuffle(rows)
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    config = make_config(tmp_path, encoder_files, "finetune.task=semantic_search",
                         "finetune.dataset=jsonl", f"finetune.train_file={tmp_path}/pairs.jsonl",
                         "finetune.text_column=query", "finetune.text_pair_column=doc",
                         "finetune.name=search", "finetune.register_model=false",
                         "finetune.random_init_baseline=false")  # (not checked here)
    with quiet():
        results = finetuning.fine_tune(config)
    assert {"recall_at_1", "recall_at_5", "mrr"} <= set(results["test"])
    assert results["export_max_abs_diff"] < 1e-5
    (tmp_path / "docs.txt").write_text("the cat saw the river .\nthe dog saw the city .\n")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert predict.main(["predict", "--model", results["output_dir"], "--documents",
                             str(tmp_path / "docs.txt"), "--query", "cat river",
                             "--top-k", "2"]) == 0
    result = json.loads(buffer.getvalue())
    assert [r["rank"] for r in result["results"]] == [1, 2]
    assert result["results"][0]["score"] >= result["results"][1]["score"]


def test_freeze_strategies(encoder_files):
    model_path, _ = encoder_files
    sizes = {}
    for strategy in ("none", "encoder", "all_but_last_n"):
        backbone = task_model.load_backbone(model_path)
        fc = config_lib.FinetuneConfig(freeze=strategy, trainable_last_n=1)
        model = tasks.get("classification", fc).build_model(backbone, 3)
        sizes[strategy] = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    head = 32 * 3 + 3
    assert sizes["encoder"] == head
    # 1 layer: all_but_last_n=1 trains the layer and the pooler, not the embeddings.
    embeddings = sum(int(np.prod(v.shape)) for v in backbone.get_layer("token_embedding").weights)
    assert head < sizes["all_but_last_n"] < sizes["none"] - embeddings + 1
    with pytest.raises(ValueError, match="trainable_last_n = 2"):
        heads.freeze_backbone(task_model.load_backbone(model_path), "all_but_last_n", 2)


def test_sweep_runs_the_grid_as_child_runs_and_reports_the_best(tmp_path, monkeypatch,
                                                                sqlite_mlflow):
    """The grid, the nested MLflow runs and the choice of the best point (the stage itself is
    stubbed: it is tested above)."""
    seen = []

    def fake_run(config, write_outputs=True, evaluate_test=True):
        fc = config.finetune
        assert not fc.baselines  # the points are compared with each other: no baselines
        seen.append((fc.learning_rate, fc.freeze, write_outputs))
        score = fc.learning_rate * (2 if fc.freeze == "none" else 1)
        return {"metric": "accuracy", "validation": {"accuracy": score},
                "test": {"accuracy": score / 2}, "best_epoch": 1, "seconds": 0.0,
                "trained_steps": 1}

    monkeypatch.setattr(sweep_lib, "fine_tune", fake_run)
    config = config_lib.load(None, [f"run_dir={tmp_path}/run", "finetune.name=sw",
                                    'finetune.sweep=["learning_rate=1e-4,3e-4", '
                                    '"freeze=none,encoder"]'])
    _, experiment = sqlite_mlflow
    with mlflow.start_run(experiment_id=experiment) as parent, quiet():
        summary = sweep_lib.sweep(config)
    assert seen == [(1e-4, "none", False), (1e-4, "encoder", False), (3e-4, "none", False),
                    (3e-4, "encoder", False)]
    assert summary["best"]["point"] == {"learning_rate": 3e-4, "freeze": "none"}
    paths = artifacts.Artifacts(config.run_dir).finetune("sw")
    assert json.loads(paths.sweep.read_text())["metric"] == "validation_accuracy"
    client = mlflow.MlflowClient()
    children = client.search_runs([experiment],
                                  f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 4
    logged = client.get_run(parent.info.run_id)
    assert logged.data.params["best.freeze"] == "none"
    assert logged.data.tags["sweep.best_run_id"] == summary["best"]["mlflow_run_id"]
    with pytest.raises(config_lib.ConfigError, match="learning_rate"):
        sweep_lib.sweep(config, {"learning_rate": [5.0]})
