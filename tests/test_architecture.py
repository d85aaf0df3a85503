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
        assert callable(getattr(importlib.import_module(spec.module), spec.function)), name
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
                     "pipeline/training/strategy.py", "pipeline/config/load.py",
                     "pipeline/config/keys.py", "beam_jobs/schema.py",
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


# No shadow defaults: a config key's default lives in its declaration (pipeline/config/
# sections.py) only. `getattr(fc, "window_stride", 0)` re-states one, and can disagree with it
# (the declaration said 64); code reads `fc.window_stride`. Config-like objects: a name or
# attribute containing config / cfg / section, a section reached from one (`config.finetune`),
# and any name that code in pipeline/ binds to one (`fc = config.finetune`, `dc, tc =
# config.data, config.train`, `self.fc = fc`, a parameter annotated `FinetuneConfig`).
CONFIG_WORDS = ("config", "cfg", "section")


def _last_name(node) -> str:
    return node.id if isinstance(node, ast.Name) else \
        node.attr if isinstance(node, ast.Attribute) else ""


def _config_like(node, sections: set, aliases: set) -> bool:
    name = _last_name(node)
    if not name:
        return False
    if any(word in name.lower() for word in CONFIG_WORDS) or name in aliases:
        return True
    return (isinstance(node, ast.Attribute) and name in sections
            and _config_like(node.value, sections, aliases))


def _bindings(tree):
    """(target, value) of every assignment, tuples paired element by element."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                        and len(target.elts) == len(node.value.elts):
                    yield from zip(target.elts, node.value.elts)
                else:
                    yield target, node.value


def shadow_defaults(sources: dict[str, str], sections: set) -> list[str]:
    """Every `getattr(<config-like>, "<literal key>", <default>)` in `sources` (name -> code)."""
    trees = {name: ast.parse(code) for name, code in sources.items()}
    aliases: set = set()
    for tree in trees.values():  # parameters annotated with a config section's class
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.annotation is not None and \
                    ast.unparse(node.annotation).split(".")[-1].endswith("Config"):
                aliases.add(node.arg)
    while True:  # names bound to a config-like value, until no new one appears
        found = {_last_name(target) for tree in trees.values()
                 for target, value in _bindings(tree)
                 if _config_like(value, sections, aliases)} - aliases - {""}
        if not found:
            break
        aliases |= found
    problems = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id == "getattr" and len(node.args) == 3 and \
                    isinstance(node.args[1], ast.Constant) and \
                    isinstance(node.args[1].value, str) and \
                    _config_like(node.args[0], sections, aliases):
                problems.append(f"{name}:{node.lineno}: {ast.unparse(node)}: the declaration "
                                f"owns the default; read {ast.unparse(node.args[0])}."
                                f"{node.args[1].value}")
    return problems


def _pipeline_sources() -> dict[str, str]:
    return {path.relative_to(PROJECT).as_posix(): path.read_text(encoding="utf-8")
            for path in sorted((PROJECT / "pipeline").rglob("*.py"))}


def _sections() -> set:
    import dataclasses

    from pipeline.config import Config

    return {f.name for f in dataclasses.fields(Config)}


def test_no_shadow_defaults_of_config_keys():
    problems = shadow_defaults(_pipeline_sources(), _sections())
    assert not problems, "\n".join(problems)


def test_the_shadow_default_check_catches_what_it_claims():
    """It fails on each way a config is reached, and passes what is not a config."""
    bad = {"a.py": 'def f(config):\n    return getattr(config.finetune, "window_stride", 0)\n',
           "b.py": 'def g(config):\n    fc = config.finetune\n    return getattr(fc, "x", 1)\n',
           "c.py": 'def h(config):\n    dc, tc = config.data, config.train\n'
                   '    return getattr(tc, "seed", 0)\n',
           "d.py": 'class T:\n    def __init__(self, fc):\n        self.fc = fc\n'
                   '    def w(self):\n        return getattr(self.fc, "windows", 0)\n',
           "e.py": 'def k(section: "TrainConfig", cfg):\n'
                   '    return getattr(section, "a", 1), getattr(cfg, "b", 2)\n'}
    ok = {"f.py": 'def m(model, err, config):\n    getattr(model, "backbone", model)\n'
                  '    getattr(err, "error_code", "")\n    getattr(config, "a")\n'
                  '    return getattr(config.finetune, key, 0)\n'}
    sections = {"finetune", "data", "train", "model"}
    found = shadow_defaults({**bad, **ok}, sections)
    assert [line.split(":")[0] for line in found] == \
        ["a.py", "b.py", "c.py", "d.py", "e.py", "e.py"], found


# Few parameters in fine-tuning: what a run shares (its config, task, data, tokenizer, splits,
# paths, strategy) travels as one context (pipeline/finetuning/context.py), a training's knobs
# as one plan (runtime.FitPlan), not as loose arguments passed along from call to call.
MAX_PARAMETERS = 5


def long_signatures(sources: dict[str, str], limit: int = MAX_PARAMETERS) -> list[str]:
    """Every function in `sources` (name -> code) taking more than `limit` parameters (a
    method's self or cls not counted; keyword-only ones, *args and **kwargs counted)."""
    problems = []
    for name, code in sources.items():
        for node in ast.walk(ast.parse(code)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            params = [p.arg for p in (*a.posonlyargs, *a.args, a.vararg, *a.kwonlyargs, a.kwarg)
                      if p is not None]
            if params[:1] in (["self"], ["cls"]):
                params = params[1:]
            if len(params) > limit:
                problems.append(f"{name}:{node.lineno}: {node.name} takes {len(params)} "
                                f"parameters ({', '.join(params)}), more than {limit}")
    return problems


def test_no_fine_tuning_function_takes_more_than_five_parameters():
    sources = {name: code for name, code in _pipeline_sources().items()
               if name.startswith("pipeline/finetuning/")}
    assert len(sources) > 20  # the package was found
    problems = long_signatures(sources)
    assert not problems, "\n".join(problems)


def test_the_parameter_check_counts_what_it_claims():
    found = long_signatures({
        "a.py": "def f(a, b, c, d, e, g):\n    pass\n",
        "b.py": "class C:\n    def m(self, a, b, c, d, e):\n        pass\n"
                "    def n(self, a, *b, c, d, e, **f):\n        pass\n",
        "c.py": "def ok(a, b, c, d, e=1):\n    def inner(a, b, c, d, e, f):\n        pass\n"})
    assert [line.split(": ")[1].split(" takes")[0] for line in found] == ["f", "n", "inner"]
    assert "n takes 6 parameters (a, b, c, d, e, f)" in found[1]
