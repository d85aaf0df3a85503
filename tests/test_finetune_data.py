"""pipeline/finetuning/data.py, readers.py, features.py: readers, label sets, seeded splits, features (small fixtures)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.finetuning import data as fd
from pipeline.finetuning import features, readers
from models import preprocessor

WORDS = ("the cat dog bird sat ran over under a big small red blue house tree river hill "
         "road saw found old new who where what is was paris london city capital of").split()


def write_vocab(path, words=WORDS):
    """A tiny Google-layout vocab: [PAD], [unused0..4], [UNK], [CLS], [SEP], [MASK], words, ##s."""
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(5)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += sorted(set(words)) + [".", ",", "?", "!", "##s", "##ed"]
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return tokens


@pytest.fixture(scope="module")
def pre(tmp_path_factory):
    vocab = write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    return preprocessor.TextPreprocessor(vocab, lowercase=True, seq_length=16)


# --- readers ---------------------------------------------------------------------------------


def test_read_table_csv_tsv_jsonl_with_column_mapping(tmp_path):
    (tmp_path / "a.csv").write_text('sentence,other,tag\n"A cat, big",x,pos\nA dog,y,neg\n')
    (tmp_path / "a.tsv").write_text("q\td\tscore\nwho\tparis\t1.5\n")
    (tmp_path / "a.jsonl").write_text('{"text": "a", "label": 1}\n\n{"text": "b", "label": 0}\n')
    csv_examples = readers.read_table(tmp_path / "a.csv", ("sentence", "", "tag"))
    assert [(e.text, e.label) for e in csv_examples] == [("A cat, big", "pos"), ("A dog", "neg")]
    assert csv_examples[0].source.endswith("a.csv:2")
    tsv = readers.read_table(tmp_path / "a.tsv", ("q", "d", "score"), regression=True)
    assert (tsv[0].text, tsv[0].text_pair, tsv[0].label) == ("who", "paris", 1.5)
    assert [e.label for e in readers.read_table(tmp_path / "a.jsonl")] == ["1", "0"]
    with pytest.raises(readers.FinetuneDataError, match=r"no column 'label'.*label_column"):
        readers.read_table(tmp_path / "a.csv", ("sentence", "", "label"))
    with pytest.raises(readers.FinetuneDataError, match="not a number"):
        readers.read_table(tmp_path / "a.csv", ("sentence", "", "tag"), regression=True)


def test_read_conll_and_squad(tmp_path):
    (tmp_path / "ner.txt").write_text("-DOCSTART- -X- O\n\nParis NNP B-LOC\nis VBZ O\n\n"
                                      "John NNP B-PER\nSmith NNP I-PER\n")
    examples = readers.read_conll(tmp_path / "ner.txt")
    assert [(e.words, e.tags) for e in examples] == [(["Paris", "is"], ["B-LOC", "O"]),
                                                     (["John", "Smith"], ["B-PER", "I-PER"])]
    squad = {"data": [{"title": "t", "paragraphs": [{"context": "Paris is big.", "qas": [
        {"id": "1", "question": "What is big?", "answers": [{"text": "Paris", "answer_start": 0}]},
        {"id": "2", "question": "Who?", "answers": [], "is_impossible": True}]}]}]}
    (tmp_path / "squad.json").write_text(json.dumps(squad))
    qa = readers.read_squad(tmp_path / "squad.json")
    assert qa[0].answers == [("Paris", 0)] and qa[1].is_impossible and qa[1].answers == []
    squad["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = 3
    (tmp_path / "bad.json").write_text(json.dumps(squad))
    with pytest.raises(readers.FinetuneDataError, match="not at character 3"):
        readers.read_squad(tmp_path / "bad.json")


def test_read_glue_task_folders(tmp_path):
    glue = tmp_path / "glue_data"
    (glue / "CoLA").mkdir(parents=True)
    (glue / "CoLA" / "train.tsv").write_text("gj04\t1\t\tThe cat sat.\ngj04\t0\t*\tCat the sat.\n")
    (glue / "CoLA" / "dev.tsv").write_text("gj04\t1\t\tThe dog ran.\n")
    (glue / "MRPC").mkdir()
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    (glue / "MRPC" / "train.tsv").write_text(header + '1\t1\t2\tHe said "hi".\tHe said hi.\n'
                                             "0\t3\t4\tA cat.\n")  # malformed: skipped
    (glue / "MRPC" / "dev.tsv").write_text(header + "0\t5\t6\tA cat.\tA dog.\n")
    (glue / "MNLI").mkdir()
    header = "index\tsentence1\tsentence2\tgold_label\n"
    for name in ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv"):
        (glue / "MNLI" / name).write_text(header + "0\tA cat sat.\tA cat.\tentailment\n")
    cola = readers.read_glue(glue, "cola")
    assert [(e.text, e.label) for e in cola["train"]] == [("The cat sat.", "1"),
                                                          ("Cat the sat.", "0")]
    mrpc = readers.read_glue(glue, "mrpc")
    assert mrpc["skipped"] == 1
    assert (mrpc["train"][0].text, mrpc["train"][0].text_pair) == ('He said "hi".', "He said hi.")
    mnli = readers.read_glue(glue, "mnli")
    assert set(mnli) == {"train", "test", "test_mismatched", "skipped"}
    with pytest.raises(readers.FinetuneDataError, match="unknown GLUE task"):
        readers.read_glue(glue, "squad")


@pytest.mark.skipif(not artifacts.BROWN_TARBALL.is_file(), reason="needs `make setup` (Brown)")
def test_brown_genre_and_pos_readers():
    examples = readers.read_brown_genre(artifacts.BROWN_TARBALL, sentences_per_example=3)
    assert len({e.group for e in examples}) == 500
    assert len({e.label for e in examples}) == 15
    assert {e.label for e in examples if e.group == "brown/ca01"} == {"press_reportage"}
    groups = {readers.brown_genre(e.group, "group") for e in examples}
    assert groups == {"press", "nonfiction", "learned", "fiction"}


# --- labels and splits -----------------------------------------------------------------------


def test_label_set_and_unknown_label_error():
    train = [readers.TextExample("a", label="pos"), readers.TextExample("b", label="neg")]
    assert fd.label_set(train) == ["neg", "pos"]
    assert fd.label_set(train, ["pos", "neg"]) == ["pos", "neg"]
    bad = [readers.TextExample("c", label="neutral", source="dev.csv:7")]
    with pytest.raises(readers.FinetuneDataError, match=r"dev.csv:7: label 'neutral' is not in"):
        fd.check_labels(bad, ["neg", "pos"], "validation")
    with pytest.raises(readers.FinetuneDataError, match="at least 2"):
        fd.label_set(train[:1])


def test_split_by_group_is_seeded_disjoint_and_stratified():
    examples = [readers.TextExample(f"t{d}-{i}", label="ab"[d % 2], group=f"doc{d}")
                for d in range(40) for i in range(3)]
    a = fd.split_by_group(examples, 0.2, 0.2, seed=7)
    b = fd.split_by_group(examples, 0.2, 0.2, seed=7)
    c = fd.split_by_group(examples, 0.2, 0.2, seed=8)
    assert a[3] == b[3] and a[3]["groups"] != c[3]["groups"]
    train, val, test, record = a
    groups = [set(record["groups"][s]) for s in ("train", "validation", "test")]
    assert not (groups[0] & groups[1] or groups[0] & groups[2] or groups[1] & groups[2])
    assert len(train) + len(val) + len(test) == len(examples)
    assert len(groups[2]) == 8 and len(groups[1]) == 8  # 20% of 20 documents per label, twice
    assert {e.label for e in test} == {"a", "b"}
    assert {e.group for e in test} == groups[2]


def test_load_task_from_csv_records_splits_and_rejects_unknown_test_labels(tmp_path):
    rows = "text,label\n" + "".join(f"text {i},{'xy'[i % 2]}\n" for i in range(40))
    (tmp_path / "train.csv").write_text(rows)
    (tmp_path / "test.csv").write_text("text,label\nz,x\n")
    train = f"finetune.train_file={tmp_path}/train.csv"
    cfg = config_lib.load(None, ["finetune.dataset=csv", train,
                                 "finetune.validation_fraction=0.25"])
    data = fd.load_task(cfg.finetune)
    assert data.labels == ["x", "y"]
    # stratified: per label 20 rows -> round(0.1 * 20) = 2 test, round(0.25 * 20) = 5 validation
    assert data.splits["counts"] == {"train": 26, "validation": 10, "test": 4}
    assert data.splits["split"]["seed"] == 12345
    assert data.splits["files"]["train"]["sha256"]
    (tmp_path / "test.csv").write_text("text,label\nz,w\n")
    cfg = config_lib.load(None, ["finetune.dataset=csv", train,
                                 f"finetune.test_file={tmp_path}/test.csv"])
    with pytest.raises(readers.FinetuneDataError, match=r"test.csv:2: label 'w' is not in"):
        fd.load_task(cfg.finetune)


def test_finetune_config_validation_messages():
    def error(*overrides):
        with pytest.raises(config_lib.ConfigError) as info:
            config_lib.load(None, list(overrides))
        return str(info.value)

    assert "finetune.dataset = 'brown_genre' cannot feed finetune.task = 'question_answering'" \
        in error("finetune.task=question_answering")
    assert "choose one of: none, encoder, all_but_last_n" in error("finetune.freeze=half")
    assert "finetune.learning_rate = 0.5 is out of range" in error("finetune.learning_rate=0.5")
    assert "finetune.train_file is empty" in error("finetune.dataset=csv")
    assert "finetune.glue_task" in error("finetune.dataset=glue", "finetune.glue_dir=x")
    assert "use task regression" in error("finetune.dataset=glue", "finetune.glue_dir=x",
                                          "finetune.glue_task=sts-b")
    assert "text_pair_column is empty" in error("finetune.task=semantic_search",
                                                "finetune.dataset=csv", "finetune.train_file=a")
    assert "KEY=V1,V2" in error("finetune.sweep=[lr]")
    cfg = config_lib.load(None, ["finetune.learning_rate=0.001", "finetune.batch_size=4"])
    warnings = config_lib.finetune_warnings(cfg)
    assert any("learning_rate" in w for w in warnings) and any("batch_size" in w for w in warnings)
    assert config_lib.finetune_warnings(config_lib.load(None)) == []


# --- features --------------------------------------------------------------------------------


def test_text_preprocessor_packs_single_and_pairs(pre):
    f = pre.features(["The cat sat.", "a dog"], ["the tree", "red house"])
    ids = [pre.vocab[i] for i in f["token_ids"][0] if i]
    assert ids == ["[CLS]", "the", "cat", "sat", ".", "[SEP]", "the", "tree", "[SEP]"]
    assert f["segment_ids"][0].tolist()[:9] == [0] * 6 + [1] * 3
    assert f["padding_mask"][0].sum() == 9 and f["token_ids"].shape == (2, 16)
    single = pre.features(["Cats"])
    assert [pre.vocab[i] for i in single["token_ids"][0] if i] == ["[CLS]", "cat", "##s", "[SEP]"]
    long = pre.features(["the cat " * 20])
    assert long["padding_mask"].sum() == 16 and pre.vocab[long["token_ids"][0, -1]] == "[SEP]"


def test_token_features_label_first_piece_only(pre):
    examples = [readers.TokenExample(["Cats", "sat", "zzz"], ["B-X", "O", "O"])]
    f = features.token_features(examples, pre, ["B-X", "O"])
    # [CLS] cat ##s sat [UNK] [SEP]
    assert [pre.vocab[i] for i in f["token_ids"][0][:6]] == ["[CLS]", "cat", "##s", "sat", "[UNK]",
                                                             "[SEP]"]
    assert f["weights"][0][:6].tolist() == [0, 1, 0, 1, 1, 0]
    assert f["labels"][0][[1, 3, 4]].tolist() == [0, 1, 1]
    assert f["word_positions"] == [[1, 3, 4]]
    logits = np.zeros((1, 16, 2))
    logits[0, 1, 0] = logits[0, 3, 1] = logits[0, 4, 0] = 5
    assert features.token_predictions(logits, f, examples, ["B-X", "O"], "O") == [["B-X", "O", "B-X"]]
    long = [readers.TokenExample(["cat"] * 20, ["O"] * 20)]
    f = features.token_features(long, pre, ["B-X", "O"])
    assert f["truncated_words"] == 6 and len(f["word_positions"][0]) == 14


def test_qa_features_windows_and_answer_recovery(pre):
    context = "The old city of Paris is the capital. " * 3 + "London is a big city."
    start = context.index("London")
    examples = [readers.QAExample("q1", "what is big?", context, [("London", start)]),
                readers.QAExample("q2", "who?", "a cat sat.", [], is_impossible=True)]
    f = features.qa_features(examples, pre, max_query_length=4, doc_stride=4)
    assert f["token_ids"].shape[1] == 16
    windows = [i for i, e in enumerate(f["example_index"]) if e == 0]
    assert len(windows) > 3  # a long context becomes several windows
    with_answer = [i for i in windows if f["start_positions"][i] > 0]
    assert with_answer
    for i in with_answer:
        s, e = f["start_positions"][i], f["end_positions"][i]
        assert pre.vocab[f["token_ids"][i][s]] == "london" and s == e
        assert f["segment_ids"][i][s] == 1
    # Logits that point at the gold span recover the original text (character span).
    start_logits = np.full(f["token_ids"].shape, -5.0)
    end_logits = np.full(f["token_ids"].shape, -5.0)
    for i in with_answer:
        start_logits[i, f["start_positions"][i]] = end_logits[i, f["end_positions"][i]] = 5.0
    q2 = [i for i, e in enumerate(f["example_index"]) if e == 1]
    start_logits[q2, 0] = end_logits[q2, 0] = 9.0  # [CLS]: no answer
    logits = {"start_logits": start_logits, "end_logits": end_logits}
    answers = features.qa_predictions(examples, f, logits, {"version_2": True})
    assert answers == {"q1": "London", "q2": ""}
    # v1: always a span, never "".
    assert features.qa_predictions(examples, f, logits)["q2"] != ""


def test_every_finetune_config_file_loads():
    from pathlib import Path

    files = sorted(Path(config_lib.__file__).resolve().parents[2].glob("configs/finetune_*.yaml"))
    assert len(files) >= 2
    for path in files:
        config_lib.load(path)
