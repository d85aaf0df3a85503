"""The fast subset of `make fault-suite` (bench/fault_suite.py): one kill -9 of each fast stage
(corpus, vocab, data), with the suite's own functions, real processes, files and SQLite store.

Each stage is killed once at a moment of a different kind (inside a file write, inside an MLflow
write transaction, at a random instant), from the state it starts in; what is left must not be
taken as complete, the re-run's outputs must be byte-identical to an uninterrupted run's, and
the MLflow runs must say what happened (the whole suite, with pretraining, its export and
fine-tuning, is `make fault-suite`; pretraining's own kill test is
tests/test_operations.py::test_lock_and_resume_after_kill).

Then what counts as injected, on small child processes killed as the suite kills a stage: a
SIGKILL before the stage's completion marker counts; one after it, an exit of the process's
own or a death by another signal does not; and the tally holds verified injections only.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import fault_suite


@pytest.mark.slow
def test_kill_each_fast_stage_once_and_rerun(tmp_path):
    suite = fault_suite.Suite(tmp_path, log=lambda line: None)
    suite.build_reference(["corpus", "vocab", "data"])
    for stage, kind in (("corpus", "random"), ("vocab", "mlflow"), ("data", "file")):
        result = suite.kill_once(stage, kind, random.Random(f"test-{stage}"))
        assert result.injected, f"{stage}: the stage ended before the {kind} moment"
        assert result.survived, f"{stage} ({kind} at {result.killed_at:.1f} s): {result.problems}"
        assert result.after_kill in ("absent", "complete") and result.rerun == "identical"
        assert "re-run: ran FINISHED" in result.mlflow or "reused" in result.mlflow


# ---------------------------------------------------------------------------
# What counts as injected (bench/fault_suite.py kill_group, kill_verdict, summary): real child
# processes in their own process group, killed the way the suite kills a stage.
# ---------------------------------------------------------------------------
def _child(code: str):
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def _wait_for(condition, seconds: float = 30) -> None:
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, "the child did not get there in time"
        time.sleep(0.01)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_sigkill_inside_the_work_counts_as_injected(tmp_path):
    marker = tmp_path / "corpus" / ".stage.json"
    started = tmp_path / "started"
    proc = _child(f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); "
                  "time.sleep(60)")
    _wait_for(started.exists)
    returncode, completed = fault_suite.kill_group(proc, marker)
    assert returncode == -9 and not completed
    verdict = fault_suite.kill_verdict(1.0, returncode, completed)
    assert verdict == ""
    assert fault_suite.Result("corpus", "random", 1.0, not_injected=verdict).injected


def test_a_kill_after_the_completion_marker_is_not_injected(tmp_path):
    """The stage wrote its marker (atomically, as lineage.write_marker does), then went on
    (its MLflow run's end): a SIGKILL then lands after the stage finished."""
    marker = tmp_path / "corpus" / ".stage.json"
    marker.parent.mkdir()
    proc = _child(f"import os, pathlib, time; p = pathlib.Path({str(marker)!r}); "
                  "t = p.with_name('.stage.json.tmp-1'); t.write_text('{}'); os.replace(t, p); "
                  "time.sleep(60)")
    _wait_for(marker.exists)
    returncode, completed = fault_suite.kill_group(proc, marker)
    assert returncode == -9 and completed  # died of the SIGKILL, but after the marker
    verdict = fault_suite.kill_verdict(2.0, returncode, completed)
    assert "completion marker" in verdict
    result = fault_suite.Result("corpus", "mlflow", 2.0, not_injected=verdict)
    assert not result.injected and not result.survived and not result.lost


def test_a_process_that_ended_on_its_own_is_not_injected(tmp_path):
    """The stage exited (status 0) between the suite's last look and its SIGKILL: the signal
    reaches a finished process; its exit status says so."""
    proc = _child("import sys; sys.exit(0)")
    _wait_for(lambda: _state(proc.pid) == "Z")  # ended, not yet reaped: poll() saw it running
    returncode, completed = fault_suite.kill_group(proc, tmp_path / "none" / ".stage.json")
    assert returncode == 0 and not completed
    verdict = fault_suite.kill_verdict(0.5, returncode, completed)
    assert "ended on its own (exit 0)" in verdict
    assert not fault_suite.Result("vocab", "file", 0.5, not_injected=verdict).injected


def test_a_death_by_another_signal_is_not_injected(tmp_path):
    """Only SIGKILL (exit status -9) is the suite's kill: a process that died of SIGTERM
    (or anything else) before it came does not count."""
    import signal

    proc = _child("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    _wait_for(lambda: _state(proc.pid) == "Z")
    returncode, completed = fault_suite.kill_group(proc, tmp_path / ".stage.json")
    assert returncode == -signal.SIGTERM
    assert fault_suite.kill_verdict(0.5, returncode, completed) != ""
    assert "not killed" in fault_suite.kill_verdict(None, 0, False)


def test_the_completion_marker_is_the_stage_s_lineage_marker(tmp_path):
    run = tmp_path / "run"
    assert fault_suite.marker(run, "corpus") == run / "corpus" / ".stage.json"
    assert fault_suite.marker(run, "export") == run / "pretrain" / ".stage.json"
    assert fault_suite.marker(run, "finetune_resume") == run / "finetune" / ".stage.json"
    assert fault_suite.marker(run, "multitask") == run / "multitask" / ".stage.json"
    assert fault_suite.marker(run, "distill") == run / "distill" / ".stage.json"


def test_the_tally_counts_verified_injections_only():
    Result = fault_suite.Result
    results = [
        Result("corpus", "random", 1.0),                              # survived
        Result("vocab", "file", 2.0, problems=["partial output"]),    # lost
        Result("data", "mlflow", 3.0, not_injected="5 tries, none verified: killed after "
               "the stage had written its completion marker (.stage.json)", rerun="-"),
        Result("server_concurrent", "none", None),                    # a check: passed
        Result("server_restart", "server", 40.0, not_injected="no job saw the outage"),
    ]
    lines, failed = fault_suite.summary(results)
    assert lines[-1] == "fault-suite: 1/2 survived, 1 lost, 2 not injected"
    assert failed  # the lost kill
    assert lines[0] == "no-fault checks: 1 passed, 0 failed (server_concurrent passed)"
    assert sum(line.startswith("not injected: ") for line in lines) == 2
    table = fault_suite.table(results, ["corpus", "data", "server_concurrent"])
    assert "server_concurrent no fault (a check, not in the tally): passed" in table


def test_a_fault_merely_not_injected_does_not_fail_the_suite():
    Result = fault_suite.Result
    ok = [Result("corpus", "random", 1.0), Result("server_concurrent", "none", None),
          Result("data", "file", None, not_injected="5 tries, none verified: not killed")]
    lines, failed = fault_suite.summary(ok)
    assert lines[-1] == "fault-suite: 1/1 survived, 0 lost, 1 not injected" and not failed
    # ... but a no-fault check that failed, or an unverified fault's failed checks, do
    assert fault_suite.summary([Result("server_concurrent", "none", None,
                                       problems=["runs not FINISHED"])])[1]
    assert fault_suite.summary([Result("server_restart", "server", 9.0, not_injected="no job "
                                       "saw the outage", problems=["loss lost at steps [5]"])])[1]
