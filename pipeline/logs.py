"""Logging of one invocation: the pipeline's lines on stdout and in <run_dir>/logs/<time>-<pid>.log,
and each stage's full log in <run_dir>/logs/<stage>.log.

Every module under pipeline/ logs through `logging.getLogger(__name__)` (a child of the
"pipeline" logger, whose lines the console shows; a warning or an error says so first). The log
file is a handler on the root logger, so it also receives what the libraries underneath
report through `logging` (Beam, MLflow, TensorFlow/absl: warnings and errors) and Python
warnings; outside a stage those also reach the console on stderr.

While a stage runs (`stage`), the console is quiet: file descriptor 2 of the process (what
TensorFlow's C++ runtime writes at start-up, `I0000 ... oneDNN`, `E0000 ... cuInit`) and of
the processes it starts (the Beam DirectRunner's SDK-harness workers, which log everything
they do) points at the stage's log file, Beam's own log records go only there, and Python's
`sys.stderr` (warnings, errors, progress bars) still reaches the terminal. `setup(...,
verbose=True)` (the CLI's `-v`) leaves every stream where it is and shows INFO records of
every library: everything on the console.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import threading
import time
import traceback
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
        if self._name == "stderr" and _STATE["console"] is not None:
            return _STATE["console"]  # the terminal, while a stage's stderr is its log file
        return getattr(sys, self._name)

    @stream.setter
    def stream(self, value):
        pass

    def emit(self, record):
        if not _STATE["bars"]:
            return super().emit(record)
        from tqdm import tqdm

        try:  # above the progress bar, which is drawn again below the line
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - as logging.StreamHandler does
            self.handleError(record)


class ConsoleFormatter(logging.Formatter):
    """The pipeline's lines as they are; a warning or an error says so first."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.WARNING:
            level = "warning" if record.levelno < logging.ERROR else "error"
            if not text.startswith(f"{level}:"):
                text = f"{level}: {text}"
        return text


FILE_ONLY = {"file_only": True}  # `extra=` for a record the console should not show


class _NotFileOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "file_only", False)


def to_file(message: str) -> None:
    """A line for the log file only (a traceback behind a one-line console message)."""
    logging.getLogger(NAME).info(message, extra=FILE_ONLY)


class NotOurs(logging.Filter):
    """Passes every logger's records but the pipeline's."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(NAME)


class _OursOrWarnings(logging.Filter):
    """The log file's filter without --verbose: the pipeline's records, other loggers' from
    WARNING up (whatever level the root logger was left at by an earlier caller)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.name.startswith(NAME)


class _NotBeamFailures(logging.Filter):
    """Beam logs the traceback of a failing DoFn before it re-raises the error; the error
    reaches the CLI, which prints it (one line for what the user can fix, else the traceback),
    so on the console that record would only say it twice. It stays in the log file."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("apache_beam") and record.levelno >= logging.ERROR)


class _NotBeam(logging.Filter):
    """Drops Beam's records (its loggers', and those its modules send through the root
    logger: `apitools not found ...`, the workers' `Worker: severity: WARN ...`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("apache_beam")
                    or f"{os.sep}apache_beam{os.sep}" in (record.pathname or ""))


_STATE = {"verbose": False, "others": None, "bars": 0, "said": 0.0, "console": None}


class _Said(logging.Filter):
    """Notes when the pipeline last printed a line (for `_Heartbeat`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        _STATE["said"] = time.monotonic()
        return True


class _Heartbeat(threading.Thread):
    """While a stage runs: `<stage>: running, <elapsed>` whenever the pipeline has printed
    nothing for `every` seconds and no progress bar shows (a long Beam job, an export), so
    that cron, CI and Kubernetes logs show it is alive. BERT_PIPELINE_HEARTBEAT: seconds
    (default 60; 0: off)."""

    def __init__(self, name: str):
        super().__init__(daemon=True, name=f"heartbeat-{name}")
        self.stage, self.began, self.done = name, time.monotonic(), threading.Event()
        try:
            self.every = float(os.environ.get("BERT_PIPELINE_HEARTBEAT", "60"))
        except ValueError:
            self.every = 60.0

    def run(self):
        while self.every > 0 and not self.done.wait(min(self.every, 5.0)):
            now = time.monotonic()
            if now - _STATE["said"] >= self.every and not _STATE["bars"]:
                minutes, seconds = divmod(int(now - self.began), 60)
                logger().info(f"{self.stage}: running, {minutes}m {seconds:02d}s")

    def stop(self):
        self.done.set()
        self.join(timeout=10)


def setup(log_file: Path, verbose: bool = False) -> logging.Logger:
    """Sends the pipeline's lines to stdout and `log_file`, other loggers' warnings to stderr
    and `log_file`; returns the pipeline's logger. Calling it again replaces its handlers.
    `verbose`: every library's INFO records on stderr too, and `stage` leaves stderr as it is."""
    root, ours = logging.getLogger(), logging.getLogger(NAME)
    # Every handler an earlier call installed, also one a caller took off and put back after
    # the next call (a test's fixture): a line is never printed twice.
    for logger in (root, ours):
        for handler in logger.handlers[:]:
            if handler in _HANDLERS or getattr(handler, "_pipeline_setup", False):
                logger.removeHandler(handler)
                handler.close()
    _HANDLERS.clear()
    to_file = logging.FileHandler(log_file, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    to_file.setLevel(logging.INFO)
    to_console = _Current("stdout")
    to_console.setFormatter(ConsoleFormatter())
    to_console.addFilter(_NotFileOnly())
    to_console.addFilter(_Said())  # (on the handler: a logger's filters miss its children's)
    others = _Current("stderr")  # what Python's last-resort handler printed
    others.setLevel(logging.INFO if verbose else logging.WARNING)
    others.addFilter(NotOurs())
    if not verbose:
        others.addFilter(_NotBeamFailures())
        to_file.addFilter(_OursOrWarnings())
    ours.setLevel(logging.INFO)
    ours.addHandler(to_console)
    root.addHandler(to_file)
    root.addHandler(others)
    if verbose:
        root.setLevel(logging.INFO)
        to_file.setLevel(logging.INFO)
    elif root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)
    _STATE.update(verbose=verbose, others=others)
    logging.captureWarnings(False)  # re-installed: something may have reset warnings.showwarning
    logging.captureWarnings(True)
    for handler in (to_console, to_file, others):
        handler._pipeline_setup = True
    _HANDLERS.extend([to_console, to_file, others])
    return ours


def logger() -> logging.Logger:
    return logging.getLogger(NAME)


def _real_stderr() -> bool:
    """Whether sys.stderr writes to file descriptor 2 (not a test's capture object)."""
    try:
        return sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False


@contextlib.contextmanager
def stderr_to(path: Path, python_too: bool = False):
    """Points file descriptor 2 (this process's C/C++ libraries and the subprocesses it starts)
    at `path` (appended to) while the pipeline's warnings and errors, and progress bars, keep
    going to the terminal; restores both on exit. `python_too`: `sys.stderr` too (what a
    library prints there itself, e.g. MLflow's "Successfully registered model"). Nests. Does
    nothing under `setup(..., verbose=True)`."""
    if _STATE["verbose"]:
        yield
        return
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stderr.flush()
    saved = os.dup(2)  # where fd 2 points now (the terminal, or an outer `stderr_to`'s file)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    old_stderr, old_console, opened = sys.stderr, _STATE["console"], []
    if _real_stderr() or (old_console is not None and sys.stderr is old_console):
        if old_console is None:  # the terminal, for the pipeline's warnings and errors
            old_console = io.TextIOWrapper(io.FileIO(os.dup(saved), "w"), encoding="utf-8",
                                           errors="backslashreplace", line_buffering=True)
            opened.append(old_console)
        sys.stderr = old_console
        if python_too:
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                          errors="backslashreplace", line_buffering=True)
            opened.append(sys.stderr)
        _STATE["console"] = old_console
    os.dup2(target, 2)
    os.close(target)
    try:
        yield
    finally:
        for stream in opened:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os.dup2(saved, 2)
        os.close(saved)
        sys.stderr = old_stderr
        _STATE["console"] = old_console if old_console not in opened else None
        for stream in opened:
            with contextlib.suppress(OSError, ValueError):
                stream.close()


@contextlib.contextmanager
def stage(name: str, logs_dir: Path, keep=None):
    """One stage's run: a line when it starts and when it ends on the console, and its full
    log in `logs_dir/<name>.log` (the previous run's kept as `<name>.previous.log`): the
    pipeline's lines, every library's warnings, Beam's records, and whatever the process and
    its workers write on file descriptor 2. A quiet stage says it is running now and then
    (`_Heartbeat`). `keep(path)` is called with the file at the end
    (the CLI logs it to the stage's MLflow run), also when the stage fails."""
    logs_dir = Path(logs_dir)
    logs_dir.mkdir(parents=True, exist_ok=True)
    path = logs_dir / f"{name}.log"
    if path.exists():
        os.replace(path, logs_dir / f"{name}.previous.log")
    to_file = logging.FileHandler(path, mode="a", encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                           "%H:%M:%S"))
    root, others = logging.getLogger(), _STATE["others"]
    quiet = None if _STATE["verbose"] or others is None else _NotBeam()
    root.addHandler(to_file)
    if quiet is not None:
        others.addFilter(quiet)
    say, started = logger(), time.monotonic()
    say.info(f"{name}: started (log: {path})")
    outcome, beat = "failed", _Heartbeat(name)
    beat.start()
    try:
        with stderr_to(path, python_too=True):
            yield path
        outcome = "finished"
    except BaseException as err:  # the stage's log says why it failed (the console: one line)
        to_file.emit(logging.LogRecord(NAME, logging.ERROR, __file__, 0,
                                       f"error: {err}\n{traceback.format_exc()}", None, None))
        raise
    finally:
        beat.stop()
        say.info(f"{name}: {outcome} in {time.monotonic() - started:.1f} s")
        if quiet is not None:
            others.removeFilter(quiet)
        root.removeHandler(to_file)
        to_file.close()
        if keep is not None:
            try:
                keep(path)
            except Exception as err:  # noqa: BLE001 - the log is on disk either way
                say.warning(f"{name}: could not record its log file {path} ({err})")


KEPT_BYTES = 8 << 20  # what of a log file goes to an MLflow run: its last 8 MB


def tail(path: Path, limit: int = KEPT_BYTES) -> str:
    """The last `limit` bytes of a log file as text (what is logged to an MLflow run)."""
    with open(path, "rb") as handle:
        handle.seek(max(0, os.path.getsize(path) - limit))
        return handle.read().decode("utf-8", "replace")


def progress_bar(total: int, initial: int = 0, desc: str = "", unit: str = "step",
                 leave: bool = True, unit_scale: bool = False):
    """A tqdm bar (ETA, rate; the caller adds loss and tokens/s) on stderr when stdout is a
    terminal; None otherwise (cron, CI, Kubernetes), where the callers print their plain
    periodic lines. BERT_PIPELINE_PROGRESS=bar or =plain chooses either way."""
    choice = os.environ.get("BERT_PIPELINE_PROGRESS", "").strip().lower()
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, OSError, ValueError):
        tty = False
    if choice == "plain" or (choice != "bar" and not tty):
        return None
    from tqdm import tqdm

    console = _STATE["console"] or sys.stderr
    try:  # a terminal that reports no size (some ptys) would get a bar 0 columns wide
        sized = os.get_terminal_size(console.fileno()).columns > 0
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        sized = False
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, unit_scale=unit_scale,
                file=console,
                dynamic_ncols=sized, ncols=None if sized else 100, mininterval=0.5,
                smoothing=0.1, leave=leave)


def showing(change: int) -> None:
    """A progress bar appears (+1) or goes (-1): the heartbeat is quiet while one shows, and
    the pipeline's lines are written above it."""
    _STATE["bars"] += int(change)


class Bar:
    """A `progress_bar` driven by a training loop's step counter: `update(step, **postfix)`
    moves it to `step` (redrawing its postfix at most twice a second), `line(text)` sends a
    periodic line to the log file only while the bar shows (to the console without a bar)."""

    def __init__(self, total: int, initial: int, desc: str, leave: bool = True):
        self.bar = progress_bar(total, initial, desc, leave=leave)
        self._drawn = 0.0
        showing(self.bar is not None)

    @property
    def active(self) -> bool:
        return self.bar is not None

    def update(self, step: int, postfix=None) -> None:
        if self.bar is None:
            return
        if postfix and time.monotonic() - self._drawn > 0.5:
            self.bar.set_postfix_str(postfix() if callable(postfix) else postfix)
            self._drawn = time.monotonic()
        self.bar.update(max(0, step - self.bar.n))

    def expect(self, total: int) -> None:
        """Where the bar now ends (a time budget that stops training before its last step):
        its percentage and ETA follow; small changes are not redrawn."""
        if self.bar is not None and abs(total - (self.bar.total or 0)) > 0.005 * total:
            self.bar.total = max(total, self.bar.n)
            self.bar.refresh()

    def line(self, text: str) -> None:
        if self.bar is None:
            logger().info(text)
        else:
            to_file(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
            showing(-1)
