"""Operations: lineage tags, stage reuse, what a corpus change re-runs, the run lock,
exit codes for schedulers, and resuming after a kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import mlflow
import pytest

from pipeline import artifacts, cli
from pipeline.stages import vocab as vocab_stage

PROJECT = artifacts.PROJECT_ROOT


def overrides(tmp_path, corpus_dir, *extra):
    return [f"run_dir={tmp_path / 'run'}", f"corpus.path={corpus_dir}/*.txt",
            f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            "tracking.experiment=ops", *extra]


def stage_runs(tmp_path):
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("ops")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children


@pytest.mark.slow
def test_lineage_reuse_and_corpus_change(tmp_path, corpus_dir, capsys, monkeypatch):
    args = ["all", "--config", "configs/test_tiny.yaml", *overrides(tmp_path, corpus_dir)]
    assert cli.main(args) == cli.EXIT_OK
    parents, children = stage_runs(tmp_path)
    by_stage = {r.data.tags["pipeline.stage"]: r for r in children}
    assert set(by_stage) == {"corpus", "vocab", "data", "pretrain"}
    for run in children:
        tags = run.data.tags
        assert len(tags["mlflow.source.git.commit"]) in (0, 40)
        assert len(tags["lineage.config_hash"]) == 64 and len(tags["lineage.code_hash"]) == 64
    data_tags = by_stage["data"].data.tags
    vocab_sha = __import__("hashlib").sha256(
        (tmp_path / "run" / "vocab" / "vocab.txt").read_bytes()).hexdigest()
    assert data_tags["lineage.input.vocab"] == vocab_sha
    assert data_tags["lineage.upstream.vocab"] == by_stage["vocab"].info.run_id
    assert data_tags["lineage.upstream.corpus"] == by_stage["corpus"].info.run_id
    assert by_stage["pretrain"].data.tags["lineage.upstream.data"] == by_stage["data"].info.run_id
    assert "lineage.input.corpus_files" in by_stage["corpus"].data.tags
    capsys.readouterr()

    # The same invocation again: nothing to do, every stage reused, linked to its producer;
    # keys that change how a stage runs, not what it makes, do not count as a change.
    how = ["vocab.spill_words=7", "vocab.merge_fan_in=3", "data.workers=2",
           'data.beam_args=["--runner=DirectRunner", "--direct_num_workers=1"]']
    assert cli.main([*args, *how, "--scheduled"]) == cli.EXIT_NOTHING_TO_DO
    parents, children_after = stage_runs(tmp_path)
    assert len(children_after) == 4
    tags = parents[-1].data.tags
    for stage in ("corpus", "vocab", "data", "pretrain"):
        assert tags[f"stage.{stage}"] == "reused"
        assert tags[f"stage.{stage}.run_id"] == by_stage[stage].info.run_id
        assert tags[f"stage.{stage}.link"].endswith(f"/runs/{by_stage[stage].info.run_id}")

    # New text in the corpus: corpus → data → pretrain run again; the vocab stays.
    with open(corpus_dir / "part-0.txt", "a", encoding="utf-8") as handle:
        handle.write("\nA new document arrives today.\nIt has two sentences.\n")
    assert cli.main([*args, "--scheduled"]) == cli.EXIT_OK
    parents, _ = stage_runs(tmp_path)
    tags = parents[-1].data.tags
    assert [tags[f"stage.{s}"] for s in ("corpus", "vocab", "data", "pretrain")] == [
        "ran", "reused", "ran", "ran"]

    # --force runs a reused stage again; the spill keys reach the job (7 distinct words in
    # memory, runs merged 3 at a time) and the vocab is the same, byte for byte.
    assert cli.main(["vocab", "--force", *args[1:]]) == cli.EXIT_OK
    vocab_file = tmp_path / "run" / "vocab" / "vocab.txt"
    before = vocab_file.read_bytes()
    argvs = []

    def recorded(argv, *rest, real=vocab_stage.vocab_job.run, **kwargs):
        argvs.append(list(argv))
        return real(argv, *rest, **kwargs)

    monkeypatch.setattr(vocab_stage.vocab_job, "run", recorded)
    assert cli.main(["vocab", "--force", *args[1:], *how[:2]]) == cli.EXIT_OK
    parents, _ = stage_runs(tmp_path)
    assert parents[-1].data.tags["stage.vocab"] == "ran"
    assert len(argvs) == 1 and " ".join(argvs[0]).count("--spill_words 7 --merge_fan_in 3") == 1
    assert vocab_file.read_bytes() == before


def start(tmp_path, corpus_dir, *extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(PROJECT))
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", "all", "--config", "configs/test_tiny.yaml",
         *overrides(tmp_path, corpus_dir, *extra)],
        cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)


def wait_for(predicate, timeout, what, every=0.2):
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


@pytest.mark.slow
def test_lock_and_resume_after_kill(tmp_path, corpus_dir, capsys):
    """A run killed with kill -9 in the middle of training: while it lives, a second invocation
    on its run directory stops at once (exit 4, naming it); a re-run resumes from the last
    checkpoint, reuses the stages before, and continues the killed run's MLflow run. The
    killed run is a child process; the two later invocations run here (no start-up to pay)."""
    steps = 100
    long_run = [f"train.steps={steps}", "train.warmup_steps=10", "train.checkpoint_every=5",
                "train.log_every=5"]
    args = ["all", "--config", "configs/test_tiny.yaml", *overrides(tmp_path, corpus_dir,
                                                                     *long_run)]
    first = start(tmp_path, corpus_dir, *long_run)
    ckpts = tmp_path / "run" / "pretrain" / "checkpoints"
    try:
        wait_for(lambda: list(ckpts.glob("ckpt-*.weights.h5")) or first.poll() is not None,
                 240, "the first checkpoint", every=0.05)
        # Held where it is (SIGSTOP), so that it is still training when killed, whatever
        # the second invocation below takes; it keeps its lock meanwhile.
        os.killpg(first.pid, signal.SIGSTOP)
        assert first.poll() is None, first.communicate()
        # A second invocation on the same run directory stops at once with "already running".
        capsys.readouterr()
        assert cli.main(args) == cli.EXIT_ALREADY_RUNNING
        err = capsys.readouterr().err
        assert "already running" in err and f"pid {first.pid}" in err, err
        # kill -9 in the middle of training.
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    steps_done = max(int(p.name[5:13]) for p in ckpts.glob("ckpt-*.weights.h5"))
    assert 5 <= steps_done < steps
    # Nothing half-written looks complete: no model exported, no stray temporary files.
    assert not (tmp_path / "run" / "pretrain" / "model.keras").exists()
    # The re-run resumes from the last checkpoint (the stages before are reused).
    assert cli.main(args) == cli.EXIT_OK, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"resuming from ckpt-{steps_done:08d}.weights.h5 (step {steps_done})" in out, out
    assert "corpus: up to date" in out and "data: up to date" in out
    assert f"step {steps}/{steps}" in out
    # The re-run continued the MLflow run the killed one started (kill -9 left it RUNNING).
    _, children = stage_runs(tmp_path)
    (run,) = [r for r in children if r.data.tags["pipeline.stage"] == "pretrain"]
    assert run.info.status == "FINISHED" and run.data.tags["resume.count"] == "1"
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    logged = {m.step for m in client.get_metric_history(run.info.run_id, "loss")}
    assert {5, steps_done, steps_done + 5, steps} <= logged  # before the kill and after it
