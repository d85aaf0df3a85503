"""Word counts on disk, for the vocab job (beam_jobs/vocab.py): sorted runs and their merge.

A run is a file of `word<TAB>count` lines, one per distinct word, sorted by word (code point
order), UTF-8; a word never holds a line break (the tokenizer splits on them). Runs are written
and read through Beam's FileSystems (a local path, gs://, s3://), so any worker of any runner
can write one and any other read it. The vocab job's workers spill their counts into runs
(at most `spill_words` distinct words in memory each), merges sum runs `fan_in` at a time, and
the last step reads the merged words as a stream: no process holds every distinct word of the
corpus, however large it is.

    >>> import tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> a = write_run(os.path.join(folder, "a.tsv"), [("ant", 2), ("cat", 2), ("the", 5)])
    >>> b = write_run(os.path.join(folder, "b.tsv"), [("dog", 1), ("the", 3)])
    >>> list(merge_runs([a, b]))
    [('ant', 2), ('cat', 2), ('dog', 1), ('the', 8)]
    >>> c = merge_to_one([a, b], os.path.join(folder, "m"), fan_in=2)
    >>> cut = top_cut(lambda: read_run(c), max_words=2)  # "the", then "cat" before "ant"
    >>> cut, list(top_words(read_run(c), cut))
    ((2, 1), [('cat', 2), ('the', 8)])
    >>> remove_dir(folder)
"""

from __future__ import annotations

import heapq
import itertools

from apache_beam.io.filesystem import BeamIOError, CompressionTypes
from apache_beam.io.filesystems import FileSystems

_WRITE_LINES = 4096  # lines per write call


def write_run(path: str, pairs) -> str:
    """(word, count) pairs, distinct and sorted by word -> a run file at `path`; returns it."""
    with FileSystems.create(path, mime_type="text/tab-separated-values",
                            compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        pairs = iter(pairs)
        while block := list(itertools.islice(pairs, _WRITE_LINES)):
            handle.write("".join(f"{word}\t{count}\n" for word, count in block).encode("utf-8"))
    return path


def read_run(path: str):
    """The (word, count) pairs of a run file, in its order (by word)."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        for line in iter(handle.readline, b""):  # binary: a line ends at b"\n" only
            word, count = line.decode("utf-8").rstrip("\n").rsplit("\t", 1)
            yield word, int(count)


def merge_runs(paths):
    """The runs at `paths` as one stream of (word, total count), sorted by word: a k-way
    merge holding one line of each run at a time."""
    merged = heapq.merge(*(read_run(path) for path in paths))
    for word, group in itertools.groupby(merged, key=lambda pair: pair[0]):
        yield word, sum(count for _, count in group)


def merge_to_one(paths, prefix: str, fan_in: int) -> str:
    """Merges the runs at `paths` into one, `fan_in` runs at a time (rounds of merges, so no
    more than `fan_in` files are open at once); returns its path (`paths[0]` if it is the only
    one; the merged runs are written at `prefix`-<round>-<group>.tsv)."""
    paths = list(paths)
    level = 0
    while len(paths) > 1:
        groups = [paths[i:i + fan_in] for i in range(0, len(paths), fan_in)]
        paths = [group[0] if len(group) == 1 else
                 write_run(f"{prefix}-{level}-{i:06d}.tsv", merge_runs(group))
                 for i, group in enumerate(groups)]
        level += 1
    return paths[0]


def top_cut(stream, max_words: int) -> tuple[int, int]:
    """Where the `max_words` most frequent words end, ranked by (count, word) as Beam's
    `Top.PerKey(max_words, key=lambda wc: (wc[1], wc[0]))` ranks them: (count, skip) = keep
    every word counted more than `count` times and, of the words counted exactly `count` times
    (in word order), all but the first `skip`. (0, 0): keep all.

    `stream()`: a fresh iterator of distinct (word, count) pairs; read once here. Holds one
    number per distinct count value, not per word.
    """
    histogram: dict[int, int] = {}
    for _, count in stream():
        histogram[count] = histogram.get(count, 0) + 1
    if sum(histogram.values()) <= max_words:
        return 0, 0
    above = 0
    for count in sorted(histogram, reverse=True):
        if above + histogram[count] >= max_words:
            return count, histogram[count] - (max_words - above)
        above += histogram[count]
    raise AssertionError("unreachable")


def top_words(pairs, cut: tuple[int, int]):
    """The pairs (in their order) that `top_cut` keeps."""
    count_at_cut, skip = cut
    seen = 0
    for word, count in pairs:
        if count > count_at_cut:
            yield word, count
        elif count == count_at_cut:
            if seen >= skip:
                yield word, count
            seen += 1


def remove_dir(path: str) -> None:
    """Deletes the folder `path` and the files in it (on object stores, the files under the
    prefix); nothing if it is not there."""
    try:
        files = [m.path for m in FileSystems.match([FileSystems.join(path, "*")])[0].metadata_list]
    except BeamIOError:
        files = []
    if files:
        FileSystems.delete(files)
    if FileSystems.exists(path):
        FileSystems.delete([path])
