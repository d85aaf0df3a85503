"""Reading corpora in bounded pieces: byte ranges of files -> documents, in three formats.

Input formats (`--input_format`), every one read through Beam's `FileSystems`
(local paths, gs://, s3://, ...; `.gz`/`.bz2` decompressed transparently):

    google  one sentence per line, a blank line between documents (Google's format)
    text    plain text: a document is a block of lines between blank lines (a
            paragraph block; a file without blank lines is one document); its lines
            are joined and split into sentences by `split_sentences` (rule-based)
    jsonl   one JSON object per line, one document each; the text is in the field
            `--text_field` (default "text"); its lines are split into sentences

    >>> split_documents("One.\\nTwo.\\n\\nThree.\\n")
    ([['One.', 'Two.'], ['Three.']], 0)
    >>> split_sentences("Mr. Smith went to Washington. He arrived at 5 p.m. on Monday! Did he?")
    ['Mr. Smith went to Washington.', 'He arrived at 5 p.m. on Monday!', 'Did he?']

Streaming: an uncompressed file is read in byte ranges of `chunk_bytes` (a
document belongs to the range holding its first byte), a compressed one as one
stream; either way a worker holds one document (plus one tokenizer batch) at a
time. A document's id is `(file path, byte offset of its first line)` — the same
whatever the range size or runner — so every later step can sort and hash
documents deterministically.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import zlib

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs import progress
from beam_jobs.runners import TaggedOutputs
from beam_jobs.settings import INPUT_FORMATS

# Uncompressed files are read in byte ranges of this size (one range = one unit of work).
READ_CHUNK_BYTES = 16 << 20


# The tagged output of a DoFn that carries its counters (summed by SumCounters).
STATS_TAG = "stats"



def decode_utf8(data: bytes, path: str, offset: int = 0) -> str:
    """Decodes `data` as UTF-8, or raises ValueError naming the file and the byte offset
    (`offset` = where `data` starts in the file)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = data[err.start:err.start + 4]
        raise ValueError(
            f"{path}: not valid UTF-8 at byte offset {offset + err.start} (bytes {bad!r}: "
            f"{err.reason}); re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
        ) from None


def split_documents(text: str) -> tuple[list[list[str]], int]:
    """Google-format text -> (documents as lists of stripped sentences, number of empty ones).

    Lines are stripped; blank (whitespace-only) lines separate documents. Extra
    blank lines between two documents would be empty documents: they are
    dropped and counted (blank lines at the start or end of a file are not).
    """
    data = text.replace("\r\n", "\n").replace("\r", "\n").encode("utf-8")
    reader = _BlockReader(io.BytesIO(data), "<text>", 0, len(data) + 1, previous_blank=True)
    documents = [[line.decode("utf-8").strip() for line in lines] for _, _, lines in reader]
    return documents, reader.extra_blank_lines


# Abbreviations after which a period does not end a sentence (lowercased, without the dot).
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e cf al inc ltd co corp no nos vol vols fig "
    "figs gen col lt sgt capt cmdr adm gov sen rep rev hon jan feb mar apr jun jul aug sep sept "
    "oct nov dec u.s u.k a.m p.m approx dept est ca op ed eds pp".split())


# A sentence ends at . ! ? (possibly repeated, possibly followed by closing quotes/brackets)
# followed by whitespace and then something that can start a sentence.
_SENTENCE_END = re.compile(
    r"([.!?]+)([\"'\u201d\u2019)\]]*)\s+(?=[\"'\u201c\u2018(\[]*[A-Z0-9\u00c0-\u024f])")


def split_sentences(text: str) -> list[str]:
    """Rule-based sentence splitter for plain text (English-oriented).

    Splits after ., ! or ? (and any closing quotes/brackets) when whitespace and an
    upper-case letter, a digit or an opening quote follow, except after a common
    abbreviation ("Mr.", "e.g.", "p.m.") or an upper-case initial ("J. Smith").
    Whitespace inside a sentence is collapsed.
    """
    text = " ".join(text.split())
    sentences, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        if match.group(1) == ".":
            word = text[start:match.start()].rsplit(" ", 1)[-1].lstrip("\"'(\u201c\u2018[")
            lowered = word.lower()
            if lowered in _ABBREVIATIONS or (len(word) == 1 and word.isupper()) or (
                    "." in word and len(word) <= 5):  # initials and dotted abbreviations
                continue
        end = match.end(2)
        sentence = text[start:end].strip()
        if sentence:
            sentences.append(sentence)
        start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


# ---------------------------------------------------------------------------
# Reading: byte ranges of files -> documents
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class InputRange:
    """A unit of reading: bytes [start, end) of `path` (end None: the whole stream)."""

    path: str
    start: int
    end: int | None
    size: int  # the file's size in bytes (compressed size for compressed files)


def _compressed(path: str) -> bool:
    return CompressionTypes.detect_compression_type(path) != CompressionTypes.UNCOMPRESSED


def plan_input(patterns, chunk_bytes: int = READ_CHUNK_BYTES) -> list[InputRange]:
    """Globs (a list, or one comma-separated string) -> the ranges to read, in a fixed order.

    Raises FileNotFoundError for a pattern that matches no file. A file matched by
    two patterns is read once.
    """
    if isinstance(patterns, str):
        patterns = [p.strip() for p in patterns.split(",") if p.strip()]
    ranges, seen = [], set()
    for pattern in patterns:
        matches = FileSystems.match([pattern])[0].metadata_list
        if not matches:
            raise FileNotFoundError(f"--input pattern {pattern!r} matches no file")
        for metadata in sorted(matches, key=lambda m: m.path):
            if metadata.path in seen:
                continue
            seen.add(metadata.path)
            size = metadata.size_in_bytes
            if _compressed(metadata.path) or size <= chunk_bytes:
                ranges.append(InputRange(metadata.path, 0, None, size))
                continue
            for start in range(0, size, chunk_bytes):
                ranges.append(InputRange(metadata.path, start, min(start + chunk_bytes, size),
                                         size))
    return ranges


def _is_blank(line: bytes) -> bool:
    """A blank line: nothing but ASCII whitespace (it separates documents)."""
    return not line.strip()


def _look_back(handle, position: int) -> tuple[bool, bool]:
    """For a line start `position`: (is the previous line blank?, is there text before?).

    Scans backwards in growing windows for the last non-blank byte; the start of
    the file counts as a blank line.
    """
    low = high = max(0, position - 1)  # without the previous line's final "\n"
    window = 4096
    while low > 0:
        low = max(0, high - window)
        handle.seek(low)
        data = handle.read(high - low).rstrip()
        if data:
            return b"\n" in _read_between(handle, low + len(data), position - 1), True
        high, window = low, window * 4
    return True, False


def _read_between(handle, start: int, end: int) -> bytes:
    handle.seek(start)
    return handle.read(end - start)


class _BlockReader:
    """Iterates over the blank-line separated blocks whose first line starts in [start, end).

    Yields (byte offset of the block's first line, its length in bytes, its raw lines
    if `keep_lines` else None). After the iteration, `extra_blank_lines` holds the
    blank lines in [start, end) beyond the first one of a run that separates two
    blocks (empty documents).
    """

    def __init__(self, handle, path: str, start: int, end: int | None,
                 previous_blank: bool | None = None, keep_lines: bool = True):
        self.handle, self.path, self.start, self.end = handle, path, start, end
        self.previous_blank = previous_blank
        self.text_before = start > 0  # replaced by the look-back when previous_blank is None
        self.keep_lines = keep_lines
        self.extra_blank_lines = 0

    def _lines(self, position: int):
        """(offset, raw line) from `position` (a line start) on."""
        if position > 0:
            self.handle.seek(position)
        for line in iter(self.handle.readline, b""):
            yield position, line
            position += len(line)

    def __iter__(self):
        handle, position = self.handle, self.start
        if position > 0:  # move to the first line that starts at or after `start`
            handle.seek(position - 1)
            if handle.read(1) != b"\n":
                position += len(handle.readline())
        if self.previous_blank is None:
            self.previous_blank, self.text_before = _look_back(handle, position)
        end = self.end if self.end is not None else float("inf")
        keep = self.keep_lines
        block_start = block_end = None
        block: list | None = None
        # Inside a block that started before `start` (owned by the previous range): skip it.
        skipping = not self.previous_blank
        seen_text = self.text_before  # a block came before
        run_extra = 0  # extra blank lines of the current run inside [start, end)
        previous_blank = self.previous_blank
        for offset, raw in self._lines(position):
            if _is_blank(raw):
                if block_start is not None:
                    yield block_start, block_end - block_start, block
                    block_start = block = None
                elif previous_blank and seen_text and offset < end:
                    run_extra += 1
                skipping = False
                previous_blank = True
                continue
            if previous_blank:  # a block starts here
                self.extra_blank_lines += run_extra
                run_extra = 0
                if offset >= end:
                    return
                if not skipping:
                    block_start, block = offset, ([] if keep else None)
            previous_blank = False
            seen_text = True
            if block_start is not None:
                block_end = offset + len(raw)
                if keep:
                    block.append(raw)
        if block_start is not None:
            yield block_start, block_end - block_start, block


def range_bytes(input_range: InputRange) -> int:
    """The bytes of `input_range` in its file (a compressed file's: its compressed size), so
    that the ranges of a file add up to its size."""
    end = input_range.size if input_range.end is None else input_range.end
    return end - input_range.start


def read_lines(input_range: InputRange, reporter: progress.Reporter | None = None):
    """Yields the lines that start in `input_range`, decoded (UTF-8, else a ValueError naming
    the file and offset), line breaks included: every line of a file exactly once, whatever
    the ranges. `reporter` (beam_jobs/progress.py) gets the bytes read as `read`, every 64 KB
    (a compressed file: its compressed size at the end); they add up to `range_bytes`."""
    path, end = input_range.path, input_range.end
    compression = CompressionTypes.AUTO if end is None else CompressionTypes.UNCOMPRESSED
    told, limit = 0, range_bytes(input_range)
    # Offsets in the text are offsets in the file only if it is not compressed.
    gradual = reporter is not None and (end is not None or not _compressed(path))
    with FileSystems.open(path, compression_type=compression) as handle:
        position = input_range.start
        if position > 0:  # the line that starts before `start` belongs to the previous range
            handle.seek(position - 1)
            if handle.read(1) != b"\n":
                position += len(handle.readline())
        for raw in iter(handle.readline, b""):
            if end is not None and position >= end:
                break
            yield decode_utf8(raw, path, position)
            position += len(raw)
            now = position - input_range.start
            if gradual and now - told >= _TELL_BYTES:
                now = min(now, limit)
                reporter.add(read=now - told)
                told = now
    if reporter is not None:
        reporter.add(read=limit - told)


# How often (bytes of text) a reading step adds to its progress reporter.
_TELL_BYTES = 1 << 16


def _skipper(counters: dict):
    def skip(reason, n=1):
        if n:
            counters[f"skipped/{reason}"] = counters.get(f"skipped/{reason}", 0) + n
    return skip


def index_range(input_range: InputRange, input_format: str = "google",
                counters: dict | None = None):
    """Yields ((path, offset), ref) for the documents owned by `input_range`, without
    decoding them: ref = (offset, length) for a seekable (uncompressed) file, or the
    document's bytes zlib-compressed for a compressed stream (it cannot be re-read
    at an offset). `load_document` turns a ref into sentences.
    """
    skip = _skipper({} if counters is None else counters)
    path = input_range.path
    seekable = input_range.end is not None or not _compressed(path)
    compression = (CompressionTypes.AUTO if input_range.end is None
                   else CompressionTypes.UNCOMPRESSED)
    with FileSystems.open(path, compression_type=compression) as handle:
        if input_format == "jsonl":
            position = input_range.start
            if position > 0:
                handle.seek(position - 1)
                if handle.read(1) != b"\n":
                    position += len(handle.readline())
            for raw in iter(handle.readline, b""):
                offset, position = position, position + len(raw)
                if input_range.end is not None and offset >= input_range.end:
                    return
                if _is_blank(raw):
                    continue
                yield (path, offset), ((offset, len(raw)) if seekable else zlib.compress(raw, 1))
            return
        reader = _BlockReader(handle, path, input_range.start, input_range.end,
                              previous_blank=True if input_range.start == 0 else None,
                              keep_lines=not seekable)
        for offset, length, lines in reader:
            yield (path, offset), ((offset, length) if seekable
                                   else zlib.compress(b"".join(lines), 1))
        skip("empty_documents", reader.extra_blank_lines)


class DocumentLoader:
    """Turns refs from `index_range` back into documents, keeping files open between calls.

    Use as a context manager; `load` returns [sentence, ...] or None (counted as skipped).
    """

    def __init__(self, input_format: str = "google", text_field: str = "text",
                 counters: dict | None = None):
        self.format, self.text_field = input_format, text_field
        self.counters = {} if counters is None else counters
        self._skip = _skipper(self.counters)
        self._handles: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()

    def raw(self, path: str, ref) -> bytes:
        if isinstance(ref, bytes):
            return zlib.decompress(ref)
        offset, length = ref
        handle = self._handles.get(path)
        if handle is None:
            handle = self._handles[path] = FileSystems.open(
                path, compression_type=CompressionTypes.UNCOMPRESSED)
        handle.seek(offset)
        return handle.read(length)

    def load(self, doc_id, ref) -> list[str] | None:
        path, offset = doc_id
        text = decode_utf8(self.raw(path, ref), path, offset)
        if self.format == "jsonl":
            return self._jsonl(text)
        lines = text.split("\n")
        if lines and not lines[-1]:
            lines.pop()
        if self.format == "text":
            return split_sentences(" ".join(lines))
        return [line.strip() for line in lines]

    def _jsonl(self, line: str) -> list[str] | None:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            self._skip("jsonl_invalid_json")
            return None
        text = record.get(self.text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            self._skip("jsonl_missing_text_field")
            return None
        sentences = [s for paragraph in text.splitlines() for s in split_sentences(paragraph)]
        if not sentences:
            self._skip("jsonl_empty_text")
            return None
        return sentences


def read_range(input_range: InputRange, input_format: str = "google", text_field: str = "text",
               counters: dict | None = None):
    """Yields ((path, offset), [sentence, ...]) for the documents owned by `input_range`.

    `counters` (a dict) receives "skipped/<reason>" counts.
    """
    counters = {} if counters is None else counters
    with DocumentLoader(input_format, text_field, counters) as loader:
        for doc_id, ref in index_range(input_range, input_format, counters):
            sentences = loader.load(doc_id, ref)
            if sentences is not None:
                yield doc_id, sentences


def ref_bytes(ref) -> int:
    """The bytes of a document by its ref from `index_range` (a compressed stream's document:
    its zlib-compressed bytes), what `progress` counts documents in."""
    return len(ref) if isinstance(ref, bytes) else ref[1]


class _ReadFn(beam.DoFn):
    """Reads one InputRange per element; with `progress_dir`, tells beam_jobs/progress.py the
    range's bytes as `read` and its documents' bytes (`ref_bytes`) as `total`."""

    def __init__(self, input_format: str = "google", text_field: str = "text",
                 progress_dir: str = ""):
        self._format, self._text_field = input_format, text_field
        self._progress_dir = progress_dir

    def setup(self):
        self._reporter = progress.reporter(self._progress_dir)

    def documents(self, input_range, counters: dict):
        raise NotImplementedError

    def process(self, input_range):
        counters: dict = {}
        reporter = getattr(self, "_reporter", None)
        for doc_id, ref, value in self.documents(input_range, counters):
            if reporter is not None:
                reporter.add(total=ref_bytes(ref))
            if value is not None:
                yield doc_id, value
        if reporter is not None:
            reporter.add(read=range_bytes(input_range))
            reporter.flush()
        if counters:
            yield beam.pvalue.TaggedOutput(STATS_TAG, counters)


class IndexRangeFn(_ReadFn):
    """InputRange -> ((path, offset), ref) per document (see `index_range`); counters on `stats`."""

    def documents(self, input_range, counters: dict):
        for doc_id, ref in index_range(input_range, self._format, counters):
            yield doc_id, ref, ref


class ReadRangeFn(_ReadFn):
    """InputRange -> ((path, offset), [sentence, ...]) per document; counters on `stats`."""

    def documents(self, input_range, counters: dict):
        with DocumentLoader(self._format, self._text_field, counters) as loader:
            for doc_id, ref in index_range(input_range, self._format, counters):
                yield doc_id, ref, loader.load(doc_id, ref)


def _ranges(patterns, chunk_bytes: int) -> list[InputRange]:
    if isinstance(patterns, (list, tuple)) and patterns and isinstance(patterns[0], InputRange):
        return list(patterns)
    return plan_input(patterns, chunk_bytes)


class ReadDocuments(beam.PTransform):
    """Globs (or a list of InputRange from `plan_input`) -> documents keyed by (path, offset).

    With `index_only`, the documents are not read: each comes as a ref (`index_range`)
    for `DocumentLoader` to read later. `progress_dir`: where the reading tells its progress
    (beam_jobs/progress.py; "": nowhere). Returns `.documents` (the documents) and `.stats`
    (the counters), separate on every runner (`runners.TaggedOutputs`).
    """

    def __init__(self, patterns, input_format: str = "google", text_field: str = "text",
                 chunk_bytes: int = READ_CHUNK_BYTES, index_only: bool = False,
                 progress_dir: str = ""):
        super().__init__()
        if input_format not in INPUT_FORMATS:
            raise ValueError(f"input format {input_format!r} is not one of {INPUT_FORMATS}")
        self._ranges = _ranges(patterns, chunk_bytes)
        self._format = input_format
        self._text_field = text_field
        self._index_only = index_only
        self._progress_dir = progress_dir

    def expand(self, pbegin):
        read = (IndexRangeFn if self._index_only else ReadRangeFn)(
            self._format, self._text_field, self._progress_dir)
        return (
            pbegin
            | "Ranges" >> beam.Create(self._ranges, reshuffle=len(self._ranges) > 1)
            | "ReadRanges" >> TaggedOutputs(read, [STATS_TAG], main="documents"))
