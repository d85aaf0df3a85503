"""Progress of a Beam job that runs on this machine, told through small files: each worker
adds up what it has done and writes it to `--progress_dir`, and the launcher sums the files.

The workers of a local runner (the FnApiRunner, the DirectRunner's worker processes, Prism with
LOOPBACK workers) are threads or processes of this machine that import no TensorFlow and cannot
call back into the launcher; a file per worker is what they can all share. Each `Reporter`
(one per DoFn instance) writes `<dir>/<pid>-<id>.json`, `{"read": bytes, ...}`, replaced
atomically at most once a second (and at the end of each element), so a reader never sees half
a file; `totals(dir)` sums every file. Nothing is written without the flag (remote runners:
the launcher passes none), and the files are no input of any step: the job's outputs are the
same bytes with or without them.

The counts (all bytes of the input text, for the launcher's bar or lines):

    read     input bytes read (every file's bytes once the reading is complete)
    total    the bytes of the documents found while reading (the data job: what `done` ends at)
    done     the bytes of the documents processed (the data job's CreateInstances); the
             fine-tuning features job: the bytes of the examples (JSON lines) encoded

Pure Python (no Beam, no TensorFlow): the workers and the pipeline import it at no cost.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> one, two = Reporter(folder), Reporter(folder)
    >>> one.add(read=10, total=8); two.add(read=5); one.flush(); two.flush()
    >>> totals(folder)
    {'read': 15, 'total': 8}
"""

from __future__ import annotations

import json
import os
import time
import uuid

# The workers write their counts at most this often (seconds).
WRITE_EVERY = 1.0
_SUFFIX = ".json"


class Reporter:
    """Counts added by one worker's DoFn instance, written to its own file in `directory`."""

    def __init__(self, directory: str, every: float = WRITE_EVERY):
        self.path = os.path.join(directory, f"{os.getpid()}-{uuid.uuid4().hex[:12]}{_SUFFIX}")
        self.every, self.counts = every, {}
        self._written, self._dirty = time.monotonic(), False

    def add(self, **counts: int) -> None:
        """Adds to the counts; writes them if the last write is `every` seconds old."""
        for key, value in counts.items():
            self.counts[key] = self.counts.get(key, 0) + value
        self._dirty = True
        if time.monotonic() - self._written >= self.every:
            self.flush()

    def flush(self) -> None:
        """Writes the counts now (if they changed); never fails the job (a full disk, a
        removed folder: the bar stops moving, the job goes on)."""
        if not self._dirty:
            return
        temp = f"{self.path}.{uuid.uuid4().hex[:6]}.tmp"
        try:
            with open(temp, "w", encoding="utf-8") as handle:
                json.dump(self.counts, handle)
            os.replace(temp, self.path)
        except OSError:
            try:
                os.remove(temp)
            except OSError:
                pass
        self._written, self._dirty = time.monotonic(), False


def reporter(directory: str | None) -> Reporter | None:
    """A Reporter for `directory` (the job's --progress_dir), or None without one."""
    return Reporter(directory) if directory else None


def totals(directory: str) -> dict:
    """The counts of every worker's file in `directory`, summed (a file being replaced or
    unreadable is skipped: it counts at the next look)."""
    summed: dict = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return summed
    for name in names:
        if not name.endswith(_SUFFIX):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                counts = json.load(handle)
        except (OSError, ValueError):
            continue
        for key, value in counts.items():
            if isinstance(value, int):
                summed[key] = summed.get(key, 0) + value
    return dict(sorted(summed.items()))
