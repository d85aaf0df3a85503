"""The vocab and data stages on a real dask.distributed cluster (a scheduler and two worker
processes on 127.0.0.1, started and stopped here), through the pipeline's command line: the
same vocab, TFRecords and stats, byte for byte, as the in-process FnApiRunner."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from beam_jobs import runners
from pipeline import artifacts

PROJECT = artifacts.PROJECT_ROOT
DASK = Path(sys.executable).with_name("dask")
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(PROJECT))


def _stop(process: subprocess.Popen) -> None:
    """Stops a process this module started, and its children (its own session)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """tcp://127.0.0.1:PORT of a scheduler with two single-threaded worker processes. They
    import the project from PYTHONPATH, as a real cluster's must (the task graph refers to
    beam_jobs and models by name)."""
    pytest.importorskip("dask.distributed")
    folder = tmp_path_factory.mktemp("dask")
    scheduler_file = folder / "scheduler.json"
    started = []

    def start(*args, log):
        process = subprocess.Popen([str(DASK), *args], cwd=folder, env=ENV,
                                   stdout=open(folder / log, "w"), stderr=subprocess.STDOUT,
                                   start_new_session=True)
        started.append(process)
        return process

    try:
        scheduler = start("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                          "--scheduler-file", str(scheduler_file), log="scheduler.log")
        deadline = time.time() + 60
        while not scheduler_file.exists() or not scheduler_file.read_text().strip():
            assert scheduler.poll() is None and time.time() < deadline, (
                (folder / "scheduler.log").read_text())
            time.sleep(0.2)
        address = json.loads(scheduler_file.read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:")
        for i in range(2):
            start("worker", address, "--host", "127.0.0.1", "--nthreads", "1",
                  "--no-dashboard", "--name", f"w{i}", log=f"worker{i}.log")
        from dask.distributed import Client

        with Client(address, timeout=30, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
        yield address
    finally:
        for process in reversed(started):
            _stop(process)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=PROJECT, env=ENV,
                          capture_output=True, text=True, timeout=300)


def overrides(tmp_path, corpus_dir, name):
    """A run directory, MLflow store and artifacts all under tmp_path (none in the checkout)."""
    return ["--run-root", str(tmp_path), f"run_dir={tmp_path / name}",
            f"corpus.path={corpus_dir}/*.txt",
            f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            "tracking.experiment=dask"]


def outputs(run_dir: Path) -> dict:
    """Every file of vocab/ and data/ (bar the stage markers) by name; in the JSON files the
    run directory is replaced by RUN (the stats record the input and vocab paths), and of
    checksums.json only the TFRecords' entries are kept."""
    files = {}
    for folder in ("vocab", "data"):
        for path in sorted((run_dir / folder).rglob("*")):
            if path.is_file() and path.name != ".stage.json":
                data = path.read_bytes()
                if path.name == "checksums.json":  # the JSON files' hashes depend on RUN
                    data = json.dumps({name: entry for name, entry in json.loads(data)[
                        "files"].items() if not name.endswith(".json")}).encode()
                elif path.suffix == ".json":
                    data = data.replace(str(run_dir).encode(), b"RUN")
                files[str(path.relative_to(run_dir))] = data
    return files


def _transitions(dask_worker):
    return dask_worker.state.transition_counter


@pytest.mark.slow
def test_vocab_and_data_on_dask_are_byte_identical_to_fnapi(tmp_path, corpus_dir,
                                                            dask_cluster):
    fnapi = run_cli("corpus", "vocab", "data", "--config", "configs/test_tiny.yaml",
                    *overrides(tmp_path, corpus_dir, "fnapi"))
    assert fnapi.returncode == 0, fnapi.stderr[-3000:]

    import cloudpickle
    from dask.distributed import Client

    with Client(dask_cluster, timeout=30, set_as_default=False) as client:
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        before = client.run(_transitions)
        beam_args = json.dumps(["--runner=DaskRunner", f"--dask_client_address={dask_cluster}",
                                "--dask_npartitions=4"])
        dask = run_cli("corpus", "vocab", "data", "--config", "configs/test_tiny.yaml",
                       *overrides(tmp_path, corpus_dir, "dask"), f"data.beam_args={beam_args}")
        assert dask.returncode == 0, dask.stderr[-3000:]
        after = client.run(_transitions)
    # Both workers ran tasks of the job (not a LocalCluster of the launcher's own).
    assert len(after) == 2 and all(after[w] > before.get(w, 0) for w in after), (before, after)

    expected, got = outputs(tmp_path / "fnapi"), outputs(tmp_path / "dask")
    assert "vocab/vocab.txt" in got and "data/train-00000-of-00002.tfrecord" in got
    assert "data/train-stats.json" in got and "data/stats.json" in got
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name] == expected[name], name
    # No part file or temporary folder is left behind.
    assert not [p for p in (tmp_path / "dask").rglob("*tmp*")]


@pytest.mark.slow
def test_vocab_job_spilling_and_merging_on_dask_is_byte_identical(tmp_path, corpus_dir,
                                                                  dask_cluster):
    """The count on disk at its smallest (a spill every 3 distinct words, ~1 KB ranges, runs
    merged 2 at a time over several levels), on two Dask workers: the vocab and vocab.json of
    the FnApiRunner with the default settings, and no run file left."""

    def job(name, *flags):
        out = tmp_path / name / "vocab.txt"
        result = subprocess.run(
            [sys.executable, "-m", "beam_jobs.vocab", "--input", f"{corpus_dir}/*.txt",
             "--output", str(out), "--vocab_size", "150", "--min_word_count", "1", *flags],
            cwd=PROJECT, env=ENV, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        assert sorted(p.name for p in out.parent.iterdir()) == ["vocab.json", "vocab.txt"]
        return out.read_bytes(), (out.parent / "vocab.json").read_bytes()

    expected = job("fnapi", "--runner=FnApiRunner")
    got = job("dask", "--spill_words", "3", "--merge_fan_in", "2", "--read_chunk_mb", "0.001",
              "--runner=DaskRunner", f"--dask_client_address={dask_cluster}",
              "--dask_npartitions=4")
    assert got == expected


def test_unreachable_dask_scheduler_is_exit_2_with_one_line(tmp_path, corpus_dir, capsys,
                                                            monkeypatch):
    """In this process (the CLI's own error path; a subprocess would add its imports only)."""
    from pipeline import cli

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    beam_args = json.dumps(["--runner=DaskRunner", f"--dask_client_address={address}"])
    monkeypatch.delenv(artifacts.RUN_ROOT_VARIABLE, raising=False)
    old_root = artifacts.RUN_ROOT
    try:
        code = cli.main(["corpus", "vocab", "--config", "configs/test_tiny.yaml",
                         *overrides(tmp_path, corpus_dir, "run"), f"data.beam_args={beam_args}"])
    finally:
        artifacts.set_run_root(old_root)
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"no Dask scheduler answers at {address}" in errors[0]
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "vocab").exists()


def test_short_runner_name_and_dask_flags_reach_the_options():
    options = runners.pipeline_options(
        ["--runner=DaskRunner", "--dask_client_address=tcp://127.0.0.1:1",
         "--dask_npartitions=3"], check=False).get_all_options()
    assert options["runner"] == runners.DASK_RUNNER
    assert options["address"] == "tcp://127.0.0.1:1" and options["npartitions"] == 3
    assert runners.expand_runner(["--runner", "DaskRunner"]) == ["--runner", runners.DASK_RUNNER]
