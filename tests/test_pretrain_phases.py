"""Two-phase pretraining (data.phases + train.phases) and resuming a training into the MLflow
run it started, both through the CLI's tracking (pipeline/cli.py) on a SQLite store.

The records are synthetic (test_training.write_pretraining_data); phase 2 has longer
sequences than phase 1, as in BERT's 128 → 512 recipe.
"""

from __future__ import annotations

import json
import shutil

import mlflow
import numpy as np
import pytest

from pipeline import artifacts, cli
from pipeline import config as config_lib
from pipeline.stages import pretrain
from pipeline.training import checkpoints, loop, pretrainer

import test_training
from test_training import die_after_checkpoint, tiny_config, write_pretraining_data
from tests.conftest import PipelineLines

PHASES = [(32, 5), (48, 7)]


def write_phase_data(run_dir) -> None:
    """data/phase1/ (32/5) and data/phase2/ (48/7) and a stats.json as the data stage writes
    them with data.phases = ["32/5", "48/7"]."""
    paths = artifacts.Artifacts(run_dir)
    stats = {"phases": []}
    seq, predictions = test_training.SEQ, test_training.PREDICTIONS
    try:
        for index, (test_training.SEQ, test_training.PREDICTIONS) in enumerate(PHASES, start=1):
            scratch = run_dir.parent / f"{run_dir.name}-phase{index}"
            write_pretraining_data(scratch, seed=index)
            made = json.loads(artifacts.Artifacts(scratch).data_stats.read_text())
            paths.data_phase_dir(index).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(artifacts.Artifacts(scratch).data_dir), paths.data_phase_dir(index))
            paths.vocab_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy(artifacts.Artifacts(scratch).vocab_file, paths.vocab_file)
            stats["phases"].append({"name": f"phase{index}", "dir": f"phase{index}",
                                    **made["settings"], "train": made["train"],
                                    "eval": made["eval"]})
            if index == 1:
                stats.update(made)
            shutil.rmtree(scratch)
    finally:
        test_training.SEQ, test_training.PREDICTIONS = seq, predictions
    paths.data_stats.write_text(json.dumps(stats))


def phase_config(tmp_path, *extra):
    return tiny_config(
        tmp_path / "run", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        "tracking.experiment=phases", 'data.phases=["32/5", "48/7"]',
        "train.phases=[{steps: 4, checkpoint_every: 2, learning_rate: 2e-3, warmup_steps: 1},"
        " {steps: 2, checkpoint_every: 1, batch_size: 4, learning_rate: 5e-4, warmup_steps: 1}]",
        *extra)


def fake_export(monkeypatch, exported):
    """The SavedModel export (~10 s) and the review plots are tested elsewhere; record the
    digest of the model that would be exported and leave small files to log."""
    def export(model, paths, lowercase):
        exported.append(checkpoints.weights_digest(model))
        paths.saved_model.mkdir(parents=True, exist_ok=True)
        (paths.saved_model / "saved_model.pb").write_text("stand-in")
        for path in (paths.model_keras, paths.model_vocab, paths.model_vocab_meta):
            path.write_text("stand-in")

    monkeypatch.setattr(pretrain, "export", export)
    monkeypatch.setattr(pretrain, "review_plots", lambda *args, **kwargs: None)


def run_cli(config, lines=None) -> int:
    paths = artifacts.Artifacts(config.run_dir)
    try:
        with PipelineLines() as said:
            code = cli._run(config, "", ["pretrain"], False, paths)
        if lines is not None:
            lines.extend(said)
        return code
    finally:
        mlflow.set_tracking_uri(None)


def runs_by_stage(tmp_path) -> tuple[list, dict]:
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("phases")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    stages: dict = {}
    for r in runs:
        if "pipeline.stage" in r.data.tags:
            stages.setdefault(r.data.tags["pipeline.stage"], []).append(r)
    return parents, stages


def metric_steps(tmp_path, run, key="loss") -> list[int]:
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    return sorted(m.step for m in client.get_metric_history(run.info.run_id, key))


def test_train_phases_config_is_validated():
    base = ["data.phases=[\"32/5\", \"48/7\"]"]
    cases = {
        "train.phases=[{steps: 4}]": "train.phases has 1 entries but data.phases",
        "train.phases=[{steps: 4}, {optimizer: lamb}]": "train.phases[1].optimizer cannot be set "
                                                         "per phase; allowed: steps, batch_size",
        "train.phases=[{steps: 4}, {steps: 0}]": "train.phases[1].steps = 0 is out of range",
        "train.phases=[{steps: 4}, {learning_rate: x}]": "train.phases[1].learning_rate = 'x' is "
                                                         "not a number",
        "train.phases=[{steps: 4}, {steps: 2, warmup_steps: 3}]": "train.phases[1].warmup_steps = "
                                                                  "3 is more than",
    }
    for override, message in cases.items():
        with pytest.raises(config_lib.ConfigError, match=message.replace("[", r"\[")
                           .replace("]", r"\]")):
            config_lib.load("configs/test_tiny.yaml", [*base, override])
    with pytest.raises(config_lib.ConfigError, match="data.phases is empty"):
        config_lib.load("configs/test_tiny.yaml", ["train.phases=[{steps: 4}]"])
    config = config_lib.load("configs/test_tiny.yaml", [
        *base, "train.phases=[{steps: 9, learning_rate: 1e-4}, {steps: 3, batch_size: 4}]"])
    first, second = config_lib.train_phases(config)
    assert (first.steps, first.learning_rate, first.batch_size) == (9, 1e-4, 8)
    assert (second.steps, second.learning_rate, second.batch_size) == (3, 1e-3, 4)
    shipped = config_lib.load("configs/pretrain_two_phase.yaml")
    assert [(p.steps, p.batch_size) for p in config_lib.train_phases(shipped)] == [(6, 8), (3, 4)]
    # Without train.phases every data phase trains with train.*.
    plain = config_lib.load("configs/test_tiny.yaml", base)
    assert [p.steps for p in config_lib.train_phases(plain)] == [6, 6]


@pytest.mark.slow
def test_two_phases_train_in_turn_each_its_own_run(tmp_path, monkeypatch):
    write_phase_data(tmp_path / "run")
    exported, starts, lines = [], [], []
    fake_export(monkeypatch, exported)
    start_from = checkpoints.start_from_previous_phase

    def spy(model, previous, prefix="pretrain"):
        start_from(model, previous, prefix)
        starts.append((checkpoints.weights_digest(model), checkpoints.global_step(model)))

    monkeypatch.setattr(loop, "start_from_previous_phase", spy)
    config = phase_config(tmp_path)
    assert run_cli(config, lines) == cli.EXIT_OK

    paths = artifacts.Artifacts(config.run_dir)
    names = lambda folder: sorted(p.name for p in folder.glob("ckpt-*.weights.h5"))  # noqa: E731
    assert names(paths.phase_checkpoint_dir(1)) == ["ckpt-00000002.weights.h5",
                                                    "ckpt-00000004.weights.h5"]
    assert names(paths.phase_checkpoint_dir(2)) == ["ckpt-00000001.weights.h5",
                                                    "ckpt-00000002.weights.h5"]
    assert not names(paths.checkpoint_dir)
    assert any("pretrain phase2: 48/7" in line for line in lines)
    assert any(line.startswith("pretrain phase2: BERT ") and "batch 4," in line
               for line in lines)

    parents, stages = runs_by_stage(tmp_path)
    assert len(parents) == 1 and set(stages) == {"pretrain", "pretrain.phase1", "pretrain.phase2"}
    (stage,), (phase1,), (phase2,) = (stages["pretrain"], stages["pretrain.phase1"],
                                      stages["pretrain.phase2"])
    for run in (stage, phase1, phase2):  # all children of the pipeline run
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert run.info.status == "FINISHED"
    assert stage.data.tags["pretrain.phase1.run_id"] == phase1.info.run_id
    assert stage.data.tags["pretrain.phase2.run_id"] == phase2.info.run_id
    assert metric_steps(tmp_path, phase1) == [1, 2, 3, 4]
    assert metric_steps(tmp_path, phase2) == [1, 2]
    assert phase2.data.params["data.max_seq_length"] == "48"
    assert phase2.data.params["train.batch_size"] == "4"
    # Phase 2: phase 1's final weights, a fresh optimizer (step 0) and its own schedule.
    assert starts == [(phase1.data.tags["pretrain.weights_sha256"], 0)]
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    rates = [m.value for m in sorted(client.get_metric_history(phase2.info.run_id,
                                                               "learning_rate"),
                                     key=lambda m: m.step)]
    np.testing.assert_allclose(rates, [5e-4, 0.0], atol=1e-9)
    # The exported model is phase 2's final one.
    assert exported == [phase2.data.tags["pretrain.weights_sha256"]]
    assert stage.data.tags["pretrain.weights_sha256"] == exported[0]
    assert json.loads(paths.pretrain_eval.read_text())["step"] == 2


@pytest.mark.slow
def test_two_phase_resume_skips_a_finished_phase_and_continues_its_runs(tmp_path, monkeypatch):
    """Killed after phase 2's first checkpoint; the re-run skips phase 1, resumes phase 2 from
    its checkpoint, and continues the same pretrain and phase 2 MLflow runs."""
    write_phase_data(tmp_path / "run")
    fake_export(monkeypatch, [])

    revive = die_after_checkpoint(
        monkeypatch,
        lambda ckpt: ckpt.dir.name == "phase2" and checkpoints.global_step(ckpt.model) == 1)
    config = phase_config(tmp_path)
    assert run_cli(config) == cli.EXIT_FAILED
    revive()
    lines = []
    assert run_cli(config, lines) == cli.EXIT_OK

    assert any(line.startswith("pretrain phase1: already trained (ckpt-00000004.weights.h5")
               for line in lines)
    assert any("pretrain phase2: resuming from ckpt-00000001.weights.h5 (step 1)" in line
               for line in lines)
    parents, stages = runs_by_stage(tmp_path)
    assert len(parents) == 2
    assert {name: len(runs) for name, runs in stages.items()} == {
        "pretrain": 1, "pretrain.phase1": 1, "pretrain.phase2": 1}
    (stage,), (phase1,), (phase2,) = (stages["pretrain"], stages["pretrain.phase1"],
                                      stages["pretrain.phase2"])
    assert metric_steps(tmp_path, phase1) == [1, 2, 3, 4]
    assert metric_steps(tmp_path, phase2) == [1, 2]  # step 1 before the kill, 2 after
    for run in (stage, phase2):
        assert run.info.status == "FINISHED"
        assert run.data.tags["resume.count"] == "1"
        assert run.data.tags["mlflow.parentRunId"] == parents[1].info.run_id
        assert run.data.tags["resume.previous_parent_run_ids"] == parents[0].info.run_id
    assert phase1.data.tags["mlflow.parentRunId"] == parents[0].info.run_id


@pytest.mark.slow
def test_resumed_training_continues_the_same_mlflow_run(tmp_path, monkeypatch):
    """No phases: 3 of 6 steps, killed, re-run: one pretrain run, metrics for steps 1..6."""
    write_pretraining_data(tmp_path / "run")
    fake_export(monkeypatch, [])

    config = tiny_config(tmp_path / "run", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
                         "tracking.experiment=phases", "train.steps=6", "train.checkpoint_every=3",
                         "train.warmup_steps=2")
    revive = die_after_checkpoint(monkeypatch,
                                  lambda ckpt: checkpoints.global_step(ckpt.model) == 3)
    assert run_cli(config) == cli.EXIT_FAILED
    paths = artifacts.Artifacts(config.run_dir)
    recorded = json.loads(paths.pretrain_run_file.read_text())["run_id"]
    revive()
    lines = []
    assert run_cli(config, lines) == cli.EXIT_OK
    assert any("resuming from ckpt-00000003.weights.h5 (step 3)" in line for line in lines)

    parents, stages = runs_by_stage(tmp_path)
    assert len(parents) == 2 and list(stages) == ["pretrain"]
    (run,) = stages["pretrain"]
    assert run.info.run_id == recorded
    assert run.info.status == "FINISHED"
    assert metric_steps(tmp_path, run) == [1, 2, 3, 4, 5, 6]
    assert metric_steps(tmp_path, run, "resumed_from_step") == [3]
    assert "eval_loss" in run.data.metrics
    assert run.data.tags["mlflow.parentRunId"] == parents[1].info.run_id
    assert run.data.tags["resume.previous_parent_run_ids"] == parents[0].info.run_id

    # Training further under another train.steps is refused (the checkpoints belong to the
    # schedule of 6 steps): exit 2, and the finished run is left alone.
    longer = tiny_config(tmp_path / "run", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
                         "tracking.experiment=phases", "train.steps=7", "train.checkpoint_every=3",
                         "train.warmup_steps=2")
    assert run_cli(longer) == cli.EXIT_BAD_INPUT
    _, stages = runs_by_stage(tmp_path)
    assert [r.info.status for r in stages["pretrain"]].count("FINISHED") == 1
    assert metric_steps(tmp_path, run) == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_two_phase_config_runs_end_to_end(tmp_path, corpus_dir):
    """configs/pretrain_two_phase.yaml: the data stage's phase folders feed the two phases.
    Without what is not the point here and is tested elsewhere: XLA (a compile per phase;
    tests/test_train_step.py), the encoder logged as an MLflow model (tests/test_tracking.py)
    and the start-up matmul timing (tests/test_training.py's MFU test)."""
    args = ["all", "--config", "configs/pretrain_two_phase.yaml", f"run_dir={tmp_path / 'run'}",
            f"corpus.path={corpus_dir}/*.txt",
            f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            "tracking.experiment=phases", "train.jit_compile=false",
            "tracking.register_encoder=false", "train.peak_flops_seconds=0"]
    try:
        assert cli.main(args) == cli.EXIT_OK
    finally:
        mlflow.set_tracking_uri(None)
    paths = artifacts.Artifacts(tmp_path / "run")
    for index in (1, 2):
        assert paths.shards("train") == []  # no single-phase records
        assert list(paths.data_phase_dir(index).glob("train-*.tfrecord"))
        assert checkpoints.latest_checkpoint(paths.phase_checkpoint_dir(index))[0] == (6, 3)[index - 1]
    assert json.loads(paths.pretrain_eval.read_text())["step"] == 3
    assert paths.model_keras.exists() and paths.saved_model.exists()
    _, stages = runs_by_stage(tmp_path)
    assert {name: len(runs) for name, runs in stages.items()} == {
        "corpus": 1, "vocab": 1, "data": 1, "pretrain": 1, "pretrain.phase1": 1,
        "pretrain.phase2": 1}
    assert metric_steps(tmp_path, stages["pretrain.phase2"][0]) == [1, 2, 3]


def test_a_phase_starts_from_the_previous_phase_checkpoint_without_its_optimizer(tmp_path):
    """After a restart the previous phase's weights come from its final checkpoint: the model
    weights are copied, its optimizer state (here: another accumulation setup) is not."""
    vocabulary_size = write_pretraining_data(tmp_path / "run")
    built = []
    for extra in (["train.grad_accum_steps=1"], ["train.grad_accum_steps=2"]):
        config = tiny_config(tmp_path / "run", *extra)
        model = pretrainer.build_model(config, vocabulary_size)
        optimizer = pretrainer.build_optimizer(config.train)
        pretrainer.compile_model(model, optimizer)
        optimizer.build(model.trainable_variables)
        model({  # builds the weights
            "token_ids": np.ones((1, 8), "int32"), "segment_ids": np.zeros((1, 8), "int32"),
            "padding_mask": np.ones((1, 8), "int32"),
            "mask_positions": np.zeros((1, 2), "int32")})
        built.append(model)
    first, second = built
    first.optimizer.iterations.assign(5)
    for variable in slots(first.optimizer):
        variable.assign(np.full(variable.shape, 0.5, variable.dtype))
    checkpoint = tmp_path / "ckpt-00000005.weights.h5"
    first.save_weights(str(checkpoint))
    assert checkpoints.weights_digest(first) != checkpoints.weights_digest(second)

    with PipelineLines() as lines:
        checkpoints.start_from_previous_phase(second, checkpoint, "pretrain phase2")
    assert checkpoints.weights_digest(second) == checkpoints.weights_digest(first)
    assert checkpoints.global_step(second) == 0
    assert slots(second.optimizer) and not any(np.any(keras_numpy(v))
                                               for v in slots(second.optimizer))
    assert lines == ["pretrain phase2: starting from the previous phase's "
                     f"{tmp_path.name}/ckpt-00000005.weights.h5 (fresh optimizer and schedule)"]


def slots(optimizer) -> list:
    """The optimizer's state but its step counter (moments, accumulators)."""
    return [v for v in optimizer.variables if "iteration" not in v.path]


def keras_numpy(variable):
    import keras

    return keras.ops.convert_to_numpy(variable)
