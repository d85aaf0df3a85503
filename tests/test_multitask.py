"""The multitask stage on tiny fixtures: a topic classifier and a tagger share a 1-layer encoder;
the batch schedule follows the configured ratio, the loss weights reach the gradients, per-task
metrics and the single-task comparison are logged to MLflow."""

from __future__ import annotations

import dataclasses
import json
import random

import keras
import mlflow
import numpy as np
import pytest

from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.finetuning import multitask as multitask_lib
from pipeline.finetuning.context import TokenizerBundle
from pipeline.stages import multitask

from tests.test_distill import (killed_after_first_checkpoint, outage_metric_history, progress_lines,
                               run_through_an_outage)
from tests.test_finetune import ANIMALS, PLACES, encoder_files, sentence, sqlite_mlflow  # noqa: F401
from tests.test_finetune_data import WORDS
from tests.test_tracking_outage import store  # noqa: F401


def write_fixtures(tmp_path):
    rng = random.Random(0)
    rows = ["text,label"] + [f"{sentence(rng, ANIMALS if i % 2 else PLACES)},"
                             f"{'animal' if i % 2 else 'place'}" for i in range(60)]
    (tmp_path / "topic.csv").write_text("\n".join(rows) + "\n")
    lines = []
    for _ in range(40):
        for w in [rng.choice(WORDS[:20]) for _ in range(rng.randint(3, 6))]:
            lines.append(f"{w} {'ANI' if w in ANIMALS else ('LOC' if w in PLACES else 'O')}")
        lines.append("")
    (tmp_path / "tags.conll").write_text("\n".join(lines))


def make_config(tmp_path, encoder_files, *overrides, topic_weight=1.0, tags_weight=1.0,  # noqa: F811
                ratios=(1.0, 1.0)):
    model, vocab = encoder_files
    tasks = [{"name": "topic", "task": "classification", "dataset": "csv",
              "train_file": f"{tmp_path}/topic.csv", "weight": topic_weight,
              "sampling_ratio": ratios[0]},
             {"name": "tags", "task": "token_classification", "dataset": "conll",
              "train_file": f"{tmp_path}/tags.conll", "weight": tags_weight,
              "sampling_ratio": ratios[1], "max_seq_length": 16}]
    return config_lib.load(None, [
        f"run_dir={tmp_path}/run", f"finetune.init_from={model}", f"finetune.vocab_file={vocab}",
        "finetune.max_seq_length=24", "finetune.batch_size=8", "finetune.learning_rate=0.003",
        "finetune.baselines=false", "finetune.dropout=0.0", f"multitask.tasks={json.dumps(tasks)}",
        *overrides])


def test_schedule_follows_the_sampling_ratio():
    draws = np.array([int(i) for i in multitask_lib.task_schedule([3.0, 1.0, 1.0], seed=7).take(6000)])
    shares = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(shares, [0.6, 0.2, 0.2], atol=0.025)
    other = [int(i) for i in multitask_lib.task_schedule([1.0, 1.0], seed=8).take(4000)]
    assert abs(np.mean(other) - 0.5) < 0.03


def test_config_validation_names_the_key(tmp_path, encoder_files):  # noqa: F811
    write_fixtures(tmp_path)
    with pytest.raises(config_lib.ConfigError, match=r"tasks\[1\] \(tags\)\.sampling_ratio"):
        make_config(tmp_path, encoder_files, ratios=(1.0, 0.0))
    with pytest.raises(config_lib.ConfigError, match=r"tasks\[0\] \(topic\)\.learning_rate "
                                                     r"cannot differ per task"):
        config_lib.load(None, ['multitask.tasks=[{name: topic, learning_rate: 0.1}]'])
    with pytest.raises(config_lib.ConfigError, match="question_answering.*choose one of: "
                                                     "classification, regression"):
        config_lib.load(None, ['multitask.tasks=[{name: qa, task: question_answering, '
                               'dataset: squad, train_file: x.json}]'])
    with pytest.raises(config_lib.ConfigError, match="used twice"):
        config_lib.load(None, ['multitask.tasks=[{name: a}, {name: a}]'])


def _head_kernel(task):
    return np.array(task.model.get_layer("logits").kernel)


@pytest.mark.slow
def test_loss_weight_zero_leaves_its_head_unchanged(tmp_path, encoder_files):  # noqa: F811
    """weight 0: the topic head gets zero gradients (no weight decay here, so no change) while
    the tagger's head and the shared encoder train; weight 1: the topic head moves."""
    write_fixtures(tmp_path)
    kernels = {}
    for weight in (0.0, 1.0):
        config = make_config(tmp_path, encoder_files, "finetune.weight_decay=0.0",
                             topic_weight=weight)
        tokenizer = TokenizerBundle.read(encoder_files[1], True, 24)
        tasks = multitask_lib.load_tasks(config, tokenizer)
        keras.utils.set_random_seed(0)
        from pipeline.finetuning import task_model

        backbone = task_model.load_backbone(encoder_files[0])
        multitask_lib.build_models(tasks, backbone, config.finetune, 12)
        before = {t.name: _head_kernel(t) for t in tasks}
        embedding = np.array(backbone.get_layer("token_embedding").embeddings)
        trained = multitask_lib.train_mixed(tasks, 12, dataclasses.replace(config.finetune,
                                                                           seed=0))
        assert trained["batches"]["topic"] > 0 and trained["batches"]["tags"] > 0
        kernels[weight] = {t.name: np.abs(_head_kernel(t) - before[t.name]).max() for t in tasks}
        kernels[weight]["encoder"] = np.abs(
            np.array(backbone.get_layer("token_embedding").embeddings) - embedding).max()
    assert kernels[0.0]["topic"] == 0.0
    assert kernels[0.0]["tags"] > 1e-4 and kernels[0.0]["encoder"] > 1e-4
    assert kernels[1.0]["topic"] > 1e-4


@pytest.mark.slow
def test_stage_logs_per_task_metrics_and_the_single_task_comparison(tmp_path, encoder_files,  # noqa: F811
                                                                   sqlite_mlflow):  # noqa: F811
    write_fixtures(tmp_path)
    config = make_config(tmp_path, encoder_files, "multitask.steps=24", "multitask.name=mt",
                         ratios=(3.0, 1.0))
    _, experiment = sqlite_mlflow
    with mlflow.start_run(experiment_id=experiment) as run:
        results = multitask.run(config)
    assert sum(results["batches"].values()) == 24
    assert results["batches"]["topic"] > results["batches"]["tags"]  # 3:1 on 24 draws
    assert set(results["multitask"]["topic"]["test"]) >= {"accuracy", "macro_f1"}
    assert "f1" in results["multitask"]["tags"]["test"]
    rows = {r["task"]: r for r in results["comparison"]}
    for name, metric in (("topic", "accuracy"), ("tags", "f1")):
        assert rows[name]["metric"] == metric
        assert rows[name]["delta"] == pytest.approx(
            results["multitask"][name]["test"][metric]
            - results["single_task"][name]["test"][metric])

    client = mlflow.MlflowClient()
    logged = client.get_run(run.info.run_id).data
    assert {"topic.test_accuracy", "tags.test_f1", "topic.validation_accuracy",
            "topic.delta_test_accuracy", "tags.delta_test_f1", "topic.batches",
            "tags.train_loss"} <= set(logged.metrics)
    assert logged.metrics["topic.test_accuracy"] == pytest.approx(
        results["multitask"]["topic"]["test"]["accuracy"])
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    assert sorted(c.data.tags["multitask.task"] for c in children) == ["tags", "topic"]
    for child in children:
        name = child.data.tags["multitask.task"]
        metric = rows[name]["metric"]
        assert child.data.metrics[f"{name}.test_{metric}"] == pytest.approx(
            rows[name]["single_task"])
        assert child.data.params["multitask.total_steps"] == "24"
    logged = {a.path for a in client.list_artifacts(run.info.run_id, "multitask")}
    assert {"multitask/comparison.md", "multitask/comparison.json"} <= logged

    paths = artifacts.Artifacts(config.run_dir).multitask("mt")
    table = paths.comparison_md.read_text()
    assert "| topic | classification | accuracy |" in table
    for name in ("topic", "tags"):
        folder = paths.task(name)
        assert folder.model_keras.is_file() and folder.task_json.is_file()
    assert paths.task("topic").saved_model.is_dir()
    # The saved task model reloads and gives the outputs evaluated above.
    model = keras.models.load_model(paths.task("tags").model_keras, compile=False)
    assert model.get_layer("logits").units == 3  # O, ANI, LOC


@pytest.mark.slow
def test_cli_runs_the_stage_and_reports_a_missing_task_list(tmp_path, capsys):
    from pipeline import cli

    assert {"multitask", "distill"} <= set(cli.EXTRA_STAGES)
    code = cli.main(["multitask", f"run_dir={tmp_path}/run",
                     f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db"])
    assert code == cli.EXIT_BAD_INPUT
    assert "multitask.tasks is empty" in capsys.readouterr().err
    code = cli.main(["multitask", f"run_dir={tmp_path}/run",
                     "multitask.tasks=[{name: a, weight: -2}]"])
    assert code == cli.EXIT_BAD_INPUT
    assert "multitask.tasks[0] (a).weight = -2.0" in capsys.readouterr().err


def test_shipped_configs_load():
    config = config_lib.load("configs/multitask_brown.yaml")
    tasks = config_lib.multitask_tasks(config)
    assert [(t.name, t.finetune.task, t.finetune.dataset) for t in tasks] == [
        ("genre", "classification", "brown_genre"), ("pos", "token_classification", "brown_pos")]
    assert tasks[0].finetune.learning_rate == config.finetune.learning_rate
    assert tasks[1].finetune.max_seq_length == 96
    distill_config = config_lib.load("configs/distill_brown.yaml")
    assert distill_config.distill.teacher.endswith("finetune/brown_genre")


@pytest.mark.slow  # three runs of the stage, outputs written
def test_multitask_prints_progress_resumes_after_a_kill_and_loses_nothing_in_an_outage(
        tmp_path, encoder_files, store, monkeypatch):  # noqa: F811
    """The uninterrupted run, with the tracking store down throughout: fine-tuning's progress
    and epoch lines; once the store answers, every logged step and final figure is there. A run
    killed after its first checkpoint (update 3, inside epoch 1) and started again resumes there
    and ends with the uninterrupted run's batches, history and metrics."""
    from tests.conftest import PipelineLines

    write_fixtures(tmp_path)
    uri, run_id = store

    def config(name):
        return make_config(tmp_path, encoder_files, "multitask.steps=24", f"multitask.name={name}",
                           "multitask.compare_single_task=false", "finetune.checkpoint_every=3")

    straight, lines, sent = run_through_an_outage(uri, run_id,
                                                  lambda: multitask.run(config("straight")))
    assert sent > 5
    steps, epochs = progress_lines(lines, "multitask")
    assert steps == [10, 20], lines
    assert epochs == [e["step"] for e in straight["history"]] and epochs[-1] == 24, lines
    assert sum(straight["batches"].values()) == 24
    assert outage_metric_history(run_id, "train_loss") == sorted(steps + epochs)
    assert outage_metric_history(run_id, "tags.train_loss") == epochs
    logged = mlflow.MlflowClient().get_run(run_id).data
    assert logged.metrics["topic.test_accuracy"] == straight["multitask"]["topic"]["test"][
        "accuracy"]
    assert logged.metrics["tags.batches"] == straight["batches"]["tags"]
    assert logged.params["multitask.total_steps"] == "24"
    assert "multitask/metrics.json" in [
        a.path for a in mlflow.MlflowClient().list_artifacts(run_id, "multitask")]

    killed_after_first_checkpoint(monkeypatch, lambda: multitask.run(config("resumed")))
    checkpoints = tmp_path / "run" / "multitask" / ".checkpoints" / "resumed" / "mixed"
    assert [p.name for p in checkpoints.glob("ckpt-*")] == ["ckpt-00000003"]
    with PipelineLines() as lines:
        resumed = multitask.run(config("resumed"))
    assert "multitask: resuming from ckpt-00000003 (step 3 of 24, epoch 1)" in lines
    for key in ("batches", "history", "multitask", "best_epoch"):
        assert resumed[key] == straight[key], key  # exact
    assert not checkpoints.exists()  # removed once the output folder is complete
