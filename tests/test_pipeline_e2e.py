"""End to end: a corpus written by the test → corpus → vocab → Beam → a few training steps →
checkpoint → resume → held-out eval → export, tracked in a real MLflow store."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import mlflow
import numpy as np
import pytest

from pipeline import artifacts, cli

from tests.conftest import make_corpus

PROJECT = artifacts.PROJECT_ROOT


def overrides(tmp_path, corpus_dir):
    return [f"run_dir={tmp_path / 'run'}", f"corpus.path={corpus_dir}/*.txt",
            f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            "tracking.experiment=e2e", "tracking.attention_maps=true"]


def runs_of(tmp_path):
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("e2e")
    return client, client.search_runs([experiment.experiment_id], order_by=["attributes.start_time"])


def test_fast_end_to_end_with_resume(tmp_path, corpus_dir, capsys):
    args = overrides(tmp_path, corpus_dir)
    assert cli.main(["all", "--config", "configs/test_tiny.yaml", *args]) == 0
    out = capsys.readouterr().out
    assert "held-out MLM accuracy" in out and "MLflow store" in out
    paths = artifacts.Artifacts(tmp_path / "run")
    for path in (paths.vocab_file, paths.data_stats, paths.model_keras, paths.saved_model,
                 paths.pretrain_eval, paths.pretrain_config):
        assert path.exists(), path
    assert len(paths.shards("train")) == 2 and len(paths.shards("eval")) == 1
    assert sorted(p.name for p in paths.checkpoint_dir.glob("ckpt-*")) == [  # + random state
        "ckpt-00000003.seeds.json", "ckpt-00000003.weights.h5", "ckpt-00000006.seeds.json",
        "ckpt-00000006.weights.h5"]
    first_eval = json.loads(paths.pretrain_eval.read_text())
    assert first_eval["step"] == 6
    assert 0.0 <= first_eval["eval_mlm_accuracy"] <= 1.0
    # Time to accuracy: the held-out probe every 3 steps (test_tiny.yaml) and at the end.
    heldout = json.loads(paths.heldout_curve.read_text())
    assert [step for step, _, _ in heldout["curve"]] == [3, 6]
    assert all(0.0 <= accuracy <= 1.0 and seconds > 0 for _, seconds, accuracy in heldout["curve"])

    client, runs = runs_of(tmp_path)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1
    assert sorted(r.data.tags["pipeline.stage"] for r in children) == [
        "corpus", "data", "pretrain", "vocab"]
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in children)
    pretrain_run = next(r for r in children if r.data.tags["pipeline.stage"] == "pretrain")
    assert pretrain_run.data.params["train.steps"] == "6"
    assert pretrain_run.data.params["train.onednn"] == "True"  # pipeline/__init__.py
    history = client.get_metric_history(pretrain_run.info.run_id, "loss")
    assert [m.step for m in history] == [2, 4, 6]
    probes = client.get_metric_history(pretrain_run.info.run_id, "heldout_mlm_accuracy")
    assert [m.step for m in probes] == [3, 6]
    assert "train_seconds" in pretrain_run.data.metrics
    for key in ("learning_rate", "tokens_per_second", "mlm_accuracy", "nsp_accuracy",
                "eval_mlm_accuracy", "eval_nsp_accuracy"):
        assert key in pretrain_run.data.metrics, key
    artifacts_logged = {a.path for a in client.list_artifacts(pretrain_run.info.run_id, "model")}
    assert "model/model.keras" in artifacts_logged
    plots = {a.path for a in client.list_artifacts(pretrain_run.info.run_id, "plots")}
    assert "plots/training_curves.png" in plots
    attention = [a.path for a in client.list_artifacts(pretrain_run.info.run_id, "plots/attention")]
    assert attention and all(p.endswith(".png") for p in attention)

    # Re-run with other schedule settings: the checkpoints belong to the old ones, so the
    # stage refuses (exit 2, naming the keys) and changes nothing.
    before = sorted(p.name for p in paths.checkpoint_dir.iterdir())
    assert cli.main(["all", "--config", "configs/test_tiny.yaml", *args, "train.steps=9",
                     "train.learning_rate=0.0005"]) == 2
    err = capsys.readouterr().err
    assert "train.steps: 6 -> 9" in err and "train.learning_rate" in err and "--force" in err
    assert sorted(p.name for p in paths.checkpoint_dir.iterdir()) == before
    assert json.loads(paths.pretrain_eval.read_text())["step"] == 6
    # --force: the upstream stages are reused, the old checkpoints are set aside (not deleted)
    # and training starts over under the new settings, in a new MLflow run that records them.
    assert cli.main(["pretrain", "--force", "--config", "configs/test_tiny.yaml", *args,
                     "train.steps=9", "train.learning_rate=0.0005"]) == 0
    out = capsys.readouterr().out
    assert "kept aside" in out and "resuming" not in out
    aside = list(paths.pretrain_dir.glob("checkpoints.aside-*"))
    assert len(aside) == 1 and sorted(
        p.name for p in (aside[0] / "checkpoints").glob("ckpt-*.weights.h5")) == [
        "ckpt-00000003.weights.h5", "ckpt-00000006.weights.h5"]
    assert json.loads(paths.pretrain_eval.read_text())["step"] == 9
    _, runs = runs_of(tmp_path)
    pretrain_runs = [r for r in runs if r.data.tags.get("pipeline.stage") == "pretrain"]
    # The refused run is recorded as FAILED, with no model; the two trainings, each with the
    # parameters that produced its model.
    assert [r.info.status for r in pretrain_runs].count("FAILED") == 1
    pretrain_runs = [r for r in pretrain_runs if r.info.status == "FINISHED"]
    assert len(pretrain_runs) == 2 and pretrain_runs[0].info.run_id != pretrain_runs[1].info.run_id
    rates = sorted(r.data.params["train.learning_rate"] for r in pretrain_runs)
    assert rates == ["0.0005", "0.001"]
    # A re-run with the settings of the checkpoints resumes (nothing left to train here).
    assert cli.main(["pretrain", "--config", "configs/test_tiny.yaml", *args, "train.steps=9",
                     "train.learning_rate=0.0005"]) == 0
    assert "pretrain: up to date" in capsys.readouterr().out


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One `all` run of configs/test_tiny.yaml (3 steps) for the tests that read a finished
    run and change nothing in it: (its folder, its overrides)."""
    root = tmp_path_factory.mktemp("finished")
    make_corpus(root / "raw")
    args = overrides(root, root / "raw")
    assert cli.main(["all", "--config", "configs/test_tiny.yaml", *args, "train.steps=3"]) == 0
    return root, args


@pytest.mark.slow
def test_exported_models_reload_with_same_outputs(finished_run):
    import keras
    import tensorflow as tf

    import models  # noqa: F401  (registers the custom classes for loading)
    from pipeline.training import inputs

    root, args = finished_run
    paths = artifacts.Artifacts(root / "run")
    x, _, _ = next(iter(inputs.pretraining_dataset(paths.shard_pattern("eval"), 4, 32, 5,
                                                   training=False)))
    reloaded = keras.saving.load_model(str(paths.model_keras))
    expected = reloaded(x, training=False)
    saved = tf.saved_model.load(str(paths.saved_model))
    served = saved.serve(x)
    for name in ("mlm", "nsp"):
        np.testing.assert_allclose(np.asarray(served[name]), np.asarray(expected[name]),
                                   atol=1e-5)
    # And the reloaded model is the trained one (its weights equal the last checkpoint's).
    from pipeline import config as config_lib
    from pipeline.training import pretrainer

    config = config_lib.load("configs/test_tiny.yaml", args)
    vocabulary_size = len(paths.vocab_file.read_text().splitlines())
    fresh = pretrainer.build_model(config, vocabulary_size)
    fresh.compile(optimizer=pretrainer.build_optimizer(config.train))
    fresh.optimizer.build(fresh.trainable_variables)
    fresh.load_weights(str(paths.checkpoint_dir / "ckpt-00000003.weights.h5"))
    np.testing.assert_allclose(np.asarray(fresh(x, training=False)["mlm"]),
                               np.asarray(expected["mlm"]), atol=1e-5)


def run_cli(*args, cwd=PROJECT):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_missing_previous_stage_exits_2_with_message(tmp_path, corpus_dir):
    result = run_cli("data", "--config", "configs/test_tiny.yaml", *overrides(tmp_path, corpus_dir))
    assert result.returncode == 2, result.stderr
    assert "the prepared corpus not found" in result.stderr and "make corpus" in result.stderr
    assert not (tmp_path / "run" / "data").exists()


def test_bad_config_exits_2_naming_the_key(tmp_path, corpus_dir):
    result = run_cli("all", "--config", "configs/test_tiny.yaml", *overrides(tmp_path, corpus_dir),
                     "model.num_heads=3")
    assert result.returncode == 2
    assert "model.num_heads = 3" in result.stderr and "divisible" in result.stderr
    result = run_cli("all", "--config", "configs/test_tiny.yaml", *overrides(tmp_path, corpus_dir),
                     "data.max_seq_length=128")
    assert result.returncode == 2
    assert "data.max_seq_length = 128" in result.stderr and "position table" in result.stderr
    assert not (tmp_path / "run").exists() or not (tmp_path / "run" / "corpus").exists()


@pytest.mark.slow  # reads the module's finished run (a whole pipeline)
def test_vocab_without_mask_stops_data_stage(tmp_path, finished_run, capsys):
    """A prepared corpus and a vocab without [MASK] (the finished run's, copied): the data stage
    stops with exit 2 and one line, and makes no data folder. Edited after the vocab stage, the
    vocab is refused as altered; written that way (its checksums agree), for its missing token."""
    root, _ = finished_run
    for stage in ("corpus", "vocab"):
        shutil.copytree(root / "run" / stage, tmp_path / "run" / stage)
    args = overrides(tmp_path, root / "raw")
    paths = artifacts.Artifacts(tmp_path / "run")
    tokens = [t for t in paths.vocab_file.read_text().splitlines() if t != "[MASK]"]
    paths.vocab_file.write_text("\n".join(tokens) + "\n")
    capsys.readouterr()
    assert cli.main(["data", "--config", "configs/test_tiny.yaml", *args]) == 2
    err = capsys.readouterr().err
    assert "vocab.txt" in err and "altered" in err and "rebuild it" in err, err
    assert "[MASK]" not in err
    artifacts.write_checksums(paths.vocab_dir)
    assert cli.main(["data", "--config", "configs/test_tiny.yaml", *args]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "has no [MASK] token" in errors[0], errors
    assert not paths.data_dir.exists()


@pytest.mark.slow
def test_demo_config_pipeline_on_brown_runs_briefly(tmp_path):
    """The shipped default config on the real demo corpus, shortened: every stage runs."""
    if not artifacts.BROWN_TARBALL.exists():
        pytest.fail(f"{artifacts.BROWN_TARBALL} missing: run `make setup` first")
    args = [f"run_dir={tmp_path / 'run'}", f"tracking.tracking_uri=sqlite:///{tmp_path / 'm.db'}",
            "train.steps=40", "train.warmup_steps=10", "train.checkpoint_every=20",
            "train.log_every=20", "train.eval_batches=5", "data.dupe_factor=1"]
    assert cli.main(["all", "--config", "configs/pretrain_tiny.yaml", *args]) == 0
    stats = json.loads(artifacts.Artifacts(tmp_path / "run").data_stats.read_text())
    assert stats["train"]["documents"] > 400 and stats["train"]["instances"] > 10_000
    assert 0.4 < stats["train"]["nsp_random_fraction"] < 0.6
