"""When the tracking server goes away: MLflow calls that cannot reach it are kept in the run
directory and sent when it answers again, so no logging call ends a long training.

The CLI points the outbox at <run_dir>/tracking/outbox.jsonl (`configure`) once per invocation.
What a running stage logs goes through `log_metrics`, `set_tags`, `log_artifact`, `log_text`,
`deferred` and `end_run` here instead of mlflow's: each tries the store; if it does not answer
(a refused or timed-out connection, a 5xx, a locked SQLite file: `is_outage`), the call is
appended to the outbox with its original timestamp, one warning is printed, and for
`RETRY_SECONDS` no further call waits on the network. The first call after that which reaches
the store sends the outbox first, in order, so a metric history comes out as if nothing had
happened. Whatever is still in the outbox when the invocation ends is sent by the next
invocation on the same run directory, or by

    python -m pipeline tracking-sync --config FILE [key=value ...]

(pipeline/tools/tracking_sync.py).

A run whose end could not be recorded stays RUNNING in the store until then (the outbox holds
its FINISHED/FAILED with the time it really ended). A run nested under a stage's that starts
while the store is down (the next point of a sweep) is created from the outbox too
(`pending_run`): until then it goes by a local id, "pending-<hex>", which the kept calls name
and which is replaced by the store's id when the run is created.

This module is the pipeline's one door to MLflow for what a stage writes: outside
pipeline/tracking/, pipeline/serving/ and pipeline/tools/ nothing imports mlflow
(tests/test_import_contracts.py). Each call is a no-op while no run is active (a library user
calling a stage function without the CLI), so callers need no guard of their own.

Calls made while nothing is configured (a library user, a test) go straight to mlflow.
Starting a run needs the store (its id comes from there): a store that is down when a stage
starts is a one-line error (exit 2) naming it, before any work.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
import uuid
from pathlib import Path

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

log = logging.getLogger(__name__)

# After a failed call, this long passes before the store is tried again (calls in between
# go straight to the outbox: a training step never waits on a dead server twice);
# tracking.retry_seconds.
RETRY_SECONDS = 30.0
# How patient one MLflow HTTP call is (mlflow's defaults retry for minutes); set by the CLI
# unless the environment already says otherwise.
HTTP_SETTINGS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
# MLflow error codes that mean "the store is not answering", not "the request is wrong".
OUTAGE_CODES = {"TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED",
                "DEADLINE_EXCEEDED", "ENDPOINT_NOT_FOUND"}
# The prefix of the local id of a run created through the outbox (`pending_run`).
PENDING = "pending-"


class _State:
    path: Path | None = None
    retry_seconds: float = RETRY_SECONDS
    down_until: float = 0.0
    pending: int = 0
    warned: bool = False

    def __init__(self):
        self.runs: list[str] = []  # the pending runs active here, innermost last
        self.ids: dict[str, str] = {}  # pending id -> the store's id, once created


_state = _State()


def set_http_patience() -> None:
    """Bounded MLflow HTTP retries (a few seconds, not minutes) unless already set."""
    for key, value in HTTP_SETTINGS.items():
        os.environ.setdefault(key, value)


def configure(outbox_file: str | os.PathLike | None,
              retry_seconds: float = RETRY_SECONDS) -> int:
    """Keeps calls that cannot reach the store in `outbox_file` (None: none kept, calls go
    straight to mlflow). Returns the number of calls already waiting there."""
    _state.path = Path(outbox_file) if outbox_file else None
    _state.retry_seconds = retry_seconds
    _state.down_until, _state.warned = 0.0, False
    _state.runs, _state.ids = [], {}
    _state.pending = len(_read(_state.path)) if _state.path else 0
    return _state.pending


def is_outage(err: BaseException) -> bool:
    """True if `err` says the tracking store did not answer (worth keeping the call for later),
    False if the call itself was wrong (that is a bug to raise)."""
    if isinstance(err, MlflowException):
        # The REST client's own failures (no connection, a non-JSON 5xx from a proxy) say
        # "API request to ..."; a busy SQLite store says "database is locked".
        text = str(err)
        return (err.error_code in OUTAGE_CODES
                or "API request to" in text or "database is locked" in text)
    if isinstance(err, (ConnectionError, TimeoutError)):
        return True
    module = type(err).__module__
    return module.startswith(("requests", "urllib3", "sqlalchemy", "sqlite3"))


def is_down() -> bool:
    """True while the store is known not to answer (the outbox holds calls)."""
    return _state.pending > 0 or time.time() < _state.down_until


def is_configured() -> bool:
    """True while calls that cannot reach the store are kept (the CLI's stages)."""
    return _state.path is not None


def went_down(err: BaseException) -> None:
    """Records an outage seen by a call made outside this module (e.g. starting a run)."""
    _went_down(err)


# ---------------------------------------------------------------------------
# The calls a stage makes.
# ---------------------------------------------------------------------------
def _active_id(run_id: str | None) -> str | None:
    if run_id:
        return run_id
    if _state.runs:
        return _state.runs[-1]
    run = mlflow.active_run()
    return run.info.run_id if run else None


def active_run_id() -> str | None:
    """The id of the active run (the stage's, or a nested one), None without one. A run
    created from the outbox goes by its pending id (`is_pending`)."""
    return _active_id(None)


def is_pending(run_id: str | None) -> bool:
    """True for the local id of a run created through the outbox (`pending_run`)."""
    return bool(run_id) and run_id.startswith(PENDING)


def store_id(run_id: str) -> str | None:
    """The store's id of `run_id` (itself, unless pending); None while it is not created."""
    return _state.ids.get(run_id) if is_pending(run_id) else run_id


@contextlib.contextmanager
def pending_run(experiment_id: str, name: str, tags: dict, parent_run_id: str):
    """A run nested under `parent_run_id`, created through the outbox (now if the store
    answers, else once it does): the active run of the calls here inside the block (not of
    mlflow's fluent API), ended FINISHED (FAILED if the block raises). Yields its pending id."""
    run_id = f"{PENDING}{uuid.uuid4().hex}"
    submit({"op": "create", "run_id": run_id, "experiment_id": experiment_id, "run_name": name,
            "tags": {**tags, "mlflow.parentRunId": parent_run_id},
            "start_time": _now_ms()})
    _state.runs.append(run_id)
    status = "FAILED"
    try:
        yield run_id
        status = "FINISHED"
    finally:
        _state.runs.remove(run_id)
        terminate(run_id, status)


def _now_ms() -> int:
    return int(time.time() * 1000)


def log_metrics(metrics: dict, step: int | None = None, run_id: str | None = None) -> None:
    """mlflow.log_metrics for the active run (or `run_id`); kept if the store is down."""
    run_id = _active_id(run_id)
    if run_id and metrics:
        ts = _now_ms()
        rows = [[k, float(v), ts, int(step or 0)] for k, v in metrics.items()]
        for start in range(0, len(rows), BATCH_LIMITS["metrics"]):
            submit({"op": "batch", "run_id": run_id,
                    "metrics": rows[start:start + BATCH_LIMITS["metrics"]]})


def log_params(params: dict, run_id: str | None = None) -> None:
    """mlflow.log_params (values as strings); a param the run already has with another value is
    refused by the store (raised now; moved aside by `flush` if it was kept)."""
    run_id = _active_id(run_id)
    if run_id and params:
        rows = [(k, str(v)) for k, v in params.items()]
        for start in range(0, len(rows), BATCH_LIMITS["params"]):
            submit({"op": "batch", "run_id": run_id,
                    "params": dict(rows[start:start + BATCH_LIMITS["params"]])})


def set_tags(tags: dict, run_id: str | None = None) -> None:
    run_id = _active_id(run_id)
    if run_id and tags:
        submit({"op": "batch", "run_id": run_id, "tags": {k: str(v) for k, v in tags.items()}})


def log_artifact(local_path, artifact_path: str | None = None, run_id: str | None = None) -> None:
    """A file or a folder (mlflow.log_artifact / log_artifacts), sent from where it lies."""
    run_id = _active_id(run_id)
    if run_id:
        submit({"op": "artifact", "run_id": run_id, "path": str(Path(local_path).resolve()),
                "artifact_path": artifact_path})


def log_text(text: str, artifact_file: str, run_id: str | None = None) -> None:
    run_id = _active_id(run_id)
    if run_id:
        submit({"op": "text", "run_id": run_id, "text": text, "artifact_file": artifact_file})


def deferred(target: str, args: list, run_id: str | None = None) -> None:
    """Calls "module:function"(*args) with `run_id` as the active run (e.g. logging and
    registering a model), now, or from the outbox once the store answers. `args` must be JSON."""
    run_id = _active_id(run_id)
    if run_id:
        submit({"op": "call", "run_id": run_id, "target": target, "args": list(args)})


def terminate(run_id: str, status: str = "FINISHED") -> None:
    """Ends `run_id`, a run that is not the active one (MlflowClient.set_terminated)."""
    submit({"op": "terminate", "run_id": run_id, "status": status, "end_time": _now_ms()})


def end_run(status: str = "FINISHED") -> None:
    """Ends the active run (mlflow.end_run); its end is kept if the store is down."""
    run = mlflow.active_run()
    if run is None:
        return
    end_time = _now_ms()
    if _state.pending and time.time() >= _state.down_until:
        flush()  # what was kept goes first (the run's last metrics before its end)
    if not is_down():
        try:
            mlflow.end_run(status)
            return
        except Exception as err:  # an outage is kept, anything else re-raised
            if not is_outage(err):
                raise
            _went_down(err)
    else:
        _pop_active_run()
    _stop_system_metrics(run.info.run_id)
    _append({"op": "terminate", "run_id": run.info.run_id, "status": status,
             "end_time": end_time})


def _pop_active_run() -> None:
    """mlflow.end_run without its network call: the run is no longer the active one."""
    from mlflow.tracking import fluent

    stack = fluent._active_run_stack.get()
    if stack:
        stack.pop()
        os.environ.pop("MLFLOW_RUN_ID", None)


def _stop_system_metrics(run_id: str) -> None:
    from mlflow.tracking import fluent

    monitor = fluent.run_id_to_system_metrics_monitor.pop(run_id, None)
    if monitor is not None:
        monitor.finish()


# ---------------------------------------------------------------------------
# Sending, keeping, resending.
# ---------------------------------------------------------------------------
def submit(entry: dict) -> None:
    """Sends `entry` (after whatever the outbox holds), or keeps it if the store is down."""
    if _state.path is None:
        _send(entry)
        return
    if time.time() < _state.down_until:
        _append(entry)
        return
    try:
        if _state.pending:
            flush()
            if _state.pending:  # still down
                _append(entry)
                return
        _send(entry)
    except Exception as err:  # an outage is kept, anything else re-raised
        if not is_outage(err):
            raise
        _went_down(err)
        _append(entry)


def _resolved(entry: dict) -> dict:
    """`entry` with the pending ids of runs created meanwhile replaced by the store's (in any
    field: a tag may name a run too)."""
    if not _state.ids:
        return entry
    text = json.dumps(entry)
    if PENDING not in text:
        return entry
    for pending, real in _state.ids.items():
        text = text.replace(pending, real)
    return json.loads(text)


def _send(entry: dict) -> None:
    client = mlflow.MlflowClient()
    entry = _resolved(entry)
    run_id, op = entry["run_id"], entry["op"]
    if op == "create":
        created = client.create_run(entry["experiment_id"], start_time=entry["start_time"],
                                    tags=entry["tags"], run_name=entry["run_name"])
        _state.ids[run_id] = created.info.run_id
    elif op == "batch":
        client.log_batch(
            run_id, metrics=[Metric(k, v, ts, step) for k, v, ts, step in entry.get("metrics", [])],
            params=[Param(k, v) for k, v in entry.get("params", {}).items()],
            tags=[RunTag(k, v) for k, v in entry.get("tags", {}).items()])
    elif op == "artifact":
        path = Path(entry["path"])
        if not path.exists():
            log.warning(f"tracking: {path} is gone; its upload to run {run_id} is dropped")
        elif path.is_dir():
            client.log_artifacts(run_id, str(path), entry["artifact_path"])
        else:
            client.log_artifact(run_id, str(path), entry["artifact_path"])
    elif op == "text":
        client.log_text(run_id, entry["text"], entry["artifact_file"])
    elif op == "terminate":
        client.set_terminated(run_id, entry["status"], entry["end_time"])
    elif op == "call":
        import importlib

        module, function = entry["target"].split(":")
        active = mlflow.active_run()
        if active is not None and active.info.run_id == run_id:
            getattr(importlib.import_module(module), function)(*entry["args"])
        else:
            with mlflow.start_run(run_id=run_id, nested=active is not None):
                getattr(importlib.import_module(module), function)(*entry["args"])
    else:
        raise ValueError(f"tracking outbox: unknown entry {op!r}")


def _went_down(err: BaseException) -> None:
    _state.down_until = time.time() + _state.retry_seconds
    if not _state.warned:
        _state.warned = True
        reason = str(err).splitlines()[0][:200]
        refused = re.search(r"error code (401|403)\b", str(err))
        if refused:  # a server with accounts (make server) turned this user away mid-run
            log.warning(f"the tracking store {mlflow.get_tracking_uri()} refuses the calls of "
                        f"user {os.environ.get('MLFLOW_TRACKING_USERNAME')!r} (HTTP "
                        f"{refused.group(1)}); training goes on, and what it logs is kept in "
                        f"{_state.path}: fix MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD "
                        f"or the user's permissions (docs/team-server.md), then run python -m "
                        f"pipeline tracking-sync --config ...")
            return
        log.warning(f"the tracking store {mlflow.get_tracking_uri()} does not answer "
                    f"({reason}); training goes on, and what it logs is kept in {_state.path} "
                    f"and sent when the store answers again (or: python -m pipeline "
                    f"tracking-sync --config ...)")


def _read(path: Path | None) -> list[dict]:
    if path is None or not path.is_file():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:  # a line cut by a kill while it was appended: nothing to send
            continue
    return entries


def _append(entry: dict) -> None:
    if _state.path is None:
        raise RuntimeError("tracking outbox: not configured")
    _state.path.parent.mkdir(parents=True, exist_ok=True)
    with open(_state.path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    _state.pending += 1


def flush() -> tuple[int, int]:
    """Sends what the outbox holds, in order; stops at the first outage. Returns (sent, left).
    An entry the store refuses for another reason (e.g. its run was deleted) is moved to
    outbox.rejected.jsonl beside it with a warning, so it cannot block the rest."""
    path = _state.path
    entries = _read(path)
    sent = 0
    for index, count, entry in _merged(entries):
        try:
            _send(entry)
            sent += count
        except Exception as err:  # noqa: BLE001
            if is_outage(err):
                _went_down(err)
                _rewrite(path, [_resolved(e) for e in entries[index:]])
                return sent, len(entries) - index
            log.warning(f"tracking: the store refused a kept {entry['op']} for run "
                        f"{entry['run_id']} ({str(err).splitlines()[0][:200]}); moved to "
                        f"{path.with_suffix('.rejected.jsonl')}")
            with open(path.with_suffix(".rejected.jsonl"), "a", encoding="utf-8") as handle:
                handle.write(json.dumps(entry) + "\n")
    if path is not None and path.exists():
        path.unlink()
    if _state.warned and sent:  # the next outage gets its own warning
        log.info(f"tracking: the store {mlflow.get_tracking_uri()} answers again; sent the "
                 f"{sent} calls kept meanwhile")
    _state.pending, _state.down_until, _state.warned = 0, 0.0, False
    restart_system_metrics()
    return sent, 0


def restart_system_metrics() -> list[str]:
    """MLflow's system-metrics monitor ends its thread for good at the first call that fails
    (found by the fault suite's server_restart case: a training's `system/*` metrics stopped at
    the outage). Once the store answers again, each monitor of a run still active here whose
    thread has ended is replaced by a new one that continues its steps (the samples of the
    outage itself are not kept). Returns the run ids restarted."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    from mlflow.tracking import fluent

    restarted = []
    for run_id, monitor in list(fluent.run_id_to_system_metrics_monitor.items()):
        thread = getattr(monitor, "_process", None)
        if thread is None or thread.is_alive():
            continue
        fresh = SystemMetricsMonitor(run_id, resume_logging=True,
                                     tracking_uri=mlflow.get_tracking_uri())
        fluent.run_id_to_system_metrics_monitor[run_id] = fresh
        fresh.start()
        restarted.append(run_id)
    return restarted


# What one log_batch request may carry (MLflow's limits).
BATCH_LIMITS = {"metrics": 1000, "params": 100, "tags": 100}


def _merged(entries: list[dict]):
    """(index of the first entry, entries merged, entry): consecutive `batch` entries of one
    run merged up to MLflow's batch limits, so a long outage is sent in a few requests."""
    index = 0
    while index < len(entries):
        entry, count = entries[index], 1
        if entry["op"] == "batch":
            merged = {"op": "batch", "run_id": entry["run_id"],
                      "metrics": list(entry.get("metrics", [])),
                      "params": dict(entry.get("params", {})), "tags": dict(entry.get("tags", {}))}
            while index + count < len(entries):
                after = entries[index + count]
                if after["op"] != "batch" or after["run_id"] != entry["run_id"] or any(
                        len(merged[key]) + len(after.get(key, {})) > limit
                        for key, limit in BATCH_LIMITS.items()):
                    break
                merged["metrics"] += after.get("metrics", [])
                merged["params"].update(after.get("params", {}))
                merged["tags"].update(after.get("tags", {}))
                count += 1
            entry = merged
        yield index, count, entry
        index += count


def _rewrite(path: Path, entries: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    os.replace(tmp, path)
    _state.pending = len(entries)
