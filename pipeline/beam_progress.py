"""The progress of a Beam job that the vocab or data stage (or fine-tuning's features,
pipeline/finetuning/records.py) runs on this machine: a progress bar
(text done, MB/s, ETA) on a terminal, a plain line now and then otherwise (cron, CI, Kubernetes).

`watch(desc, total_bytes, local)` wraps the job's call: with `local` (the workers are threads or
processes of this machine: `data_job.runs_locally`) it yields a fresh folder for the job's
`--progress_dir`, where each worker writes what it has done (beam_jobs/progress.py), and a
thread here sums the files twice a second and drives either

    a bar   (`logs.progress_bar`, when stdout is a terminal or BERT_PIPELINE_PROGRESS=bar):
            `data: train split:  45%|████▌     | 12.3M/27.1M [00:30<00:36, 410kB/s]`
    lines   through the `pipeline` logger, every BERT_PIPELINE_PROGRESS_EVERY seconds (default
            30; 0: none), the first one only after that long, so a short job says nothing:
            `data: train split 45% (12.3/27.1 MB, 0.4 MB/s, ETA 0m 36s)`

Either way the stage's heartbeat (`<stage>: running, 1m 00s`, pipeline/logs.py) stays quiet:
the bar counts as one, and the lines are the pipeline's lines. Without `local` (Dataflow,
Flink, Spark, Dask) it yields None: the job gets no flag and the heartbeat speaks as before.

What is counted (bytes of the corpus text): the vocab job's words counted, `measure="read"`
(the total known up front: the corpus bytes); the data job's documents turned into instances,
`measure="done"` (the total: the corpus bytes until the reading is complete, then the bytes of
the documents found, what `done` ends at); the fine-tuning features job's examples encoded,
`measure="done"` (the total: the bytes of its JSON-lines input, known up front).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time

from beam_jobs import progress
from pipeline import logs

log = logging.getLogger(__name__)

EVERY_ENV = "BERT_PIPELINE_PROGRESS_EVERY"
DEFAULT_EVERY = 30.0


def every() -> float:
    """Seconds between two plain progress lines (BERT_PIPELINE_PROGRESS_EVERY; 0: none)."""
    try:
        return max(0.0, float(os.environ.get(EVERY_ENV, DEFAULT_EVERY)))
    except ValueError:
        return DEFAULT_EVERY


def position(counts: dict, planned: int, measure: str) -> tuple[int, int]:
    """(bytes done, bytes in all) from the workers' summed counts (`progress.totals`).

    >>> position({"read": 40}, 100, "read")
    (40, 100)
    >>> position({"read": 50, "total": 45, "done": 9}, 100, "done")  # still reading
    (9, 100)
    >>> position({"read": 100, "total": 90, "done": 90}, 100, "done")
    (90, 90)
    """
    total = planned
    if measure == "done" and "total" in counts and counts.get("read", 0) >= planned:
        total = counts["total"]
    return min(counts.get(measure, 0), total), total


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes}m {seconds:02d}s"


def line(desc: str, done: int, total: int, seconds: float) -> str:
    """The plain progress line.

    >>> line("data: train split", 12_300_000, 27_100_000, 30.0)
    'data: train split 45% (12.3/27.1 MB, 0.4 MB/s, ETA 0m 36s)'
    """
    rate = done / seconds if seconds > 0 else 0.0
    eta = _duration((total - done) / rate) if rate > 0 else "unknown"
    share = 100 * done / total if total else 100.0
    return (f"{desc} {share:.0f}% ({done / 1e6:.1f}/{total / 1e6:.1f} MB, {rate / 1e6:.1f} MB/s, "
            f"ETA {eta})")


class Watcher(threading.Thread):
    """Sums the progress files in `folder` and shows them (a bar or plain lines) until
    `stop`. `shown`: the last (done, total); `lines`: how many plain lines it wrote."""

    def __init__(self, folder: str, desc: str, total_bytes: int, measure: str = "read"):
        super().__init__(daemon=True, name=f"beam-progress-{desc}")
        self.folder, self.desc, self.planned, self.measure = folder, desc, total_bytes, measure
        self.every, self.began, self.done = every(), time.monotonic(), threading.Event()
        self.said, self.shown, self.lines = self.began, (0, total_bytes), 0
        self._last_line = None  # (done, total) of the last plain line
        self.bar = logs.progress_bar(max(total_bytes, 1), desc=desc, unit="B", unit_scale=True)
        if self.bar is not None:
            logs.showing(+1)  # the heartbeat is quiet while a bar shows, as logs.Bar

    def look(self, last: bool = False) -> tuple[int, int]:
        """Reads the files once and moves the bar (or writes a line when one is due; `last`:
        not one that would say the same as the line before)."""
        done, total = position(progress.totals(self.folder), self.planned, self.measure)
        self.shown = done, total
        now = time.monotonic()
        if self.bar is not None:
            self.bar.total = max(total, 1)
            self.bar.update(max(0, done - self.bar.n))
        elif self.every and now - self.said >= self.every and not (
                last and self._last_line == (done, total)):
            log.info(line(self.desc, done, total, now - self.began))
            self.said, self.lines, self._last_line = now, self.lines + 1, (done, total)
        return done, total

    def run(self):
        pause = min(0.5, self.every) if self.every else 0.5
        while not self.done.wait(pause):
            self.look()

    def stop(self, finished: bool = True) -> None:
        """Stops the thread; with `finished` (the job succeeded), takes a last look at the
        counts (every worker has written its own by then), which the bar shows before it
        closes (plain lines: one more only if one is due)."""
        self.done.set()
        self.join(timeout=10)
        if finished:
            self.look(last=True)
        if self.bar is not None:
            self.bar.close()
            self.bar = None
            logs.showing(-1)


@contextlib.contextmanager
def watch(desc: str, total_bytes: int, local: bool, measure: str = "read"):
    """Around a Beam job's call: yields the folder for its --progress_dir and shows the
    progress the workers write there (see the module's doc), or yields None when not `local`.
    The folder is removed at the end."""
    if not local:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="bert-beam-progress-")
    watcher = Watcher(folder, desc, total_bytes, measure)
    watcher.start()
    finished = False
    try:
        yield folder
        finished = True
    finally:
        watcher.stop(finished)
        shutil.rmtree(folder, ignore_errors=True)
