"""What `make pretrain` prints: its command on the tiny config, in a subprocess (so that what
TensorFlow's C++ runtime and the Beam workers write on file descriptor 2 is captured too).
The console keeps the pipeline's lines and a line per stage start and end; Beam's worker
logging, TensorFlow's start-up lines and MLflow's artifact bars go to <run_dir>/logs/ and to
the stage's MLflow run; `-v` puts them back on the console."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import mlflow
import pytest

from pipeline import artifacts
from tests.conftest import PipelineLines

PROJECT = artifacts.PROJECT_ROOT

# Lines that must stay off the console at the default level.
BEAM = re.compile(r"^(INFO|WARNING):(apache_beam|__main__|root):|Worker: severity:|"
                  r"apitools not found|Pipeline_options")
TF_CPP = re.compile(r"^[IWE]\d{4} \d\d:\d\d:[\d.]+ +\d+ \w+\.cc:\d+\]|cudart_stub|cuInit|"
                    r"absl::InitializeLog")
MLFLOW = re.compile(r"Downloading artifacts|Creating initial MLflow database|"
                    r"Successfully registered model|Created version")
STAGES = ("corpus", "vocab", "data", "pretrain")


def pipeline(tmp_path, corpus_dir, *args, code=0):
    """`make pretrain`'s command (Makefile: TF_CPP_MIN_LOG_LEVEL=2, PYTHONPATH) on test_tiny,
    with the DirectRunner's multi-process mode so that the Beam jobs start harness workers
    as a larger corpus would."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, "-m", "pipeline", *args, "--config", "configs/test_tiny.yaml",
               f"run_dir={tmp_path / 'run'}", f"corpus.path={corpus_dir}/*.txt",
               f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
               "tracking.experiment=console", 'data.beam_args=["--runner=DirectRunner"]',
               "data.workers=2"]
    done = subprocess.run(command, cwd=PROJECT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == code, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout.splitlines() + done.stderr.splitlines()


def matching(pattern, lines):
    return [line for line in lines if pattern.search(line)]


@pytest.mark.slow
def test_the_console_is_quiet_and_the_stage_logs_are_full(tmp_path, corpus_dir):
    # (register_encoder: the encoder logged as an MLflow model and read back, as by default)
    console = pipeline(tmp_path, corpus_dir, "all", "tracking.register_encoder=true")
    for pattern in (BEAM, TF_CPP, MLFLOW):
        assert not matching(pattern, console), matching(pattern, console)[:5]
    assert len(console) <= 60, "\n".join(console)
    for stage in STAGES:  # one line when it starts, one when it ends
        assert sum(line.startswith(f"{stage}: started (log: ") for line in console) == 1
        assert sum(re.match(rf"{stage}: finished in [\d.]+ s$", line) is not None
                   for line in console) == 1
    assert any(line.startswith("step 6/6") for line in console)
    assert any("held-out MLM accuracy" in line for line in console)

    logs = artifacts.Artifacts(tmp_path / "run").logs_dir
    for stage in STAGES:
        assert (logs / f"{stage}.log").exists(), sorted(logs.iterdir())
    for stage in ("vocab", "data"):  # the harness workers' own logging, and the main process'
        text = (logs / f"{stage}.log").read_text().splitlines()
        assert len(matching(re.compile(r"^INFO:apache_beam\.runners\.worker"), text)) >= 4
        assert matching(re.compile("Python sdk harness starting"), text)
        assert matching(re.compile("apitools not found"), text)
    # TensorFlow's C++ start-up lines: in the log of the stage that loads it (pretrain).
    assert matching(TF_CPP, (logs / "pretrain.log").read_text().splitlines())
    # What MLflow prints on sys.stderr itself while the encoder is registered.
    assert "Successfully registered model" in (logs / "pretrain.log").read_text()

    # Each stage's log is an artifact of its MLflow run.
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("console")
    runs = client.search_runs([experiment.experiment_id])
    by_stage = {r.data.tags.get("pipeline.stage"): r for r in runs}
    for stage in STAGES:
        run_id = by_stage[stage].info.run_id
        names = [a.path for a in client.list_artifacts(run_id, "logs")]
        assert names == [f"logs/{stage}.log"], (stage, names)
    local = client.download_artifacts(by_stage["vocab"].info.run_id, "logs/vocab.log",
                                      str(tmp_path))
    with open(local, encoding="utf-8") as handle:
        assert "Python sdk harness starting" in handle.read()

    # -v: everything on the console (the data jobs' harness workers write on the same file
    # descriptor as TensorFlow's C++ runtime: what the quiet run sent to the log file).
    verbose = pipeline(tmp_path, corpus_dir, "-v", "data", "--force")
    assert len(matching(BEAM, verbose)) >= 10
    assert matching(re.compile(r"^INFO:apache_beam\.runners\.worker"), verbose)
    assert matching(re.compile("Python sdk harness starting"), verbose)


def fit_with_step_logger(monkeypatch, progress: str, steps=4, every=2):
    """A tiny Keras model trained `steps` updates with the pretraining StepLogger."""
    import keras
    import numpy as np

    from pipeline.training.callbacks import StepLogger

    monkeypatch.setenv("BERT_PIPELINE_PROGRESS", progress)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    logger = StepLogger(every, steps, batch_size=2, seq_length=8, to_mlflow=False)
    x = np.arange(steps * 6, dtype="float32").reshape(steps * 2, 3) / 10
    with PipelineLines() as lines:
        model.fit(x, x[:, :1], batch_size=2, epochs=1, callbacks=[logger], verbose=0)
    return lines


def test_training_progress_is_a_bar_on_a_terminal_and_lines_elsewhere(monkeypatch, capsys,
                                                                       tmp_path):
    from pipeline import logs

    log_file = tmp_path / "run.log"
    logs.setup(log_file)
    try:
        lines = fit_with_step_logger(monkeypatch, "plain")
        assert [line.split()[:2] for line in lines] == [["step", "2/4"], ["step", "4/4"]]
        assert "it/s" not in capsys.readouterr().err
        bar_lines = fit_with_step_logger(monkeypatch, "bar")
        err = capsys.readouterr().err
    finally:
        logging.captureWarnings(False)
    assert bar_lines == []  # the periodic lines went to the log file instead
    final = err.replace("\r", "\n").splitlines()[-1]
    assert re.search(r"train: 100%.*4/4", final) and "loss " in final and "tok/s" in final, err
    text = log_file.read_text()
    assert "step 2/4" in text and "step 4/4" in text


def test_a_time_budget_sets_where_the_bar_ends_and_the_eta(monkeypatch, capsys, tmp_path):
    """train.max_seconds stops a 100-step run early: the bar ends where the budget ends (not
    at 20/100) and the plain lines say how long is left."""
    import keras
    import numpy as np

    from pipeline import logs
    from pipeline.training.callbacks import StepLogger

    logs.setup(tmp_path / "run.log")
    x = np.arange(120, dtype="float32").reshape(40, 3) / 10
    try:
        for mode in ("plain", "bar"):
            monkeypatch.setenv("BERT_PIPELINE_PROGRESS", mode)
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            # the budget is spent: training ends at the step it has reached
            logger = StepLogger(10, 100, batch_size=2, seq_length=8, to_mlflow=False,
                                max_seconds=5.0, clock=lambda: 5.0)
            with PipelineLines() as lines:
                model.fit(x, x[:, :1], batch_size=2, epochs=1, callbacks=[logger], verbose=0)
            err = capsys.readouterr().err
            if mode == "plain":
                assert [line.split()[:2] for line in lines] == [["step", "10/100"],
                                                                ["step", "20/100"]]
                assert all(line.endswith("eta 0m 00s") for line in lines), lines
            else:
                final = err.replace("\r", "\n").splitlines()[-1]
                assert re.search(r"train: 100%.* 20/20 ", final), err
    finally:
        logging.captureWarnings(False)


def test_finetuning_progress_is_a_bar_on_a_terminal_and_lines_elsewhere(monkeypatch, capsys):
    import keras
    import numpy as np

    from pipeline.training.callbacks import Progress

    x = np.arange(24, dtype="float32").reshape(8, 3) / 10
    for mode in ("plain", "bar"):
        monkeypatch.setenv("BERT_PIPELINE_PROGRESS", mode)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        with PipelineLines() as lines:
            model.fit(x, x[:, :1], batch_size=2, epochs=1, verbose=0,
                      callbacks=[Progress(2, 4, 2, to_mlflow=False)])
        err = capsys.readouterr().err
        if mode == "plain":
            assert [line.split()[:3] for line in lines] == [
                ["finetune:", "step", "2/4"], ["finetune:", "step", "4/4"]]
            assert "finetune:" not in err
        else:
            assert lines == [] and "finetune:" in err and "examples/s" in err, err


def test_a_quiet_stage_says_it_is_running(monkeypatch, tmp_path, capsys):
    import time

    from pipeline import logs

    monkeypatch.setenv("BERT_PIPELINE_HEARTBEAT", "1")
    logs.setup(tmp_path / "run.log")
    try:
        with logs.stage("data", tmp_path / "logs"):
            time.sleep(2.5)  # a Beam job that prints nothing
    finally:
        logging.captureWarnings(False)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("data: started") and out[-1].startswith("data: finished in")
    assert any(re.fullmatch(r"data: running, 0m 0[1-3]s", line) for line in out[1:-1]), out
    assert "data: running" in (tmp_path / "logs" / "data.log").read_text()


def test_a_stage_that_speaks_gets_no_heartbeat(monkeypatch, tmp_path, capsys):
    """Lines from any module's logger (children of "pipeline") count as speaking."""
    import time

    from pipeline import logs

    monkeypatch.setenv("BERT_PIPELINE_HEARTBEAT", "1")
    logs.setup(tmp_path / "run.log")
    try:
        with logs.stage("data", tmp_path / "logs"):
            for i in range(10):
                logging.getLogger("pipeline.stages.data").info(f"data: {i}")
                time.sleep(0.25)
    finally:
        logging.captureWarnings(False)
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("data: ") and line[6:].isdigit()] == [
        f"data: {i}" for i in range(10)]
    assert not [line for line in out if "running" in line], out


def test_bad_input_is_still_one_line_on_the_console(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    console = pipeline(tmp_path, empty, "corpus", code=2)
    errors = [line for line in console if line.startswith("error: ")]
    assert len(errors) == 1 and "corpus.path" in errors[0], console
    assert not [line for line in console if "Traceback" in line], console
