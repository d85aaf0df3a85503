"""Commands that are not pipeline stages: predict, serve, server, tracking-sync,
retrieval-eval and the inspection tools (fill-mask, nsp, attention, embed), and what the cycle
command keeps and reports (cycle_state, cycle_report); `python -m pipeline <command>`
dispatches to them.

`console(verbose)` is the logging each command sets up (its `-v/--verbose`): the pipeline's
progress and status lines (`logging.getLogger(__name__).info`) on stderr, so that what a command
prints on stdout as its result (a table, JSON lines a user pipes on) stays clean; other
libraries' warnings on stderr too, their INFO lines only with `verbose`. A run of the pipeline's
stages logs through pipeline/logs.py instead (a run directory, log files per stage).

`old_spelling(parser, "--top_k", action)`: the flags are kebab-case (`--top-k`, docs/cli.md); a
flag's former underscore spelling stays accepted, parsed into the same `dest`, and is left out
of `--help` and of docs/cli.md.
"""

from __future__ import annotations

import argparse
import logging
import sys

from pipeline.logs import NAME, ConsoleFormatter, NotOurs

_INSTALLED: list[tuple[logging.Logger, logging.Handler]] = []  # by `console`, replaced by the next


class _Stderr(logging.StreamHandler):
    """A StreamHandler on whatever sys.stderr is when a line is written (tests redirect it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


class _Alone(logging.Filter):
    """Silent once pipeline/logs.py `setup` (a stage run in the same process, as in tests)
    put its own console on the pipeline's logger: a line is not printed twice."""

    def filter(self, record: logging.LogRecord) -> bool:
        mine = [handler for _, handler in _INSTALLED]
        return all(handler in mine for handler in logging.getLogger(NAME).handlers)


def console(verbose: bool = False) -> logging.Logger:
    """Logging for one command (see the module's docstring); returns the pipeline's logger.
    Calling it again replaces what the last call installed."""
    root, ours = logging.getLogger(), logging.getLogger(NAME)
    for logger, handler in _INSTALLED:
        logger.removeHandler(handler)
        handler.close()
    _INSTALLED.clear()
    own = _Stderr()
    own.setFormatter(ConsoleFormatter())
    own.addFilter(_Alone())
    others = _Stderr()
    others.setFormatter(ConsoleFormatter())
    others.addFilter(NotOurs())
    others.addFilter(_Alone())
    others.setLevel(logging.INFO if verbose else logging.WARNING)
    ours.setLevel(logging.INFO)
    ours.addHandler(own)
    root.addHandler(others)
    if verbose:
        root.setLevel(logging.INFO)
    elif root.level == logging.NOTSET or root.level > logging.WARNING:
        root.setLevel(logging.WARNING)
    _INSTALLED.extend([(ours, own), (root, others)])
    return ours


def parse(parser: argparse.ArgumentParser, argv, command: str) -> argparse.Namespace:
    """`parser`'s arguments of `argv` (default: sys.argv[1:]) less a leading `command` (as
    `python -m pipeline <command>` passes it), with `console(args.verbose)` set up."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv[1:] if argv and argv[0] == command else argv)
    console(args.verbose)
    return args


def old_spelling(parser, flag: str, action: argparse.Action) -> None:
    """`flag` (e.g. `--top_k`), the former spelling of `action`'s flag (`--top-k`, a flag that
    takes a value), still accepted into the same `dest`; hidden from --help. `parser`: the
    parser or argument group `action` was added to."""
    assert flag.replace("_", "-") in action.option_strings, (flag, action.option_strings)
    parser.add_argument(flag, dest=action.dest, type=action.type, choices=action.choices,
                        nargs=action.nargs, metavar=action.metavar, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
