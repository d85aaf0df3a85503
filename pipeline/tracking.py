"""MLflow tracking: one parent run per pipeline invocation, one nested run per stage.

The store is `tracking.tracking_uri` if set, else $MLFLOW_TRACKING_URI, else a
SQLite file in the project (`mlflow.db`, artifacts under `mlartifacts/`), which
`make ui` serves. Every stage run gets the whole config flattened as params,
the config file as an artifact, and the stage's own metrics and artifacts.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import time

import mlflow

from pipeline import artifacts, config as config_lib


def tracking_uri(config: config_lib.Config) -> str:
    if config.tracking.tracking_uri:
        return config.tracking.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{artifacts.MLFLOW_DB}"


def _experiment_id(name: str, uri: str) -> str:
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    location = None
    if uri.startswith("sqlite:") or uri.startswith("file:"):
        location = artifacts.MLFLOW_ARTIFACTS.as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except mlflow.exceptions.MlflowException:  # created concurrently
        return client.get_experiment_by_name(name).experiment_id


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
    mlflow.set_tracking_uri(uri)
    experiment_id = _experiment_id(config.tracking.experiment, uri)
    tags = {
        "pipeline.stages": " ".join(stages),
        "pipeline.run_dir": str(artifacts.Artifacts(config.run_dir).root),
        "pipeline.config_file": config_path,
        "mlflow.source.git.commit": git_commit(),
        "lineage.config_hash": hashlib.sha256(config_lib.dump_yaml(config).encode()).hexdigest(),
        "mlflow.note.content": f"Pipeline invocation running stages: {', '.join(stages)}.",
    }
    mlflow.set_experiment(experiment_id=experiment_id)  # the stage runs nest in the same one
    with mlflow.start_run(experiment_id=experiment_id, run_name=f"pipeline: {' → '.join(stages)}",
                          tags=tags) as run:
        mlflow.log_params(config_lib.to_flat_dict(config))
        mlflow.log_text(config_lib.dump_yaml(config), "config.yaml")
        yield run


def run_link(run_id: str) -> str:
    """The MLflow UI's address of a run, relative to the UI root (paste after the host)."""
    if not run_id:
        return ""
    try:
        experiment_id = mlflow.get_run(run_id).info.experiment_id
    except mlflow.exceptions.MlflowException:
        return ""
    return f"#/experiments/{experiment_id}/runs/{run_id}"


@contextlib.contextmanager
def stage_run(name: str, config: config_lib.Config, description: str = "", tags: dict | None = None):
    """A nested run for one stage; its status is FAILED if the block raises."""
    with mlflow.start_run(run_name=name, nested=True,
                          tags={"pipeline.stage": name,
                                "mlflow.source.git.commit": git_commit(),
                                "mlflow.note.content": description or f"Stage {name}.",
                                **(tags or {})}) as run:
        mlflow.log_params(config_lib.to_flat_dict(config))
        mlflow.log_text(config_lib.dump_yaml(config), "config.yaml")
        start = time.time()
        yield run
        mlflow.log_metric("stage_seconds", time.time() - start)


# ---------------------------------------------------------------------------
# Model registry: a version per run; the "champion" alias moves only to a better model.
# ---------------------------------------------------------------------------
CHAMPION = "champion"


def promote_if_better(model_name: str, version: str, metric: str, value: float,
                      test_split: str, higher_is_better: bool = True, log=print) -> bool:
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
    elif holder.version == str(version):
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
    if mlflow.active_run():
        mlflow.set_tags({"registry.model": model_name, "registry.version": str(version),
                         "registry.promoted": str(promote), "registry.decision": reason})
    log(f"registry: {model_name} v{version}: {'promoted to' if promote else 'not'} "
        f"{CHAMPION} ({reason})")
    return promote
