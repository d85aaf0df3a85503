"""docs/cli.md, the command-line reference (issue 51, point 4): generated from every command's
parser (pipeline/cli_reference.py), stale = a failure; one flag style, kebab-case, with the
former underscore spellings still parsed into the same dest. Built without TensorFlow."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from pipeline import cli, cli_reference
from pipeline.cli_reference import PAGE, ROOT

STALE = "docs/cli.md is stale: run make cli-docs"


def staleness(committed: str, generated: str) -> str:
    """"" when the page is current, else the one line to act on (with the first line that
    differs, to see why)."""
    if committed == generated:
        return ""
    old, new = committed.splitlines(), generated.splitlines()
    n = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
    shown = new[n] if n < len(new) else (old[n] if n < len(old) else "")
    return f"{STALE} (line {n + 1}: {shown.strip()[:120]!r})"


@pytest.fixture(scope="module")
def listed():
    return cli_reference.commands()


@pytest.fixture(scope="module")
def generated(listed):
    return cli_reference.markdown(listed)


def test_the_committed_page_is_what_the_parsers_make(generated):
    problem = staleness(PAGE.read_text(encoding="utf-8"), generated)
    assert not problem, problem


def test_the_staleness_check_reports_a_flag_the_page_lacks(listed, generated):
    """The check can fail: a parser with one more flag makes a page that differs, and the
    message names the row."""
    changed = cli_reference.commands()
    fill_mask = next(c for c in changed if c.name == "python -m pipeline fill-mask")
    fill_mask.parser.add_argument("--extra-flag", type=int, default=3, help="a new flag")
    page = cli_reference.markdown(changed)
    problem = staleness(generated, page)
    assert problem.startswith(STALE) and "--extra-flag" in problem, problem
    assert "| `--extra-flag EXTRA_FLAG` | `3` | a new flag |" in page
    assert staleness(generated, generated) == ""


def test_every_command_is_listed(listed):
    names = {c.name for c in listed}
    # the stages' parser and every command of python -m pipeline (config: its subcommands)
    assert "python -m pipeline" in names
    for tool in cli.TOOLS:
        assert any(n == f"python -m pipeline {tool}" or n.startswith(f"python -m pipeline {tool} ")
                   for n in names), tool
    assert {"python -m pipeline config show", "python -m pipeline config docs"} <= names
    assert {f"python -m models.convert {c}" for c in ("import-hf", "import-google",
                                                      "export-hf")} <= names
    # every benchmark script with a parser, and each script a make target runs
    scripts = {f"python bench/{f.name}" for f in (ROOT / "bench").glob("*.py")
               if "argparse" in f.read_text(encoding="utf-8")}
    assert scripts <= names, scripts - names
    made = cli_reference.make_targets()
    assert {"bench/bench_train.py", "bench/gpu_bench.py", "bench/checkpoint_fetch.py",
            "bench/fault_suite.py", "pipeline config docs", "pipeline.cli_reference"} <= set(made)
    page = PAGE.read_text(encoding="utf-8")
    for name in names:
        assert f"### `{name}`" in page, name
    for target in ("bench-train", "bench-gpu", "predict", "finetune", "server-stop",
                   "cli-docs", "config-docs"):
        assert f"`make {target}`" in page, target


# (command's argv before the flag, the flag's value, the former spelling, the kebab-case one)
FORMER = [
    ("python -m pipeline fill-mask", ["fill-mask", "the [MASK]"], "7", "--top_k", "--top-k"),
    ("python -m pipeline fill-mask", ["fill-mask", "the [MASK]"], "runs/x", "--run_dir",
     "--run-dir"),
    ("python -m pipeline nsp", ["nsp", "a", "b"], "runs/x", "--run_dir", "--run-dir"),
    ("python -m pipeline attention", ["attention", "a"], "runs/x", "--run_dir", "--run-dir"),
    ("python -m pipeline embed", ["embed", "a", "--out", "v.npy"], "runs/x", "--run_dir",
     "--run-dir"),
    ("python -m pipeline embed", ["embed", "a", "--out", "v.npy"], "9", "--batch_size",
     "--batch-size"),
    ("python -m pipeline retrieval-eval", [], "runs/x", "--run_dir", "--run-dir"),
]


def _parse(name: str, argv: list[str]) -> argparse.Namespace:
    """`argv` through the parser `name` is dispatched to (the shared one for fill-mask...)."""
    from pipeline.tools import inspect_model, retrieval_eval

    if name.startswith("python -m pipeline retrieval-eval"):
        return retrieval_eval.build_parser().parse_args(argv)
    return inspect_model.build_parser().parse_args(argv)


@pytest.mark.parametrize("name, head, value, old, new", FORMER)
def test_a_former_spelling_parses_into_the_same_dest(name, head, value, old, new):
    kebab = _parse(name, [*head, new, value])
    former = _parse(name, [*head, old, value])
    assert vars(former) == vars(kebab)
    dest = new.removeprefix("--").replace("-", "_")
    expected = int(value) if value.isdigit() else value
    assert getattr(kebab, dest) == expected
    # `--old=value` too, and the default stays when neither is given
    assert vars(_parse(name, [*head, f"{old}={value}"])) == vars(kebab)
    assert getattr(_parse(name, head), dest) != expected


def test_the_flags_are_kebab_case_and_the_former_spellings_are_all_known(listed):
    """No shown flag has an underscore; every hidden underscore flag is a former spelling of a
    shown one (same dest) and is tested above; neither --help nor the page shows it."""
    former = {}
    for command in listed:
        for action in command.parser._actions:
            if action.help == argparse.SUPPRESS:
                continue
            for flag in action.option_strings:
                assert "_" not in flag, f"{command.name}: {flag} (kebab-case: " \
                                        f"{flag.replace('_', '-')}, old_spelling for the old one)"
        former.update({(command.name, old): new for old, new in
                       cli_reference.former_spellings(command.parser).items()})
        hidden = {f for a in command.parser._actions if a.help == argparse.SUPPRESS
                  for f in a.option_strings if "_" in f}
        assert hidden <= set(cli_reference.former_spellings(command.parser)), command.name
        assert not any(f in command.parser.format_help() for f in hidden), command.name
    assert former == {(name, old): new for name, _, _, old, new in FORMER}
    page = PAGE.read_text(encoding="utf-8")
    assert "`--top_k` (`--top-k`)" in page  # listed as a former spelling, not as a row
    assert "| `--top_k" not in page


def test_the_reference_needs_no_tensorflow():
    """Building every parser imports none of the heavy libraries (a fresh interpreter: this
    one may have imported them for other tests)."""
    code = ("import sys; from pipeline import cli_reference; cli_reference.markdown(); "
            "print(sorted(m for m in ('tensorflow', 'keras', 'mlflow', 'torch', 'apache_beam', "
            "'sklearn', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_reading_the_benchmarks_leaves_the_environment_alone(monkeypatch):
    """gpu_bench.py sets KERAS_BACKEND=jax when imported: not for the process that reads it."""
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.delitem(sys.modules, "bench.gpu_bench", raising=False)  # imported again here
    path = list(sys.path)
    cli_reference.bench_commands()
    assert "KERAS_BACKEND" not in os.environ
    assert sys.path == path
