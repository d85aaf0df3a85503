"""The fine-tuning features job's progress (beam_jobs/finetune_data.py --progress_dir, driven by
pipeline/finetuning/records.py through pipeline/beam_progress.py): its local workers tell every
byte of the examples they encode, the records are the same bytes with or without the flag, and
the launcher shows plain lines off a terminal or a bar when one is asked for."""

from __future__ import annotations

import logging
import random
import re
import shutil
from pathlib import Path

import pytest

from beam_jobs import finetune_data, progress
from pipeline import beam_progress, logs
from pipeline import config as config_lib
from pipeline.config import data_job
from pipeline.finetuning import data as fd
from pipeline.finetuning import readers, records, tasks
from pipeline.finetuning.context import TokenizerBundle
from tests.test_finetune_data import WORDS, write_vocab
from tests.test_finetune_records import write_animal_place_csv

SEQ = 24
DESC = "finetune: encoding features"
LINE = re.compile(r"^finetune: encoding features \d+% \(\d+\.\d/\d+\.\d MB, \d+\.\d MB/s, "
                  r"ETA (\d+m \d\ds|unknown)\)$")


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    return path, write_vocab(path)


def _text(rng, n):
    # "naïve": a character of two UTF-8 bytes, so characters and bytes differ.
    return " ".join(rng.choice(WORDS + ["naïve", "Zebra", "cats"]) for _ in range(n))


def _examples_dir(folder, counts: dict) -> int:
    """<folder>/<split>.jsonl of classification examples, as records.py writes them; returns
    their bytes in all."""
    rng = random.Random(7)
    folder.mkdir()
    for split, n in counts.items():
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8") as handle:
            for i in range(n):
                example = readers.TextExample(_text(rng, rng.randint(2, 20)),
                                              label=rng.choice(["x", "y"]))
                handle.write(records.example_json(i, example) + "\n")
    return sum((folder / f"{split}.jsonl").stat().st_size for split in counts)


def files(folder) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_workers_tell_every_byte_and_the_records_do_not_change(vocab, tmp_path,
                                                                   monkeypatch):
    """Batches of 16 examples (many part files, many counts): `done` ends at the inputs' size
    exactly (non-ASCII text included), the watcher shows 100%, and the outputs with the flag
    are the bytes written without it."""
    _, tokens = vocab
    monkeypatch.setattr(finetune_data, "ENCODE_BATCH", 16)
    size = _examples_dir(tmp_path / "examples", {"train": 90, "validation": 20, "test": 20})
    fc = config_lib.FinetuneConfig(task="classification", max_seq_length=SEQ)
    encoder = records.RowEncoder("classification", fc,
                                 TokenizerBundle(tokens, Path("vocab.txt"), True, SEQ),
                                 ["x", "y"], False)

    def job(out, *extra):
        return finetune_data.run(["--input_dir", str(tmp_path / "examples"), "--output_dir",
                                  str(out), "--splits", "train:2,validation:1,test:1", *extra,
                                  "--runner=FnApiRunner"], encoder=encoder)

    folder = tmp_path / "progress"
    folder.mkdir()
    watcher = beam_progress.Watcher(str(folder), DESC, size, measure="done")
    watcher.start()
    told = job(tmp_path / "told", "--progress_dir", str(folder))
    watcher.stop()
    assert progress.totals(str(folder)) == {"done": size}
    assert watcher.shown == (size, size)
    assert len(list(folder.glob("*.json"))) >= 1

    plain = job(tmp_path / "plain")
    assert told == plain and told["train"]["examples"] == 90
    written = files(tmp_path / "plain")
    assert sum(name.endswith(".tfrecord") for name in written) == 4
    assert written == files(tmp_path / "told")


def _config(tmp_path, vocab_path, run: str):
    write_animal_place_csv(tmp_path)
    return config_lib.load(None, [
        f"run_dir={tmp_path}/{run}", f"finetune.vocab_file={vocab_path}",
        "finetune.dataset=csv", f"finetune.train_file={tmp_path}/train.csv",
        f"finetune.max_seq_length={SEQ}"])


def _write(config, tokens, vocab_path):
    task = tasks.get("classification", config.finetune)
    data = fd.load_task(config.finetune)
    return records.write_or_reuse(config, task, data, TokenizerBundle(tokens, vocab_path, True,
                                                                      SEQ))


def test_plain_lines_off_a_terminal_and_none_for_a_short_job(vocab, tmp_path, caplog,
                                                             monkeypatch):
    vocab_path, tokens = vocab
    config = _config(tmp_path, vocab_path, "run")
    caplog.set_level(logging.INFO, logger="pipeline")
    monkeypatch.setenv("BERT_PIPELINE_PROGRESS", "plain")
    monkeypatch.setenv("BERT_PIPELINE_PROGRESS_EVERY", "3600")  # longer than the job
    _write(config, tokens, vocab_path)
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("finetune: wrote ") for m in said), said
    assert not [m for m in said if "%" in m], said

    shutil.rmtree(tmp_path / "run" / "finetune_features")  # not reused: the job runs again
    caplog.clear()
    monkeypatch.setenv("BERT_PIPELINE_PROGRESS_EVERY", "0.02")
    _write(config, tokens, vocab_path)
    said = [r.getMessage() for r in caplog.records]
    lines = [m for m in said if LINE.match(m)]
    assert lines, said
    assert said.index(lines[-1]) < said.index(next(m for m in said if "wrote" in m))
    assert logs._STATE["bars"] == 0


def test_a_forced_bar_draws_while_the_features_are_written(vocab, tmp_path, monkeypatch,
                                                           capsys):
    vocab_path, tokens = vocab
    monkeypatch.setenv("BERT_PIPELINE_PROGRESS", "bar")
    splits = _write(_config(tmp_path, vocab_path, "run"), tokens, vocab_path)
    drawn = capsys.readouterr().err
    assert f"{DESC}: 100%" in drawn, drawn[-500:]
    assert "B/s" in drawn
    assert logs._STATE["bars"] == 0
    assert len(splits["train"]) > 0

    # A remote runner's workers cannot write here: no flag, no bar (the heartbeat speaks).
    remote = config_lib.load(None, ['data.beam_args=["--runner=DataflowRunner"]'])
    assert not data_job.runs_locally(remote)
    with beam_progress.watch(DESC, 100, data_job.runs_locally(remote)) as folder:
        assert folder is None and data_job.progress_args(folder) == []
