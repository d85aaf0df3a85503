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
    manifest = corpus.run(config)
    paths = artifacts.Artifacts(config.run_dir)
    train, held = read_docs(paths.corpus_train_dir), read_docs(paths.corpus_eval_dir)
    assert len(train) + len(held) == 40
    assert manifest["train"]["documents"] == len(train)
    assert manifest["eval"]["documents"] == len(held)
    assert 2 <= len(held) <= 16  # ~20% of 40
    original = read_docs(corpus_dir)
    assert sorted(map(tuple, train + held)) == sorted(map(tuple, original))
    assert json.loads(paths.corpus_manifest.read_text())["inputs"][0]["sha256"]
    # Deterministic: the same seed holds out the same documents.
    corpus.run(config)
    assert read_docs(paths.corpus_eval_dir) == held


def test_empty_corpus_is_refused_and_nothing_is_left(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n\n")
    config = files_config(tmp_path, f"{tmp_path}/empty.txt")
    with pytest.raises(CorpusError, match="no documents"):
        corpus.run(config)
    paths = artifacts.Artifacts(config.run_dir)
    assert not paths.corpus_dir.exists()
    assert not list(paths.root.glob(".*tmp*"))


def test_non_utf8_file_is_named(tmp_path, corpus_dir):
    bad = corpus_dir / "latin1.txt"
    bad.write_bytes("Caf\u00e9 au lait.\nSecond line.\n".encode("latin-1"))
    config = files_config(tmp_path, f"{corpus_dir}/*.txt")
    with pytest.raises(CorpusError) as info:
        corpus.run(config)
    assert "latin1.txt" in str(info.value) and "not UTF-8" in str(info.value)
    assert "byte offset 3" in str(info.value)


def test_megabyte_line_errors_or_is_skipped(tmp_path, corpus_dir):
    (corpus_dir / "long.txt").write_text("A short line.\n" + "word " * 210_000 + "\n")
    config = files_config(tmp_path, f"{corpus_dir}/*.txt")
    with pytest.raises(CorpusError) as info:
        corpus.run(config)
    assert "long.txt:2" in str(info.value) and "corpus.long_lines=skip" in str(info.value)
    config = files_config(tmp_path, f"{corpus_dir}/*.txt", "corpus.long_lines=skip")
    manifest = corpus.run(config)
    assert manifest["skipped"] == {"line_too_long": 1}


def test_single_document_and_single_sentence_documents(tmp_path):
    (tmp_path / "one.txt").write_text("Only one document.\nWith two sentences.\n")
    with pytest.raises(CorpusError, match="only one document"):
        corpus.run(files_config(tmp_path, f"{tmp_path}/one.txt"))
    (tmp_path / "singles.txt").write_text("One sentence.\n\nAnother one.\n\nA third.\n")
    manifest = corpus.run(files_config(tmp_path, f"{tmp_path}/singles.txt"))
    counted = (manifest["train"]["single_sentence_documents"]
               + manifest["eval"]["single_sentence_documents"])
    assert counted == 3


def test_unmatched_glob(tmp_path):
    with pytest.raises(CorpusError, match="matches no file"):
        corpus.run(files_config(tmp_path, f"{tmp_path}/nothing-*.txt"))


def test_brown_sentence_detokenizes():
    line = "``/`` Only/rb a/at handful/nn ''/'' ,/, the/at jury/nn said/vbd ./."
    assert sources.brown_sentence(line) == '"Only a handful", the jury said.'
    assert sources.brown_sentence("It/pps does/doz n't/* work/vb ./.") == "It doesn't work."


# ---------------------------------------------------------------------------
# Raw text in: corpus.format = text | jsonl, plain, .gz or .bz2; the stage streams.
# ---------------------------------------------------------------------------
DOCS = [  # (raw text of a document, the sentences the splitter must find)
    ("Mr. Smith paid $3.50 for 2.5 lbs. of apples in the U.S. yesterday. He was happy.",
     ["Mr. Smith paid $3.50 for 2.5 lbs. of apples in the U.S. yesterday.", "He was happy."]),
    ('"Really?" she asked. Dr. Jones arrived at 5 p.m. on Jan. 3. It was raining!',
     ['"Really?" she asked.', "Dr. Jones arrived at 5 p.m. on Jan. 3.", "It was raining!"]),
    ("One sentence only, without a full stop",
     ["One sentence only, without a full stop"]),
    ("The river rose 1.5 metres.   Nobody    left the village.",
     ["The river rose 1.5 metres.", "Nobody left the village."]),
]


def _compress(path, text: str, kind: str):
    import bz2
    import gzip

    data = text.encode("utf-8")
    if kind == "gz":
        data, path = gzip.compress(data), path.with_name(path.name + ".gz")
    elif kind == "bz2":
        data, path = bz2.compress(data), path.with_name(path.name + ".bz2")
    path.write_bytes(data)
    return path


def _all_docs(config):
    paths = artifacts.Artifacts(config.run_dir)
    return sorted(map(tuple, read_docs(paths.corpus_train_dir) + read_docs(paths.corpus_eval_dir)))


def _layouts():
    """(format, extra overrides, file name, file text) of the same DOCS in each layout."""
    lines = "".join(text + "\n" for text, _ in DOCS)
    # Blank-line documents, hard-wrapped: every document's words over several lines.
    wrapped = "\n\n\n".join(_wrap(text) for text, _ in DOCS) + "\n"
    jsonl = "".join(json.dumps({"id": i, "text": text}) + "\n" for i, (text, _) in enumerate(DOCS))
    body = "".join(json.dumps({"body": text}) + "\n\n" for text, _ in DOCS)
    return [("text-lines", ["corpus.format=text"], "docs.txt", lines),
            ("text-blank-lines", ["corpus.format=text", "corpus.documents=blank_line"],
             "docs.txt", wrapped),
            ("jsonl", ["corpus.format=jsonl"], "docs.jsonl", jsonl),
            ("jsonl-text-key", ["corpus.format=jsonl", "corpus.text_key=body"], "docs.jsonl", body)]


def _wrap(text: str, width: int = 25) -> str:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + len(word) > width:
            lines.append(line)
            line = ""
        line = f"{line} {word}".strip()
    return "\n".join(lines + [line])


@pytest.mark.parametrize("compression", ["plain", "gz", "bz2"])
@pytest.mark.parametrize("layout", _layouts(), ids=lambda layout: layout[0])
def test_raw_formats_give_the_documents_and_sentences(tmp_path, layout, compression):
    name, overrides, filename, text = layout
    path = _compress(tmp_path / filename, text, compression)
    config = files_config(tmp_path, str(path), *overrides, "corpus.eval_fraction=0.5")
    manifest = corpus.run(config)
    assert _all_docs(config) == sorted(tuple(sentences) for _, sentences in DOCS)
    assert manifest["format"] == overrides[0].split("=")[1]
    assert manifest["train"]["documents"] >= 1 and manifest["eval"]["documents"] >= 1
    assert manifest["train"]["single_sentence_documents"] + \
        manifest["eval"]["single_sentence_documents"] == 1


def test_google_format_reads_bz2_like_gz_and_plain(tmp_path, corpus_dir):
    text = (corpus_dir / "part-0.txt").read_text()
    results = []
    for kind in ("plain", "gz", "bz2"):
        folder = tmp_path / kind
        folder.mkdir()
        _compress(folder / "part-0.txt", text, kind)
        config = config_lib.load(None, [f"run_dir={tmp_path / ('run-' + kind)}",
                                        "corpus.source=files", f"corpus.path={folder}/*",
                                        "corpus.eval_fraction=0.2"])
        corpus.run(config)
        results.append(_all_docs(config))
    assert results[0] == results[1] == results[2] and len(results[0]) == 20


def test_a_megabyte_document_on_one_line_is_split_into_sentences(tmp_path):
    sentence = "The farmer saw {} small birds near the old house."
    big = " ".join(sentence.format(i) for i in range(21_000))
    assert len(big) > 1_000_000
    (tmp_path / "big.txt").write_text(big + "\nA second document. It is short.\n")
    config = files_config(tmp_path, f"{tmp_path}/big.txt", "corpus.format=text",
                          "corpus.eval_fraction=0.5")
    manifest = corpus.run(config)
    assert manifest["train"]["sentences"] + manifest["eval"]["sentences"] == 21_002
    assert manifest["skipped"] == {}
    docs = _all_docs(config)
    big_doc = max(docs, key=len)
    assert len(big_doc) == 21_000 and big_doc[0] == sentence.format(0)
    assert big_doc[-1] == sentence.format(20_999)


def test_a_sentence_over_max_line_chars_after_splitting_errors_or_is_skipped(tmp_path):
    (tmp_path / "docs.txt").write_text("Fine. Also fine.\nA list " + "item, " * 400 + "end.\n"
                                       "Third document. Short.\n")
    with pytest.raises(CorpusError) as info:
        corpus.run(files_config(tmp_path, f"{tmp_path}/docs.txt", "corpus.format=text",
                                "corpus.max_line_chars=1000"))
    message = str(info.value)
    assert "docs.txt:2" in message and "corpus.max_line_chars = 1,000" in message
    assert "a sentence of 2,411 characters" in message and "corpus.long_lines=skip" in message
    manifest = corpus.run(files_config(tmp_path, f"{tmp_path}/docs.txt", "corpus.format=text",
                                       "corpus.max_line_chars=1000", "corpus.long_lines=skip"))
    assert manifest["skipped"] == {"sentence_too_long": 1}
    assert manifest["train"]["documents"] + manifest["eval"]["documents"] == 3


BAD_RAW = [  # (name, file name, bytes, overrides, what the message must name)
    ("text not UTF-8", "latin1.txt", "Fine.\nCaf\u00e9 au lait.\n".encode("latin-1"),
     ["corpus.format=text"], ["latin1.txt:2", "not UTF-8", "byte offset 9"]),
    ("jsonl line not JSON", "docs.jsonl", b'{"text": "Fine."}\n{"text": "broken\n',
     ["corpus.format=jsonl"], ["docs.jsonl:2", "not JSON"]),
    ("jsonl record without the key", "docs.jsonl", b'{"text": "Fine."}\n\n{"body": "B."}\n',
     ["corpus.format=jsonl"], ["docs.jsonl:3", "has no field 'text'", "corpus.text_key"]),
    ("jsonl record with an empty text", "docs.jsonl", b'{"text": "Fine."}\n{"text": "  "}\n',
     ["corpus.format=jsonl"], ["docs.jsonl:2", "empty 'text'"]),
    ("jsonl record with a number as text", "docs.jsonl", b'{"text": 42}\n',
     ["corpus.format=jsonl"], ["docs.jsonl:1", "int in 'text'", "not a string"]),
    ("jsonl record not an object", "docs.jsonl", b'["a list"]\n',
     ["corpus.format=jsonl"], ["docs.jsonl:1", "not a JSON object"]),
    ("jsonl missing custom key", "docs.jsonl", b'{"text": "Fine."}\n',
     ["corpus.format=jsonl", "corpus.text_key=body"], ["docs.jsonl:1", "'body'"]),
    ("corrupt .gz", "docs.txt.gz", b"\x1f\x8b\x08\x00 this is not deflate data at all",
     ["corpus.format=text"], ["docs.txt.gz", "gzip", "corrupt or truncated"]),
    ("not gzip at all", "docs.txt.gz", b"plain text named .gz\n",
     ["corpus.format=text"], ["docs.txt.gz", "gzip"]),
    ("truncated .bz2", "docs.txt.bz2", None,
     ["corpus.format=text"], ["docs.txt.bz2", "bzip2", "corrupt or truncated"]),
    ("corrupt .gz in google format", "docs.txt.gz", b"\x1f\x8b\x08\x00 garbage",
     [], ["docs.txt.gz", "gzip"]),
]


@pytest.mark.parametrize("name,filename,data,overrides,names", BAD_RAW,
                         ids=[row[0] for row in BAD_RAW])
def test_bad_raw_input_is_a_corpus_error_naming_file_and_line(tmp_path, name, filename, data,
                                                             overrides, names):
    import bz2

    if data is None:  # a bzip2 stream cut in half
        whole = bz2.compress(("A sentence of some length. " * 2000).encode())
        data = whole[: len(whole) // 2]
    (tmp_path / filename).write_bytes(data)
    config = files_config(tmp_path, str(tmp_path / filename), *overrides)
    with pytest.raises(CorpusError) as info:
        corpus.run(config)
    message = str(info.value)
    assert "\n" not in message
    for expected in names:
        assert expected in message, message
    assert not artifacts.Artifacts(config.run_dir).corpus_dir.exists()


@pytest.mark.parametrize("override,names", [
    ("corpus.format=html", ["corpus.format", "'html'", "google, text, jsonl"]),
    ("corpus.documents=page", ["corpus.documents", "'page'", "line, blank_line"]),
])
def test_unknown_format_or_document_layout_is_refused_by_the_config(tmp_path, override, names):
    with pytest.raises(config_lib.ConfigError) as info:
        files_config(tmp_path, "x.txt", override)
    for expected in names:
        assert expected in str(info.value)


def test_jsonl_needs_a_text_key(tmp_path):
    with pytest.raises(config_lib.ConfigError, match="corpus.text_key"):
        files_config(tmp_path, "x.jsonl", "corpus.format=jsonl", "corpus.text_key=")


class _Doc(list):
    """A document's sentences that a weak reference can watch."""


def test_the_stage_streams_documents_without_holding_them(tmp_path, monkeypatch):
    """Each document is released once written (one, the latest train document, is kept a step):
    memory does not grow with the corpus. Before, `list(documents)` held them all."""
    import weakref

    alive = []

    def documents(path, cc, skipped):
        for i in range(300):
            # Of the documents before the latest, one at most (the train document kept a
            # step) may still be alive.
            assert sum(ref() is not None for ref in alive[:-1]) <= 1, i
            doc = _Doc([f"Document {i} sentence one.", f"Document {i} sentence two."])
            alive.append(weakref.ref(doc))
            yield f"doc-{i}", doc

    (tmp_path / "any.txt").write_text("unused\n")
    monkeypatch.setattr(corpus, "_read_file", documents)
    manifest = corpus.run(files_config(tmp_path, f"{tmp_path}/any.txt"))
    assert manifest["train"]["documents"] + manifest["eval"]["documents"] == 300


@pytest.mark.parametrize("held", [True, False])
def test_one_document_each_side_when_the_hash_puts_all_on_one(tmp_path, monkeypatch, held):
    """All held out: the first document goes to train (the held-out files are rewritten
    without it); none held out: the last goes to eval. As before streaming."""
    from conftest import make_corpus

    docs = make_corpus(tmp_path / "raw", documents=250)
    order = docs[0::2] + docs[1::2]  # part-0.txt, then part-1.txt
    monkeypatch.setattr(corpus, "is_held_out", lambda *_: held)
    config = files_config(tmp_path, f"{tmp_path}/raw/*.txt")
    manifest = corpus.run(config)
    paths = artifacts.Artifacts(config.run_dir)
    train, held_out = read_docs(paths.corpus_train_dir), read_docs(paths.corpus_eval_dir)
    if held:
        assert train == order[:1] and held_out == order[1:]
        assert len(list(paths.corpus_eval_dir.glob("*.txt"))) == 3  # 100 + 100 + 49
        assert not (paths.corpus_dir / "eval.all").exists()
    else:
        assert train == order[:-1] and held_out == order[-1:]
    assert manifest["train"]["documents"] == len(train)
    assert manifest["eval"]["sentences"] == sum(map(len, held_out))
    assert manifest["train"]["characters"] == sum(len(s) for d in train for s in d)
