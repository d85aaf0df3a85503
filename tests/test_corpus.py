import json

import pytest

from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.stages import corpus
from pipeline.text import sources
from pipeline.text.sources import CorpusError


def files_config(tmp_path, pattern, *overrides):
    return config_lib.load(None, [f"run_dir={tmp_path / 'run'}", "corpus.source=files",
                                  f"corpus.path={pattern}", "corpus.eval_fraction=0.2",
                                  *overrides])


def read_docs(folder):
    docs = []
    for path in sorted(folder.glob("*.txt")):
        docs += [d.split("\n") for d in path.read_text().strip().split("\n\n") if d]
    return docs


def test_split_keeps_every_document_once(tmp_path, corpus_dir):
    config = files_config(tmp_path, f"{corpus_dir}/*.txt")
    manifest = corpus.run(config, log=lambda *_: None)
    paths = artifacts.Artifacts(config.run_dir)
    train, held = read_docs(paths.corpus_train_dir), read_docs(paths.corpus_eval_dir)
    assert len(train) + len(held) == 40
    assert manifest["train"]["documents"] == len(train) and manifest["eval"]["documents"] == len(held)
    assert 2 <= len(held) <= 16  # ~20% of 40
    original = read_docs(corpus_dir)
    assert sorted(map(tuple, train + held)) == sorted(map(tuple, original))
    assert json.loads(paths.corpus_manifest.read_text())["inputs"][0]["sha256"]
    # Deterministic: the same seed holds out the same documents.
    corpus.run(config, log=lambda *_: None)
    assert read_docs(paths.corpus_eval_dir) == held


def test_empty_corpus_is_refused_and_nothing_is_left(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n\n")
    config = files_config(tmp_path, f"{tmp_path}/empty.txt")
    with pytest.raises(CorpusError, match="no documents"):
        corpus.run(config, log=lambda *_: None)
    paths = artifacts.Artifacts(config.run_dir)
    assert not paths.corpus_dir.exists()
    assert not list(paths.root.glob(".*tmp*"))


def test_non_utf8_file_is_named(tmp_path, corpus_dir):
    bad = corpus_dir / "latin1.txt"
    bad.write_bytes("Caf\u00e9 au lait.\nSecond line.\n".encode("latin-1"))
    config = files_config(tmp_path, f"{corpus_dir}/*.txt")
    with pytest.raises(CorpusError) as info:
        corpus.run(config, log=lambda *_: None)
    assert "latin1.txt" in str(info.value) and "not UTF-8" in str(info.value)
    assert "byte offset 3" in str(info.value)


def test_megabyte_line_errors_or_is_skipped(tmp_path, corpus_dir):
    (corpus_dir / "long.txt").write_text("A short line.\n" + "word " * 210_000 + "\n")
    config = files_config(tmp_path, f"{corpus_dir}/*.txt")
    with pytest.raises(CorpusError) as info:
        corpus.run(config, log=lambda *_: None)
    assert "long.txt:2" in str(info.value) and "corpus.long_lines=skip" in str(info.value)
    config = files_config(tmp_path, f"{corpus_dir}/*.txt", "corpus.long_lines=skip")
    manifest = corpus.run(config, log=lambda *_: None)
    assert manifest["skipped"] == {"line_too_long": 1}


def test_single_document_and_single_sentence_documents(tmp_path):
    (tmp_path / "one.txt").write_text("Only one document.\nWith two sentences.\n")
    with pytest.raises(CorpusError, match="only one document"):
        corpus.run(files_config(tmp_path, f"{tmp_path}/one.txt"), log=lambda *_: None)
    (tmp_path / "singles.txt").write_text("One sentence.\n\nAnother one.\n\nA third.\n")
    manifest = corpus.run(files_config(tmp_path, f"{tmp_path}/singles.txt"), log=lambda *_: None)
    counted = manifest["train"]["single_sentence_documents"] + manifest["eval"]["single_sentence_documents"]
    assert counted == 3


def test_unmatched_glob(tmp_path):
    with pytest.raises(CorpusError, match="matches no file"):
        corpus.run(files_config(tmp_path, f"{tmp_path}/nothing-*.txt"), log=lambda *_: None)


def test_brown_sentence_detokenizes():
    line = "``/`` Only/rb a/at handful/nn ''/'' ,/, the/at jury/nn said/vbd ./."
    assert sources.brown_sentence(line) == '"Only a handful", the jury said.'
    assert sources.brown_sentence("It/pps does/doz n't/* work/vb ./.") == "It doesn't work."
