"""Install as written: the package and its `bert-pipeline` command outside the checkout, the
container images' Dockerfiles checked against the project. (The scheduling recipes of deploy/,
run with the command lines they hold: tests/test_recipes.py.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from pipeline import artifacts

PROJECT = artifacts.PROJECT_ROOT
DEPLOY = PROJECT / "deploy"


def _env(**extra):
    """A child environment without the checkout on PYTHONPATH (make test exports it) and
    without a tracking URI an earlier in-process test left (mlflow.set_tracking_uri sets it)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "BERT_PIPELINE_ROOT", "MLFLOW_TRACKING_URI")}
    return {**env, "TF_CPP_MIN_LOG_LEVEL": "3", **extra}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A venv outside the checkout with the project's wheel installed (its dependencies come
    from this venv through a .pth file, so nothing is downloaded)."""
    root = tmp_path_factory.mktemp("install")
    source = root / "src"  # a copy of the tracked files: the build writes build/ and egg-info
    tracked = subprocess.run(["git", "ls-files"], cwd=PROJECT, capture_output=True, text=True,
                             check=True).stdout.split()
    for name in tracked:
        if (PROJECT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(PROJECT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(root / "dist"), str(source)],
                   check=True, env=_env(), timeout=300, capture_output=True)
    wheel = next((root / "dist").glob("bert_pipeline-*.whl"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "--quiet", "--no-deps", str(wheel)],
                   check=True, env=_env(), timeout=300, capture_output=True)
    return venv


@pytest.mark.slow
def test_installed_command_runs_outside_the_checkout(installed, tmp_path, corpus_dir):
    command = str(installed / "bin" / "bert-pipeline")
    work = tmp_path / "work"
    work.mkdir()
    help_text = subprocess.run([command, "--help"], cwd=work, env=_env(), capture_output=True,
                               text=True, timeout=120, check=False)
    assert help_text.returncode == 0 and "bert-pipeline" in help_text.stdout
    # The installed code, not the checkout's, and shipped configs by name.
    where = subprocess.run([str(installed / "bin" / "python"), "-c",
                            "import pipeline; print(pipeline.__file__)"], cwd=work, env=_env(),
                           capture_output=True, text=True, check=True).stdout
    assert str(installed) in where and str(PROJECT) not in where
    run = subprocess.run([command, "all", "--config", "test_tiny",
                          f"corpus.path={corpus_dir}/*.txt"], cwd=work, env=_env(), check=False,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (work / "runs" / "test" / "pretrain" / "model.keras").is_file()
    assert (work / "mlflow.db").is_file()  # the store where it ran, not beside the package
    # --run-root, and the demo corpus downloaded when it is missing (here from a file:// copy).
    other = tmp_path / "other"
    corpus = subprocess.run([command, "corpus", "--config", "pretrain_tiny", "--run-root",
                             str(other)], cwd=work, capture_output=True, text=True, timeout=300,
                            check=False,
                            env=_env(BERT_PIPELINE_BROWN_URL=artifacts.BROWN_TARBALL.as_uri()))
    assert corpus.returncode == 0, corpus.stderr[-3000:]
    assert (other / "data" / "downloads" / artifacts.BROWN_TARBALL.name).is_file()
    assert list((other / "runs" / "default" / "corpus" / "train").glob("*.txt"))
    missing = subprocess.run([command, "corpus", "--config", "no_such_config"], cwd=work,
                             env=_env(), capture_output=True, text=True, timeout=120, check=False)
    assert missing.returncode == 2 and "pretrain_tiny" in missing.stderr


def test_dockerfiles_match_the_project():
    from pipeline import cli

    makefile = (PROJECT / "Makefile").read_text()
    for name in ("Dockerfile", "Dockerfile.gpu"):
        text = (DEPLOY / name).read_text()
        for line in re.findall(r"^COPY (.+)$", text, re.MULTILINE):
            for source in line.split()[:-1]:
                assert (PROJECT / source).exists(), (name, source)
        # The venv is built with the same install line as `make setup`.
        assert "pip install --quiet -r requirements.lock" in text
        assert "$(VENV)/bin/pip install --quiet -r requirements.lock" in makefile
        entry = yaml.safe_load(re.search(r"^ENTRYPOINT (.+)$", text, re.MULTILINE).group(1))
        command = yaml.safe_load(re.search(r"^CMD (.+)$", text, re.MULTILINE).group(1))
        assert entry == ["bert-pipeline"]
        assert 'bert-pipeline = "pipeline.cli:main"' in (PROJECT / "pyproject.toml").read_text()
        assert command[0] in cli.STAGES + cli.EXTRA_STAGES + ("all",)
        config = command[command.index("--config") + 1]
        assert (PROJECT / "configs" / f"{config}.yaml").is_file()
    gpu = (DEPLOY / "Dockerfile.gpu").read_text()
    assert "requirements-gpu.txt" in gpu and (PROJECT / "requirements-gpu.txt").is_file()
