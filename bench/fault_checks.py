"""What the fault suite (bench/fault_suite.py) verifies after each kill and after each re-run:
the stage's outputs against the uninterrupted reference's, and what the MLflow runs (read from
the SQLite store) say; each kill's Result collects the problems found.

After the kill (check_after_kill, check_killed_runs): the output folder absent or complete, a
marker the lineage accepts only on a complete output, the data's checksums, every checkpoint
and model.keras whole, no FINISHED run of the killed invocation unless its output is complete.
After the re-run (compare_rerun, check_rerun_runs): outputs identical to the reference's (or,
for a resumed pretraining, the loss curve continuing it within LOSS_TOLERANCE), the re-run's
parent and stage runs FINISHED, a resumed training in the killed run, none left RUNNING.

The checks read what they compare with from a `Reference` (the suite's folder, the reference's
outputs, its store), a plain record the suite fills: they know nothing of the suite itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sqlite3
import zipfile
from pathlib import Path

from bench.fault_setup import CHECKPOINT_EVERY, COMMAND, OUTPUT, ROOT, STAGE_LABEL, overrides

# A resumed run's per-step loss may differ this much from the uninterrupted run's (measured:
# ~0.01 at a loss of ~6 on the tiny model).
LOSS_TOLERANCE = 0.05
SKIP = {".stage.json", ".pipeline.lock"}
# Whether the lineage caches a stage (its .stage.json marker is checked after a kill).
STAGES_CACHED = {"corpus": True, "vocab": True, "data": True, "pretrain": True,
                 "finetune": False, "multitask": False, "distill": False}
# What a fine-tuning's metrics.json holds that depends on the clock, not on what was trained.
TIMINGS = {"seconds", "train_seconds", "examples_per_second", "speedup", "output_dir"}


# ---------------------------------------------------------------------------
# Outputs, the store, the Result
# ---------------------------------------------------------------------------
def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def folder_hashes(folder: Path) -> dict:
    """{relative path: sha256} of every file below `folder` (markers and locks aside)."""
    return {str(p.relative_to(folder)): sha256(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in SKIP}


def without_timings(value):
    """A metrics.json's contents without its `TIMINGS` keys, at any depth."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def finetune_summary(folder: Path) -> dict:
    """What a fine-tuning run must reproduce: its metrics (timings aside), its predictions."""
    metrics = without_timings(json.loads((folder / "metrics.json").read_text()))
    predictions = sorted(p.name for p in folder.glob("test_predictions*"))
    return {"metrics": metrics, "predictions": {n: sha256(folder / n) for n in predictions},
            "files": sorted(p.name for p in folder.iterdir())}


def step_losses(output: str) -> dict:
    """{step: loss} from the `step N/M  loss X` lines of a pretrain log."""
    losses = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[0] == "step" and "/" in parts[1] and parts[2] == "loss":
            losses[int(parts[1].split("/")[0])] = float(parts[3])
    return losses


def outputs(top: Path, stage: str) -> dict:
    """The stage's outputs as the comparisons need them (the reference's, or a re-run's)."""
    run = top / "root" / "run"
    if stage in ("corpus", "vocab", "data"):
        return folder_hashes(run / stage)
    if COMMAND.get(stage, stage) in OUTPUT:  # finetune, multitask, distill
        return finetune_summary(run / OUTPUT[COMMAND.get(stage, stage)])
    pretrain = run / "pretrain"
    return {"eval": json.loads((pretrain / "eval.json").read_text()),
            "model.keras": zip_whole(pretrain / "model.keras"),
            "saved_model": (pretrain / "saved_model" / "saved_model.pb").is_file()}


def zip_whole(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (OSError, zipfile.BadZipFile):
        return False


class Store:
    """The suite's reads of the SQLite MLflow store (sqlite3 directly: the file is replaced
    between kills, and a fresh connection each time sees the current one)."""

    def __init__(self, top: Path):
        self.path = top / "root" / "mlflow.db"

    def runs(self) -> dict:
        """{run id: {"status", "tags": {...}}} of every run."""
        if not self.path.exists():
            return {}
        with contextlib_closing(sqlite3.connect(self.path)) as db:
            runs = {rid: {"status": status, "start": start, "tags": {}}
                    for rid, status, start in db.execute(
                        "select run_uuid, status, start_time from runs")}
            for rid, key, value in db.execute("select run_uuid, key, value from tags"):
                if rid in runs:
                    runs[rid]["tags"][key] = value
        return runs


    def stage_run_tags(self, stage: str) -> dict:
        """Tags of the run the latest parent run names for `stage` (stage.<name>.run_id)."""
        runs = self.runs()
        parents = sorted((r for r in runs.values() if "mlflow.parentRunId" not in r["tags"]),
                         key=lambda r: r["start"])
        if not parents:
            return {}
        run_id = parents[-1]["tags"].get(f"stage.{COMMAND.get(stage, stage)}.run_id", "")
        return runs.get(run_id, {}).get("tags", {})


@dataclasses.dataclass
class Reference:
    """What the checks compare a killed and re-run stage with: the suite's folder `top` (its
    root/ holds the run directory and the MLflow store), the uninterrupted reference's outputs
    by suite stage (and "losses": its pretraining loss per step) and final weights' sha256."""
    top: Path
    expected: dict = dataclasses.field(default_factory=dict)
    weights_sha: str = ""

    def __post_init__(self):
        self.top = Path(self.top)

    @property
    def root(self) -> Path:
        return self.top / "root"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def store(self) -> Store:
        return Store(self.top)


def contextlib_closing(db):
    import contextlib

    return contextlib.closing(db)


@dataclasses.dataclass
class Result:
    stage: str
    kind: str                # the kind of kill / fault; "none": a case with nothing to inject
    killed_at: float | None  # seconds since the start at which the fault was delivered (or None)
    inside: bool = False
    after_kill: str = ""     # absent | complete | partial (the output folder after the kill)
    rerun: str = ""          # identical | curve | failed ...
    mlflow: str = ""
    strays: int = 0          # temporaries of the killed run still there after the re-run
    problems: list = dataclasses.field(default_factory=list)
    # Why a fault that was delivered (or tried) does not count as injected: the process had
    # ended on its own, the stage had written its completion marker, no job saw the outage
    # (bench/fault_suite.py kill_verdict, bench/fault_server.py restart_verdict). "" if it does.
    not_injected: str = ""

    @property
    def no_fault(self) -> bool:
        """A check with nothing injected (server_concurrent): reported apart, not tallied."""
        return self.kind == "none"

    @property
    def injected(self) -> bool:
        """The fault verifiably happened (its verification passed): only these are tallied."""
        return not self.no_fault and self.killed_at is not None and not self.not_injected

    @property
    def survived(self) -> bool:
        return self.injected and not self.problems

    @property
    def lost(self) -> bool:
        """Something was lost: a check failed, whether or not the fault counts as injected
        (a no-fault case's or an unverified fault's failed checks are losses too)."""
        return bool(self.problems)


# ---------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------
def check_after_kill(ref: Reference, stage: str, result: Result) -> bool:
    """Nothing partial taken as complete; returns whether the output is complete."""
    from pipeline import artifacts
    from pipeline import config as config_lib
    from pipeline.tracking import lineage

    name = COMMAND.get(stage, stage)
    config = config_lib.load(str(ROOT / "configs" / "test_tiny.yaml"), overrides(ref.top))
    paths = artifacts.Artifacts(ref.run)  # absolute: no run root involved
    if Path(config.run_dir).resolve() != ref.run.resolve():
        raise ValueError(f"the suite's config runs in {config.run_dir}, not {ref.run}")
    folder = ref.run / OUTPUT.get(name, name)
    complete = False
    if name in ("corpus", "vocab", "data", *OUTPUT):
        if not folder.exists():
            result.after_kill = "absent"
        else:
            try:
                complete = outputs(ref.top, stage) == ref.expected[stage]
            except (OSError, ValueError) as err:
                result.problems.append(f"{folder} unreadable after the kill: {err}")
            result.after_kill = "complete" if complete else "partial"
            if not complete:
                result.problems.append(f"{folder} exists but differs from the reference")
        if name == "data" and folder.exists():
            try:
                artifacts.verify_checksums(folder, "-")
            except artifacts.AlteredArtifact as err:
                result.problems.append(f"checksums do not verify: {err}")
    else:  # pretrain (and its export)
        pretrain = ref.run / "pretrain"
        for path in (pretrain / "checkpoints").glob("ckpt-*.weights.h5"):
            if not _h5_opens(path):
                result.problems.append(f"{path.name} does not open (partial checkpoint)")
        keras_ok = (pretrain / "model.keras").exists()
        if keras_ok and not zip_whole(pretrain / "model.keras"):
            result.problems.append("model.keras is not a whole zip")
        if (pretrain / "eval.json").exists():
            ev = json.loads((pretrain / "eval.json").read_text())
            if ev != ref.expected["pretrain"]["eval"]:
                result.problems.append("eval.json differs from the reference's")
        if (pretrain / "saved_model").exists() and not (
                pretrain / "saved_model" / "saved_model.pb").is_file():
            result.problems.append("saved_model/ has no saved_model.pb")
        complete = (keras_ok and (pretrain / "eval.json").exists()
                    and (pretrain / "saved_model" / "saved_model.pb").is_file())
        result.after_kill = ("complete" if complete else "absent" if not keras_ok
                             else "exported")
    if STAGES_CACHED.get(name):
        fp = lineage.fingerprint(name, config, paths)
        if lineage.is_current(name, paths, fp) and not complete:
            result.problems.append(f"the {name} marker accepts an incomplete output")
    return complete


def check_killed_runs(stage: str, runs: dict, complete: bool, result: Result) -> None:
    """No run of the killed invocation says FINISHED unless what it made is complete."""
    finished = [r for r in runs.values() if r["status"] == "FINISHED"]
    if finished and not complete:
        result.problems.append(f"{len(finished)} MLflow run(s) of the killed invocation "
                               f"say FINISHED but the output is incomplete")
    mine = [r for r in runs.values() if r["tags"].get("pipeline.stage")]
    result.mlflow = ("killed: " + ",".join(sorted({r["status"] for r in mine}))
                     if mine else "killed: no stage run")


def compare_rerun(ref: Reference, stage: str, killed_output: str, rerun_output: str,
                  result: Result) -> None:
    """The re-run's outputs against the reference's (a resumed pretraining: its loss curve);
    `killed_output` and `rerun_output` are the two runs' logs."""
    if stage not in ("pretrain", "export"):
        got = outputs(ref.top, stage)
        resumed = re.search(rf"{STAGE_LABEL.get(stage, 'finetune')}: resuming from "
                            rf"ckpt-\d+ \(step (\d+) of (\d+)", rerun_output)
        if stage in STAGE_LABEL and not resumed:
            result.problems.append("killed after a checkpoint, the re-run did not resume")
        if got == ref.expected[stage]:
            result.rerun = "identical" + (f" (resumed from step {resumed.group(1)} of "
                                          f"{resumed.group(2)})" if resumed else "")
        else:
            result.rerun = "differs"
            diff = [k for k in set(got) | set(ref.expected[stage])
                    if got.get(k) != ref.expected[stage].get(k)]
            result.problems.append(f"re-run's output differs from the reference: {diff[:5]}")
        return
    got = outputs(ref.top, stage)
    if not (got["model.keras"] and got["saved_model"]):
        result.problems.append("re-run left no whole model.keras / saved_model")
    sha = ref.store.stage_run_tags(stage).get("pretrain.weights_sha256", "")
    if sha and sha == ref.weights_sha:
        result.rerun = "identical"
        return
    # Not bit-identical: the resumed loss curve must continue the uninterrupted one.
    resumed_from = 0
    for line in rerun_output.splitlines():
        if "resuming from ckpt-" in line:
            resumed_from = int(line.rsplit("(step ", 1)[1].rstrip(")"))
    reached = max(step_losses(killed_output), default=0)
    if resumed_from < reached - CHECKPOINT_EVERY:
        result.problems.append(f"resumed from step {resumed_from}, more than one checkpoint "
                               f"interval before step {reached} (logged before the kill)")
    losses, expected = step_losses(rerun_output), ref.expected["losses"]
    after = [s for s in expected if s > resumed_from]
    missing = [s for s in after if s not in losses]
    worst = max((abs(losses[s] - expected[s]) for s in after if s in losses), default=0.0)
    if missing:
        result.problems.append(f"the re-run logged no loss for steps {missing[:5]}")
    if worst > LOSS_TOLERANCE:
        result.problems.append(f"resumed loss off the uninterrupted curve by {worst:.4f}")
    result.rerun = f"curve from {resumed_from} (max |dloss| {worst:.3f})"


def check_rerun_runs(ref: Reference, stage: str, runs_killed: dict, rerun_output: str,
                     result: Result) -> None:
    """The re-run's parent FINISHED; its stage run FINISHED; a pretraining killed after a
    checkpoint is continued in the killed run (resumed), not a new one."""
    name = COMMAND.get(stage, stage)
    runs = ref.store.runs()
    parents = sorted((r for r in runs.values() if "mlflow.parentRunId" not in r["tags"]),
                     key=lambda r: r["start"])
    parent = parents[-1]
    run_id = parent["tags"].get(f"stage.{name}.run_id", "")
    how = parent["tags"].get(f"stage.{name}", "?")
    problems = []
    if parent["status"] != "FINISHED":
        problems.append(f"re-run's parent run is {parent['status']}")
    stage_run = runs.get(run_id, {})
    # Killed after the stage wrote its checksums and marker but before its run ended: the
    # outputs are complete and reused; the run that made them says KILLED (interrupted).
    reused_killed = (how == "reused" and stage_run.get("status") == "KILLED"
                     and "pipeline.interrupted" in stage_run.get("tags", {}))
    if stage_run.get("status") != "FINISHED" and not reused_killed:
        problems.append(f"re-run's {name} run is {runs.get(run_id, {}).get('status')}")
    if name == "pretrain" and "resuming from ckpt-" in rerun_output:
        killed_stage = [k for k, r in runs_killed.items()
                        if r["tags"].get("pipeline.stage") == "pretrain"]
        if killed_stage and run_id != killed_stage[0]:
            problems.append("the resumed training got a new MLflow run, not the killed one")
        elif killed_stage:
            how = f"resumed (resume.count {runs[run_id]['tags'].get('resume.count')})"
    left = [r["status"] for k, r in runs.items() if k in runs_killed and k != run_id
            and r["tags"].get("pipeline.stage")]
    result.mlflow += f"; re-run: {how} {runs.get(run_id, {}).get('status', '?')}" + (
        f"; killed run now {','.join(left)}" if left else "")
    # The killed invocation's runs say so once the next one has started: KILLED (tagged
    # pipeline.interrupted), or continued (a resumed training) — none left RUNNING.
    still = [k for k, r in runs.items() if k in runs_killed and r["status"] == "RUNNING"]
    if still:
        problems.append(f"{len(still)} run(s) of the killed invocation still RUNNING")
    result.problems += problems


def _h5_opens(path: Path) -> bool:
    import h5py

    try:
        with h5py.File(path, "r") as handle:
            handle.visit(lambda name: None)
        return True
    except OSError:
        return False
