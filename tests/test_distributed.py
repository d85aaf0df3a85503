"""Distributed training, for real, on this machine: the pretrain stage under
MultiWorkerMirroredStrategy with two worker processes on 127.0.0.1 (TF_CONFIG), and under
MirroredStrategy over two logical CPU devices, each compared with a one-device run of the
same global batch (dropout off, gradient clipping active so its cross-replica semantics are
checked too).

The three runs start together (the two workers and the mirrored run in subprocesses, the
reference in this process) to keep the wall time down.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from pipeline import artifacts
from pipeline.stages import pretrain

from test_training import tiny_config, write_pretraining_data
from tests.conftest import PipelineLines

# Every test reads the module's one set of runs (two workers, mirrored, the reference):
# about two minutes, so the whole file is slow.
pytestmark = pytest.mark.slow

PROJECT = artifacts.PROJECT_ROOT
RTOL = 1e-4
# Global batch 8 (4 per replica), clipping at 0.5 (every gradient norm here is above it),
# data sharding by record, so every setup sees the same global batches. XLA as the pipeline
# decides by default: on for the one-device reference, off under the two-replica strategies.
ARGS = ["train.steps=6", "train.checkpoint_every=3", "train.warmup_steps=2",
        "train.batch_size=8", "train.clipnorm=0.5", "train.data_sharding=data",
        "train.jit_compile=auto"]

DRIVER = r"""
import json, logging, sys
said = logging.StreamHandler(sys.stdout)  # the pipeline's lines, as the CLI's console shows them
said.setFormatter(logging.Formatter("%(message)s"))
logging.getLogger("pipeline").addHandler(said)
logging.getLogger("pipeline").setLevel(logging.INFO)
mode, run_dir, *overrides = sys.argv[1:]
if mode == "mirrored":
    from pipeline.training import strategy
    strategy.split_cpu(2)  # before TensorFlow initialises its devices
from pipeline.stages import pretrain
from test_training import tiny_config
if mode == "mirrored":
    pretrain.export = lambda model, paths, *lowercase: None
if mode == "multi_worker":
    # Through the CLI, as on a cluster: only the chief takes the run lock and records MLflow runs.
    from pipeline import artifacts, cli
    stage, results = pretrain.run, []
    pretrain.run = lambda config: results.append(stage(config)) or results[-1]
    config = tiny_config(run_dir, *overrides)
    code = cli._run(config, "", ["pretrain"], False, artifacts.Artifacts(run_dir))
    assert code == 0, f"exit {code}"
    result = results[0]
else:
    result = pretrain.run(tiny_config(run_dir, *overrides))
print("RESULT " + json.dumps({k: result[k] for k in ("history", "weights_sha256", "step",
                                                      "eval_loss")}), flush=True)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(mode, run_dir, extra_env=None, extra_args=()):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([str(PROJECT), str(PROJECT / "tests")]),
               **(extra_env or {}))
    env.pop("TF_CONFIG", None)
    env.update(extra_env or {})
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, mode, str(run_dir), *ARGS, *extra_args,
         *(["train.strategy=multi_worker"] if mode == "multi_worker" else []),
         *(["train.strategy=mirrored", "train.allow_cpu=true"] if mode == "mirrored" else [])],
        cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process, timeout=420):
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"timed out\n{out[-2000:]}\n{err[-3000:]}")
    assert process.returncode == 0, f"exit {process.returncode}\n{out[-2000:]}\n{err[-3000:]}"
    result = json.loads(next(line[7:] for line in out.splitlines() if line.startswith("RESULT ")))
    result["log"] = out
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    for name in ("reference", "worker0", "worker1", "mirrored"):
        write_pretraining_data(root / name)  # the same records in each (seeded)
    ports = [free_port(), free_port()]
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    # Both workers are given the same MLflow store (only the chief may write to it).
    tracked = [f"tracking.tracking_uri=sqlite:///{root / 'mlflow.db'}",
               "tracking.experiment=distributed"]
    processes = {
        f"worker{i}": start("multi_worker", root / f"worker{i}", {"TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": i}})}, tracked)
        for i in range(2)}
    processes["mirrored"] = start("mirrored", root / "mirrored")
    try:
        export = pretrain.export
        pretrain.export = lambda model, paths, *lowercase: None
        try:
            with PipelineLines() as reference_log:
                reference = pretrain.run(tiny_config(root / "reference", *ARGS))
            reference["log"] = "\n".join(reference_log)
        finally:
            pretrain.export = export
        results = {name: finish(process) for name, process in processes.items()}
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    results["reference"] = reference
    results["root"] = root
    return results


def assert_same_curve(history, reference, rtol):
    expected = dict(reference)
    assert [step for step, _ in history] == [1, 2, 3, 4, 5, 6]
    for step, metrics in history:
        for key in ("loss", "mlm_loss", "nsp_loss", "grad_norm", "learning_rate"):
            np.testing.assert_allclose(metrics[key], expected[step][key], rtol=rtol,
                                       err_msg=f"{key} at step {step}")


def test_reference_run_clips_every_update(runs):
    assert all(metrics["grad_norm"] > 0.5 for _, metrics in runs["reference"]["history"])
    # train.jit_compile=auto, one replica on a CPU with the fused kernels: the update in XLA only
    assert ", XLA off," in runs["reference"]["log"]


def test_two_workers_match_one_worker_with_the_same_global_batch(runs):
    chief, worker = runs["worker0"], runs["worker1"]
    assert "2 replica(s) under CollectiveAllReduceStrategy (worker 0 of 2)" in chief["log"]
    assert "(worker 1 of 2)" in worker["log"]
    assert ", XLA off," in chief["log"] and ", XLA off," in worker["log"]
    assert chief["step"] == worker["step"] == 6
    # Synchronous training: bit-identical weights on both workers.
    assert chief["weights_sha256"] == worker["weights_sha256"]
    # The MLM loss is the weighted mean over the global batch however it is split
    # (pretrain.normalize_mlm_weights), so the curves agree to float rounding.
    assert_same_curve(chief["history"], runs["reference"]["history"], rtol=RTOL)
    assert_same_curve(worker["history"], runs["reference"]["history"], rtol=RTOL)
    np.testing.assert_allclose(chief["eval_loss"], runs["reference"]["eval_loss"], rtol=RTOL)
    # Only the chief writes checkpoints and exports.
    chief_paths = artifacts.Artifacts(runs["root"] / "worker0")
    worker_paths = artifacts.Artifacts(runs["root"] / "worker1")
    assert sorted(p.name for p in chief_paths.checkpoint_dir.glob("ckpt-*.weights.h5")) == [
        "ckpt-00000003.weights.h5", "ckpt-00000006.weights.h5"]
    assert chief_paths.model_keras.exists() and chief_paths.saved_model.exists()
    assert not worker_paths.pretrain_dir.exists()


def test_only_the_chief_locks_the_run_dir_and_records_mlflow_runs(runs):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{runs['root'] / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("distributed")
    found = client.search_runs([experiment.experiment_id])
    parents = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    stages = [r for r in found if r.data.tags.get("pipeline.stage") == "pretrain"]
    assert len(found) == 2 and len(parents) == 1 and len(stages) == 1
    steps = [m.step for m in client.get_metric_history(stages[0].info.run_id, "loss")]
    assert sorted(steps) == [1, 2, 3, 4, 5, 6]  # the chief's steps, once each
    assert "not the chief worker: no run lock, no MLflow runs" in runs["worker1"]["log"]
    assert "not the chief worker" not in runs["worker0"]["log"]
    assert (runs["root"] / "worker0" / ".pipeline.lock").exists()
    assert not (runs["root"] / "worker1" / ".pipeline.lock").exists()


def test_mirrored_on_two_logical_cpus_matches_one_device(runs):
    mirrored = runs["mirrored"]
    assert "2 replica(s) under MirroredStrategy" in mirrored["log"]
    assert ", XLA off," in mirrored["log"]
    assert_same_curve(mirrored["history"], runs["reference"]["history"], rtol=RTOL)
    np.testing.assert_allclose(mirrored["eval_loss"], runs["reference"]["eval_loss"], rtol=RTOL)
