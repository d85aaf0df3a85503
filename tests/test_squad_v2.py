"""SQuAD as the official scripts score it (pipeline/finetuning/squad_official.py) and the v2.0
null-score threshold chosen on the validation split, saved with the model and served.

The expected figures are worked out by hand from evaluate-v2.0.py's definitions (written in
the comments as arithmetic), not taken from the code under test."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import random
from pathlib import Path

import mlflow
import numpy as np
import pytest

from pipeline.config import FinetuneConfig
from pipeline.finetuning import readers, tasks
from pipeline.finetuning import squad_official as official
from pipeline.finetuning import train as finetuning
from tests import test_finetune
from tests.test_finetune import ANIMALS, PLACES, make_config, quiet, sentence

# The fixtures of tests/test_finetune.py: a tiny encoder and vocab, a SQLite MLflow store.
encoder_files = test_finetune.encoder_files
sqlite_mlflow = test_finetune.sqlite_mlflow


# ---------------------------------------------------------------------------
# The metric on hand-made files
# ---------------------------------------------------------------------------
# Five questions: three answerable (h1..h3), two not (n1, n2).
GOLD = {"h1": ["Denver Broncos"], "h2": ["Carolina Panthers"], "h3": ["Santa Clara"],
        "n1": [], "n2": []}
PREDICTIONS = {"h1": "the Denver Broncos",  # article dropped: exact 1, f1 1
               "h2": "Panthers team",  # 1 common token of 2 and 2: P = R = 1/2, f1 0.5, exact 0
               "h3": "",  # no answer to an answerable question: 0, 0
               "n1": "",  # no answer, rightly: 1, 1
               "n2": "Levi's Stadium"}  # an answer to an unanswerable one: 0, 0
NA_PROBS = {"h1": 0.1, "h2": 0.3, "h3": 0.9, "n1": 0.8, "n2": 0.85}


def squad_file(path, gold: dict) -> None:
    """A SQuAD JSON file with one paragraph per question; the answers stand in the context."""
    paragraphs = []
    for qid, answers in gold.items():
        context = "Context: " + " / ".join(answers) if answers else "Nothing here."
        qas = {"id": qid, "question": f"question {qid}?", "is_impossible": not answers,
               "answers": [{"text": a, "answer_start": context.index(a)} for a in answers]}
        paragraphs.append({"context": context, "qas": [qas]})
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t",
                                                             "paragraphs": paragraphs}]}))


def run_main(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = official.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def test_official_v2_metric_on_hand_made_files(tmp_path):
    squad_file(tmp_path / "dev.json", GOLD)
    official.write_predictions(tmp_path / "predictions.json", PREDICTIONS)
    official.write_na_probs(tmp_path / "na_prob.json", NA_PROBS)
    code, out, err = run_main(tmp_path / "dev.json", tmp_path / "predictions.json",
                              "--na-prob-file", tmp_path / "na_prob.json")
    assert code == 0 and err == ""
    result = json.loads(out)
    assert list(result) == list(official.V2_KEYS)  # the official keys, in its order
    expected = {
        "exact": 100 * (1 + 0 + 0 + 1 + 0) / 5, "f1": 100 * (1 + 0.5 + 0 + 1 + 0) / 5,
        "total": 5,
        "HasAns_exact": 100 * (1 + 0 + 0) / 3, "HasAns_f1": 100 * (1 + 0.5 + 0) / 3,
        "HasAns_total": 3,
        "NoAns_exact": 100 * (1 + 0) / 2, "NoAns_f1": 100 * (1 + 0) / 2, "NoAns_total": 2,
        # Start at "answer nothing": the 2 unanswerable right = 2. By rising probability:
        # h1 (0.1) +1 -> 3 (best, thresh 0.1); h2 (0.3) +0.5 -> 3.5 (best, 0.3); n1 (0.8)
        # predicted "" +0 -> 3.5; n2 (0.85) predicted a span -1 -> 2.5; h3 (0.9) +0 -> 2.5.
        "best_f1": 100 * 3.5 / 5, "best_f1_thresh": 0.3,
        # Exact: h1 +1 -> 3 (best, 0.1); h2 +0 -> 3 (not better); n1 +0; n2 -1 -> 2; h3 +0.
        "best_exact": 100 * 3 / 5, "best_exact_thresh": 0.1,
    }
    assert result == pytest.approx(expected)
    assert isinstance(result["total"], int)

    # --na-prob-thresh 0.5: h3, n1, n2 (above it) score as if answered "": h3 0, n1 1, n2 1.
    code, out, _ = run_main(tmp_path / "dev.json", tmp_path / "predictions.json",
                            "--na-prob-file", tmp_path / "na_prob.json",
                            "--na-prob-thresh", "0.5")
    result = json.loads(out)
    assert result["exact"] == pytest.approx(100 * (1 + 0 + 0 + 1 + 1) / 5)
    assert result["f1"] == pytest.approx(100 * (1 + 0.5 + 0 + 1 + 1) / 5)
    assert result["NoAns_exact"] == pytest.approx(100.0)

    # Without a na-prob file: no best_* keys; a missing prediction is left out of the totals.
    code, out, err = run_main(tmp_path / "dev.json", tmp_path / "predictions.json")
    assert "best_f1" not in json.loads(out)
    partial = {q: a for q, a in PREDICTIONS.items() if q != "n2"}
    result = official.evaluate_v2(GOLD, {q: bool(a) for q, a in GOLD.items()}, partial)
    assert result["total"] == 4 and result["NoAns_total"] == 1
    assert result["f1"] == pytest.approx(100 * (1 + 0.5 + 0 + 1) / 4)


def test_official_v2_gold_rules():
    """Every gold answer is tried (the best counts); a gold answer that normalises to nothing
    is dropped, and a question left with none is answered by "" alone."""
    gold = {"a": ["Carolina Panthers", "Panthers"], "b": ["the", "a"]}
    has = {"a": True, "b": True}
    # a: "Panthers" vs "Panthers" = 1 (exact and f1). b: gold becomes [""]: "" scores 1.
    result = official.evaluate_v2(gold, has, {"a": "panthers!", "b": ""})
    assert result["exact"] == pytest.approx(100.0) and result["f1"] == pytest.approx(100.0)
    # a: "Panthers team" vs "Carolina Panthers" f1 1/2, vs "Panthers" P 1/2 R 1 -> 2/3.
    result = official.evaluate_v2(gold, has, {"a": "Panthers team", "b": "x"})
    assert result["f1"] == pytest.approx(100 * (2 / 3 + 0) / 2)


def test_main_bad_input_is_one_line_and_exit_2(tmp_path):
    squad_file(tmp_path / "dev.json", GOLD)
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "bad_prob.json").write_text(json.dumps({"h1": "high"}))
    (tmp_path / "preds.json").write_text(json.dumps(PREDICTIONS))
    (tmp_path / "short.json").write_text(json.dumps({"h1": 0.5}))
    cases = [((tmp_path / "missing.json", tmp_path / "preds.json"), "missing.json"),
             ((tmp_path / "preds.json", tmp_path / "preds.json"), "not SQuAD JSON"),
             ((tmp_path / "dev.json", tmp_path / "list.json"), "not an object"),
             ((tmp_path / "dev.json", tmp_path / "preds.json", "-n", tmp_path / "bad_prob.json"),
              "question 'h1' has \"high\""),
             ((tmp_path / "dev.json", tmp_path / "preds.json", "-n", tmp_path / "short.json"),
              "miss 4 predicted question(s)")]
    for argv, words in cases:
        code, out, err = run_main(*argv)
        assert code == 2 and out == "", argv
        assert len(err.strip().splitlines()) == 1 and words in err, err


# ---------------------------------------------------------------------------
# Choosing the threshold (score units) and the no-answer probability
# ---------------------------------------------------------------------------
HAS = {q: bool(a) for q, a in GOLD.items()}
SPANS = {"h1": "Denver Broncos", "h2": "Panthers team", "h3": "Santa",
         "n1": "somewhere", "n2": "Levi's Stadium"}  # every question's best span
# null score - best span score, in the order of NA_PROBS above
DIFFS = {"h1": -2.0, "h2": -0.5, "h3": 4.0, "n1": 3.0, "n2": 3.5}


def test_choose_null_threshold_best_f1_not_zero():
    # Answer iff diff <= t. Start at "answer nothing" = 2 (n1, n2). Rising diffs: h1 +1 -> 3,
    # h2 +0.5 -> 3.5 (best: t = -0.5), n1 (span) -1 -> 2.5, n2 -1 -> 1.5, h3 ("Santa" vs
    # "Santa Clara": P 1, R 1/2, f1 2/3) -> 2.17. With h2 at +0.5 the best is t = +0.5.
    assert official.choose_null_threshold(GOLD, HAS, SPANS, DIFFS) == -0.5
    shifted = {**DIFFS, "h2": 0.5}
    assert official.choose_null_threshold(GOLD, HAS, SPANS, shifted) == 0.5
    answers = official.answers_at(SPANS, DIFFS, -0.5)
    assert answers == {"h1": "Denver Broncos", "h2": "Panthers team", "h3": "", "n1": "",
                       "n2": ""}
    # The F1 of those answers is the search's best: (1 + 0.5 + 0 + 1 + 1) / 5.
    assert official.evaluate_v2(GOLD, HAS, answers)["f1"] == pytest.approx(100 * 3.5 / 5)
    # ... and no other threshold does better (brute force over every cut).
    for t in [-math.inf, *DIFFS.values()]:
        f1 = official.evaluate_v2(GOLD, HAS, official.answers_at(SPANS, DIFFS, t))["f1"]
        assert f1 <= 100 * 3.5 / 5 + 1e-9


def test_choose_null_threshold_ties_and_answering_nothing():
    gold = {"a": ["x"], "b": []}
    has = {"a": True, "b": False}
    # Equal differences: a threshold answers both or neither. Both: 1 (a) + 0 (b answered) = 1;
    # neither: 0 + 1 = 1: not better, so neither; the threshold just below the smallest
    # difference (the official search, question by question, would report 0.0 = both).
    spans, diffs = {"a": "x", "b": "y"}, {"a": 0.0, "b": 0.0}
    t = official.choose_null_threshold(gold, has, spans, diffs)
    assert t < 0.0 and t == np.nextafter(0.0, -np.inf)
    assert official.answers_at(spans, diffs, t) == {"a": "", "b": ""}
    assert official.find_best_threshold(spans, {"a": 1.0, "b": 0.0}, diffs, has) == (100.0, 0.0)
    # Every span wrong: answering nothing is best.
    spans = {"a": "z", "b": "y"}
    t = official.choose_null_threshold(gold, has, spans, {"a": -1.0, "b": 2.0})
    assert t < -1.0 and official.answers_at(spans, {"a": -1.0, "b": 2.0}, t)["a"] == ""


def test_na_probability_is_the_sigmoid_of_null_minus_span():
    assert official.na_probability(0.0, 0.0) == 0.5
    assert official.na_probability(2.0, 0.0) == pytest.approx(1 / (1 + math.exp(-2.0)))
    assert official.na_probability(-800.0, 0.0) == 0.0 and official.na_probability(1.0, -800) == 1
    assert official.na_probability(0.3, -math.inf) == 1.0  # no span at all
    values = [official.na_probability(d, 0.0) for d in np.linspace(-30, 30, 61)]
    assert values == sorted(values) and len(set(values)) == 61


def test_prediction_files_are_the_official_formats(tmp_path):
    predictions = {"q1": "Zürich", 7: "", "q3": "a \"quoted\" answer"}
    official.write_predictions(tmp_path / "predictions.json", predictions)
    loaded = json.loads((tmp_path / "predictions.json").read_text(encoding="utf-8"))
    assert loaded == {"q1": "Zürich", "7": "", "q3": "a \"quoted\" answer"}
    probs = {"q1": 1 / 3, "7": 1.0, "q3": 1e-300}
    official.write_na_probs(tmp_path / "na_prob.json", probs)
    assert json.loads((tmp_path / "na_prob.json").read_text()) == probs  # floats round-trip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["na_prob.json", "predictions.json"]


# ---------------------------------------------------------------------------
# The task: chosen on validation, used on test, served
# ---------------------------------------------------------------------------
def qa_examples(rng, n: int, prefix: str) -> list:
    """n answerable "where" questions and n unanswerable "who saw London" ones, each with
    its own context."""
    out = []
    for i in range(n):
        for kind in "hn":
            place = rng.choice(PLACES)
            context = f"{sentence(rng, ANIMALS)} The {rng.choice(ANIMALS)} sat near the " \
                      f"{place}. {sentence(rng, PLACES)}"
            answers = [(place, context.index(f"the {place}.") + 4)] if kind == "h" else []
            out.append(readers.QAExample(f"{prefix}{kind}{i}", "where was it?" if kind == "h"
                                         else "who saw London?", context, answers, kind == "n"))
    return out


def test_threshold_chosen_on_validation_is_used_on_test(encoder_files):
    """No training: a random span head (scaled, so scores spread) on the fixture encoder.
    The gold of the three answerable validation questions it is surest of is set to its own
    span, so the best threshold answers some questions and not others."""
    from models import preprocessor
    from pipeline.text import vocab as vocab_lib
    from tests.test_finetune_serving import _task_model

    rng = random.Random(7)
    validation, test = qa_examples(rng, 8, "v"), qa_examples(rng, 4, "t")
    pre = preprocessor.TextPreprocessor(vocab_lib.read_vocab(encoder_files[1]), True, 24)
    fc = FinetuneConfig(task="question_answering", dataset="squad", version_2=True,
                        max_seq_length=24, max_query_length=6, doc_stride=8, n_best=10,
                        max_answer_length=8, batch_size=4)
    assert fc.null_score_threshold == "auto"
    task = tasks.get("question_answering", fc)
    model = _task_model(encoder_files, "BertSpanExtractor", seed=3)
    first = _candidates(task, model, task.make_split(validation, pre, None, False))
    surest = sorted((first[e.qid][2] - first[e.qid][1], e.qid) for e in validation if e.answers)
    right = {q for _, q in surest[:3]}
    validation = [dataclasses.replace(e, answers=[(first[e.qid][0],
                                                   e.context.find(first[e.qid][0]))])
                  if e.qid in right else e for e in validation]
    data = readers.TaskData(train=[], validation=validation, tests={"test": test}, labels=None,
                            metric="f1")
    splits = {name: task.make_split(examples, pre, None, False)
              for name, examples in (("validation", validation), ("test", test))}

    val, _ = task.evaluate(model, splits["validation"], data)
    t = val["null_score_threshold"]
    # The chosen threshold is the best F1 of every possible cut, found by brute force here.
    search = _candidates(task, model, splits["validation"])
    spans = {q: text for q, (text, _, _) in search.items()}
    diffs = {q: null - score for q, (_, score, null) in search.items()}
    gold, has = official.gold_of(validation)
    by_cut = {c: official.evaluate_v2(gold, has, official.answers_at(spans, diffs, c))["f1"]
              for c in [-math.inf, *diffs.values()]}
    assert val["f1"] == pytest.approx(max(by_cut.values()))
    assert val["f1"] == pytest.approx(val["best_f1"])  # nothing left to gain on validation
    assert min(diffs.values()) <= t < max(diffs.values()) and t in diffs.values()
    assert 0 < sum(bool(a) for a in official.answers_at(spans, diffs, t).values()) < len(spans)

    # The test split takes the threshold of the kept epoch's validation result, nothing else.
    with pytest.raises(ValueError, match="no validation result with a chosen threshold"):
        task.evaluate(model, splits["test"], data)
    task.keep(val)
    result, prediction = task.evaluate(model, splits["test"], data)
    assert result["null_score_threshold"] == t
    assert prediction["null_score_threshold_source"] == "validation"
    assert set(result) == {*official.V2_KEYS, "null_score_threshold"}
    test_search = _candidates(task, model, splits["test"])
    for q, (text, score, null) in test_search.items():
        assert prediction["answers"][q] == ("" if null - score > t else text)
        assert prediction["na_probs"][q] == official.na_probability(null, score)
    # task.json's auto placeholder, resolved for these weights at export.
    info = task.task_info(data)
    assert info["null_score_threshold"] is None
    assert task.search_settings(info)["null_score_threshold"] == t

    # A task told no kept result has no threshold to export with.
    fresh = tasks.get("question_answering", fc)
    with pytest.raises(ValueError, match="no validation result with a chosen threshold"):
        fresh.search_settings(info)
    # A number overrides it.
    fixed = tasks.get("question_answering", dataclasses.replace(fc, null_score_threshold="1e6"))
    result, prediction = fixed.evaluate(model, splits["test"], data)
    assert result["null_score_threshold"] == 1e6
    assert prediction["null_score_threshold_source"] == "config"
    assert prediction["answers"] == {q: text for q, (text, _, _) in test_search.items()}


def test_v1_keeps_its_metric_and_both_versions_write_the_official_files(tmp_path,
                                                                         encoder_files):
    from models import preprocessor
    from pipeline.artifacts import FinetuneArtifacts
    from pipeline.text import vocab as vocab_lib
    from tests.test_finetune_serving import _task_model

    test = [e for e in qa_examples(random.Random(8), 3, "t") if e.answers]
    pre = preprocessor.TextPreprocessor(vocab_lib.read_vocab(encoder_files[1]), True, 24)
    fc = FinetuneConfig(task="question_answering", dataset="squad", max_seq_length=24,
                        max_query_length=6, doc_stride=8, n_best=10, max_answer_length=8)
    task = tasks.get("question_answering", fc)
    split = task.make_split(test, pre, None, False)
    data = readers.TaskData(train=[], validation=[], tests={"test": test}, labels=None)
    model = _task_model(encoder_files, "BertSpanExtractor", seed=3)
    result, prediction = task.evaluate(model, split, data)  # v1.1: evaluate-v1.1.py's keys
    assert set(result) == {"exact_match", "f1", "total"}
    assert prediction["answers"] == {q: text for q, (text, _, _) in
                                     _candidates(task, model, split).items()}
    out = FinetuneArtifacts(tmp_path / "v1")
    out.dir.mkdir()
    task.test_artifacts({"test": result}, {"test": prediction}, data, out, "qa")
    assert sorted(p.name for p in out.dir.iterdir()) == ["predictions.json"]
    assert json.loads((out.dir / "predictions.json").read_text()) == prediction["answers"]

    v2 = {"answers": {"a": "x", "b": ""}, "na_probs": {"a": 0.25, "b": 0.75}}
    out = FinetuneArtifacts(tmp_path / "v2")
    out.dir.mkdir()
    task.test_artifacts({}, {"test": v2, "test_other": v2}, data, out, "qa")
    assert sorted(p.name for p in out.dir.iterdir()) == [
        "na_prob.json", "predictions.json", "test_other_na_prob.json",
        "test_other_predictions.json"]
    assert json.loads((out.dir / "na_prob.json").read_text()) == v2["na_probs"]


def _candidates(task, model, split) -> dict:
    from pipeline.finetuning import features
    from pipeline.finetuning.tasks.base import predict_batch

    search = features.SpanSearch(split.examples, task.fc.n_best, task.fc.max_answer_length)
    for rows, x in task.batches(split, 8):
        out = predict_batch(model, x)
        search.add(out["start_logits"], out["end_logits"], rows)
    return search.candidates()


@pytest.mark.slow  # a tiny v2 fine-tune (one epoch), its export and MLflow
def test_squad_v2_fine_tune_saves_and_serves_the_validation_threshold(tmp_path, encoder_files,
                                                                      sqlite_mlflow):
    from pipeline.serving import export
    from pipeline.tools import predictor

    rng = random.Random(3)
    paragraphs = []
    for i in range(16):
        place = rng.choice(PLACES)
        context = f"{sentence(rng, ANIMALS)} The {rng.choice(ANIMALS)} sat near the {place}. " \
                  f"{sentence(rng, PLACES)}"
        start = context.index(f"the {place}.") + 4
        paragraphs.append({"context": context, "qas": [
            {"id": f"q{i}", "question": "where was it?",
             "answers": [{"text": place, "answer_start": start}]},
            {"id": f"n{i}", "question": "who saw London?", "answers": [],
             "is_impossible": True}]})
    squad = {"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]}
    (tmp_path / "squad.json").write_text(json.dumps(squad))
    config = make_config(tmp_path, encoder_files, "finetune.task=question_answering",
                         "finetune.dataset=squad", f"finetune.train_file={tmp_path}/squad.json",
                         "finetune.version_2=true", "finetune.max_query_length=6",
                         "finetune.doc_stride=8", "finetune.name=qa",
                         "finetune.validation_fraction=0.25", "finetune.test_fraction=0.25",
                         "finetune.random_init_baseline=false", "finetune.register_model=false",
                         "finetune.epochs=1",  # nothing here reads a second epoch
                         'data.beam_args=["--runner=FnApiRunner"]')  # no Prism download try
    with quiet(), mlflow.start_run(experiment_id=sqlite_mlflow[1]) as run:
        results = finetuning.fine_tune(config)
    folder = results["output_dir"]
    folder = Path(folder)
    info = json.loads((folder / "task.json").read_text())
    t = results["validation"]["null_score_threshold"]
    assert info["null_score_threshold"] == t == results["test"]["null_score_threshold"]
    assert info["null_score_threshold_source"] == "validation"
    assert results["validation"]["f1"] == pytest.approx(results["validation"]["best_f1"])

    # predictions.json + na_prob.json beside the model, scored as reported.
    predictions = json.loads((folder / "predictions.json").read_text(encoding="utf-8"))
    na_probs = json.loads((folder / "na_prob.json").read_text())
    rows = [json.loads(line) for line in
            (folder / "test_predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    gold = {r["id"]: r["gold"] for r in rows}
    assert set(predictions) == set(na_probs) == set(gold) and len(gold) >= 4
    rescored = official.evaluate_v2(gold, {q: bool(a) for q, a in gold.items()}, predictions,
                                    na_probs)
    assert {k: results["test"][k] for k in official.V2_KEYS} == pytest.approx(rescored)
    cut = official.na_probability(t, 0.0)  # answered iff null - span <= t iff na <= sigmoid(t)
    assert all((predictions[q] == "") == (na_probs[q] > cut) for q in gold)

    # The SavedModel answers with the saved threshold: "" exactly where null - span > t.
    questions = {r["id"]: r["question"] for r in rows}
    contexts = {e["id"]: p["context"] for p in paragraphs for e in p["qas"]}
    qids = sorted(gold)
    served = export.run_qa_model(export.load_saved_model(folder / "saved_model"),
                                 [questions[q] for q in qids], [contexts[q] for q in qids])
    for q, row in zip(qids, served):
        assert (row["answer"] == "") == (row["null_score"] - row["score"] > t), row
        assert row["answer"] == predictions[q]
    assert results["export_mismatches"] == 0
    # ... and across one question's null - span difference its answer flips: the saved
    # threshold is on one side, a module built with a threshold on the other side disagrees.
    i, row = next((i, r) for i, r in enumerate(served) if np.isfinite(r["score"]))
    d = row["null_score"] - row["score"]
    model, pre = predictor.Predictor(folder).keras_parts()
    other = d + 0.01 if d > t else d - 0.01
    module = tasks.get("question_answering").serving_module(
        model, pre, None, False, {**info, "null_score_threshold": other})
    flipped = export.run_qa_model(module.serve, [questions[qids[i]]], [contexts[qids[i]]])[0]
    assert (flipped["answer"] == "") != (row["answer"] == "")

    # A new process with the kept weights: told the kept epoch's validation result, its
    # evaluation of the test records answers as the run's did.
    from pipeline.finetuning import data as finetune_data
    from pipeline.finetuning import records

    data = finetune_data.load_task(config.finetune)
    task = tasks.get("question_answering", config.finetune)
    [features] = (Path(config.run_dir) / "finetune_features").iterdir()
    split = records.open_splits(features, task, {"test": data.test})["test"]
    task.keep(results["validation"])
    again, _ = task.evaluate(model, split, data)  # the reloaded model: float32 round-off
    assert again["null_score_threshold"] == pytest.approx(t, abs=1e-5)
    assert again == pytest.approx(results["test"], abs=1e-5)

    client = mlflow.MlflowClient()
    logged = client.get_run(run.info.run_id).data.metrics
    for key in official.V2_KEYS:
        assert logged[f"test_{key}"] == pytest.approx(results["test"][key]), key
    assert logged["validation_null_score_threshold"] == pytest.approx(t)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "finetune")}
    assert {"finetune/predictions.json", "finetune/na_prob.json"} <= artifacts
