"""The fine-tuning task registry (pipeline/finetuning/tasks/): one class per task, nothing
outside the package compares a task name, and a new task is one file that the config, the
finetune stage and `make predict` accept without other changes."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.config import task_registry
from pipeline.finetuning import tasks
from pipeline.finetuning import train as finetuning
from pipeline.finetuning.tasks.classification import Classification
from pipeline.tools import predictor
from tests.test_finetune import ANIMALS, PLACES, encoder_files, make_config, sentence  # noqa: F401

PIPELINE = Path(artifacts.PROJECT_ROOT) / "pipeline"
TASK_PACKAGE = PIPELINE / "finetuning" / "tasks"


def test_the_built_in_tasks_are_registered_in_order():
    assert tasks.names() == ("classification", "regression", "token_classification",
                             "question_answering", "semantic_search")
    for name in tasks.names():
        task = tasks.get(name)
        assert task.name == name and isinstance(task, tasks.FinetuneTask)
        assert task.datasets, name
    with pytest.raises(ValueError, match="not a fine-tuning task; choose one of: classification"):
        tasks.get("summarization")


def test_no_task_name_comparison_outside_the_task_package():
    """The issue's check (`grep "task ==\\|task in ("`), and any comparison with a registered
    task's name as a string literal."""
    names = "|".join(re.escape(n) for n in tasks.names())
    patterns = [re.compile(r"task\s*(==|!=)"), re.compile(r"task\s+(not\s+)?in\s*\("),
                re.compile(rf"""(==|!=)\s*["']({names})["']"""),
                re.compile(rf"""["']({names})["']\s*(==|!=)""")]
    offenders = []
    for path in PIPELINE.rglob("*.py"):
        if TASK_PACKAGE in path.parents:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if any(p.search(line) for p in patterns):
                offenders.append(f"{path.relative_to(PIPELINE.parent)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_config_validation_asks_the_task():
    def error(*overrides):
        with pytest.raises(config_lib.ConfigError) as err:
            config_lib.load(None, list(overrides))
        return str(err.value)

    assert "finetune.task = 'summarization' is not allowed; choose one of: classification, " \
           "regression, token_classification, question_answering, semantic_search" in \
        error("finetune.task=summarization")
    # the tasks' own rules (check_config), each named as one line
    assert "does not fit GLUE task 'sts-b'; use task regression" in error(
        "finetune.dataset=glue", "finetune.glue_task=sts-b", "finetune.glue_dir=x")
    assert "max_query_length = 62 leaves no room" in error(
        "finetune.task=question_answering", "finetune.dataset=squad", "finetune.train_file=x",
        "finetune.max_seq_length=64", "finetune.max_query_length=62")
    assert "applies to single-text classification only" in error(
        "finetune.task=regression", "finetune.dataset=csv", "finetune.train_file=x",
        "finetune.long_doc_aggregation=mean")


@pytest.fixture
def toy_task():
    """A new task in one class: classification whose label is the text's first letter's
    vowel-ness, registered for the test and removed afterwards."""

    @tasks.register
    class FirstWordTopic(Classification):
        name = "first_word_topic"
        datasets = ("csv",)
        windows = False
        multitask = False
        distillable = False

        def read_file(self, path, fc):
            examples = super().read_file(path, fc)
            for e in examples:  # the label comes from the text itself
                e.label = "animal" if e.text.split()[0].lower().strip(".") in ANIMALS else "other"
            return examples

    yield FirstWordTopic
    task_registry.remove("first_word_topic")


@pytest.mark.slow
def test_a_new_task_is_one_class(tmp_path, encoder_files, toy_task):
    """Registering the class is all it takes: the config accepts it (with its own datasets),
    the finetune stage trains, evaluates and exports it, `make predict` answers with it."""
    with pytest.raises(config_lib.ConfigError, match="cannot feed finetune.task = "
                                                     "'first_word_topic'; choose one of: csv"):
        config_lib.load(None, ["finetune.task=first_word_topic", "finetune.dataset=tsv",
                               "finetune.train_file=x"])
    with pytest.raises(ValueError):  # two tasks cannot share a name
        tasks.register(type("Other", (Classification,), {"name": "first_word_topic"}))
    rng = random.Random(0)
    rows = ["text,label"] + [f"{sentence(rng, ANIMALS if i % 2 else PLACES)},x" for i in range(60)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    config = make_config(tmp_path, encoder_files, "finetune.task=first_word_topic",
                         "finetune.dataset=csv", f"finetune.train_file={tmp_path}/train.csv",
                         "finetune.name=toy", "finetune.epochs=1", "finetune.baselines=false",
                         "finetune.register_model=false")
    results = finetuning.fine_tune(config)
    assert results["task"] == "first_word_topic"
    assert results["export_max_abs_diff"] < 1e-5
    info = json.loads(artifacts.FinetuneArtifacts(results["output_dir"]).task_json.read_text())
    assert info["task"] == "first_word_topic" and info["labels"] == ["animal", "other"]
    rows = predictor.Predictor(results["output_dir"]).texts(["Cat sat by the river."])
    assert rows[0]["label"] in ("animal", "other") and set(rows[0]["scores"]) == {"animal",
                                                                                  "other"}


def test_a_task_missing_an_abstract_method_cannot_be_made():
    class Incomplete(tasks.FinetuneTask):
        name = "incomplete"

        def make_split(self, examples, pre, labels, pair):
            return None

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()
    with pytest.raises(ValueError, match="no raw-text SavedModel"):
        tasks.FinetuneTask.serving_module(tasks.get("classification"), None, None, None, False, {})
