"""The scheduler entry point as cron, systemd, Kubernetes and Airflow call it."""

from __future__ import annotations

import importlib.util
import os
import subprocess

import pytest

from pipeline import artifacts

PROJECT = artifacts.PROJECT_ROOT


@pytest.mark.slow
def test_entry_point_exit_codes_and_airflow_command(tmp_path, corpus_dir):
    extra = [f"run_dir={tmp_path / 'run'}", f"corpus.path={corpus_dir}/*.txt",
             f"tracking.tracking_uri=sqlite:///{tmp_path / 'm.db'}"]
    env = dict(os.environ, STAGES="corpus vocab", CONFIG="configs/test_tiny.yaml",
               TF_CPP_MIN_LOG_LEVEL="3")
    script = str(PROJECT / "deploy" / "run-scheduled.sh")
    first = subprocess.run([script, *extra], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    again = subprocess.run([script, *extra], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 3, again.stderr  # nothing to do
    assert "nothing to do" in again.stdout
    assert list((tmp_path / "run" / "logs").glob("*.log"))  # a log file per run

    # The Airflow DAG's task command maps "nothing to do" to success.
    spec = importlib.util.spec_from_file_location("airflow_dag", PROJECT / "deploy" / "airflow_dag.py")
    dag = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dag)
    dag.PROJECT, dag.CONFIG = str(PROJECT), "configs/test_tiny.yaml"
    command = dag.stage_command("vocab") .replace(
        "deploy/run-scheduled.sh", "deploy/run-scheduled.sh " + " ".join(extra))
    task = subprocess.run(["bash", "-c", command], env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                          capture_output=True, text=True, timeout=300)
    assert task.returncode == 0, task.stderr
    assert "vocab: up to date" in task.stdout
