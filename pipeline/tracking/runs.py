"""MLflow tracking: one parent run per pipeline invocation, one nested run per stage.

The store is `tracking.tracking_uri` if set, else $MLFLOW_TRACKING_URI, else a
SQLite file in the project (`mlflow.db`, artifacts under `mlartifacts/`), which
`make ui` serves. Every stage run gets the whole config flattened as params,
the config file as an artifact, and the stage's own metrics and artifacts.

A training that resumes from a checkpoint continues the run it started (`resumable_run`,
`reopen_run`; the run id is kept beside the checkpoints by `write_run_file`); two-phase
pretraining adds a run per phase under the pipeline run (`child_run`). Under multi_worker only
the chief creates runs (pipeline/cli.py).

`flat_metrics` turns a nested stats dict into MLflow metrics.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import subprocess
import time
from pathlib import Path

import mlflow

from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.tracking import outbox

log = logging.getLogger(__name__)


def flat_metrics(stats: dict, prefix: str) -> dict:
    """Numbers of a stats dict as MLflow metrics: nested dicts flattened with ".", settings,
    strings and booleans left out (they are params)."""
    metrics = {}
    for key, value in stats.items():
        if key == "settings":
            continue
        if isinstance(value, dict):
            metrics.update(flat_metrics(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[f"{prefix}{key}"] = value
    return metrics


def tracking_uri(config: config_lib.Config) -> str:
    if config.tracking.tracking_uri:
        return config.tracking.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{artifacts.MLFLOW_DB}"


# MLflow 3's UI opens an experiment of this kind on its runs table (not the GenAI views).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
# Stages whose runs also record CPU, memory (and GPU) use every 10 s: MLflow's system metrics.
TRAINING_STAGES = ("pretrain", "finetune", "sweep", "multitask", "distill")
# Its start/stop lines are INFO on the console; warnings still show (and reach the log file).
logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)


def create_sqlite_store(uri: str) -> None:
    """Makes a new SQLite store aside and moves it into place. MLflow creates one by running its
    schema migrations in the file itself: killed half-way (found by the fault suite), it left a
    store that no later run could open ("table _alembic_tmp_tags already exists")."""
    if not uri.startswith("sqlite:///"):
        return
    final = Path(uri[len("sqlite:///"):])
    if final.exists():
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    for stray in final.parent.glob(f".{final.name}.tmp-*"):  # a killed creation's, if old
        if time.time() - stray.stat().st_mtime > 3600:
            stray.unlink(missing_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{int(time.time() * 1e6)}")
    try:
        mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments(max_results=1)
        try:
            os.link(tmp, final)  # not over a store another process made meanwhile
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)


def _experiment_id(name: str, uri: str) -> str:
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.tags.get("mlflow.experimentKind") is None:
            for key, value in EXPERIMENT_KIND.items():
                client.set_experiment_tag(experiment.experiment_id, key, value)
        return experiment.experiment_id
    location = None
    if uri.startswith("sqlite:") or uri.startswith("file:"):
        location = artifacts.MLFLOW_ARTIFACTS.as_uri()
    try:
        return client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_KIND)
    except mlflow.exceptions.MlflowException:  # created concurrently
        return client.get_experiment_by_name(name).experiment_id


class TrackingAccessError(ValueError):
    """The tracking server refused this user (HTTP 401: credentials; 403: permission); a
    ValueError, so the CLI prints its one line and exits 2 (pipeline/cli.py)."""


def access_error(err: Exception, uri: str, experiment: str) -> TrackingAccessError | None:
    """The one-line error for a refusal by an MLflow server with accounts (`make server`,
    docs/team-server.md); None for any other error."""
    code = getattr(err, "error_code", "")
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    if code == "UNAUTHENTICATED":
        said = (f"refused the credentials of user {user!r}" if user
                else "needs credentials and none were given")
        return TrackingAccessError(
            f"the tracking server {uri} {said} (HTTP 401): set MLFLOW_TRACKING_USERNAME and "
            f"MLFLOW_TRACKING_PASSWORD to a user of that server and its password (its admin "
            f"adds users: docs/team-server.md)")
    if code == "PERMISSION_DENIED":
        return TrackingAccessError(
            f"the tracking server {uri} does not let user {user!r} (MLFLOW_TRACKING_USERNAME) "
            f"write to experiment {experiment!r} (HTTP 403): ask its admin for EDIT on it "
            f"(docs/team-server.md) or set tracking.experiment to one you may write to")
    return None


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=artifacts.PROJECT_ROOT,
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@contextlib.contextmanager
def pipeline_run(config: config_lib.Config, stages: list[str], config_path: str = ""):
    """The parent run of one invocation; stage runs started inside it are nested."""
    uri = tracking_uri(config)
    create_sqlite_store(uri)
    mlflow.set_tracking_uri(uri)
    tags = {
        "pipeline.stages": " ".join(stages),
        "pipeline.run_dir": str(artifacts.Artifacts(config.run_dir).root),
        "pipeline.config_file": config_path,
        "mlflow.source.git.commit": git_commit(),
        "lineage.config_hash": hashlib.sha256(config_lib.dump_yaml(config).encode()).hexdigest(),
        "mlflow.note.content": f"Pipeline invocation running stages: {', '.join(stages)}.",
    }
    try:  # the first calls that reach the store: a server refusing this user is one line
        experiment_id = _experiment_id(config.tracking.experiment, uri)
        mlflow.set_experiment(experiment_id=experiment_id)  # the stage runs nest in the same one
        run = mlflow.start_run(experiment_id=experiment_id,
                               run_name=f"pipeline: {' → '.join(stages)}", tags=tags)
    except mlflow.exceptions.MlflowException as err:
        refused = access_error(err, uri, config.tracking.experiment)
        if refused is None:
            raise
        raise refused from err
    paths = artifacts.Artifacts(config.run_dir)
    _close_interrupted(paths, run.info.run_id)
    _remember(paths, "pipeline", run.info.run_id)
    # From here on what the stages log survives the store going away (kept in the run dir).
    kept = outbox.configure(artifacts.Artifacts(config.run_dir).tracking_outbox,
                            config.tracking.retry_seconds)
    try:
        with _ending(run):
            if kept:  # calls an earlier invocation on this run dir could not send
                sent, left = outbox.flush()
                log.info(
                    f"tracking: sent {sent} MLflow calls an earlier run kept while the store was "
                    f"down" + (f" ({left} still kept)" if left else ""))
            outbox.log_params(config_lib.to_flat_dict(config))
            outbox.log_text(config_lib.dump_yaml(config), "config.yaml")
            yield run
    finally:
        outbox.configure(None)
        paths.active_runs.unlink(missing_ok=True)  # ended, one way or another, not killed


def _remember(paths: artifacts.Artifacts, name: str, run_id: str) -> None:
    """Adds a run of the invocation under way to <run_dir>/tracking/active_runs.json."""
    try:
        record = json.loads(paths.active_runs.read_text())
    except (OSError, ValueError):
        record = {}
    record[name] = run_id
    artifacts.write_text_atomic(paths.active_runs, json.dumps(record, indent=1))


def _close_interrupted(paths: artifacts.Artifacts, new_parent: str) -> None:
    """An active_runs.json left by an earlier invocation means it was killed (or its machine
    went down) before it could end its runs (the run directory's lock keeps two invocations
    apart): its runs that still say RUNNING are ended as KILLED, with a tag saying so, so
    that the UI shows what happened. (An interrupted training's run is then reopened by its
    re-run, `resumable_run`.)"""
    try:
        record = json.loads(paths.active_runs.read_text())
    except (OSError, ValueError):
        return
    client = mlflow.MlflowClient()
    for name, run_id in record.items():
        try:
            if client.get_run(run_id).info.status != "RUNNING":
                continue
            client.set_tag(run_id, "pipeline.interrupted",
                           f"its invocation was killed before {name} ended; pipeline run "
                           f"{new_parent} ran next")
            client.set_terminated(run_id, "KILLED")
        except mlflow.exceptions.MlflowException:
            continue  # another store, or gone
    paths.active_runs.unlink(missing_ok=True)


@contextlib.contextmanager
def _ending(run):
    """Ends `run` as FINISHED, or FAILED if the block raises, through the outbox: a tracking
    store that went away meanwhile does not turn a finished stage into a crash."""
    try:
        yield
    except BaseException:
        if _is_active(run):
            outbox.end_run("FAILED")
        raise
    if _is_active(run):
        outbox.end_run("FINISHED")


def _is_active(run) -> bool:
    active = mlflow.active_run()
    return active is not None and active.info.run_id == run.info.run_id


def run_link(run_id: str) -> str:
    """The MLflow UI's address of a run, relative to the UI root (paste after the host)."""
    if not run_id or outbox.is_down():
        return ""
    try:
        experiment_id = mlflow.get_run(run_id).info.experiment_id
    except mlflow.exceptions.MlflowException:
        return ""
    return f"#/experiments/{experiment_id}/runs/{run_id}"


def _has_psutil() -> bool:
    import importlib.util

    return importlib.util.find_spec("psutil") is not None


@contextlib.contextmanager
def stage_run(name: str, config: config_lib.Config, description: str = "", tags: dict | None = None,
              resume_run_id: str = ""):
    """A nested run for one stage; its status is FAILED if the block raises.

    `resume_run_id`: the run an interrupted stage recorded (the pretrain stage keeps it beside
    its checkpoints); if it can be resumed (`resumable_run`) it is reopened instead of
    starting a new run, so its metrics continue where they stopped.
    """
    tags = {"pipeline.stage": name, "mlflow.source.git.commit": git_commit(),
            "mlflow.note.content": description or f"Stage {name}.", **(tags or {})}
    if resumable_run(resume_run_id):
        active = reopen_run(resume_run_id, tags)
    else:
        active = mlflow.start_run(run_name=name, nested=True, tags=tags,
                                  log_system_metrics=name in TRAINING_STAGES and _has_psutil())
    _remember(artifacts.Artifacts(config.run_dir), name, active.info.run_id)
    with _ending(active):
        log_params(config_lib.to_flat_dict(config))
        outbox.log_text(config_lib.dump_yaml(config), "config.yaml")
        start = time.time()
        yield active
        outbox.log_metrics({"stage_seconds": time.time() - start})


# ---------------------------------------------------------------------------
# Resuming a run: a training interrupted (preempted, killed) and re-run continues the
# MLflow run it started, recorded in <checkpoint dir>/mlflow_run.json (write_run_file).
# ---------------------------------------------------------------------------
def resumable_run(run_id: str) -> bool:
    """True if `run_id` is a run of the current store and experiment that did not finish
    (RUNNING: its process died; FAILED or KILLED), so a resumed training may continue it.
    A FINISHED run is left alone: training further after it completed gets a new run."""
    if not run_id:
        return False
    try:
        run = mlflow.MlflowClient().get_run(run_id)
    except mlflow.exceptions.MlflowException:
        return False  # another store, or deleted for good
    active = mlflow.active_run()
    experiment = active.info.experiment_id if active else None
    return (run.info.lifecycle_stage == "active" and run.info.status != "FINISHED"
            and (experiment is None or run.info.experiment_id == experiment))


def reopen_run(run_id: str, tags: dict | None = None,
               parent_run_id: str | None = None) -> mlflow.ActiveRun:
    """Reopens `run_id` (status RUNNING again) as a nested run under `parent_run_id` (default:
    the active run, i.e. this invocation's pipeline run); the parents it had before are kept in
    the tag `resume.previous_parent_run_ids`."""
    client = mlflow.MlflowClient()
    active = mlflow.active_run()
    parent = parent_run_id or (active.info.run_id if active else None)
    old_tags = client.get_run(run_id).data.tags
    previous = old_tags.get("mlflow.parentRunId")
    extra = {"resume.count": str(int(old_tags.get("resume.count", "0")) + 1)}
    if parent and previous and previous != parent:
        history = [p for p in old_tags.get("resume.previous_parent_run_ids", "").split(",") if p]
        extra["resume.previous_parent_run_ids"] = ",".join(history + [previous])
    if parent:
        extra["mlflow.parentRunId"] = parent
    return mlflow.start_run(run_id=run_id, nested=True, tags={**(tags or {}), **extra})


@contextlib.contextmanager
def child_run(name: str, parent_run_id: str, tags: dict | None = None, resume_run_id: str = ""):
    """A run nested under `parent_run_id` (which need not be the active run: e.g. a pretraining
    phase's run under the pipeline run, while the pretrain stage's run is active), or
    `resume_run_id` reopened there if it is resumable. It is the active run inside the block;
    its status is FAILED if the block raises."""
    from mlflow.tracking.context import registry

    tags = dict(tags or {})
    if resumable_run(resume_run_id):
        active = reopen_run(resume_run_id, tags, parent_run_id)
    else:
        client = mlflow.MlflowClient()
        experiment = (mlflow.active_run().info.experiment_id if mlflow.active_run()
                      else client.get_run(parent_run_id).info.experiment_id)
        created = client.create_run(experiment, run_name=name, tags=registry.resolve_tags(
            {**tags, "mlflow.parentRunId": parent_run_id, "mlflow.runName": name}))
        active = mlflow.start_run(run_id=created.info.run_id, nested=True)
    with _ending(active):
        yield active


def log_params(params: dict) -> None:
    """mlflow.log_params on the active run (none: nothing), safe on a resumed run: params it
    already has with the same value are skipped; a changed value (MLflow params cannot change)
    is recorded as the tag `param_changed.<key>` = the new value instead. Through the outbox:
    while the store is down they are kept (and the run's old params are not read)."""
    run_id = outbox.active_run_id()
    if run_id is None:
        return
    stored = outbox.store_id(run_id)
    old = {}
    if not outbox.is_down() and stored is not None:
        try:
            old = mlflow.MlflowClient().get_run(stored).data.params
        except Exception as err:  # the store went away now: keep the params, as every call does
            if not (outbox.is_configured() and outbox.is_outage(err)):
                raise
            outbox.went_down(err)
    new, changed = {}, {}
    for key, value in params.items():
        if key not in old:
            new[key] = value
        elif old[key] != str(value):
            changed[f"param_changed.{key}"] = str(value)
    outbox.log_params(new, run_id)
    outbox.set_tags(changed, run_id)


@contextlib.contextmanager
def nested_run(name: str, tags: dict):
    """A run named `name` nested under the active run, active inside the block and ended
    FINISHED (FAILED if the block raises) through the outbox; yields its id. Without an active
    run it yields None and the block logs nothing (its outbox calls are no-ops). While the
    store is down (under the CLI) the run is created from the outbox once it answers
    (`outbox.pending_run`), so a sweep goes on through an outage and loses nothing."""
    from mlflow.tracking.context import registry

    parent = outbox.active_run_id()
    if parent is None:
        yield None
        return
    run = None
    if not (outbox.is_pending(parent) or (outbox.is_configured() and outbox.is_down())):
        try:
            run = mlflow.start_run(run_name=name, nested=True, tags=tags,
                                   experiment_id=mlflow.active_run().info.experiment_id)
        except Exception as err:  # an outage under the CLI is kept, anything else raised
            if not (outbox.is_configured() and outbox.is_outage(err)):
                raise
            outbox.went_down(err)
    if run is not None:
        with _ending(run):
            yield run.info.run_id
        return
    with outbox.pending_run(mlflow.active_run().info.experiment_id, name,
                            registry.resolve_tags(tags), parent) as run_id:
        yield run_id


def parent_run_id(run_id: str) -> str:
    """The run `run_id` is nested under (itself if it is a top-level run)."""
    return mlflow.MlflowClient().get_run(run_id).data.tags.get("mlflow.parentRunId") or run_id


def write_run_file(path, run_id: str) -> None:
    """Records `run_id` (with the tracking URI) in `path` (atomically): the run a resumed
    training continues (see `resumable_run`)."""
    artifacts.write_text_atomic(Path(path), json.dumps(
        {"run_id": run_id, "tracking_uri": mlflow.get_tracking_uri()}, indent=2))


def read_run_file(path) -> str:
    """The run id `write_run_file` recorded in `path`, if it is for the current store ("" if
    there is none or it is unreadable)."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(record, dict) or record.get("tracking_uri") != mlflow.get_tracking_uri():
        return ""
    return str(record.get("run_id") or "")


# ---------------------------------------------------------------------------
# A run kept open across invocations, not on the active-run stack (the model cycle's,
# pipeline/cycle.py): created and read here, written to through the outbox with its id.
# ---------------------------------------------------------------------------
def use_store(config: config_lib.Config) -> str:
    """Points MLflow at the config's store (a new SQLite file created safely), with bounded
    HTTP retries; returns the id of the config's experiment (created if new)."""
    outbox.set_http_patience()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    uri = tracking_uri(config)
    create_sqlite_store(uri)
    mlflow.set_tracking_uri(uri)
    return _experiment_id(config.tracking.experiment, uri)


def create_run(experiment_id: str, name: str, tags: dict, params: dict) -> str:
    """A new top-level run (not made the active one) with `tags` and `params`; its id."""
    run_id = mlflow.MlflowClient().create_run(experiment_id, run_name=name,
                                              tags=tags).info.run_id
    outbox.log_params(params, run_id)
    return run_id


def mark_running(run_id: str) -> None:
    """Status RUNNING again for a run that ended (or failed) and is continued."""
    client = mlflow.MlflowClient()
    if client.get_run(run_id).info.status != "RUNNING":
        client.update_run(run_id, status="RUNNING")


def adopt_runs(experiment_id: str, run_dir, since_ms: int, parent_run_id: str) -> str:
    """Nests under `parent_run_id` the top-level runs of `run_dir` started since `since_ms`
    (a pipeline invocation's runs); returns the id of the last one ("" if none)."""
    last = ""
    for run in mlflow.MlflowClient().search_runs(
            [experiment_id], f"tags.`pipeline.run_dir` = '{run_dir}' and "
                             f"attributes.start_time >= {since_ms}"):
        if not run.data.tags.get("mlflow.parentRunId"):
            outbox.set_tags({"mlflow.parentRunId": parent_run_id}, run.info.run_id)
            last = run.info.run_id
    return last


@contextlib.contextmanager
def active(run_id: str):
    """`run_id` as the active run inside the block (e.g. to log a model on it), ended after
    (FINISHED, or FAILED if the block raises) as mlflow.start_run's block would."""
    run = mlflow.start_run(run_id=run_id)
    with _ending(run):
        yield run


# ---------------------------------------------------------------------------
# Model registry: a version per run; the "champion" alias moves only to a better model.
# ---------------------------------------------------------------------------
CHAMPION = "champion"


def promote_if_better(model_name: str, version: str, metric: str, value: float,
                      test_split: str, higher_is_better: bool = True) -> bool:
    """Gives `version` the champion alias if its `metric` on `test_split` beats the holder's.

    The comparison is only made on the same test split (an id such as the hash of the
    split's contents): a holder evaluated on another split is not comparable, and then the
    new version is promoted only if there is no holder. The decision is recorded as tags
    on the model version and, when a run is active, on the run.
    """
    client = mlflow.MlflowClient()
    client.set_model_version_tag(model_name, version, f"eval.{metric}", str(value))
    client.set_model_version_tag(model_name, version, "eval.test_split", test_split)
    try:
        holder = client.get_model_version_by_alias(model_name, CHAMPION)
    except mlflow.exceptions.MlflowException:
        holder = None
    if holder is None:
        promote, reason = True, "no champion yet"
    elif str(holder.version) == str(version):
        promote, reason = False, "already the champion"
    elif holder.tags.get("eval.test_split") != test_split:
        promote, reason = False, (f"champion v{holder.version} was evaluated on another test split "
                                  f"({holder.tags.get('eval.test_split')}); not comparable")
    else:
        best = float(holder.tags.get(f"eval.{metric}", "nan"))
        better = value > best if higher_is_better else value < best
        promote = better or best != best  # NaN: the holder has no score for this metric
        reason = (f"{metric} {value:.4f} {'beats' if better else 'does not beat'} champion "
                  f"v{holder.version}'s {best:.4f}")
    if promote:
        client.set_registered_model_alias(model_name, CHAMPION, version)
    client.set_model_version_tag(model_name, version, "promotion", reason)
    outbox.set_tags({"registry.model": model_name, "registry.version": str(version),
                     "registry.promoted": str(promote), "registry.decision": reason})
    log.info(f"registry: {model_name} v{version}: {'promoted to' if promote else 'not'} "
             f"{CHAMPION} ({reason})")
    return promote


def version_tag(model_name: str, version: str, key: str) -> str:
    """A tag of a registered model version ("" if it has none)."""
    return mlflow.MlflowClient().get_model_version(model_name, version).tags.get(key, "")


def describe_version(model_name: str, version: str, description: str | None = None,
                     tags: dict | None = None) -> None:
    """Sets a registered model version's tags (values as strings) and its description."""
    client = mlflow.MlflowClient()
    for key, value in (tags or {}).items():
        client.set_model_version_tag(model_name, version, key, str(value))
    if description is not None:
        client.update_model_version(model_name, version, description=description)


def log_parameter_breakdown(model, artifact_dir: str = "params"):
    """Logs the parameter breakdown of `model`: `<artifact_dir>/params.json`, `params.txt` and `params_*` metrics to the active run."""
    from models.params import parameter_breakdown

    breakdown = parameter_breakdown(model)  # models/params.py
    if outbox.active_run_id() is None:
        return breakdown
    outbox.log_text(json.dumps(breakdown.to_dict(), indent=2, default=str),
                    f"{artifact_dir}/params.json")
    outbox.log_text(breakdown.format_table() + "\n", f"{artifact_dir}/params.txt")
    metrics = {f"params_{k}": float(v) for k, v in breakdown.summary().items()}
    metrics.update({f"params_{k}": float(v) for k, v in breakdown.ratios.items()})
    outbox.log_metrics(metrics)
    return breakdown
