"""The layout's rules, checked: import-linter's contracts (pyproject.toml), no import cycles,
one stage descriptor read by the CLI and lineage, and a stage's code hash that follows its
real imports."""

from __future__ import annotations

import ast
import importlib
import logging
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import grimp
import networkx as nx

from pipeline import artifacts, cli, logs
from pipeline.stage_spec import STAGES
from pipeline.tracking import lineage

PROJECT = artifacts.PROJECT_ROOT
PACKAGES = ("pipeline", "models", "beam_jobs")


def test_import_contracts_hold():
    """models/ imports no pipeline/Beam/MLflow, Beam workers no TensorFlow, stages no other
    stage, libraries no stage, and the library layers point one way (lint-imports)."""
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--config", str(PROJECT / "pyproject.toml")], cwd=PROJECT,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_no_import_cycles():
    """No module reaches itself through imports (in-function imports count: grimp reads them)."""
    graph = grimp.build_graph(*PACKAGES)
    edges = nx.DiGraph()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            edges.add_edge(module, imported)
    cycles = [sorted(c) for c in nx.strongly_connected_components(edges) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def test_the_cli_runs_what_the_stage_specs_name():
    assert cli.STAGES == ("corpus", "vocab", "data", "pretrain")
    assert set(cli.STAGES + cli.EXTRA_STAGES) == set(STAGES)
    for name, spec in STAGES.items():
        module = importlib.import_module(spec.module)
        assert callable(module.run), name
        assert set(spec.upstream) < set(STAGES)
        paths = artifacts.Artifacts("runs/x")
        assert lineage.output_dir(name, paths) == getattr(paths, spec.output)
        if spec.resumable:
            target, function = spec.resumable.split(":")
            assert callable(getattr(importlib.import_module(target), function))


def copy_project(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(PROJECT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_code_hash_covers_every_module_a_stage_imports(tmp_path):
    root = copy_project(tmp_path)
    files = {p.relative_to(root).as_posix() for p in lineage.code_files("pretrain", root)}
    # What the hand-kept list used to miss: models/convert/ (imported inside a function of the
    # training code), the strategy, the config package, the TFRecord schema.
    for expected in ("models/convert/huggingface.py", "models/convert/google.py",
                     "pipeline/training/strategy.py", "pipeline/config/validation.py",
                     "pipeline/config/allowed.py", "beam_jobs/schema.py",
                     "pipeline/training/loop.py", "pipeline/stages/pretrain.py",
                     "pipeline/__init__.py"):
        assert expected in files, expected
    assert not any(f.startswith("pipeline/stages/") and f != "pipeline/stages/pretrain.py"
                   and not f.endswith("__init__.py") for f in files)  # no other stage
    before = {stage: lineage.code_hash(stage, root) for stage in STAGES}
    for relative in sorted(files):
        path = root / relative
        original = path.read_bytes()
        path.write_bytes(original + b"\n# changed\n")
        try:
            assert lineage.code_hash("pretrain", root) != before["pretrain"], relative
        finally:
            path.write_bytes(original)
    assert lineage.code_hash("pretrain", root) == before["pretrain"]
    # A module the corpus stage does not import leaves its hash (and cache) alone.
    corpus_files = {p.relative_to(root).as_posix() for p in lineage.code_files("corpus", root)}
    assert "pipeline/training/loop.py" not in corpus_files
    loop = root / "pipeline/training/loop.py"
    loop.write_text(loop.read_text() + "\n# changed\n")
    assert lineage.code_hash("corpus", root) == before["corpus"]
    assert lineage.code_hash("pretrain", root) != before["pretrain"]
    # A file's imports are read again once its text changed (lineage parses a text once per
    # process): a module the corpus stage starts to import joins its files and its hash.
    (root / "pipeline" / "newly_imported.py").write_text('"""New."""\n')
    stage = root / "pipeline/stages/corpus.py"
    stage.write_text(stage.read_text() + "\n\ndef later():\n    import pipeline.newly_imported\n")
    assert "pipeline/newly_imported.py" in {
        p.relative_to(root).as_posix() for p in lineage.code_files("corpus", root)}


def test_log_file_gets_the_pipeline_lines_and_the_libraries_warnings(tmp_path, capsys):
    log_file = tmp_path / "run.log"
    log = logs.setup(log_file).info
    try:
        log("pretrain: step 1/2")
        logging.getLogger("apache_beam.runners").warning("a Beam warning")
        logging.getLogger("apache_beam.runners").info("Beam chatter")  # below WARNING: dropped
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a Python warning", UserWarning)
    finally:
        logging.captureWarnings(False)
    out, err = capsys.readouterr()
    text = log_file.read_text()
    assert out == "pretrain: step 1/2\n"
    assert "a Beam warning" in err and "pretrain" not in err
    for line in ("pretrain: step 1/2", "a Beam warning", "a Python warning"):
        assert line in text
    assert "Beam chatter" not in text
    # A second invocation replaces the handlers instead of adding to them.
    logs.setup(tmp_path / "second.log").info("once")
    assert capsys.readouterr().out == "once\n"
    # Also when a caller took the handlers off, called `setup`, and put the earlier ones back
    # (a test fixture restoring the loggers as it found them): the CI run that printed the
    # [UNK] warning twice.
    ours = logging.getLogger("pipeline")
    earlier = list(ours.handlers)
    for handler in earlier:
        ours.removeHandler(handler)
    logs.setup(tmp_path / "third.log")
    for handler in ours.handlers[:]:
        ours.removeHandler(handler)
    for handler in earlier:
        ours.addHandler(handler)
    logs.setup(tmp_path / "fourth.log").info("once more")
    assert capsys.readouterr().out == "once more\n"
    logging.captureWarnings(False)


# One role per file (docs/layout.md, "How files are split"). A line cap measured the wrong
# thing: files were squeezed under it (comments cut) instead of split by role. What is checked:
# every module states its role in its docstring, no module is named for no role, and a
# module past MAX_LINES (about twice the largest today) is flagged as a likely second role.
# The packages and bench/ (the benchmark scripts: no package, no import contracts) are checked.
MAX_LINES = 900
NO_ROLE_NAMES = {"utils", "util", "helpers", "helper", "misc", "stuff"}
ROLE_CHECKED = PACKAGES + ("bench",)


def python_modules():
    for folder in ROLE_CHECKED:
        yield from sorted((PROJECT / folder).rglob("*.py"))


def test_every_module_states_its_role_and_has_one():
    problems = []
    for path in python_modules():
        name = path.relative_to(PROJECT).as_posix()
        source = path.read_text(encoding="utf-8")
        lines = len(source.splitlines())
        docstring = ast.get_docstring(ast.parse(source)) or ""
        if source.strip() and not docstring.strip():
            problems.append(f"{name}: no module docstring; its first sentence says what the "
                            f"file is for (its one role)")
        if path.stem in NO_ROLE_NAMES:
            problems.append(f"{name}: a name that holds no role; put each function in the "
                            f"module of its role (docs/layout.md, How files are split)")
        if lines > MAX_LINES:
            problems.append(f"{name}: {lines} lines (> {MAX_LINES}): does it hold two roles? "
                            f"split it by role, not by length")
    assert not problems, "\n".join(problems)


def test_the_role_check_catches_what_it_claims(tmp_path, monkeypatch):
    """The check above fails on a module without a docstring, a utils.py and a 901-line file."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "quiet.py").write_text("X = 1\n")
    (package / "utils.py").write_text('"""Things."""\n')
    (package / "long.py").write_text('"""One role."""\n' + "x = 1\n" * MAX_LINES)
    (package / "fine.py").write_text('"""One role."""\n')
    monkeypatch.setattr(sys.modules[__name__], "PROJECT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "ROLE_CHECKED", ("pkg",))
    try:
        test_every_module_states_its_role_and_has_one()
    except AssertionError as error:
        reported = str(error)
    else:
        raise AssertionError("the role check passed a package it should refuse")
    assert "pkg/quiet.py: no module docstring" in reported
    assert "pkg/utils.py: a name that holds no role" in reported
    assert "pkg/long.py: 901 lines" in reported
    assert "fine.py" not in reported
