"""MLflow: the pipeline's runs are visible through a real MLflow server's REST API (what
`make ui` serves), and MLFLOW_TRACKING_URI points the pipeline at such a server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import pytest

from pipeline import config as config_lib
from pipeline.tracking import runs as tracking


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`mlflow server` on 127.0.0.1:port over one SQLite store; stop() kills it by its pid
    (its process group: the server's workers too), start() brings it back on the same port."""

    def __init__(self, tmp_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.store = f"sqlite:///{tmp_path / 'server.db'}"
        self.artifacts = tmp_path / "server-artifacts"
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
             self.store, "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--artifacts-destination", str(self.artifacts)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            # MLflow's job runner (7 worker processes) is not used here: a start twice as fast.
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("mlflow server did not start")
            time.sleep(0.3)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture
def mlflow_server(tmp_path):
    """`mlflow server` on 127.0.0.1 over a SQLite store, as `make ui` runs it."""
    server = Server(tmp_path)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def rest(server: str, path: str, body=None) -> dict:
    """One call of the MLflow server's REST API (GET, or POST with a JSON body)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{server}/api/2.0/mlflow/{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


@pytest.mark.slow
def test_pipeline_runs_through_a_server_and_its_rest_api(mlflow_server, monkeypatch, tmp_path,
                                                         corpus_dir):
    """MLFLOW_TRACKING_URI=http://... : the pipeline records its runs and artifacts on the server."""
    from pipeline import cli

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    assert cli.main(["corpus", "vocab", "--config", "configs/test_tiny.yaml",
                     f"run_dir={tmp_path / 'run'}", f"corpus.path={corpus_dir}/*.txt",
                     "tracking.experiment=rest-check"]) == 0

    experiment_id = rest(mlflow_server, "experiments/get-by-name?experiment_name=rest-check")[
        "experiment"]["experiment_id"]
    runs = rest(mlflow_server, "runs/search", {"experiment_ids": [experiment_id]})["runs"]
    tags = {run["info"]["run_id"]: {t["key"]: t["value"] for t in run["data"].get("tags", [])}
            for run in runs}
    parents = [rid for rid, t in tags.items() if "mlflow.parentRunId" not in t]
    assert len(parents) == 1
    children = {t["pipeline.stage"]: rid for rid, t in tags.items()
                if t.get("mlflow.parentRunId") == parents[0]}
    assert sorted(children) == ["corpus", "vocab"]
    params = {p["key"]: p["value"] for p in runs[0]["data"]["params"]}
    assert params["vocab.size"] == "300" and params["model.preset"] == "tiny"
    # The vocab went to the server's artifact store, and can be read back from it.
    listed = rest(mlflow_server, f"artifacts/list?run_id={children['vocab']}&path=vocab")
    assert "vocab/vocab.txt" in [f["path"] for f in listed["files"]]
    local = mlflow.artifacts.download_artifacts(run_id=children["vocab"],
                                                artifact_path="vocab/vocab.txt",
                                                dst_path=str(tmp_path / "dl"))
    assert open(local).read() == (tmp_path / "run" / "vocab" / "vocab.txt").read_text()


@pytest.mark.slow
def test_training_runs_where_reviewers_look(mlflow_server, monkeypatch, tmp_path, corpus_dir):
    """Through a server's REST API: a model-training experiment (the UI opens on its runs),
    system metrics on the training stage, the pretrained encoder logged as an MLflow model and
    registered, and fine-tuning able to start from it by its models:/ URI."""
    import pandas as pd

    from pipeline import cli
    from pipeline import config as config_lib
    from pipeline.finetuning import task_model

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "1")
    overrides = [f"run_dir={tmp_path / 'run'}", f"corpus.path={corpus_dir}/*.txt",
                 "tracking.experiment=review", "tracking.register_encoder=true", "train.steps=30"]
    assert cli.main(["all", "--config", "configs/test_tiny.yaml", *overrides]) == 0

    experiment = rest(mlflow_server,
                      "experiments/get-by-name?experiment_name=review")["experiment"]
    kinds = {t["key"]: t["value"] for t in experiment.get("tags", [])}
    assert kinds["mlflow.experimentKind"] == "custom_model_development"
    runs = rest(mlflow_server, "runs/search",
                {"experiment_ids": [experiment["experiment_id"]]})["runs"]
    pretrain = next(r for r in runs if {"key": "pipeline.stage", "value": "pretrain"}
                    in r["data"].get("tags", []))
    metrics = {m["key"] for m in pretrain["data"].get("metrics", [])}
    assert any(k.startswith("system/cpu") for k in metrics), sorted(metrics)
    model = rest(mlflow_server,
                 "registered-models/get?name=bert-encoder-run")["registered_model"]
    assert model["latest_versions"][0]["version"] == "1"

    encoder = mlflow.pyfunc.load_model("models:/bert-encoder-run/1")
    out = encoder.predict(pd.DataFrame({"text": ["the cat sat", "a dog ran"]}))
    assert len(out) == 2 and len(out["embedding"][0]) == 32  # hidden_dim of test_tiny

    config = config_lib.load("configs/test_tiny.yaml", [
        *overrides, "finetune.init_from=models:/bert-encoder-run/1"])
    model_path, vocab = task_model.resolve_init(config)
    assert model_path.suffix == ".keras" and task_model.load_backbone(model_path) is not None
    assert vocab.read_text() == (tmp_path / "run" / "vocab" / "vocab.txt").read_text()


def test_default_store_is_sqlite_in_the_project(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = tracking.tracking_uri(config_lib.load(None))
    assert uri.startswith("sqlite:////") and uri.endswith("/mlflow.db")


def test_champion_moves_only_to_a_better_model_on_the_same_split(tmp_path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'registry.db'}")
    client = mlflow.MlflowClient()
    client.create_registered_model("clf")
    versions = [client.create_model_version("clf", f"file://{tmp_path}/m{i}").version
                for i in range(4)]
    assert tracking.promote_if_better("clf", versions[0], "accuracy", 0.70, "split-a")
    assert not tracking.promote_if_better("clf", versions[1], "accuracy", 0.65, "split-a")
    assert client.get_model_version_by_alias("clf", "champion").version == versions[0]
    assert tracking.promote_if_better("clf", versions[2], "accuracy", 0.80, "split-a")
    # A better score on another split is not comparable: no promotion.
    assert not tracking.promote_if_better("clf", versions[3], "accuracy", 0.99, "split-b")
    assert client.get_model_version_by_alias("clf", "champion").version == versions[2]
    reason = client.get_model_version("clf", versions[1]).tags["promotion"]
    assert "does not beat" in reason and "0.7000" in reason
    assert "not comparable" in client.get_model_version("clf", versions[3]).tags["promotion"]
    # Lower-is-better metrics (a loss) compare the other way.
    client.create_registered_model("reg")
    a = client.create_model_version("reg", f"file://{tmp_path}/r0").version
    b = client.create_model_version("reg", f"file://{tmp_path}/r1").version
    assert tracking.promote_if_better("reg", a, "loss", 0.5, "s", higher_is_better=False)
    assert tracking.promote_if_better("reg", b, "loss", 0.4, "s", higher_is_better=False)


def test_a_new_sqlite_store_is_made_aside(tmp_path):
    """MLflow migrates a new SQLite store in place; a kill then left an unusable file (the fault
    suite found it). The store appears only once complete, and an existing one is untouched."""
    store = tmp_path / "deep" / "mlflow.db"
    tracking.create_sqlite_store(f"sqlite:///{store}")
    assert sorted(p.name for p in store.parent.iterdir()) == ["mlflow.db"]
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{store}")
    assert [e.name for e in client.search_experiments()] == ["Default"]
    before = store.read_bytes()
    tracking.create_sqlite_store(f"sqlite:///{store}")
    assert store.read_bytes() == before
    tracking.create_sqlite_store("http://127.0.0.1:1")  # not a file: nothing to make
