"""Fault-suite cases against the team server (issue 43 point 3): concurrent jobs on one
PostgreSQL-backed, authenticated MLflow server (pipeline/tools/server.py), the server or its
database killed mid-run, and nothing lost.

    python bench/fault_suite.py --stages server_concurrent,server_restart,postgres_restart

Every case runs three pipeline invocations at once against the same server, as the scheduled
jobs of a team would: two `pretrain --scheduled` on different run directories (their corpus,
vocab and data copied from one base run; train.max_seconds bounds them) and one `finetune` of
the base run's pretrained model. Then, per case:

    server_concurrent   no fault: the three write at once
    server_restart      once every invocation is in its training loop (and a seeded 0-3 s
                        later), the MLflow server's process group is killed (SIGKILL), and
                        started again on the same port DOWN_SECONDS later
    postgres_restart    the same with the PostgreSQL cluster (postmaster and backends, SIGKILL);
                        the MLflow server stays up and answers 5xx meanwhile

After the three have ended (each must exit 0), `python -m pipeline tracking-sync` on each run
directory sends what an outbox still holds (pipeline/tracking/outbox.py), and the checks run on
the server's REST API:

- every metric step the run's own log shows was logged reached the run, once: pretraining's
  `step N/M` lines against the run's `loss` history; fine-tuning's `finetune: step N/T` and
  `finetune: epoch E  step S` lines against its `train_loss` history (both log it, so a step
  can be there twice, as often as the log says) and each epoch's step against the `val_*`
  histories; the end-of-stage metrics (stage_seconds, eval / test metrics) are there;
- the run's artifacts are there, each with the size of the local file it was sent from
  (pretrain: model.keras, saved_model.pb, eval.json, its config; finetune: metrics.json,
  model.keras, the test predictions, config.yaml);
- a training run that went on 20 s past the restart has `system/*` samples after it (MLflow's
  monitor ends its thread at a failed call; pipeline/tracking/outbox.py starts a new one);
- no run of the experiment is RUNNING (every run FINISHED), the outbox is empty and nothing
  was rejected (outbox.rejected.jsonl would hold calls the store refused: lost).

Each case's Result reads like fault_suite's: survived when every check passed; `rerun` says
what the outage cost (warnings, calls kept and sent later). A restart counts as injected only
when verified (restart_verdict): the kill came while all three jobs were running, and at least
one job met the outage (the outbox's "does not answer" warning in its log after the kill);
otherwise it is reported as not injected, its checks still run. server_concurrent injects
nothing: a no-fault check, passed or failed, outside the tally. The server lives in its own
world-searchable temporary folder (the cluster runs as the `postgres` system user), started
once for the cases and stopped at the end; only process groups this suite started are killed.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.fault_checks import Result
from bench.fault_setup import SERVER_CASES, overrides, write_inputs
from pipeline.tools import server as server_lib

CASES = SERVER_CASES
FAULT = {"server_concurrent": None, "server_restart": "server", "postgres_restart": "postgres"}
JOBS = ("pretrain_a", "pretrain_b", "finetune")
DOWN_SECONDS = 3.0        # between the kill and the restart
TRAIN_SECONDS = 40        # train.max_seconds of each pretraining (the step count follows)
FINETUNE_EPOCHS = 10
# The lines a job prints once it is in its training loop (the fault waits for all three).
TRAINING = {"pretrain_a": r"^step \d+/", "pretrain_b": r"^step \d+/",
            "finetune": r"^finetune: (step \d+/|epoch \d+ )"}
# MLflow's system-metrics monitor logs this every 10 s itself (not through the outbox): its
# samples missing during an outage are reported, not counted as lost (the run's log has none).
SYSTEM_METRIC = "system/cpu_utilization_percentage"
STEP_LINE = re.compile(r"^step (\d+)/\d+\s")
FT_STEP_LINE = re.compile(r"^finetune: step (\d+)/\d+\s")
FT_EPOCH_LINE = re.compile(r"^finetune: epoch (\d+)\s+step (\d+)\s")
# What a job's log says when one of its MLflow calls meets the outage: the outbox's warning,
# once per outage (pipeline/tracking/outbox.py _went_down).
OUTAGE_WARNING = "does not answer"


# ---------------------------------------------------------------------------
# Counting what a run logged (its own log) and what the server holds
# ---------------------------------------------------------------------------
def logged_steps(job: str, log_text: str) -> dict[str, list[int]]:
    """{metric: sorted steps, one entry per time the job logged it} from the job's own log:
    pretraining's `step N/M` lines log `loss` at N; fine-tuning's progress lines log
    `train_loss` at N, its epoch lines `train_loss` and the `val_*` metrics at the epoch's step."""
    lines = log_text.splitlines()
    if job.startswith("pretrain"):
        return {"loss": sorted(int(m.group(1)) for m in map(STEP_LINE.match, lines) if m)}
    progress = [int(m.group(1)) for m in map(FT_STEP_LINE.match, lines) if m]
    epochs = [int(m.group(2)) for m in map(FT_EPOCH_LINE.match, lines) if m]
    return {"train_loss": sorted(progress + epochs), "val_*": sorted(epochs)}


def missing_and_extra(logged: list[int], stored: list[int]) -> tuple[list[int], list[int]]:
    """Steps the log has more often than the store (lost), and the other way (sent twice)."""
    left, extra = list(stored), []
    for step in logged:
        if step in left:
            left.remove(step)
    lost = list(logged)
    for step in stored:
        if step in lost:
            lost.remove(step)
        else:
            extra.append(step)
    return sorted(lost), sorted(extra)


class Api:
    """The server's REST API with the admin's basic-auth credentials."""

    def __init__(self, url: str, password: str):
        self.url = url
        self.auth = "Basic " + base64.b64encode(f"{server_lib.ADMIN}:{password}".encode()).decode()

    def call(self, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            f"{self.url}/api/2.0/mlflow/{path}", data=json.dumps(body).encode() if body else None,
            headers={"Content-Type": "application/json", "Authorization": self.auth})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read() or b"{}")

    def runs(self, experiment: str) -> list[dict]:
        found = self.call(f"experiments/get-by-name?experiment_name={experiment}")
        body = {"experiment_ids": [found["experiment"]["experiment_id"]], "max_results": 1000}
        return self.call("runs/search", body).get("runs", [])

    def history(self, run_id: str, key: str) -> list[int]:
        query = urllib.parse.urlencode({"run_id": run_id, "metric_key": key,
                                        "max_results": 100000})
        return sorted(int(m.get("step", 0)) for m in
                      self.call(f"metrics/get-history?{query}").get("metrics", []))

    def times(self, run_id: str, key: str) -> list[int]:
        query = urllib.parse.urlencode({"run_id": run_id, "metric_key": key,
                                        "max_results": 100000})
        return [int(m.get("timestamp", 0)) for m in
                self.call(f"metrics/get-history?{query}").get("metrics", [])]

    def artifacts(self, run_id: str, path: str = "") -> dict[str, int]:
        """{artifact path: size} of every file under `path`, folders walked."""
        query = urllib.parse.urlencode({"run_id": run_id, "path": path})
        files = {}
        for entry in self.call(f"artifacts/list?{query}").get("files", []):
            if entry.get("is_dir"):
                files.update(self.artifacts(run_id, entry["path"]))
            else:
                files[entry["path"]] = int(entry.get("file_size", -1))
        return files


def tags_of(run: dict) -> dict:
    return {t["key"]: t["value"] for t in run.get("data", {}).get("tags", [])}


def expected_artifacts(job: str, run_dir: Path) -> dict[str, Path]:
    """{artifact path: the local file it was sent from} that a job's stage run must hold."""
    if job.startswith("pretrain"):
        pretrain = run_dir / "pretrain"
        return {"model/model.keras": pretrain / "model.keras",
                "model/saved_model/saved_model.pb": pretrain / "saved_model" / "saved_model.pb",
                "pretrain/eval.json": pretrain / "eval.json"}
    out = run_dir / "finetune" / "topic"
    names = ["metrics.json", "model.keras"] + sorted(
        p.name for p in out.glob("test_predictions*"))
    return {f"finetune/{name}": out / name for name in names}


def saw_outage(logs: dict, offsets: dict) -> list[str]:
    """The jobs whose log holds the outbox's outage warning after `offsets` (each log's size
    in bytes just before the fault; 0: the whole log)."""
    return [job for job, path in logs.items()
            if OUTAGE_WARNING in Path(path).read_bytes()[offsets.get(job, 0):].decode(
                errors="replace")]


def restart_verdict(killed_at: float | None, inside: bool, saw: list) -> str:
    """Why a server / PostgreSQL restart does not count as injected ("" when it does): it
    counts only if the kill came while every job was still running (inside their run) and at
    least one job met the outage (its log warned after the kill)."""
    if killed_at is None:
        return "not killed: the jobs did not all reach their training loop"
    if not inside:
        return "a job had already ended when the kill came"
    if not saw:
        return "no job saw the outage (no outage warning in any job's log after the kill)"
    return ""


# ---------------------------------------------------------------------------
# The server, the inputs, the jobs
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Team:
    folder: Path          # the server's folder (secrets, cluster, artifacts, logs)
    url: str
    port: int
    password: str

    @property
    def layout(self) -> server_lib.Layout:
        return server_lib.Layout(self.folder)

    def env(self) -> dict:
        return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT),
                    PYTHONUNBUFFERED="1", MLFLOW_TRACKING_URI=self.url,
                    MLFLOW_TRACKING_USERNAME=server_lib.ADMIN,
                    MLFLOW_TRACKING_PASSWORD=self.password)


def start_team_server(base: Path, log=print) -> Team:
    """`make server`'s server (its own cluster: DATABASE_URL is not used here) in base/server."""
    folder = base / "server"
    state = server_lib.start(folder, port=0, workers=2, database_url=None)
    if not state.get("cluster"):
        server_lib.stop(folder)
        raise RuntimeError("DATABASE_URL is set: the server cases kill and restart a cluster of "
                           "their own; unset it")
    password = (os.environ.get("MLFLOW_AUTH_ADMIN_PASSWORD")
                or server_lib.Layout(folder).admin_password.read_text().strip())
    return Team(folder, state["url"], state["port"], password)


def kill_mlflow(team: Team) -> int:
    """SIGKILL of the MLflow server's process group (its pid in <dir>/mlflow.pid)."""
    pid = int(team.layout.pid.read_text())
    os.killpg(pid, signal.SIGKILL)
    _reap(pid)
    return pid


def kill_postgres(team: Team) -> int:
    """SIGKILL of the cluster's postmaster and its backends (their process group when the
    postmaster leads one, else the postmaster and its children)."""
    pid = int((team.layout.pgdata / "postmaster.pid").read_text().split()[0])
    if os.getpgid(pid) == pid:
        os.killpg(pid, signal.SIGKILL)
    else:
        children = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat")
                    if _ppid(p) == pid]
        for target in [pid, *children]:
            try:
                os.kill(target, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.time() + 30
    while Path(f"/proc/{pid}").exists() and time.time() < deadline:
        _reap(pid)
        time.sleep(0.1)
    return pid


def _ppid(stat: Path) -> int:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def restart(team: Team, what: str, log=print) -> None:
    if what == "server":
        server_lib.start(team.folder, port=team.port, workers=2)
    else:
        server_lib.start_cluster(team.layout, json.loads(team.layout.state.read_text()))


def prepare_base(top: Path, team: Team, log=print) -> Path:
    """corpus, vocab, data and a pretrained model in top/base/run (tracked in the server's
    experiment `faults-base`), once for all cases."""
    write_inputs(top)
    run = top / "base" / "run"
    if (run / "pretrain" / "model.keras").exists():
        return run
    settings = job_settings(top, run, "faults-base", "pretrain")
    command = ["corpus", "vocab", "data", "pretrain", "--config",
               str(ROOT / "configs" / "test_tiny.yaml"), *settings]
    done = subprocess.run([sys.executable, "-m", "pipeline", *command], check=False, cwd=ROOT,
                          env=team.env(), capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"the base pretraining failed:\n{(done.stdout + done.stderr)[-3000:]}")
    log(f"base: corpus, vocab, data and pretrain in {run}")
    return run


def job_settings(top: Path, run_dir: Path, experiment: str, job: str) -> list[str]:
    """fault_suite's tiny settings with this job's run directory, the server (from the
    environment) and a short retry interval; pretraining bounded by time."""
    settings = [s for s in overrides(top) if not s.startswith(
        ("run_dir=", "tracking.tracking_uri=", "tracking.experiment=", "train.steps="))]
    settings += [f"run_dir={run_dir}", f"tracking.experiment={experiment}",
                 "tracking.retry_seconds=2"]
    if job.startswith("pretrain") and experiment != "faults-base":
        settings += ["train.steps=100000", f"train.max_seconds={TRAIN_SECONDS}",
                     "train.log_every=5", "train.checkpoint_every=1000"]
    elif job.startswith("pretrain"):
        settings += ["train.steps=24"]
    else:
        settings += [f"finetune.epochs={FINETUNE_EPOCHS}"]
    return settings


def copy_run(base: Path, to: Path, job: str) -> None:
    """The base run directory, without the pretraining for a pretraining job, and without
    the base invocation's tracking state and logs."""
    shutil.copytree(base, to, symlinks=True)
    for name in ("tracking", "logs", "finetune", *(["pretrain"] if job != "finetune" else [])):
        shutil.rmtree(to / name, ignore_errors=True)


# ---------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------
def run_case(top: Path, team: Team, base: Path, case: str, rng: random.Random,
             log=print) -> Result:
    fault = FAULT[case]
    folder = top / case
    shutil.rmtree(folder, ignore_errors=True)
    experiment = f"faults-{case}"
    result = Result(case, fault or "none", None)
    procs, logs, run_dirs, back_ms, offsets = {}, {}, {}, 0, {}
    for job in JOBS:
        run_dirs[job] = folder / job / "run"
        copy_run(base, run_dirs[job], job)
        logs[job] = folder / f"{job}.log"
        command = (["pretrain", "--scheduled"] if job.startswith("pretrain") else ["finetune"])
        with open(logs[job], "w") as out:
            procs[job] = subprocess.Popen(
                [sys.executable, "-m", "pipeline", *command, "--config",
                 str(ROOT / "configs" / "test_tiny.yaml"),
                 *job_settings(top, run_dirs[job], experiment, job)],
                cwd=ROOT, env=team.env(), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
    began = time.time()
    try:
        if fault is not None:  # (none: nothing to inject, the case is the concurrency)
            training = _wait_training(procs, logs, timeout=600)
            if training:
                time.sleep(rng.uniform(0, 3))
                offsets = {job: logs[job].stat().st_size for job in JOBS}  # what came before
                killed = (kill_mlflow if fault == "server" else kill_postgres)(team)
                result.killed_at = time.time() - began
                result.inside = all(p.poll() is None for p in procs.values())
                log(f"  {case}: killed {fault} (pid {killed}) at {result.killed_at:.1f} s; "
                    f"restart in {DOWN_SECONDS:.0f} s")
                time.sleep(DOWN_SECONDS)
                restart(team, fault, log=lambda _: None)
                back_ms = int(time.time() * 1000)
                log(f"  {case}: {fault} back at {time.time() - began:.1f} s")
            else:
                result.problems.append("the jobs did not all reach their training loop: "
                                       + _last_lines(logs))
        codes = {job: p.wait(timeout=900) for job, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # our own child's group, by pid
                p.wait(timeout=60)
        if fault and not server_lib.status(team.folder)["running"]:
            restart(team, "server", log=lambda _: None)  # for the checks and the next case
    failed = {job: code for job, code in codes.items() if code != 0}
    if failed:
        result.problems.append(f"exit codes {failed}: " + _last_lines(
            {job: logs[job] for job in failed}))
    synced = {job: _sync(top, team, run_dirs[job], experiment, job) for job in JOBS}
    for job, (code, said) in synced.items():
        if code != 0:
            result.problems.append(f"{job}: tracking-sync exit {code}: {said}")
    result.mlflow = check_runs(team, experiment, run_dirs, logs, result, back_ms)
    saw = saw_outage(logs, offsets)
    if fault is not None:
        result.not_injected = restart_verdict(result.killed_at, result.inside, saw)
    sent = sum(int(m.group(1)) for job in JOBS for m in re.finditer(
        r"sent the (\d+) calls kept", logs[job].read_text(errors="replace")))
    sent += sum(int(m.group(1)) for _, said in synced.values()
                for m in re.finditer(r"sent (\d+) kept calls", said))
    result.rerun = (f"{len(JOBS)} jobs exit 0 in {max(0.0, time.time() - began):.0f} s; "
                    f"{len(saw)} saw the outage, {sent} kept calls sent later"
                    if not failed else "failed")
    return result


def _wait_training(procs: dict, logs: dict, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        texts = {job: logs[job].read_text(errors="replace") for job in procs}
        if all(re.search(TRAINING[job], texts[job], re.MULTILINE) for job in procs):
            return True
        if any(p.poll() is not None for p in procs.values()):
            return False
        time.sleep(0.2)
    return False


def _sync(top: Path, team: Team, run_dir: Path, experiment: str, job: str) -> tuple[int, str]:
    command = ["tracking-sync", "--config", str(ROOT / "configs" / "test_tiny.yaml"),
               *job_settings(top, run_dir, experiment, job)]
    done = subprocess.run([sys.executable, "-m", "pipeline", *command], check=False, cwd=ROOT,
                          env=team.env(), capture_output=True, text=True, timeout=600)
    return done.returncode, (done.stdout + done.stderr).strip().splitlines()[-1:][0] if (
        done.stdout + done.stderr).strip() else ""


def _last_lines(logs: dict) -> str:
    return "; ".join(f"{job}: {Path(path).read_text(errors='replace').strip().splitlines()[-1:]}"
                     for job, path in logs.items())


def check_runs(team: Team, experiment: str, run_dirs: dict, logs: dict, result: Result,
               back_ms: int = 0) -> str:
    """The checks on the server; adds a problem per loss; returns a summary."""
    api = Api(team.url, team.password)
    try:
        runs = api.runs(experiment)
    except (urllib.error.URLError, OSError, KeyError) as err:
        result.problems.append(f"cannot read experiment {experiment}: {err}")
        return "unreadable"
    statuses = sorted({r["info"]["status"] for r in runs})
    if statuses != ["FINISHED"]:
        result.problems.append("runs not FINISHED: " + ", ".join(
            f"{r['info'].get('run_name')}={r['info']['status']}" for r in runs
            if r["info"]["status"] != "FINISHED"))
    counted = gaps = resumed = 0
    for job in JOBS:
        run_dir = run_dirs[job]
        stage = "pretrain" if job.startswith("pretrain") else "finetune"
        mine = [r for r in runs if tags_of(r).get("pipeline.stage") == stage
                and str(run_dir) in _parent_dir(runs, r)]
        if len(mine) != 1:
            result.problems.append(f"{job}: {len(mine)} {stage} runs for {run_dir}")
            continue
        run = mine[0]
        run_id = run["info"]["run_id"]
        for key, steps in logged_steps(job, logs[job].read_text(errors="replace")).items():
            keys = [key] if key != "val_*" else sorted(
                {m["key"] for m in run["data"].get("metrics", []) if m["key"].startswith("val_")})
            if not steps or not keys:
                result.problems.append(f"{job}: no {key} logged ({len(steps)} log lines)")
                continue
            for name in keys:
                lost, twice = missing_and_extra(steps, api.history(run_id, name))
                counted += len(steps)
                if lost:
                    result.problems.append(f"{job} run {run_id}: {name} lost at steps {lost}")
                if twice:
                    result.problems.append(f"{job} run {run_id}: {name} twice at steps {twice}")
        final = {m["key"] for m in run["data"].get("metrics", [])}
        wanted = {"stage_seconds", "eval_mlm_accuracy" if stage == "pretrain" else "test_accuracy"}
        if wanted - final:
            result.problems.append(f"{job} run {run_id}: no {sorted(wanted - final)}")
        stored = api.artifacts(run_id)
        for path, local in expected_artifacts(job, run_dir).items():
            if not local.exists():
                result.problems.append(f"{job}: {local} missing locally")
            elif stored.get(path) != local.stat().st_size:
                result.problems.append(f"{job} run {run_id}: artifact {path} "
                                       f"{'missing' if path not in stored else 'of another size'}")
        samples = api.history(run_id, SYSTEM_METRIC)  # MLflow's own monitor, not the outbox
        gaps += len(set(range(samples[0], samples[-1] + 1)) - set(samples)) if samples else 0
        after = [t for t in api.times(run_id, SYSTEM_METRIC) if t > back_ms]
        if back_ms and samples and int(run["info"].get("end_time", 0)) > back_ms + 20_000:
            resumed += 1
            if not after:
                result.problems.append(f"{job} run {run_id}: no system metrics after the outage")
        outbox = run_dir / "tracking" / "outbox.jsonl"
        if outbox.exists() or outbox.with_suffix(".rejected.jsonl").exists():
            result.problems.append(f"{job}: calls left in {outbox.parent} (kept or rejected)")
    return (f"{len(runs)} runs {','.join(statuses)}; {counted} logged metric steps checked"
            + (f"; {gaps} system-metric samples missing (MLflow's monitor)" if gaps else "")
            + (f"; system metrics checked after the outage in {resumed} runs" if back_ms else ""))


def _verdict(result: Result) -> str:
    problems = "; ".join(result.problems)
    if result.no_fault:
        return f"no fault: {'FAILED ' + problems if result.lost else 'passed'}"
    if not result.injected:
        return (f"not injected ({result.not_injected})"
                + (f"; its checks failed: {problems}" if result.lost else ""))
    return "survived" if result.survived else "LOST " + problems


def _parent_dir(runs: list[dict], run: dict) -> str:
    parent = tags_of(run).get("mlflow.parentRunId", "")
    found = next((r for r in runs if r["info"]["run_id"] == parent), None)
    return tags_of(found).get("pipeline.run_dir", "") if found else ""


# ---------------------------------------------------------------------------
def run_cases(top: Path, cases, seed: int, log=print) -> list[Result]:
    """One team server for the cases, the base run, then each case; every Result."""
    if server_lib.pg_bin() is None:
        raise RuntimeError("the PostgreSQL server binaries are not installed "
                           "(make test-setup installs them)")
    base = Path(tempfile.mkdtemp(prefix="fault-server-"))
    os.chmod(base, 0o711)  # the cluster's system user passes through to its folder
    results = []
    try:
        started = time.time()
        team = start_team_server(base, log=lambda _: None)
        log(f"team server {team.url} (PostgreSQL, basic auth) in {base} "
            f"[{time.time() - started:.0f} s]")
        started = time.time()
        base_run = prepare_base(Path(top), team, log)
        log(f"  base run [{time.time() - started:.0f} s]")
        for case in cases:
            started = time.time()
            result = run_case(Path(top), team, base_run, case, random.Random(f"{seed}-{case}"),
                              log)
            results.append(result)
            log(f"  {case:17s} {result.kind:8s} "
                f"{'-' if result.killed_at is None else f'{result.killed_at:5.1f} s'}: "
                f"{result.rerun}; {result.mlflow}: "
                f"{_verdict(result)}"
                f"  [{time.time() - started:.0f} s]")
    finally:
        server_lib.stop(base / "server")
        shutil.rmtree(base, ignore_errors=True)
    return results
