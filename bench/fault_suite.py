"""Fault suite: kill -9 every stage at seeded random moments, run it again, and check
that nothing partial was ever taken as complete, that the outputs equal an uninterrupted run's,
and that the MLflow runs say what happened.

    python bench/fault_suite.py [--kills N] [--seed S] [--stages corpus,vocab,...] [--keep DIR]

Everything happens in a temporary folder with its own run root (--run-root) and SQLite MLflow
store, on a generated corpus (a few seconds per stage, configs/test_tiny.yaml; pretraining 24
steps, a checkpoint every 4). First an uninterrupted reference run of every stage, watched:
when its temporary files (`.tmp-*` siblings of atomic writes, checkpoint temporaries) and the
SQLite journal (`mlflow.db-journal`: a write transaction of the store under way) exist, and
when its log lines appear. Then, per stage, N kills (default 5) from the state the stage starts
in (its upstream complete, its own output absent: the reference's folder copied back each
time), each at a seeded moment of one of three kinds, in turn:

    random  a delay drawn in the stage's measured duration
    file    the first moment after a drawn instant at which a temporary file of the run exists:
            inside a file write (checkpoint, atomic_dir, atomic_file, export, marker)
    mlflow  the first moment after a drawn instant at which the SQLite journal exists: inside
            an MLflow call's write transaction

(finetune_resume, multitask and distill have a fourth kind of their own, checkpoint: the moment
the stage's n-th checkpoint folder appears, n drawn among the reference's.)

The process group the suite started is killed (os.killpg, SIGKILL, by pid); nothing else is.
`strays` counts kills whose temporaries (never renamed into place, never taken as output)
were still in the run directory after the re-run. `inside` says whether the temporary file /
journal was still there after the kill (so the kill landed inside that write, not just
after). The export is the pretrain stage's last step (pipeline/serving/export.py); its kills
are drawn after the log line "final weights sha256" (training done), the pretrain stage's
before it.

After each kill: the stage's output folder is absent or complete (equal to the reference's);
a marker (.stage.json) the lineage would accept (`lineage.is_current`) has a complete output;
the data folder's checksums verify; every checkpoint file opens; a model.keras is a whole zip;
no MLflow run of the killed invocation says FINISHED unless its output is complete. Then the
same command again (exit 0), and:

    corpus, vocab, data   every output file byte-identical to the reference's
    pretrain, export      the final weights' sha256 (MLflow tag pretrain.weights_sha256) equal
                          to the reference's ("identical"); else, since a resumed run is not
                          bit-identical (see below), the issue's other criterion ("curve"):
                          it resumed from a checkpoint at most one interval (checkpoint_every)
                          before the last step the killed run logged, and every per-step loss
                          after it is within LOSS_TOLERANCE of the uninterrupted run's
    finetune              metrics.json equal to the reference's (timings aside), test
                          predictions byte-identical
    finetune_resume       the finetune stage killed the moment its n-th checkpoint appears
                          (kind "checkpoint", n drawn among the reference's; finetune.
                          checkpoint_every 4 of its 16 updates, and every epoch end): the
                          re-run must say it resumed from a checkpoint, and its outputs equal
                          the reference's as for finetune (a resumed fine-tuning is bit-exact)
    multitask, distill    the multitask / distill stage killed the same way (kind "checkpoint";
                          24 mixed updates of a classification and a tagging task; a 1-layer
                          student of the finetune stage's model, 16 updates), checkpoints every
                          4 updates and every epoch end: the re-run must say it resumed, and its
                          metrics.json equal the reference's (timings aside)

and MLflow: the re-run's parent run FINISHED, its stage.<name>.run_id a FINISHED run of that
stage; for pretrain, a killed run that had written a checkpoint is the run reopened (resumed,
tag resume.count), not a new one.

A kill counts as injected only when it is verified (kill_verdict): the suite sent it, the
process died of it (exit status -9, SIGKILL; not an exit of its own just before) and the
stage's completion marker (<output>/.stage.json, which the CLI writes last, after the outputs
and their checksums) did not exist once the process group was dead, so the stage was still
inside its work. A kill not verified is tried again from the start state with a fresh draw,
up to ATTEMPTS runs; then it is reported as not injected (with why) and counted apart.
Survived = an injected kill after which every check passed; lost = one after which a check
failed. The last line reads `fault-suite: <survived>/<injected> survived, <lost> lost, <n>
not injected` (injected: verified only); the exit status is 1 if anything was lost (a no-fault
check or an unverified fault whose checks failed included), not for a fault merely not
injected. tests/test_faults.py runs one kill of the fast stages with these functions.
The team server's cases (server_concurrent, server_restart, postgres_restart: concurrent jobs
on a PostgreSQL-backed MLflow server, the server or PostgreSQL killed mid-run) are in
bench/fault_server.py; each runs once (--kills is for the stages). A restart counts as
injected only if every job was still running at the kill and at least one job's log warned
of the outage after it; server_concurrent injects nothing: a check, reported on its own line
(passed / failed), not in the tally.

This file draws the moments, runs, watches and kills the stages and tallies the results; the
stages' tiny settings and inputs are bench/fault_setup.py's, the checks after each kill and
each re-run bench/fault_checks.py's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# What runs (bench/fault_setup.py) and what is checked after each kill (bench/fault_checks.py).
from bench.fault_checks import (
    Reference,
    Result,
    check_after_kill,
    check_killed_runs,
    check_rerun_runs,
    compare_rerun,
    outputs,
    step_losses,
)
from bench.fault_setup import (
    CHECKPOINTS,
    COMMAND,
    OUTPUT,
    SERVER_CASES,
    STAGES,
    overrides,
    write_inputs,
)

KINDS = ("random", "file", "mlflow")
# The kinds of kill of a suite stage (KINDS unless named here).
STAGE_KINDS = {"finetune_resume": ("checkpoint",), "multitask": ("checkpoint",),
               "distill": ("checkpoint",)}
# The reference state a suite stage starts from.
STARTS_AFTER = {"corpus": None, "vocab": "corpus", "data": "vocab", "pretrain": "data",
                "export": "data", "finetune": "pretrain", "finetune_resume": "pretrain",
                "multitask": "pretrain", "distill": "finetune"}
# The suite stages that share another's reference run (the same command, other kills).
SAME_REFERENCE = {"export": "pretrain", "finetune_resume": "finetune"}
# The log line that separates pretraining from its export (pipeline/training/loop.py).
TRAINED = "final weights sha256"
POLL = 0.002  # seconds between looks at the temporary files and the journal
# Runs drawn for one kill before it counts as missed: a stage may end before the drawn moment
# (the corpus stage's temporary folder lives a few milliseconds on the tiny corpus, the
# export's files a few tens).
ATTEMPTS = 5


# ---------------------------------------------------------------------------
# Running a stage, watched, and killing it
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Moment:
    """When to kill: at `kind`'s first occurrence (random: at once) once `at` seconds have
    passed since the start, or, with `after`, since the log showed that line (the reference's
    timings shift from run to run; a line anchors the export's window)."""
    kind: str
    at: float
    after: str = ""
    occurrence: int = 1  # file / mlflow: the n-th time it appears (after `after`)


@dataclasses.dataclass
class Watched:
    returncode: int | None
    seconds: float
    output: str
    killed_at: float | None = None
    inside: bool = False  # the temporary file / journal was still there after the kill
    # The stage's completion marker (<output>/.stage.json) was there once the process had
    # ended: after a kill, it was written before the kill (the stage had finished).
    completed: bool = False
    # seconds since the start at which each kind was seen, and when each log line appeared
    seen: dict = dataclasses.field(default_factory=dict)
    lines: list = dataclasses.field(default_factory=list)


def temporaries(run_dir: Path) -> list[Path]:
    """Temporary files and folders of atomic writes: `.<name>.tmp-*` (atomic_dir, atomic_file),
    `.tmp-*` (checkpoints, model.keras), in the run dir and the folders stages write into."""
    found = []
    folders = ("corpus", "vocab", "data", "pretrain", "pretrain/checkpoints", "finetune",
               "multitask", "distill", *sorted(set(CHECKPOINTS.values())))
    for folder in (run_dir, *(run_dir / d for d in folders)):
        try:
            with os.scandir(folder) as entries:
                found += [Path(e.path) for e in entries if ".tmp-" in e.name]
        except OSError:
            continue
    return found


def marker(run_dir: Path, stage: str) -> Path:
    """The file that marks `stage` complete: the CLI writes <output>/.stage.json last, after
    the outputs and their checksums, before the stage's MLflow run ends (pipeline/cli.py,
    lineage.write_marker); the suite starts each stage with its output absent."""
    from pipeline.artifacts import Artifacts
    from pipeline.tracking import lineage

    return lineage.marker_path(COMMAND.get(stage, stage), Artifacts(run_dir))


def kill_group(proc: subprocess.Popen, completion: Path) -> tuple[int, bool]:
    """SIGKILL of the process group the suite started (by its leader's pid; nothing else), then
    the leader reaped. Returns its exit status (-9: it died of the SIGKILL; anything else: it
    had ended on its own before the signal came) and whether `completion` (the stage's marker)
    exists now that the group is dead, i.e. was written before the kill."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group had ended and been reaped already
        pass
    proc.wait(timeout=60)
    return proc.returncode, completion.exists()


def kill_verdict(killed_at: float | None, returncode: int | None, completed: bool) -> str:
    """Why a kill does not count as injected ("" when it does): it counts only if the suite
    sent it, the process died of it (SIGKILL: exit status -9) and the stage had not written
    its completion marker by then (it was still inside its work)."""
    if killed_at is None:
        return f"not killed: the stage ended first (exit {returncode})"
    if returncode != -signal.SIGKILL:
        return f"ended on its own (exit {returncode}) before the SIGKILL came"
    if completed:
        return "killed after the stage had written its completion marker (.stage.json)"
    return ""


def start(top: Path, stage: str, log_path: Path) -> subprocess.Popen:
    """`python -m pipeline <stage>` in its own process group (killed by its pid alone)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", COMMAND.get(stage, stage), "--run-root",
         str(top / "root"), "--config", str(ROOT / "configs" / "test_tiny.yaml"),
         *overrides(top)],
        cwd=ROOT, env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
        start_new_session=True)


def watch(top: Path, stage: str, log_path: Path, moment: Moment | None = None,
          timeout: float = 600) -> Watched:
    """Runs the stage; records when temporaries / the journal exist and when log lines appear;
    with a `moment`, kills the process group (SIGKILL) when it comes."""
    run_dir, journal = top / "root" / "run", top / "root" / "mlflow.db-journal"
    completion, completed = marker(run_dir, stage), False
    checkpoints, written = run_dir / CHECKPOINTS.get(stage, "-"), set()

    def new_checkpoint() -> bool:
        """A fine-tuning checkpoint folder not there at the last look (renamed into place:
        complete)."""
        names = {p.name for p in checkpoints.glob("ckpt-*")} - written
        written.update(names)
        return bool(names)

    probes = {"file": lambda: bool(temporaries(run_dir)), "mlflow": journal.exists,
              "checkpoint": new_checkpoint, "random": lambda: True}
    seen: dict = {"file": [], "mlflow": [], "checkpoint": []}
    episodes = {"file": 0, "mlflow": 0, "checkpoint": 0, "random": 1}  # since the anchor
    was = {"file": False, "mlflow": False, "checkpoint": False}
    lines, text, last_read = [], "", 0.0
    proc = start(top, stage, log_path)
    began = time.time()
    killed_at, inside, anchor = None, False, None if moment and moment.after else 0.0
    try:
        while proc.poll() is None:
            now = time.time() - began
            if now > timeout:
                raise TimeoutError(f"{stage} ran over {timeout} s")
            if now - last_read > 0.05:  # the log, every 50 ms
                last_read, new = now, log_path.read_text(errors="replace")
                lines += [(now, line) for line in new[len(text):].splitlines()]
                text = new
                if anchor is None and moment.after in text:
                    anchor = now
            hits = {kind: probes[kind]() for kind in ("file", "mlflow", "checkpoint")}
            for kind, hit in hits.items():
                if hit:
                    seen[kind].append(now)
                    if not was[kind] and anchor is not None:
                        episodes[kind] += 1
                was[kind] = hit
            if (moment and anchor is not None and now >= anchor + moment.at
                    and (moment.kind == "random" or hits[moment.kind])
                    and episodes[moment.kind] >= moment.occurrence):
                _, completed = kill_group(proc, completion)  # our own child's group, by pid
                killed_at = now
                inside = moment.kind in ("file", "mlflow") and probes[moment.kind]()
                break
            time.sleep(POLL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    completed = completed or (killed_at is None and completion.exists())
    output = log_path.read_text(errors="replace")
    lines += [(time.time() - began, line) for line in output[len(text):].splitlines()]
    return Watched(proc.returncode, time.time() - began, output, killed_at, inside,
                   completed=completed, seen=seen, lines=lines)


def line_time(watched: Watched, needle: str) -> float | None:
    return next((t for t, line in watched.lines if needle in line), None)


def draw_moment(kind: str, stage: str, reference: Watched, rng: random.Random) -> Moment:
    """A seeded moment of `kind` in the window of the reference run that belongs to `stage`
    (pretrain: up to the TRAINED line; export: after it; the others: the whole run)."""
    trained = line_time(reference, TRAINED) if stage in ("pretrain", "export") else None
    lo, hi = 0.0, reference.seconds
    if stage == "pretrain" and trained:
        hi = trained
        if kind != "random":  # inside training itself: after the first step
            lo = line_time(reference, "step 1/") or lo
    if stage == "export" and trained:
        lo = trained
    if kind == "checkpoint":  # the n-th checkpoint the reference wrote, at once
        return Moment(kind, 0.0, "", rng.randint(1, max(1, len(reference.seen.get(kind, [])))))
    if kind == "random":
        at = rng.uniform(lo, hi)
        return Moment(kind, at - lo, TRAINED) if stage == "export" else Moment(kind, at)
    # By count, not time (a loaded machine stretches the times): the n-th appearance of a
    # temporary file / the journal after the anchor line, n drawn among the reference's.
    after = {"export": TRAINED, "pretrain": "step 1/"}.get(stage, "")
    appearances = [t for t, gap in zip(reference.seen.get(kind, []),
                                       _gaps(reference.seen.get(kind, []))) if gap]
    count = sum(lo <= t <= hi for t in appearances)
    return Moment(kind, 0.0, after, rng.randint(1, count) if count else 1)


def _gaps(times: list) -> list:
    """True where a look starts a new appearance (more than 3 looks after the previous one)."""
    return [i == 0 or t - times[i - 1] > 3 * POLL + 0.01 for i, t in enumerate(times)]


class Suite:
    """One temporary folder: inputs, the reference run (watched), its snapshots, the kills."""

    def __init__(self, top: Path, log=print):
        self.top, self.log = Path(top), log
        # what the checks (bench/fault_checks.py) compare with, filled by build_reference
        self.checked = Reference(self.top)
        self.root, self.run, self.store = self.checked.root, self.checked.run, self.checked.store
        self.snapshots = self.top / "snapshots"
        self.reference: dict[str, Watched] = {}
        self.expected: dict[str, dict] = self.checked.expected

    # -- the reference ------------------------------------------------------------------
    def build_reference(self, stages) -> None:
        """Each stage once, uninterrupted and watched, in order; the state before each is kept
        (snapshots/<stage>) and its outputs recorded."""
        write_inputs(self.top)
        self.root.mkdir(parents=True, exist_ok=True)
        needed = _with_upstream(stages)
        for stage in [s for s in STAGES if s in needed and s not in SAME_REFERENCE]:
            self.snapshot(f"before-{stage}")
            watched = watch(self.top, stage, self.top / f"reference-{stage}.log")
            if watched.returncode != 0:
                raise RuntimeError(f"reference {stage} failed:\n{watched.output[-3000:]}")
            self.reference[stage] = watched
            self.expected[stage] = outputs(self.top, stage)
            self.log(f"reference {stage:9s} {watched.seconds:5.1f} s; temporary files seen at "
                     f"{len(watched.seen['file'])} looks, journal at "
                     f"{len(watched.seen['mlflow'])}")
            for alias in [a for a, same in SAME_REFERENCE.items() if same == stage]:
                self.reference[alias] = watched
                self.expected[alias] = self.expected[stage]
            if stage == "pretrain":
                self.checked.weights_sha = self.store.stage_run_tags("pretrain").get(
                    "pretrain.weights_sha256", "")
                self.expected["losses"] = step_losses(watched.output)

    def snapshot(self, name: str) -> None:
        shutil.copytree(self.root, self.snapshots / name, symlinks=True)

    def restore(self, name: str) -> None:
        shutil.rmtree(self.root)
        shutil.copytree(self.snapshots / name, self.root, symlinks=True)

    # -- one kill -------------------------------------------------------------------------
    def kill_once(self, stage: str, kind: str, rng: random.Random) -> Result:
        """From the state before `stage`, kill it at a drawn moment of `kind`, check what is
        left, run it again, compare."""
        reasons = []
        for attempt in range(ATTEMPTS):  # a file / journal moment can come and go unseen
            self.restore(f"before-{COMMAND.get(stage, stage)}")
            before = set(self.store.runs())
            moment = draw_moment(kind, stage, self.reference[stage], rng)
            if attempt:  # missed: an earlier appearance (halved each try; the first, at the last)
                occurrence = 1 if attempt == ATTEMPTS - 1 else moment.occurrence >> attempt
                moment = dataclasses.replace(moment, occurrence=max(1, occurrence))
            killed = watch(self.top, stage, self.top / "killed.log", moment)
            verdict = kill_verdict(killed.killed_at, killed.returncode, killed.completed)
            result = Result(stage, kind, killed.killed_at, killed.inside, not_injected=verdict)
            if result.injected:
                break
            reasons.append(verdict)  # not verified: tried again from the start state
            self.log(f"  {stage:8s} {kind:6s} try {attempt + 1}: not injected ({verdict})")
        else:
            result.not_injected = (f"{ATTEMPTS} tries, none verified: "
                                   + "; ".join(sorted(set(reasons))))
            result.rerun = "-"
            return result
        runs_killed = {k: v for k, v in self.store.runs().items() if k not in before}
        complete = check_after_kill(self.checked, stage, result)
        check_killed_runs(stage, runs_killed, complete, result)
        rerun = watch(self.top, stage, self.top / "rerun.log")
        if rerun.returncode != 0:
            result.rerun = f"exit {rerun.returncode}"
            result.problems.append(f"the re-run failed (exit {rerun.returncode}): "
                                   f"{rerun.output.strip().splitlines()[-1:]}")
            return result
        result.strays = len(temporaries(self.run))
        compare_rerun(self.checked, stage, killed.output, rerun.output, result)
        check_rerun_runs(self.checked, stage, runs_killed, rerun.output, result)
        return result


def _with_upstream(stages) -> set:
    needed, todo = set(), list(stages)
    while todo:
        stage = todo.pop()
        if stage not in needed:
            needed.add(stage)
            if STARTS_AFTER[stage]:
                todo.append(STARTS_AFTER[stage])
    needed |= {same for alias, same in SAME_REFERENCE.items() if alias in needed}
    return needed


# ---------------------------------------------------------------------------
def run_suite(top: Path, stages, kills: int, seed: int, log=print) -> list[Result]:
    """The reference, then `kills` kills of each stage (kinds in turn); every Result. The team
    server's cases (bench/fault_server.py) run once each, after the stages."""
    from bench import fault_server

    cases = [s for s in stages if s in SERVER_CASES]
    stages = [s for s in stages if s not in cases]
    suite = Suite(top, log)
    if stages:
        suite.build_reference(stages)
    results = []
    for stage in stages:
        rng = random.Random(f"{seed}-{stage}")
        for i in range(kills):
            kinds = STAGE_KINDS.get(stage, KINDS)
            kind = kinds[i % len(kinds)]
            started = time.time()
            result = suite.kill_once(stage, kind, rng)
            results.append(result)
            log(f"  {stage:8s} #{i + 1} {kind:6s} killed at "
                f"{'-' if result.killed_at is None else f'{result.killed_at:5.1f} s'}"
                f"{' (inside)' if result.inside else ''}: after kill {result.after_kill}, "
                f"{result.strays} temporaries left, "
                f"re-run {result.rerun}, {result.mlflow}: "
                f"{'survived' if result.survived else 'LOST ' if result.injected else ''}"
                f"{'; '.join(result.problems) if result.injected else ''}"
                f"{'not injected (' + result.not_injected + ')' if not result.injected else ''}"
                f"  [{time.time() - started:.0f} s]")
    if cases:
        results += fault_server.run_cases(top, cases, seed, log)
    return results


def table(results: list[Result], stages) -> str:
    """Per stage / case: the verified injections, survived, lost, the faults that could not be
    verified (not injected), ...; a no-fault case (server_concurrent) is a check, passed or
    failed, outside the counts."""
    rows = [(f"{'stage':9s} {'injected':>8s} {'survived':>8s} {'lost':>5s} {'not inj.':>8s} "
             f"{'inside file':>11s} {'inside mlflow':>13s} {'strays':>6s}  re-run outputs")]
    for stage in stages:
        mine = [r for r in results if r.stage == stage]
        if mine and all(r.no_fault for r in mine):
            rows.append(f"{stage:9s} no fault (a check, not in the tally): "
                        + ", ".join("failed" if r.lost else "passed" for r in mine))
            continue
        injected = [r for r in mine if r.injected]
        reruns = sorted({r.rerun.split(" (")[0].split(" from")[0] for r in injected})
        rows.append(
            f"{stage:9s} {len(injected):8d} {sum(r.survived for r in mine):8d} "
            f"{sum(not r.survived for r in injected):5d} {len(mine) - len(injected):8d} "
            f"{sum(r.inside for r in injected if r.kind == 'file'):11d} "
            f"{sum(r.inside for r in injected if r.kind == 'mlflow'):13d} "
            f"{sum(r.strays > 0 for r in injected):6d}  {', '.join(reruns)}")
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    """The fault suite's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=5, help="kills per stage (default 5)")
    parser.add_argument("--seed", type=int, default=20, help="seed of the kill moments")
    parser.add_argument("--stages", default=",".join(STAGES + SERVER_CASES),
                        help=f"comma-separated, of {','.join(STAGES)} and the team server's "
                             f"cases (bench/fault_server.py)")
    parser.add_argument("--keep", default="", help="work in this folder and keep it")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    stages = [s for s in STAGES + SERVER_CASES if s in args.stages.split(",")]
    unknown = set(args.stages.split(",")) - set(STAGES + SERVER_CASES)
    if unknown or not stages:
        parser.error(f"unknown stage(s) {sorted(unknown)}; choose from "
                     f"{', '.join(STAGES + SERVER_CASES)}")
    print(f"fault suite: {args.kills} kills per stage, seed {args.seed}; {platform.node()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; Python "
          f"{platform.python_version()}", flush=True)
    started = time.time()
    top = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="fault-suite-"))
    if args.keep:
        shutil.rmtree(top, ignore_errors=True)
        top.mkdir(parents=True)
    try:
        results = run_suite(top, stages, args.kills, args.seed,
                            log=lambda line: print(line, flush=True))
    finally:
        if not args.keep:
            shutil.rmtree(top, ignore_errors=True)
    print()
    print(table(results, stages))
    print(f"wall time {time.time() - started:.0f} s")
    lines, failed = summary(results)
    for line in lines:
        print(line)
    return 1 if failed else 0


def summary(results: list[Result]) -> tuple[list[str], bool]:
    """The closing lines and whether the suite failed. Tallied: verified injections only. The
    no-fault checks get a line of their own; the faults that could not be verified (retried
    ATTEMPTS times for a stage kill, once for a server case) are counted apart, with why. The
    suite fails (exit 1) if something was lost: a verified injection, a no-fault check or an
    unverified fault whose checks found a problem; a fault merely not injected does not fail
    it. The last line: `fault-suite: <survived>/<injected> survived, <lost> lost, <n> not
    injected`."""
    injected = [r for r in results if r.injected]
    survived = sum(r.survived for r in injected)
    checks = [r for r in results if r.no_fault]
    uninjected = [r for r in results if not r.no_fault and not r.injected]
    lines = []
    if checks:
        lines.append(f"no-fault checks: {sum(not r.lost for r in checks)} passed, "
                     f"{sum(r.lost for r in checks)} failed ("
                     + ", ".join(f"{r.stage} {'failed' if r.lost else 'passed'}" for r in checks)
                     + ")")
    for r in uninjected:
        lines.append(f"not injected: {r.stage} {r.kind}: {r.not_injected}"
                     + (f"; its checks failed: {'; '.join(r.problems)}" if r.lost else ""))
    lines.append(f"fault-suite: {survived}/{len(injected)} survived, "
                 f"{len(injected) - survived} lost, {len(uninjected)} not injected")
    return lines, any(r.lost for r in results)


if __name__ == "__main__":
    sys.exit(main())
