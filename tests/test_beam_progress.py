"""The Beam jobs' progress (beam_jobs/progress.py, pipeline/beam_progress.py): the workers of a
local runner tell every byte they read and process, the stage's thread turns the sums into a bar
or plain lines, and the outputs are the same bytes with or without the progress folder."""

from __future__ import annotations

import doctest
import logging
import re

import pytest

from beam_jobs import pretraining_data, progress
from beam_jobs import vocab as vocab_job
from pipeline import beam_progress, logs
from tests.conftest import make_corpus

RUNNER = "--runner=FnApiRunner"
LINE = re.compile(r"^data: train split \d+% \(\d+\.\d/\d+\.\d MB, \d+\.\d MB/s, "
                  r"ETA (\d+m \d\ds|unknown)\)$")


def test_the_modules_examples_hold():
    for module in (progress, beam_progress):
        assert doctest.testmod(module).failed == 0, module.__name__


def document_bytes(folder) -> int:
    """The bytes of the corpus's documents, from the text itself: each document's lines with
    their line breaks (the blank lines between documents are no document's)."""
    total = 0
    for path in sorted(folder.glob("*.txt")):
        for block in path.read_bytes().split(b"\n\n"):
            total += len(block.strip(b"\n")) + 1
    return total


@pytest.fixture
def small(tmp_path):
    corpus = tmp_path / "corpus"
    make_corpus(corpus, documents=60)
    vocab_job.run(["--input", f"{corpus}/*.txt", "--output", str(tmp_path / "vocab.txt"),
                   "--vocab_size", "200", "--min_word_count", "1", RUNNER])
    return corpus, tmp_path / "vocab.txt"


def data_args(corpus, vocab, out, *extra):
    # Ranges of about 2 KB and groups of about 4 KB: many ranges, several groups.
    return ["--input", f"{corpus}/*.txt", "--output_dir", str(out), "--vocab_file", str(vocab),
            "--max_seq_length", "32", "--max_predictions_per_seq", "5", "--num_shards", "2",
            "--read_chunk_mb", "0.002", "--group_size_mb", "0.004", "--dupe_factor", "2",
            *extra, RUNNER]


def files(folder) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_workers_tell_every_byte_and_the_watcher_reaches_the_total(small, tmp_path):
    corpus, vocab = small
    size = sum(p.stat().st_size for p in corpus.glob("*.txt"))
    folder = tmp_path / "progress"
    folder.mkdir()
    watcher = beam_progress.Watcher(str(folder), "data: train split", size, measure="done")
    watcher.start()
    pretraining_data.run(data_args(corpus, vocab, tmp_path / "out", "--phases", "32:5,16:3",
                                   "--progress_dir", str(folder)))
    watcher.stop()
    counts = progress.totals(str(folder))
    assert counts["read"] == size  # every range's bytes once
    assert counts["total"] == counts["done"] == document_bytes(corpus)
    assert watcher.shown == (document_bytes(corpus), document_bytes(corpus))  # 100%

    # The vocab job: every byte of the text read while its words are counted.
    words = tmp_path / "words"
    words.mkdir()
    vocab_job.run(["--input", f"{corpus}/*.txt", "--output", str(tmp_path / "v" / "vocab.txt"),
                   "--vocab_size", "200", "--min_word_count", "1", "--read_chunk_mb", "0.002",
                   "--progress_dir", str(words), RUNNER])
    assert progress.totals(str(words)) == {"read": size}


def test_the_outputs_are_the_same_with_and_without_the_progress_folder(small, tmp_path):
    corpus, vocab = small
    folder = tmp_path / "progress"
    folder.mkdir()
    pretraining_data.run(data_args(corpus, vocab, tmp_path / "plain"))
    pretraining_data.run(data_args(corpus, vocab, tmp_path / "told",
                                   "--progress_dir", str(folder)))
    plain, told = files(tmp_path / "plain"), files(tmp_path / "told")
    assert any(name.endswith(".tfrecord") for name in plain)
    assert plain == told
    assert progress.totals(str(folder))["done"] > 0  # the folder was used
    for name, extra in (("v1", []), ("v2", ["--progress_dir", str(folder)])):
        vocab_job.run(["--input", f"{corpus}/*.txt", "--output", str(tmp_path / name / "vocab.txt"),
                       "--vocab_size", "200", "--min_word_count", "1", *extra, RUNNER])
    assert files(tmp_path / "v1") == files(tmp_path / "v2")


def stage_config(tmp_path, corpus):
    from pipeline import config as config_lib

    run = tmp_path / "run"
    (run / "corpus").mkdir(parents=True)
    (run / "corpus" / "train").symlink_to(corpus)
    (run / "corpus" / "eval").mkdir()
    first = min(corpus.glob("*.txt"))
    (run / "corpus" / "eval" / "part-0.txt").write_bytes(first.read_bytes())
    (run / "corpus" / "manifest.json").write_text("{}")
    return config_lib.load("configs/test_tiny.yaml", [
        f"run_dir={run}", "vocab.size=150", "vocab.min_word_count=1",
        "data.max_seq_length=32", "data.max_predictions_per_seq=5", "data.num_shards=2"])


def test_the_stages_write_plain_lines_off_a_terminal(tmp_path, caplog, monkeypatch):
    """Not a terminal: a plain line every BERT_PIPELINE_PROGRESS_EVERY seconds through the
    pipeline logger; none for a job shorter than that."""
    from pipeline.stages import data as data_stage
    from pipeline.stages import vocab as vocab_stage

    corpus = tmp_path / "corpus"
    make_corpus(corpus, documents=80)
    config = stage_config(tmp_path, corpus)
    caplog.set_level(logging.INFO, logger="pipeline")
    monkeypatch.setenv("BERT_PIPELINE_PROGRESS", "plain")
    monkeypatch.setenv("BERT_PIPELINE_PROGRESS_EVERY", "3600")  # longer than the jobs
    vocab_stage.run(config)
    data_stage.run(config)
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("data: ") and "instances" in m for m in said)
    assert not [m for m in said if "%" in m]

    caplog.clear()
    monkeypatch.setenv("BERT_PIPELINE_PROGRESS_EVERY", "0.02")
    vocab_stage.run(config)
    data_stage.run(config)
    said = [r.getMessage() for r in caplog.records]
    assert [m for m in said if LINE.match(m)], said
    assert [m for m in said if m.startswith("vocab: counting words ") and "% (" in m], said
    assert logs._STATE["bars"] == 0


def test_a_forced_bar_draws_on_the_console(small, tmp_path, monkeypatch, capsys):
    corpus, vocab = small
    size = sum(p.stat().st_size for p in corpus.glob("*.txt"))
    monkeypatch.setenv("BERT_PIPELINE_PROGRESS", "bar")
    with beam_progress.watch("data: train split", size, local=True, measure="done") as folder:
        assert logs._STATE["bars"] == 1  # the heartbeat is quiet meanwhile
        pretraining_data.run(data_args(corpus, vocab, tmp_path / "out", "--progress_dir",
                                       folder))
    assert logs._STATE["bars"] == 0
    drawn = capsys.readouterr().err
    assert "data: train split: 100%" in drawn, drawn[-500:]
    assert "B/s" in drawn
    with beam_progress.watch("data: train split", size, local=False) as folder:
        assert folder is None  # a remote runner: no flag, the heartbeat as before


def test_runs_locally_names_the_runners_whose_workers_are_here():
    from pipeline import config as config_lib
    from pipeline.config import data_job

    def local(*beam_args):
        config = config_lib.load(None, [f"data.beam_args={list(beam_args)!r}".replace("'", '"')])
        return data_job.runs_locally(config)

    assert local("--runner=FnApiRunner") and local("--runner=DirectRunner")
    assert local("--runner=PrismRunner") and local("--runner=PortableRunner",
                                                   "--environment_type=LOOPBACK")
    assert not local("--runner=DataflowRunner") and not local("--runner=FlinkRunner")
    assert not local("--runner=DirectRunner", "--environment_type=DOCKER")
    config = config_lib.load(None, ['data.beam_args=["--runner=FnApiRunner"]'])
    args = data_job.job_args(config, "in/*.txt", "vocab.txt", "out", "train", 10, "/tmp/p")
    assert args[args.index("--progress_dir") + 1] == "/tmp/p"
    assert "--progress_dir" not in data_job.job_args(config, "in/*.txt", "vocab.txt", "out",
                                                     "train", 10)
