"""A full disk (issue 20 point 3): a stage whose write fails for lack of space stops with one
line (exit 5), and what the run directory held before stays intact and usable.

The disk is made "full" for the pipeline process alone with RLIMIT_FSIZE (SIGXFSZ ignored, so a
write past the limit fails with EFBIG, as it would with ENOSPC), set below the size of the file
under test: a TFRecord shard, a checkpoint, the exported model. The MLflow store is a real
server in another process, so only the pipeline's own files meet the limit.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_corpus
from tests.test_tracking import Server

ROOT = Path(__file__).resolve().parent.parent
EXIT_NO_SPACE = 5


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A run directory whose four stages completed, and the server that recorded them."""
    root = tmp_path_factory.mktemp("full")
    make_corpus(root / "raw")
    server = Server(root)
    server.start()
    try:
        code, _, err = pipeline_here(root / "run", root, server, ["all"])
        assert code == 0, err[-3000:]
        yield root, server
    finally:
        server.stop()


def _args(run: Path, root: Path, args: list[str]) -> list[str]:
    return [*args, "--config", "configs/test_tiny.yaml", f"run_dir={run}",
            f"corpus.path={root / 'raw'}/*.txt", "tracking.register_encoder=false"]


def pipeline_here(run: Path, root: Path, server: Server, args: list[str]):
    """The same invocation as `pipeline` without a limit, in this process (no Python start-up
    and imports; only the limited run needs a process of its own): (exit code, stdout,
    stderr)."""
    import contextlib
    import io

    import mlflow

    from pipeline import cli

    out, err = io.StringIO(), io.StringIO()
    before = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = server.url
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(_args(run, root, args))
    finally:
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI")
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
        mlflow.set_tracking_uri(None)
    return code, out.getvalue(), err.getvalue()


def pipeline(run: Path, root: Path, server: Server, args: list[str], limit: int = 0):
    """`python -m pipeline ARGS` on `run`; with `limit`, no file it writes may grow past
    `limit` bytes."""
    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": server.url}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *_args(run, root, args)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        preexec_fn=limited if limit else None)


def snapshot(folder: Path) -> dict:
    """Every file below `folder` (logs and the lock aside) and its digest."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()
            and p.relative_to(folder).parts[0] not in ("logs", ".pipeline.lock")}


def one_error_line(result) -> str:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0]


# (the write that fails, the invocation, how it is set up, the stage's folder that must stay)
CASES = [
    ("a TFRecord shard", ["data", "--force"], None, "data"),
    ("a checkpoint", ["pretrain", "--force"], None, "pretrain"),
    # A training that already reached its steps (killed before its export) goes straight to
    # the export on its re-run: the model file is the first thing it writes.
    ("the exported model", ["pretrain"], lambda run: (run / "pretrain" / ".stage.json").unlink(),
     "pretrain"),
]


@pytest.mark.slow  # a server, a pipeline run, then a limited and a free run per case
@pytest.mark.parametrize("what,args,setup,stage", CASES, ids=[c[0] for c in CASES])
def test_a_full_disk_stops_the_stage_and_keeps_the_previous_outputs(what, args, setup, stage,
                                                                    made, tmp_path):
    root, server = made
    run = tmp_path / "run"
    shutil.copytree(root / "run", run, ignore=shutil.ignore_patterns("logs"))
    if setup:
        setup(run)
    sizes = {"data": max(p.stat().st_size for p in (run / "data").glob("train-*.tfrecord")),
             "pretrain": min(p.stat().st_size for p in [
                 run / "pretrain" / "model.keras",
                 *(run / "pretrain" / "checkpoints").glob("ckpt-*.weights.h5")])}
    keep = [p for p in (run / stage).iterdir() if not p.name.startswith("checkpoints")]
    before = {p.name: snapshot(p) if p.is_dir() else p.read_bytes() for p in keep}

    result = pipeline(run, root, server, args, limit=sizes[stage] // 2)

    assert result.returncode == EXIT_NO_SPACE, (result.stdout + result.stderr)[-3000:]
    line = one_error_line(result)
    assert "out of disk space" in line and f"the {stage} stage" in line, line
    after = {p.name: snapshot(p) if p.is_dir() else p.read_bytes() for p in keep}
    assert after == before  # the previous outputs, byte for byte
    leftovers = [p for p in run.rglob("*") if ".tmp-" in p.name]
    assert not leftovers, leftovers  # nothing half-written left behind
    if stage == "pretrain" and "--force" in args:  # the new checkpoints: only complete ones
        assert not list((run / "pretrain" / "checkpoints").glob("*.h5"))
    # ... and usable: the stage is reused (its checksums verify) or finishes, with space.
    code, out, err = pipeline_here(run, root, server, [stage])
    assert code == 0, (out + err)[-3000:]
    assert (f"{stage}: up to date, reused" in out) == (setup is None)
