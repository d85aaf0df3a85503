"""Logging of one invocation: the pipeline's lines on stdout and in <run_dir>/logs/<time>-<pid>.log.

The stages take a `log` callable (one line of text); the CLI passes `logger().info`. The log
file is a handler on the root logger, so it also receives what the libraries underneath
report through `logging` (Beam, MLflow, TensorFlow/absl: warnings and errors) and Python
warnings; those still reach the console on stderr as before.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

NAME = "pipeline"
_HANDLERS: list[logging.Handler] = []  # installed by `setup`, removed by the next call


class _Current(logging.StreamHandler):
    """A StreamHandler on whatever sys.stdout / sys.stderr is when a line is written (tests and
    callers redirect them)."""

    def __init__(self, name: str):
        super().__init__()
        self._name = name

    @property
    def stream(self):
        return getattr(sys, self._name)

    @stream.setter
    def stream(self, value):
        pass


FILE_ONLY = {"file_only": True}  # `extra=` for a record the console should not show


class _NotFileOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "file_only", False)


def to_file(message: str) -> None:
    """A line for the log file only (a traceback behind a one-line console message)."""
    logging.getLogger(NAME).info(message, extra=FILE_ONLY)


class _NotOurs(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(NAME)


class _NotBeamFailures(logging.Filter):
    """Beam logs the traceback of a failing DoFn before it re-raises the error; the error
    reaches the CLI, which prints it (one line for what the user can fix, else the traceback),
    so on the console that record would only say it twice. It stays in the log file."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("apache_beam") and record.levelno >= logging.ERROR)


def setup(log_file: Path) -> logging.Logger:
    """Sends the pipeline's lines to stdout and `log_file`, other loggers' warnings to stderr
    and `log_file`; returns the pipeline's logger. Calling it again replaces its handlers."""
    root, ours = logging.getLogger(), logging.getLogger(NAME)
    for handler in _HANDLERS:
        (ours if handler in ours.handlers else root).removeHandler(handler)
        handler.close()
    _HANDLERS.clear()
    to_file = logging.FileHandler(log_file, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    to_file.setLevel(logging.INFO)
    to_console = _Current("stdout")
    to_console.setFormatter(logging.Formatter("%(message)s"))
    to_console.addFilter(_NotFileOnly())
    others = _Current("stderr")  # what Python's last-resort handler printed
    others.setLevel(logging.WARNING)
    others.addFilter(_NotOurs())
    others.addFilter(_NotBeamFailures())
    ours.setLevel(logging.INFO)
    ours.addHandler(to_console)
    root.addHandler(to_file)
    root.addHandler(others)
    if root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)
    logging.captureWarnings(False)  # re-installed: something may have reset warnings.showwarning
    logging.captureWarnings(True)
    _HANDLERS.extend([to_console, to_file, others])
    return ours


def logger() -> logging.Logger:
    return logging.getLogger(NAME)
