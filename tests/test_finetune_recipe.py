"""`finetune.recipe: auto` and `finetune.max_seconds` on a tiny encoder: the search tries the
grid on the validation split only and the final run trains the choice; the time budget stops
training, is shared between the search and the final run, and skips points it cannot start;
a validation split too small to choose on falls back to the config's values; bad grids exit 2.
"""

from __future__ import annotations

import json
import random

import mlflow
import pytest

from pipeline import artifacts, cli
from pipeline import config as config_lib
from pipeline.finetuning import recipe
from pipeline.finetuning import train as finetuning

from tests.test_finetune import (  # noqa: F401 (fixtures)
    ANIMALS,
    PLACES,
    encoder_files,
    make_config,
    quiet,
    sentence,
    sqlite_mlflow,
)


def write_topic_csv(path, rows: int, seed: int = 0):
    """A two-label CSV (animal / place sentences) of `rows` rows; the splits take 10% + 10%."""
    rng = random.Random(seed)
    lines = ["text,label"] + [f"{sentence(rng, ANIMALS if i % 2 else PLACES)},"
                              f"{'animal' if i % 2 else 'place'}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def topic_config(tmp_path, encoder_files, rows: int, *overrides):
    train = write_topic_csv(tmp_path / "train.csv", rows)
    return make_config(tmp_path, encoder_files, "finetune.dataset=csv",
                       f"finetune.train_file={train}", "finetune.name=topic",
                       "finetune.export=false", "finetune.register_model=false",
                       "finetune.random_init_baseline=false", *overrides)


@pytest.mark.slow  # 45-65 s on 2 shared cores: four fine-tunings
def test_recipe_auto_chooses_on_validation_and_the_final_run_uses_the_choice(
        tmp_path, encoder_files, sqlite_mlflow, pipeline_lines):
    """Three learning rates, each up to 2 epochs: the chosen point is the argmax of the
    recorded validation values (not of anything test-related: the points never evaluate
    test), its best epoch is the epoch count, and the final run (baselines, outputs) uses
    them; metrics.json and the stage's MLflow run say what was tried and chosen."""
    config = topic_config(tmp_path, encoder_files, 120, "finetune.recipe=auto", "finetune.epochs=2",
                          'finetune.recipe_learning_rates=["1e-5", "1e-3", "1e-2"]')
    _, experiment = sqlite_mlflow
    with mlflow.start_run(experiment_id=experiment) as run, quiet():
        results = recipe.fine_tune_as_configured(config)
    report = results["recipe"]
    points = report["points"]
    assert [p["learning_rate"] for p in points] == [1e-5, 1e-3, 1e-2]
    values = [p["validation_accuracy"] for p in points]
    best = points[values.index(max(values))]  # the first of equals, as the search keeps it
    assert report["learning_rate"] == best["learning_rate"]
    assert report["epochs"] == best["best_epoch"]
    for p in points:  # each point's value is its best epoch's, which is the epoch kept
        assert 1 <= p["best_epoch"] <= 2 and p["trained_steps"] == p["planned_steps"] == 2 * 12
        assert p["validation_accuracy"] == max(p["validation_by_epoch"])
        assert p["validation_by_epoch"][p["best_epoch"] - 1] == p["validation_accuracy"]
        assert not p["stopped_for_time"]
    # The final run: the chosen learning rate and epochs (96 training rows / batch 8).
    assert results["learning_rate"] == best["learning_rate"]
    assert results["planned_steps"] == best["best_epoch"] * 12
    assert len(results["history"]) == best["best_epoch"]
    assert "test" in results and "tfidf_svm" in results["baselines"]
    line = report["line"]
    assert line.startswith(f"recipe auto chose learning_rate {best['learning_rate']:g}, "
                           f"{best['best_epoch']} epoch(s) (validation accuracy "
                           f"{best['validation_accuracy']:.4f}; tried 3 point(s) in ")
    assert f"finetune: {line}" in pipeline_lines
    cli._summary(config, artifacts.Artifacts(config.run_dir), {"finetune": results})
    assert f"  recipe       {line.removeprefix('recipe auto ')}" in pipeline_lines  # the CLI's
    written = json.loads(artifacts.Artifacts(config.run_dir).finetune("topic").metrics.read_text())
    assert written["recipe"]["learning_rate"] == best["learning_rate"]
    assert [p["validation_accuracy"] for p in written["recipe"]["points"]] == values
    # MLflow: one nested run per point, validation metrics only; the choice on the stage's run.
    client = mlflow.MlflowClient()
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    assert len(children) == 3
    for child in children:
        assert child.data.tags["pipeline.stage"] == "finetune-recipe"
        assert "validation_accuracy" in child.data.metrics
        assert not [k for k in child.data.metrics if k.startswith(("test_", "baseline_"))]
    logged = client.get_run(run.info.run_id)
    assert logged.data.tags["finetune.recipe"] == line
    assert float(logged.data.tags["finetune.recipe.learning_rate"]) == best["learning_rate"]
    assert logged.data.metrics["recipe_validation_accuracy"] == best["validation_accuracy"]
    assert logged.data.metrics["recipe_points_tried"] == 3
    assert "test_accuracy" in logged.data.metrics  # the final run's, on the stage's run


def test_max_seconds_stops_training_and_keeps_the_best_epoch(tmp_path, encoder_files):
    """200 epochs of 16 updates would take minutes; a 3-second budget stops training early,
    the interrupted epoch is evaluated, and the results say so."""
    config = topic_config(tmp_path, encoder_files, 160, "finetune.epochs=200",
                          "finetune.max_seconds=3", "finetune.baselines=false")
    with quiet():
        results = finetuning.fine_tune(config, write_outputs=False)
    assert results["stopped_for_time"] is True
    assert results["planned_steps"] == 200 * 16
    assert 0 < results["trained_steps"] < results["planned_steps"]
    assert results["trained_steps"] == results["history"][-1]["step"]
    assert len(results["history"]) < 200
    values = [h["val_accuracy"] for h in results["history"]]
    assert results["validation"]["accuracy"] == max(values)
    assert results["best_epoch"] == values.index(max(values)) + 1


def test_recipe_auto_shares_the_budget_and_skips_points_it_cannot_start(
        tmp_path, encoder_files, monkeypatch, pipeline_lines):
    """With max_seconds the search gets recipe_search_fraction of it and the final run the
    rest; points that cannot start are skipped, and with none started the config's values are
    used (a point is made unable to start by raising the seconds a point needs)."""
    config = topic_config(tmp_path, encoder_files, 160, "finetune.recipe=auto",
                          "finetune.epochs=200", "finetune.max_seconds=8",
                          "finetune.recipe_search_fraction=0.5", "finetune.baselines=false",
                          'finetune.recipe_learning_rates=["1e-3", "1e-2"]')
    with quiet():
        choice = recipe.choose(config)
    points = choice.report["points"]
    assert len(points) == 2 and "best_epoch" in points[0]  # the first point always starts
    assert points[0]["stopped_for_time"] and points[0]["trained_steps"] < 200 * 16
    for p in points[1:]:
        assert "best_epoch" in p or p["skipped"] == "the search's budget is spent"
    tried = [p for p in points if "best_epoch" in p]
    values = [p["validation_accuracy"] for p in tried]
    best = tried[values.index(max(values))]  # the argmax of the validation values
    assert (choice.config.finetune.learning_rate, choice.config.finetune.epochs) == \
        (best["learning_rate"], best["best_epoch"])
    assert choice.config.finetune.max_seconds >= 4.0  # the final run's share, at least
    assert choice.config.finetune.max_seconds == choice.report["final_max_seconds"]
    assert choice.config.finetune.recipe == "fixed"

    monkeypatch.setattr(recipe, "MIN_POINT_SECONDS", 1e9)
    with quiet():
        choice = recipe.choose(config)
    assert [p.get("skipped") for p in choice.report["points"]] == \
        ["the search's budget is spent"] * 2
    assert choice.config.finetune.learning_rate == 0.001 and choice.config.finetune.epochs == 200
    assert "no point started" in choice.report["fallback"]
    assert any("recipe auto: point 2/2 (learning_rate 0.01) skipped" in line
               for line in pipeline_lines)
    assert any("no point could start within the search's 4 s" in line for line in pipeline_lines)


def test_recipe_auto_falls_back_on_a_tiny_validation_split(tmp_path, encoder_files,
                                                           pipeline_lines):
    """40 rows: 4 validation examples, fewer than 10: no point is tried, the config's learning
    rate and epochs are used, and one warning names the split."""
    config = topic_config(tmp_path, encoder_files, 40, "finetune.recipe=auto",
                          "finetune.baselines=false")
    with quiet():
        choice = recipe.choose(config)
    assert choice.report["points"] == [] and "4 example(s)" in choice.report["fallback"]
    assert choice.config.finetune.learning_rate == 0.001 and choice.config.finetune.epochs == 2
    warnings = [line for line in pipeline_lines if "too small to choose a learning rate" in line]
    assert len(warnings) == 1
    assert "the validation split of" in warnings[0] and "train.csv" in warnings[0]
    assert "finetune.validation_fraction = 0.1" in warnings[0]


@pytest.mark.parametrize("value,expected", [
    ("[]", "finetune.recipe_learning_rates is empty"),
    ('["1e-4", "fast"]', "item 'fast' is not a learning rate"),
    ('["0.5"]', "item '0.5' is not a learning rate"),
    ("[-1e-4]", "is not a learning rate"),
])
def test_a_bad_grid_is_one_line_and_exit_2(tmp_path, capsys, value, expected):
    code = cli.main(["finetune", f"run_dir={tmp_path}/run", "finetune.recipe=auto",
                     f"finetune.recipe_learning_rates={value}"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    with pytest.raises(config_lib.ConfigError, match="recipe_search_fraction"):
        config_lib.load(None, ["finetune.recipe_search_fraction=1.5"])
