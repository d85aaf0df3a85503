"""Stage `vocab`: the training corpus → a WordPiece `vocab.txt` (Beam job `beam_jobs.vocab`).

Reads <run_dir>/corpus/train, writes <run_dir>/vocab/{vocab.txt, vocab.json}
atomically; logs the vocab and its metadata to MLflow. With `data.remote_dir` the job reads a
copy of the corpus below that URL and writes the vocab there (pipeline/remote_dir.py).
While the job counts the words on this machine, a progress bar or plain lines say how much of
the text it has read (pipeline/beam_progress.py).
"""

from __future__ import annotations

import json
import logging
import shutil
import time

from apache_beam.io.filesystems import FileSystems

from beam_jobs import vocab as vocab_job
from pipeline import artifacts, beam_progress, remote_dir
from pipeline.artifacts import Artifacts
from pipeline.config import Config, data_job
from pipeline.text import coverage
from pipeline.tracking import outbox

log = logging.getLogger(__name__)


def run(config: Config) -> dict:
    paths = Artifacts(config.run_dir)
    artifacts.require(paths.corpus_manifest, "the prepared corpus", "corpus")
    if not paths.corpus_files("train"):
        raise artifacts.MissingArtifact(f"no training text in {paths.corpus_train_dir}; "
                                        f"run `make corpus` again")
    vc = config.vocab
    start = time.time()
    if vc.from_file:
        return use_existing_vocab(config, paths)
    remote_dir.check(config)
    size = paths.corpus_bytes("train")
    with artifacts.atomic_dir(paths.vocab_dir) as tmp, remote_dir.Staging(config, "vocab") as stage:
        output = stage.output(tmp, "vocab")
        corpus = stage.files(paths.corpus_files("train"), paths.corpus_glob("train"),
                             "corpus/train")
        # A bar or plain lines while the words are counted, when the workers are local.
        with beam_progress.watch("vocab: counting words", size,
                                 data_job.runs_locally(config)) as progress_dir:
            # Every vocab.* key the job reads, as its flags (by their declaration: data_job).
            meta = vocab_job.run(data_job.vocab_job_args(
                config, corpus, FileSystems.join(output, paths.vocab_file.name), size,
                progress_dir))
        stage.download(output, tmp)
        vocab_job.check_vocab(str(tmp / paths.vocab_file.name))
    seconds = time.time() - start
    log.info(f"vocab: {meta['vocab_size']:,} tokens learned from "
             f"{meta['distinct_words_used']:,} distinct words "
             f"({meta['word_occurrences_used']:,} occurrences) in {seconds:.1f} s "
             f"({meta['word_occurrences_used'] / seconds:,.0f} words/s) -> {paths.vocab_file}")
    outbox.log_metrics({"vocab_size": meta["vocab_size"],  # kept if the store is down
                        "distinct_words_used": meta["distinct_words_used"]})
    outbox.log_artifact(paths.vocab_file, "vocab")
    outbox.log_artifact(paths.vocab_meta, "vocab")
    return meta


def use_existing_vocab(config: Config, paths: Artifacts) -> dict:
    """vocab.from_file: copies a given vocab.txt (checked) instead of learning one."""
    source = config.vocab.from_file
    special = vocab_job.check_vocab(source)
    tokens = open(source, encoding="utf-8").read().splitlines()
    meta = {"vocab_size": len(tokens), "from_file": source, "lowercase": config.vocab.lowercase,
            "strip_accents": config.vocab.lowercase, "distinct_words_used": 0,
            "word_occurrences_used": 0, "special_token_ids": special}
    with artifacts.atomic_dir(paths.vocab_dir) as tmp:
        shutil.copyfile(source, tmp / paths.vocab_file.name)
        (tmp / paths.vocab_meta.name).write_text(json.dumps(meta, indent=2))
    log.info(f"vocab: {len(tokens):,} tokens taken from {source} -> {paths.vocab_file}")
    shares = unknown_shares(config, paths, source)
    outbox.log_metrics({"vocab_size": len(tokens),
                        **({"corpus_unk_share": max(shares.values())} if shares else {})})
    outbox.log_artifact(paths.vocab_file, "vocab")
    return meta


def unknown_shares(config: Config, paths: Artifacts, source: str) -> dict:
    """{input file: share of [UNK] pieces} of the corpus's own files under a given vocab
    (pipeline/text/coverage.py); a one-line warning for each above coverage.WARN_SHARE."""
    if config.corpus.source != "files":  # the demo corpus: English, as the vocabs it meets
        return {}
    inputs = [entry["path"] for entry in json.loads(paths.corpus_manifest.read_text())["inputs"]]
    shares = coverage.input_shares(source, config.vocab.lowercase, inputs, config.corpus.format,
                                   config.corpus.text_key)
    for path, (share, pieces) in shares.items():
        if share > coverage.WARN_SHARE:
            log.warning(f"vocab: {share:.1%} of the WordPiece pieces of {path} are "
                        f"[UNK] under the vocab {source} (the first {pieces:,} pieces); the text "
                        f"is likely in another language or script than the vocab's and the "
                        f"model would learn to predict [UNK]: start from a checkpoint whose vocab "
                        f"covers it, or learn a vocab of its own (no model.init_from, no "
                        f"vocab.from_file)")
    return {path: share for path, (share, _) in shares.items()}
