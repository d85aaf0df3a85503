"""Deploy as written: the scheduling recipes of deploy/ (cron, systemd, Kubernetes, Airflow) run
with the command lines they hold, on a tiny scheduled loop (split out of tests/test_packaging.py,
which installs the package and checks the Dockerfiles)."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import make_corpus
from tests.test_packaging import DEPLOY, PROJECT, _env


# ---------------------------------------------------------------------------
# deploy/: the recipes, with the command lines they hold
# ---------------------------------------------------------------------------
def _recipe_env(tmp_path):
    """What the recipes leave to their environment: where the state goes (runs/, the MLflow
    store) and nothing else: each recipe names what it runs (the cycle) and its config."""
    return _env(BERT_PIPELINE_ROOT=str(tmp_path / "state"))


def _local(text: str) -> str:
    """A recipe's path to the checkout (/opt/bert-pipeline) made this checkout."""
    return text.replace("/opt/bert-pipeline", str(PROJECT))


def _tiny_cycle_config(tmp_path, incoming) -> Path:
    """configs/test_tiny.yaml with a cycle section: `incoming` as the new text, one tiny
    labelled task (tests/test_cycle.py's), no waiting for files to settle."""
    from tests.test_cycle import _task_files

    raw = yaml.safe_load((PROJECT / "configs" / "test_tiny.yaml").read_text())
    raw["train"]["peak_flops_seconds"] = 0  # no 1-second matmul timing per pretrain (no mfu)
    # No baselines (bag-of-words, majority class): what the recipes run is the point here;
    # tests/test_cycle.py checks what a cycle does with them.
    task = {**_task_files(tmp_path)["topic"], "overrides": ["finetune.baselines=false"]}
    raw["cycle"] = {"incoming": f"{incoming}/*.txt", "settle_seconds": 0, "tasks": [task]}
    path = tmp_path / "nightly-tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_the_config_the_recipes_name_exists():
    from pipeline import config as config_lib
    from pipeline import cycle
    from pipeline.config.load import cycle_tasks

    named = {m for f in DEPLOY.rglob("*") if f.is_file()
             for m in re.findall(r"configs/[\w.-]+\.yaml", f.read_text(errors="replace"))}
    assert "configs/nightly.yaml" in named
    for name in named:
        config = config_lib.load(PROJECT / name)
        for task in cycle_tasks(config):  # the finetune configs the cycle names load too
            cycle.task_config(config, task, None)
    nightly = config_lib.load(PROJECT / "configs" / "nightly.yaml")
    assert nightly.cycle.incoming and cycle_tasks(nightly)


@pytest.mark.slow
def test_recipes_run_as_written(tmp_path, corpus_dir):
    """cron, systemd and Kubernetes run one cycle of the scheduled loop each night (a real
    cycle, then "nothing new" = exit 3, which each maps to success); the Airflow DAG runs a
    cycle step by step (new text arrived), its pretrain step exiting 3 (skip) once there is none."""
    env = _recipe_env(tmp_path)
    config = _tiny_cycle_config(tmp_path, corpus_dir)

    def tiny(command: str) -> str:
        assert "configs/nightly.yaml" in command and "STAGES=cycle" in command
        return _local(command).replace("configs/nightly.yaml", str(config))

    # cron: the line after the five schedule fields; silent unless a real failure.
    line = next(x for x in (DEPLOY / "crontab.example").read_text().splitlines()
                if x.strip() and not x.startswith("#"))
    cron = tiny(line.split(None, 5)[5])
    for _ in range(2):  # a cycle, then nothing new (exit 3): both silent
        done = subprocess.run(["bash", "-c", cron], env=env, capture_output=True, text=True, check=False,
                              timeout=900)
        assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
    state = tmp_path / "state" / "runs" / "test"
    assert json.loads((state / "cycle" / "state.json").read_text())["last_cycle"] == 1
    failing = subprocess.run(["bash", "-c", cron.replace(str(config), "no_such_config")],
                             env=env, capture_output=True, text=True, check=False, timeout=300)
    assert "failed with exit code 2" in failing.stdout  # a real failure mails the owner

    # systemd: a non-root user, the network wanted, 3 and 4 counted as success.
    unit = (DEPLOY / "systemd" / "bert-pipeline.service").read_text()
    keys = dict(re.findall(r"^(\w+)=(.*)$", unit, re.MULTILINE))
    assert keys["User"] not in ("", "root") and keys["Wants"] == "network-online.target"
    assert set(keys["SuccessExitStatus"].split()) == {"3", "4"}
    unit_env = dict(item.split("=", 1) for item in shlex.split(keys["Environment"]))
    assert unit_env["STAGES"] == "cycle" and unit_env["CONFIG"] == "configs/nightly.yaml"
    service = subprocess.run(shlex.split(_local(keys["ExecStart"])),
                             cwd=_local(keys["WorkingDirectory"]),
                             env={**env, **unit_env, "CONFIG": str(config)},
                             capture_output=True, text=True, check=False, timeout=600)
    assert service.returncode == 3, service.stderr[-2000:]  # nothing new since cron's cycle

    # Kubernetes: the container's command and env, resources, the state on a volume.
    job = yaml.safe_load((DEPLOY / "k8s-cronjob.yaml").read_text())
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"][
        "memory"]
    container_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert container_env["BERT_PIPELINE_ROOT"] in mounts  # runs/ and the MLflow store persist
    assert "make setup" not in " ".join(container["command"])
    assert container_env["CONFIG"] == "configs/nightly.yaml"
    assert "STAGES=cycle" in container["command"][-1]
    pod_run = subprocess.run(container["command"], env={**env, "CONFIG": str(config)},
                             capture_output=True, text=True, check=False, timeout=600,
                             cwd=_local(container["workingDir"]))
    assert pod_run.returncode == 0, pod_run.stderr[-2000:]  # 3 (nothing new) mapped to 0
    policy = job["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]
    assert any(r["action"] == "FailJob" and 2 in r["onExitCodes"]["values"] for r in policy)

    # Airflow: one task per step, in a chain, exit 3 = skipped (with what follows).
    spec = importlib.util.spec_from_file_location("airflow_dag", DEPLOY / "airflow_dag.py")
    dag = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dag)
    dag.PROJECT, dag.CONFIG = str(PROJECT), str(config)
    steps = dag.steps()
    assert [task_id for task_id, _ in steps] == ["pretrain", "finetune_topic", "evaluate",
                                                 "promote"]
    assert dag.SKIP == 3 and "skip_on_exit_code=SKIP" in (DEPLOY / "airflow_dag.py").read_text()
    make_corpus(tmp_path / "day-2", documents=30, seed=2)
    shutil.copy(tmp_path / "day-2" / "part-0.txt", corpus_dir / "day-2.txt")  # new text arrived
    for task_id, command in steps:
        ran = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, check=False,
                             timeout=900)
        assert ran.returncode == 0, (task_id, ran.stdout[-2000:] + ran.stderr[-2000:])
    assert json.loads((state / "cycle" / "state.json").read_text())["last_cycle"] == 2
    again = subprocess.run(["bash", "-c", steps[0][1]], env=env, capture_output=True, text=True, check=False,
                           timeout=300)
    assert again.returncode == dag.SKIP, again.stderr[-2000:]  # no new text: the rest skipped
