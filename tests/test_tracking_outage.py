"""The tracking store going away (issue 20 point 2): what a stage logs is kept in the run
directory and sent when the store answers again, or by `python -m pipeline tracking-sync`;
a training never dies of a logging call.

The fast tests use a SQLite store and a closed port on 127.0.0.1 (a server that is not there);
a slow one runs a real fine-tuning sweep through such an outage, another kills a real `mlflow
server` mid-training, brings it back, kills it again, and checks every logged step against the
training's own log.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import mlflow
import pytest

from pipeline.finetuning import sweep as sweep_lib
from pipeline.tracking import outbox
from pipeline.tracking import runs as tracking
from tests.test_finetune import ANIMALS, PLACES, encoder_files, make_config, sentence  # noqa: F401
from tests.test_tracking import Server, free_port, rest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A SQLite store with one run; the outbox in tmp_path; mlflow's HTTP calls impatient."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    mlflow.set_tracking_uri(uri)
    run = mlflow.MlflowClient().create_run(
        mlflow.MlflowClient().create_experiment("outage")).info.run_id
    outbox.configure(tmp_path / "run" / "tracking" / "outbox.jsonl",
                     retry_seconds=60)
    yield uri, run
    outbox.configure(None)
    mlflow.set_tracking_uri(uri)


def history(run_id, key):
    return [(m.step, m.value) for m in mlflow.MlflowClient().get_metric_history(run_id, key)]


def test_calls_are_kept_while_the_store_is_down_and_sent_in_order_when_it_answers(store, tmp_path):
    uri, run = store
    outbox.log_metrics({"loss": 3.0}, step=1, run_id=run)  # the store answers: sent at once
    assert history(run, "loss") == [(1, 3.0)] and not outbox.is_down()

    mlflow.set_tracking_uri(f"http://127.0.0.1:{free_port()}")  # nobody listens there
    started = time.time()
    for step in (2, 3, 4):
        outbox.log_metrics({"loss": 3.0 - step / 10}, step=step, run_id=run)
    outbox.set_tags({"stage.pretrain": "ran"}, run_id=run)
    (tmp_path / "eval.json").write_text("{}")
    outbox.log_artifact(tmp_path / "eval.json", "pretrain", run_id=run)
    assert time.time() - started < 15  # one failed try, then no waiting on the network
    assert outbox.is_down()
    kept = [json.loads(line) for line in
            (tmp_path / "run" / "tracking" / "outbox.jsonl").read_text().splitlines()]
    assert [e["op"] for e in kept] == ["batch", "batch", "batch", "batch", "artifact"]

    mlflow.set_tracking_uri(uri)  # the store is back
    assert outbox.flush() == (5, 0)
    assert history(run, "loss") == [(1, 3.0), (2, 2.8), (3, 2.7), (4, 2.6)]
    got = mlflow.MlflowClient().get_run(run)
    assert got.data.tags["stage.pretrain"] == "ran"
    assert [a.path for a in mlflow.MlflowClient().list_artifacts(run, "pretrain")] == [
        "pretrain/eval.json"]
    assert not (tmp_path / "run" / "tracking" / "outbox.jsonl").exists()
    assert not outbox.is_down()


def test_a_wrong_call_is_raised_not_kept(store):
    """Only an unanswered store is an outage: a call the store refuses is a bug to see."""
    with pytest.raises(mlflow.exceptions.MlflowException):
        outbox.log_metrics({"loss": 1.0}, step=1, run_id="no-such-run")
    assert not outbox.is_down()


def test_a_server_that_turns_the_user_away_mid_run_is_named_as_such(store, tmp_path, caplog,
                                                                    monkeypatch):
    """A server with accounts that answers 401 (a password changed mid-run): the calls are
    kept, and the warning says the store refuses this user, not that it is down."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Refuse(BaseHTTPRequestHandler):
        def do_POST(self):  # what MLflow's basic-auth app answers a wrong password
            body = b"You are not authenticated. Please see docs."
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST

        def log_message(self, *args):
            pass

    _, run = store
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    caplog.set_level(logging.WARNING, logger="pipeline")
    try:
        mlflow.set_tracking_uri(f"http://127.0.0.1:{server.server_address[1]}")
        outbox.log_metrics({"loss": 2.0}, step=1, run_id=run)
    finally:
        server.shutdown()
    assert outbox.is_down()
    kept = (tmp_path / "run" / "tracking" / "outbox.jsonl").read_text().splitlines()
    assert [json.loads(line)["op"] for line in kept] == ["batch"]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "refuses the calls of user 'alice' (HTTP 401)" in said[0], said
    assert "MLFLOW_TRACKING_PASSWORD" in said[0] and "tracking-sync" in said[0]


def test_the_end_of_a_run_is_kept_too(store, tmp_path):
    """A run that ends while the store is down is recorded FINISHED, with the time it ended,
    once the outbox is sent; the active-run stack is left clean meanwhile."""
    uri, _ = store
    with mlflow.start_run(run_name="stage") as run:  # the store answers at the start
        mlflow.set_tracking_uri(f"http://127.0.0.1:{free_port()}")
        outbox.log_metrics({"loss": 1.5}, step=7)
        ended = time.time() * 1000
        outbox.end_run("FINISHED")
        assert mlflow.active_run() is None
    mlflow.set_tracking_uri(uri)
    assert mlflow.get_run(run.info.run_id).info.status == "RUNNING"
    assert outbox.flush() == (2, 0)
    info = mlflow.get_run(run.info.run_id).info
    assert info.status == "FINISHED" and abs(info.end_time - ended) < 5000
    assert history(run.info.run_id, "loss") == [(7, 1.5)]


def test_a_nested_run_started_while_the_store_is_down_is_created_when_it_answers(store,
                                                                                 tmp_path):
    """A run nested under the stage's that starts during an outage gets a pending id; what is
    logged under it (a tag naming it too) reaches the run the store creates for it, in order,
    ended as it ended, also when the outbox is sent by a later invocation (tracking-sync)."""
    uri, _ = store
    experiment = mlflow.MlflowClient().create_experiment(
        "nested", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment) as parent:
        mlflow.set_tracking_uri(f"http://127.0.0.1:{free_port()}")
        with tracking.nested_run("point 1", {"pipeline.stage": "finetune-sweep"}) as child:
            assert outbox.is_pending(child) and outbox.active_run_id() == child
            outbox.log_params({"finetune.learning_rate": 0.001})
            for step in (1, 2):
                outbox.log_metrics({"train_loss": 1.0 / step}, step=step)
        assert outbox.active_run_id() == parent.info.run_id
        outbox.set_tags({"sweep.best_run_id": child})
        outbox.end_run("FINISHED")
    outbox.configure(tmp_path / "run" / "tracking" / "outbox.jsonl")  # a later invocation
    mlflow.set_tracking_uri(uri)
    assert outbox.flush()[1] == 0
    client = mlflow.MlflowClient()
    (run,) = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert run.info.run_name == "point 1" and run.info.status == "FINISHED"
    assert run.data.tags["pipeline.stage"] == "finetune-sweep"
    assert run.data.params == {"finetune.learning_rate": "0.001"}
    assert history(run.info.run_id, "train_loss") == [(1, 1.0), (2, 0.5)]
    assert client.get_run(parent.info.run_id).data.tags["sweep.best_run_id"] == run.info.run_id


@pytest.mark.slow
def test_a_sweep_goes_on_through_an_outage_and_loses_nothing(store, tmp_path, encoder_files):
    """The store goes away once the stage's run has started: every point of a real fine-tuning
    sweep still trains in a run of its own, created from the outbox when the store answers
    again, with its params, its training's metrics, its result and its end; the stage's run
    gets the best point, naming its run by the store's id."""
    uri, _ = store
    experiment = mlflow.MlflowClient().create_experiment(
        "sweep", artifact_location=(tmp_path / "artifacts").as_uri())
    rng = random.Random(0)
    rows = ["text,label"] + [f"{sentence(rng, ANIMALS if i % 2 else PLACES)},"
                             f"{'animal' if i % 2 else 'place'}" for i in range(40)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    config = make_config(tmp_path, encoder_files, "finetune.dataset=csv", "finetune.name=sw",
                         f"finetune.train_file={tmp_path}/train.csv", "finetune.max_steps=2",
                         'finetune.sweep=["learning_rate=1e-3,3e-3"]')
    with mlflow.start_run(experiment_id=experiment) as parent:  # the store answers here
        mlflow.set_tracking_uri(f"http://127.0.0.1:{free_port()}")  # and then goes away
        summary = sweep_lib.sweep(config)
        outbox.end_run("FINISHED")
    assert outbox.is_down()
    kept = [json.loads(line)["op"] for line in
            (tmp_path / "run" / "tracking" / "outbox.jsonl").read_text().splitlines()]
    assert kept.count("create") == 2 and kept.count("terminate") == 3, kept

    mlflow.set_tracking_uri(uri)  # the store is back
    assert outbox.flush()[1] == 0
    client = mlflow.MlflowClient()
    children = sorted(client.search_runs(
        [experiment], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"),
        key=lambda r: r.info.run_name)
    assert [c.info.run_name for c in children] == ["sweep 1: learning_rate=0.001",
                                                   "sweep 2: learning_rate=0.003"]
    for child, point in zip(children, summary["points"]):
        assert child.info.status == "FINISHED"
        assert child.data.tags["pipeline.stage"] == "finetune-sweep"
        assert child.data.params["finetune.learning_rate"] == str(point["point"]["learning_rate"])
        assert child.data.params["finetune.total_steps"]  # what the training itself logged
        assert child.data.metrics["validation_accuracy"] == pytest.approx(
            point["validation"]["accuracy"])
        assert child.data.metrics["best_epoch"] == point["best_epoch"]
        assert history(child.info.run_id, "train_loss")  # its progress, step by step
    logged = client.get_run(parent.info.run_id)
    assert logged.info.status == "FINISHED"
    best = summary["best"]
    rate = str(best["point"]["learning_rate"])
    (best_run,) = [c for c in children if c.data.params["finetune.learning_rate"] == rate]
    assert logged.data.tags["sweep.best_run_id"] == best_run.info.run_id
    assert logged.data.params["best.learning_rate"] == rate
    assert logged.data.metrics["best_validation_accuracy"] == pytest.approx(
        best["validation"]["accuracy"])
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "sweep")] == [
        "sweep/sw.sweep.json"]
    assert "pending-" not in json.dumps([c.to_dictionary() for c in [logged, *children]])


def test_a_store_down_at_the_start_is_a_one_line_error(tmp_path, monkeypatch, corpus_dir):
    """Nothing can start a run without the store: exit 2 naming it, no traceback, no work."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
           "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"}
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "corpus", "--config", "configs/test_tiny.yaml",
         f"run_dir={tmp_path / 'run'}", f"corpus.path={corpus_dir}/*.txt"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"127.0.0.1:{port} does not answer" in errors[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "corpus").exists()


# ---------------------------------------------------------------------------
# A real server, killed mid-training.
# ---------------------------------------------------------------------------
class Lines:
    """The lines a subprocess prints, collected by a thread; wait_for blocks until one matches."""

    def __init__(self, proc):
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.thread.start()

    def _read(self, proc):
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 300) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in list(self.lines):
                if re.search(pattern, line):
                    return line
            time.sleep(0.2)
        raise AssertionError(f"no line matching {pattern!r}; last lines: {self.lines[-20:]}")


@pytest.mark.slow
def test_training_outlives_the_tracking_server(tmp_path, corpus_dir, monkeypatch):
    """The server is killed mid-training, comes back, is killed again and stays down to the
    end: training finishes (exit 0) with one warning; what was logged meanwhile reached the
    server when it came back, the rest waits in the run directory and `tracking-sync` sends it;
    in the end the server holds every logged step, the final metrics and the model, and the
    runs are FINISHED."""
    # The server without MLflow's GenAI job runner (seven more processes per start, which the
    # pipeline never uses; `make server` turns it off too): each of its three starts is quicker.
    monkeypatch.setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    server = Server(tmp_path)
    server.start()
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": server.url,
           "PYTHONUNBUFFERED": "1"}
    args = [f"run_dir={run_dir}", f"corpus.path={corpus_dir}/*.txt", "tracking.experiment=outage",
            "tracking.retry_seconds=2", "train.steps=100000", "train.max_seconds=30",
            "train.log_every=10", "train.heldout_every=200", "train.checkpoint_every=400",
            "train.peak_flops_seconds=0"]  # no matmul timing at start-up (mfu is not read)
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "all", "--config",
                             "configs/test_tiny.yaml", *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = Lines(proc)
    try:
        lines.wait_for(r"^step 20/")
        server.stop()                                    # down mid-training
        lines.wait_for(r"warning: the tracking store .* does not answer")
        server.start()                                   # back: what was kept is sent
        lines.wait_for(r"tracking: the store .* answers again")
        server.stop()                                    # down again, to the end
        assert proc.wait(timeout=600) == 0, "\n".join(lines.lines[-30:])
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
    lines.thread.join(timeout=10)
    (tmp_path / "pipeline.out").write_text("\n".join(lines.lines))  # to read when it fails
    logged = [int(m.group(1)) for m in (re.match(r"^step (\d+)/", line) for line in lines.lines)
              if m]
    assert len(logged) > 10 and logged[-1] > 40, logged
    warnings = [line for line in lines.lines if "does not answer" in line]
    assert len(warnings) == 2, warnings  # one per outage, not one per call
    outbox_file = run_dir / "tracking" / "outbox.jsonl"
    assert outbox_file.is_file()

    server.start()
    try:
        sync = subprocess.run([sys.executable, "-m", "pipeline", "tracking-sync", "--config",
                               "configs/test_tiny.yaml", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        assert sync.returncode == 0, sync.stderr[-2000:]
        assert not outbox_file.exists()
        experiment = rest(server.url, "experiments/get-by-name?experiment_name=outage")[
            "experiment"]["experiment_id"]
        runs = rest(server.url, "runs/search", {"experiment_ids": [experiment]})["runs"]
        assert {r["info"]["status"] for r in runs} == {"FINISHED"}, [
            (r["info"]["run_name"], r["info"]["status"]) for r in runs]
        pretrain = next(r for r in runs if {"key": "pipeline.stage", "value": "pretrain"}
                        in r["data"].get("tags", []))
        run_id = pretrain["info"]["run_id"]
        steps = [int(m["step"]) for m in rest(
            server.url, f"metrics/get-history?run_id={run_id}&metric_key=loss&max_results=10000")[
            "metrics"]]
        assert sorted(steps) == logged  # every step the training logged, none twice
        final = {m["key"] for m in pretrain["data"]["metrics"]}
        assert {"eval_mlm_accuracy", "stage_seconds"} <= final
        listed = rest(server.url, f"artifacts/list?run_id={run_id}&path=model")
        assert "model/model.keras" in [f["path"] for f in listed["files"]]
    finally:
        server.stop()
