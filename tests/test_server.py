"""The team tracking server (`make server`, pipeline/tools/server.py): MLflow with basic auth on
a real PostgreSQL cluster (the Debian `postgresql` server binaries; `make test-setup` installs
them), started once for the module.

A pipeline run tracked there has the same runs, params, metrics (every step), artifacts,
lineage tags and registry versions as the same run tracked in a SQLite store; a request
without credentials is refused (401); a user with READ on an experiment cannot log to it
(403); a wrong password is exit 2 with one line naming MLFLOW_TRACKING_USERNAME; no password
appears in any log, state file or console output; `stop` ends everything `start` started and
a restart keeps the runs; DATABASE_URL points a server at an existing database.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import urllib.error
import urllib.request
import uuid
import warnings
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
from mlflow.exceptions import MlflowException

from pipeline.tools import server as server_lib

ADMIN = server_lib.ADMIN
SECRET_VARIABLES = ("MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY", "DATABASE_URL",
                    "AUTH_DATABASE_URL", "ARTIFACTS_DESTINATION", "DEFAULT_PERMISSION")
NO_POSTGRES = "the PostgreSQL server binaries are not installed (make test-setup installs them)"


def world_searchable_dir() -> Path:
    """A fresh folder the `postgres` system user can pass through (pytest's tmp_path is under
    a 0700 folder of root's, which the cluster's user could not reach)."""
    base = Path(tempfile.mkdtemp(prefix="bert-server-test-"))
    os.chmod(base, 0o711)
    return base


@pytest.fixture(scope="module")
def team_server():
    if server_lib.pg_bin() is None:
        pytest.skip(NO_POSTGRES)
    base = world_searchable_dir()
    folder = base / "server"
    layout = server_lib.Layout(folder)
    try:
        with pytest.MonkeyPatch.context() as env:
            for name in SECRET_VARIABLES:
                env.delenv(name, raising=False)
            state = server_lib.start(folder, port=0, workers=1)
        yield SimpleNamespace(url=state["url"], layout=layout, state=state, base=base,
                              password=layout.admin_password.read_text().strip())
    finally:
        server_lib.stop(folder)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def as_admin(team_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", team_server.url)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", team_server.password)
    return team_server


def _request(url: str, auth: tuple[str, str] | None, body: dict | None = None):
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body else None,
                                     headers={"Content-Type": "application/json"})
    if auth:
        request.add_header("Authorization",
                           "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    return request


def api_post(url: str, body: dict, auth: tuple[str, str]) -> None:
    with urllib.request.urlopen(_request(url, auth, body), timeout=60) as response:
        assert response.status == 200


def http_status(url: str, auth: tuple[str, str] | None = None) -> int:
    request = _request(url, auth)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def secrets_of(layout: server_lib.Layout) -> list[str]:
    """The admin password, the form-signing key and the database password."""
    db_password = layout.pgpass.read_text().splitlines()[0].rsplit(":", 1)[1]
    return [layout.admin_password.read_text().strip(), layout.secret_key.read_text().strip(),
            db_password]


def assert_no_secret(texts: dict[str, str], layout: server_lib.Layout) -> None:
    for secret in secrets_of(layout):
        assert len(secret) >= 12
        for where, text in texts.items():
            assert secret not in text, f"a password appears in {where}"


def one_error_line(captured) -> str:
    """The single `error:` line of an invocation's console output (and no traceback)."""
    text = captured.out + captured.err
    assert "Traceback" not in text, text[-2000:]
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text[-2000:]
    return errors[0]


# ---------------------------------------------------------------------------
# The server: auth, permissions, secrets.
# ---------------------------------------------------------------------------
def test_requests_without_credentials_are_refused(team_server):
    api = f"{team_server.url}/api/2.0/mlflow/experiments/search?max_results=5"
    assert http_status(f"{team_server.url}/health") == 200  # liveness needs no account
    assert http_status(api) == 401
    assert http_status(api, (ADMIN, "not-the-password")) == 401
    assert http_status(api, (ADMIN, team_server.password)) == 200
    assert server_lib.status(team_server.layout.dir)["running"]


def test_a_reader_cannot_log_to_the_experiment(as_admin, monkeypatch, tmp_path, corpus_dir, capfd):
    from pipeline import cli

    reader, password = f"reader-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    admin = (ADMIN, as_admin.password)
    # The auth app's REST API (what mlflow.server.get_app_client("basic-auth") calls).
    api_post(f"{as_admin.url}/api/2.0/mlflow/users/create",
             {"username": reader, "password": password}, admin)
    client = mlflow.MlflowClient(as_admin.url)
    experiment = f"locked-{uuid.uuid4().hex[:6]}"
    experiment_id = client.create_experiment(experiment)
    admins_run = client.create_run(experiment_id).info.run_id
    api_post(f"{as_admin.url}/api/3.0/mlflow/users/permissions/grant",
             {"username": reader, "resource_type": "experiment", "resource_id": experiment_id,
              "permission": "READ"}, admin)

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", reader)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    assert client.get_experiment(experiment_id).name == experiment  # READ: may look
    with pytest.raises(MlflowException) as refused:
        client.create_run(experiment_id)
    assert refused.value.get_http_status_code() == 403
    with pytest.raises(MlflowException) as refused:
        client.log_metric(admins_run, "loss", 1.0)
    assert refused.value.get_http_status_code() == 403
    assert "loss" not in client.get_run(admins_run).data.metrics

    # The pipeline, as that user: one line naming the user, the experiment and what to ask for.
    capfd.readouterr()
    assert cli.main(["corpus", "--config", "configs/test_tiny.yaml", f"run_dir={tmp_path / 'r'}",
                     f"corpus.path={corpus_dir}/*.txt", f"tracking.experiment={experiment}"]) == 2
    line = one_error_line(capfd.readouterr())
    assert "HTTP 403" in line and reader in line and experiment in line and "EDIT" in line
    assert password not in line


@pytest.mark.parametrize("password", ["wrong-password-123", None])
def test_a_wrong_password_is_one_line_and_exit_2(as_admin, monkeypatch, tmp_path, corpus_dir,
                                                 capfd, password):
    from pipeline import cli

    if password is None:
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    capfd.readouterr()
    assert cli.main(["corpus", "--config", "configs/test_tiny.yaml", f"run_dir={tmp_path / 'r'}",
                     f"corpus.path={corpus_dir}/*.txt", "tracking.experiment=wrong"]) == 2
    captured = capfd.readouterr()
    line = one_error_line(captured)
    assert "HTTP 401" in line and "MLFLOW_TRACKING_USERNAME" in line
    assert "MLFLOW_TRACKING_PASSWORD" in line and as_admin.url in line
    assert (f"user '{ADMIN}'" in line) == (password is not None)
    assert not (tmp_path / "r" / "corpus").exists()  # refused before any work
    logs = {str(p): p.read_text() for p in (tmp_path / "r" / "logs").glob("*.log")}
    assert_no_secret({"console": captured.out + captured.err, **logs}, as_admin.layout)


def test_no_secret_in_any_file_log_or_output(team_server, capfd):
    layout = team_server.layout
    for secret_file in (layout.admin_password, layout.secret_key, layout.pgpass):
        assert secret_file.stat().st_mode & 0o777 == 0o600, secret_file
    assert "postgresql+psycopg2://mlflow@127.0.0.1:" in team_server.state["backend"]
    # What the user sees: `status`, and `start` on a running server.
    capfd.readouterr()
    assert server_lib.main(["status", "--dir", str(layout.dir)]) == 0
    assert server_lib.main(["start", "--dir", str(layout.dir), "--port", "0"]) == 0
    shown = capfd.readouterr()
    # (the status line: stderr, or stdout where a pipeline run in this process set up logging)
    assert "already running" in shown.err + shown.out and team_server.url in shown.out
    assert str(layout.admin_password) in shown.out  # where it is, not what it is
    # The server's and PostgreSQL's logs (read as root: the cluster's folder is its user's).
    files = {p.name: p.read_text(errors="replace") for p in
             (layout.log, layout.auth_ini, layout.state, layout.pglog)}
    assert "Uvicorn running" in files["server.log"] and "ready to accept" in files["postgres.log"]
    assert_no_secret({"console": shown.out + shown.err, **files}, layout)


@pytest.mark.slow
def test_restart_keeps_runs_and_artifacts(as_admin, tmp_path, caplog):
    """`stop` ends the server's processes and the cluster; `start` brings both back, with the
    runs and their artifacts."""
    layout = as_admin.layout
    client = mlflow.MlflowClient(as_admin.url)
    experiment_id = client.create_experiment(f"kept-{uuid.uuid4().hex[:6]}")
    run_id = client.create_run(experiment_id).info.run_id
    client.log_metric(run_id, "loss", 0.5, step=3)
    (tmp_path / "note.txt").write_text("kept\n")
    client.log_artifact(run_id, str(tmp_path / "note.txt"))
    pid, pg_pid = as_admin.state["pid"], int((layout.pgdata / "postmaster.pid")
                                             .read_text().split()[0])

    assert group_members(pid) and group_members(pg_pid)
    caplog.set_level(logging.INFO, logger="pipeline")
    assert server_lib.stop(layout.dir)
    said = [r.getMessage() for r in caplog.records if r.name == "pipeline.tools.server"]
    assert said == [f"server: stopped mlflow server (pid {pid})",
                    f"server: stopped PostgreSQL ({layout.pgdata})"], said
    assert not group_members(pid)  # the server, its workers, its job runner
    assert not group_members(pg_pid)  # the postmaster and its backends
    assert not (layout.pgdata / "postmaster.pid").exists() and not layout.pid.exists()
    assert server_lib.main(["status", "--dir", str(layout.dir)]) == server_lib.NOT_RUNNING
    assert server_lib.stop(layout.dir) is False  # nothing left to stop
    assert caplog.records[-1].getMessage() == f"server: nothing was running ({layout.dir})"

    state = server_lib.start(layout.dir, port=as_admin.state["port"], workers=1)
    as_admin.state.update(state)
    assert state["url"] == as_admin.url
    history = client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(3, 0.5)]
    local = client.download_artifacts(run_id, "note.txt", str(tmp_path / "back"))
    assert Path(local).read_text() == "kept\n"
    # served by the server: the file lives in its artifacts folder, not where the client wrote it
    assert list(layout.artifacts.rglob("note.txt"))


# ---------------------------------------------------------------------------
# A pipeline run: the same in PostgreSQL behind the server as in SQLite.
# ---------------------------------------------------------------------------
VOLATILE_METRICS = ("stage_seconds", "train_seconds", "examples_per_second", "tokens_per_second",
                    "mfu")  # wall-clock figures; system/* too (sampled every few seconds)
# model ids and creation times; the checkout's HEAD (another commit may land between the runs)
VOLATILE_TAGS = ("mlflow.log-model.history", "mlflow.source.git.commit")
VOLATILE_PARAMS = ("train.peak_flops",)  # measured by a matmul at the start of pretraining
CODE_DERIVED = ("lineage.code_hash", "lineage.key", "lineage.upstream.")


def _normalise(text: str, ids: dict[str, str]) -> str:
    for old, new in ids.items():
        text = text.replace(old, new)
    return text


def _content(path: str, local: str) -> str:
    """What must be the same of an artifact in both stores: its bytes; for the logged MLflow
    model (a SavedModel and a .keras archive, which embed temporary paths and times) only that
    it is there (the weights are compared by the tag pretrain.weights_sha256); for the
    held-out curve its steps and accuracies, not the seconds; a stage's log file (times, pids,
    paths on every line) only that it is there."""
    if path.startswith(("model/", "logs/")):
        return "present"
    data = Path(local).read_bytes()
    if path.endswith("heldout_curve.json"):
        curve = json.loads(data)
        curve["curve"] = [[row[0], *row[2:]] for row in curve["curve"]]  # [step, s, accuracy]
        data = json.dumps(curve, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def picture(uri: str, experiment: str, tmp: Path) -> dict:
    """What a reviewer sees of one experiment: per stage its status, params, every step of every
    metric, tags and artifacts (path -> sha256), and the registry's versions; run and
    experiment ids replaced by stage names, so that two stores compare."""
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    ids = {r.info.run_id: f"<{r.data.tags.get('pipeline.stage', 'pipeline')}>" for r in runs}
    ids[f"experiments/{exp.experiment_id}/"] = "experiments/<experiment>/"  # UI links
    seen = {}
    for run in runs:
        run_id = run.info.run_id
        metrics = {}
        for key in run.data.metrics:
            if key in VOLATILE_METRICS or key.startswith("system/"):
                continue
            metrics[key] = [(m.step, round(m.value, 5))
                            for m in client.get_metric_history(run_id, key)]
        artifacts, folders = {}, [""]
        while folders:
            for item in client.list_artifacts(run_id, folders.pop() or None):
                if item.is_dir:
                    folders.append(item.path)
                else:
                    artifacts[item.path] = _content(item.path, client.download_artifacts(
                        run_id, item.path, str(tmp / run_id)))
        seen[ids[run_id]] = {
            "status": run.info.status, "metrics": metrics,
            "params": {k: v for k, v in run.data.params.items() if k not in VOLATILE_PARAMS},
            "tags": {k: _normalise(v, ids) for k, v in run.data.tags.items()
                     if k not in VOLATILE_TAGS},
            "artifacts": artifacts}
    registry = {}
    for model in client.search_registered_models():
        versions = client.search_model_versions(f"name='{model.name}'")
        registry[model.name] = {
            "aliases": model.aliases,
            "versions": {str(v.version): {"run": ids.get(v.run_id), "status": v.status,
                                     "tags": v.tags} for v in versions}}
    return {"runs": seen, "registry": registry}


@pytest.mark.slow
def test_a_pipeline_run_is_the_same_in_postgres_as_in_sqlite(as_admin, monkeypatch, tmp_path,
                                                             corpus_dir, capfd):
    from pipeline import artifacts, cli
    from pipeline.tracking import lineage

    run_dir = tmp_path / "run"  # the same path in both runs: the same config, the same lineage
    command = ["all", "--config", "configs/test_tiny.yaml", f"run_dir={run_dir}",
               f"corpus.path={corpus_dir}/*.txt", "tracking.experiment=parity",
               "tracking.register_encoder=true"]
    sqlite = f"sqlite:///{tmp_path / 'reference' / 'mlflow.db'}"
    code_before = {stage: lineage.code_hash(stage) for stage in cli.STAGES}
    with monkeypatch.context() as reference:
        reference.setenv("MLFLOW_TRACKING_URI", sqlite)
        reference.setattr(artifacts, "MLFLOW_ARTIFACTS", tmp_path / "reference" / "mlartifacts")
        assert cli.main(command) == 0
    run_dir.rename(tmp_path / "run-sqlite")

    capfd.readouterr()
    assert cli.main(command) == 0  # MLFLOW_TRACKING_URI/USERNAME/PASSWORD: the server's
    console = capfd.readouterr()

    # Code-derived lineage tags compare only if nobody edited the stages' code between the
    # two runs (others may, in a shared checkout; in CI nobody does).
    same_code = code_before == {stage: lineage.code_hash(stage) for stage in cli.STAGES}
    if not same_code:
        warnings.warn("the pipeline's code changed between the two runs: code hashes and the "
                      "lineage keys made from them not compared", stacklevel=1)

    postgres = picture(as_admin.url, "parity", tmp_path / "dl-pg")
    reference = picture(sqlite, "parity", tmp_path / "dl-sqlite")
    assert sorted(postgres["runs"]) == ["<corpus>", "<data>", "<pipeline>", "<pretrain>",
                                        "<vocab>"]
    assert postgres["registry"]["bert-encoder-run"]["versions"]["1"]["run"] == "<pretrain>"
    assert postgres["runs"]["<pretrain>"]["metrics"]["loss"][-1][0] == 6  # every logged step
    differ = [(stage, part, key, postgres["runs"][stage][part].get(key), value)
              for stage, seen in reference["runs"].items()
              for part in ("params", "metrics", "tags", "artifacts")
              for key, value in {**seen[part], **postgres["runs"][stage][part]}.items()
              if postgres["runs"][stage][part].get(key) != seen[part].get(key)
              and (same_code or not key.startswith(CODE_DERIVED))]
    assert not differ, differ
    assert {k: v["status"] for k, v in postgres["runs"].items()} == \
        {k: v["status"] for k, v in reference["runs"].items()}
    assert postgres["registry"] == reference["registry"]
    lineage = {k for k in postgres["runs"]["<data>"]["tags"] if k.startswith("lineage.")}
    assert {"lineage.key", "lineage.code_hash", "lineage.upstream.vocab"} <= lineage
    assert postgres["runs"]["<pretrain>"]["tags"]["pretrain.weights_sha256"]
    assert postgres["runs"]["<pipeline>"]["tags"]["stage.data.run_id"] == "<data>"
    # The artifacts went through the server into its folder.
    assert list(as_admin.layout.artifacts.rglob("vocab.txt"))
    logs = {str(p): p.read_text() for p in (run_dir / "logs").glob("*.log")}
    assert_no_secret({"console": console.out + console.err, **logs,
                      "server log": as_admin.layout.log.read_text()}, as_admin.layout)


@pytest.mark.slow
def test_database_url_points_a_server_at_an_existing_database(as_admin, monkeypatch):
    """DATABASE_URL with a password: the password goes to the folder's pgpass only; the second
    server sees what the first one stored."""
    layout = as_admin.layout
    client = mlflow.MlflowClient(as_admin.url)
    name = f"shared-{uuid.uuid4().hex[:6]}"
    client.create_experiment(name)
    db_password = secrets_of(layout)[2]
    # The users live in the first server's auth database: its admin password, not a new one.
    monkeypatch.setenv("MLFLOW_AUTH_ADMIN_PASSWORD", as_admin.password)
    pg_port = as_admin.state["pg_port"]
    folder = as_admin.base / "second"
    monkeypatch.setenv("DATABASE_URL",
                       f"postgresql://mlflow:{db_password}@127.0.0.1:{pg_port}/mlflow")
    monkeypatch.setenv("AUTH_DATABASE_URL",
                       f"postgres://mlflow:{db_password}@127.0.0.1:{pg_port}/mlflow_auth")
    state = server_lib.start(folder, port=0, workers=1)
    try:
        assert not state["cluster"] and not (folder / "postgres").exists()
        assert state["backend"] == f"postgresql+psycopg2://mlflow@127.0.0.1:{pg_port}/mlflow"
        assert mlflow.MlflowClient(state["url"]).get_experiment_by_name(name) is not None
        second = server_lib.Layout(folder)
        assert second.pgpass.stat().st_mode & 0o777 == 0o600
        assert db_password in second.pgpass.read_text()
        for path in (second.auth_ini, second.state, second.log):
            assert db_password not in path.read_text(), path
    finally:
        server_lib.stop(folder)
    assert server_lib.status(folder)["running"] is False


# ---------------------------------------------------------------------------
# Bad input: one line, exit 2, before anything starts.
# ---------------------------------------------------------------------------
def _start_fails(capsys, folder, *args) -> str:
    assert server_lib.main(["start", "--dir", str(folder), *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1, captured.err
    return captured.err


@pytest.mark.parametrize("variable, value, says", [
    ("DATABASE_URL", "mysql://u:p@db/mlflow", "DATABASE_URL must look like postgresql://"),
    ("MLFLOW_AUTH_ADMIN_PASSWORD", "short", "shorter than 12 characters"),
    ("DEFAULT_PERMISSION", "ALL", "DEFAULT_PERMISSION=ALL is not one of READ"),
])
def test_bad_settings_are_one_line(tmp_path, monkeypatch, capsys, variable, value, says):
    for name in SECRET_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, value)
    err = _start_fails(capsys, tmp_path / "s", "--port", "0")
    assert says in err and (value == "short" or "p@db" not in err)
    assert not (tmp_path / "s" / "mlflow.pid").exists()


def test_a_port_in_use_is_one_line(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        err = _start_fails(capsys, tmp_path / "s", "--port", str(port))
    assert f"port {port} on 127.0.0.1 is in use" in err and "PORT=" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="as root only: the cluster then runs as postgres")
def test_a_folder_postgres_cannot_reach_is_one_line(tmp_path, capsys, monkeypatch):
    if server_lib.pg_bin() is None:
        pytest.skip(NO_POSTGRES)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    os.chmod(tmp_path, 0o700)  # pytest's own folders are root's alone
    err = _start_fails(capsys, tmp_path / "s", "--port", "0")
    assert "postgres system user cannot write" in err and "SERVER_DIR" in err


def test_database_url_password_goes_to_pgpass_only(tmp_path):
    layout = server_lib.Layout(tmp_path)
    url = server_lib.external_database(
        "postgresql://team:p%3Ass:w0rd@db.example.com:6543/tracking?sslmode=require", layout)
    assert url == "postgresql+psycopg2://team@db.example.com:6543/tracking?sslmode=require"
    assert layout.pgpass.read_text() == "db.example.com:6543:tracking:team:p\\:ss\\:w0rd\n"
    assert layout.pgpass.stat().st_mode & 0o777 == 0o600
    assert server_lib.external_database("postgresql://team@db/x", layout) == \
        "postgresql+psycopg2://team@db/x"
