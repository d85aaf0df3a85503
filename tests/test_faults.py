"""The fast subset of `make fault-suite` (bench/fault_suite.py): one kill -9 of each fast stage
(corpus, vocab, data), with the suite's own functions, real processes, files and SQLite store.

Each stage is killed once at a moment of a different kind (inside a file write, inside an MLflow
write transaction, at a random instant), from the state it starts in; what is left must not be
taken as complete, the re-run's outputs must be byte-identical to an uninterrupted run's, and
the MLflow runs must say what happened (the whole suite, with pretraining, its export and
fine-tuning, is `make fault-suite`; pretraining's own kill test is
tests/test_operations.py::test_lock_and_resume_after_kill).
"""

from __future__ import annotations

import random

from bench import fault_suite


def test_kill_each_fast_stage_once_and_rerun(tmp_path):
    suite = fault_suite.Suite(tmp_path, log=lambda line: None)
    suite.build_reference(["corpus", "vocab", "data"])
    for stage, kind in (("corpus", "random"), ("vocab", "mlflow"), ("data", "file")):
        result = suite.kill_once(stage, kind, random.Random(f"test-{stage}"))
        assert result.injected, f"{stage}: the stage ended before the {kind} moment"
        assert result.survived, f"{stage} ({kind} at {result.killed_at:.1f} s): {result.problems}"
        assert result.after_kill in ("absent", "complete") and result.rerun == "identical"
        assert "re-run: ran FINISHED" in result.mlflow or "reused" in result.mlflow
