"""`pipeline.tools.console` (the logging every command under pipeline/tools sets up, with its
-v): the pipeline's status lines on stderr, stdout left to the command's results, other
libraries' INFO lines only with -v, and no line twice when pipeline/logs.py's console is there."""

from __future__ import annotations

import logging

import mlflow
import pytest

from pipeline import logs, tools
from pipeline.tools import tracking_sync


@pytest.fixture(autouse=True)
def _own_logging():
    """Each test starts without the console handlers an earlier test's pipeline run left
    (pipeline/logs.py `setup`; pytest's own stay) and leaves none of its own behind."""
    root, ours = logging.getLogger(), logging.getLogger("pipeline")
    saved = [(logger, logger.level, list(logger.handlers)) for logger in (root, ours)]
    for logger in (root, ours):
        for handler in logger.handlers[:]:
            if not type(handler).__module__.startswith("_pytest"):
                logger.removeHandler(handler)
    yield
    tools._INSTALLED.clear()
    for logger, level, handlers in saved:
        logger.setLevel(level)
        for handler in logger.handlers[:]:
            logger.removeHandler(handler)
        for handler in handlers:
            logger.addHandler(handler)


def test_status_lines_on_stderr_and_libraries_info_only_with_verbose(capsys):
    ours, library = logging.getLogger("pipeline.tools.example"), logging.getLogger("somelib.x")
    tools.console(verbose=False)
    tools.console(verbose=False)  # again: replaces, does not add
    ours.info("tool: indexed 3 passages")
    ours.warning("the cache is stale")
    library.info("somelib: connected")
    library.warning("somelib: deprecated call")
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["tool: indexed 3 passages", "warning: the cache is stale",
                                "warning: somelib: deprecated call"]
    tools.console(verbose=True)
    ours.info("tool: done")
    library.info("somelib: connected")
    assert capsys.readouterr().err.splitlines() == ["tool: done", "somelib: connected"]


def test_silent_where_the_pipeline_console_is_set_up(tmp_path, capsys):
    tools.console()
    logs.setup(tmp_path / "run.log")
    logging.getLogger("pipeline.tools.example").info("said once")
    out, err = capsys.readouterr()
    assert out.splitlines() == ["said once"] and "said once" not in err


def test_a_tool_says_its_status_on_stderr(tmp_path, capsys):
    try:
        assert tracking_sync.main(["tracking-sync", "--config", "configs/test_tiny.yaml",
                                   f"run_dir={tmp_path / 'run'}"]) == 0
    finally:
        mlflow.set_tracking_uri(None)
    out, err = capsys.readouterr()
    assert out == ""
    outbox = tmp_path / "run" / "tracking" / "outbox.jsonl"
    assert err.splitlines() == [f"tracking-sync: nothing kept in {outbox}"]


def test_the_cli_hands_verbose_to_the_tools(tmp_path, capsys):
    """`python -m pipeline -v tracking-sync ...`: the CLI takes -v off its own arguments and
    gives it to the tool (the cycle and the tools under pipeline/tools take it themselves)."""
    from pipeline import cli

    args = ["tracking-sync", "--config", "configs/test_tiny.yaml", f"run_dir={tmp_path / 'run'}"]
    try:
        for verbose in (False, True):
            assert cli.main(["-v", *args] if verbose else args) == 0
            library = logging.getLogger("somelib.x")
            library.info("somelib: connected")
            err = capsys.readouterr().err
            assert ("somelib: connected" in err) is verbose, err
    finally:
        mlflow.set_tracking_uri(None)
        tools.console(verbose=False)
