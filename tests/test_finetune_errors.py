"""Bad labelled data for the finetune stage (issue 40, point 5): a labelled file with a missing
column, an unknown label at test time, an empty split, a label column that is all one class, a
pair task given one text column, a QA answer that is not in its context. Each is exit 2 with one
line naming the file, the line (or question id) and the key, and the outputs of an earlier good
run in <run_dir>/finetune/<name>/ stay as they were.

The readers are tested directly (fast, every variant); one full CLI invocation per case runs
against a run directory that one good fine-tuning run (a 1-layer, hidden-32 encoder, 2 steps)
filled first.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pipeline.finetuning import data as fd
from pipeline.finetuning import readers
from tests.test_finetune_data import write_vocab

RAISES = readers.FinetuneDataError


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _message(function, *args, **kwargs) -> str:
    """The error `function(*args, **kwargs)` raises: a FinetuneDataError (exit 2, as a
    ValueError) whose message is one line."""
    assert issubclass(RAISES, ValueError)
    with pytest.raises(RAISES) as info:
        function(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def _names(message: str, *parts: str) -> None:
    missing = [p for p in parts if p not in message]
    assert not missing, f"{missing} not in: {message}"


ROWS = "".join(f"the {w} sat here,{'pos' if i % 2 else 'neg'}\n"
               for i, w in enumerate(["cat", "dog", "bird", "tree"] * 5))  # lines 2-21


# --- a labelled file with a missing column ---------------------------------------------------


def test_missing_column_or_value_names_file_line_and_column(tmp_path):
    f = _write(tmp_path / "nolabel.csv", "text,tag\n" + ROWS)
    _names(_message(readers.read_table, f),
           f"{f}:1:", "no column 'label'", "(finetune.label_column)", "['text', 'tag']")
    # A short row (no value in the label column) after a blank line and a quoted field that
    # spans two lines: the line is the row's own line in the file.
    f = _write(tmp_path / "short.csv", 'text,label\n"a cat\nsat",pos\n\nthe dog,neg\nthe bird\n')
    _names(_message(readers.read_table, f),
           f"{f}:6:", "no value in column 'label'", "(finetune.label_column)")
    f = _write(tmp_path / "empty.csv", "text,label\nthe cat,pos\nthe dog,  \n")
    _names(_message(readers.read_table, f),
           f"{f}:3:", "column 'label'", "is empty")
    f = _write(tmp_path / "missing.jsonl", '{"text": "a", "label": "x"}\n\n{"text": "b"}\n')
    _names(_message(readers.read_table, f),
           f"{f}:3:", "no column 'label'", "(finetune.label_column)")
    f = _write(tmp_path / "null.jsonl",
               '{"text": "a", "label": "x"}\n{"text": null, "label": "y"}\n')
    _names(_message(readers.read_table, f),
           f"{f}:2:", "no value in column 'text'", "(finetune.text_column)")
    # An unquoted comma shifts the columns: more fields than the header names.
    f = _write(tmp_path / "shifted.csv", "text,label\nthe cat,pos\nA cat, big,pos\n")
    _names(_message(readers.read_table, f), f"{f}:3:", "3 fields", "2 columns", "quote")
    f = _write(tmp_path / "scores.tsv", "text\tscore\nthe cat\t0.5\nthe dog\tnan\n")
    _names(_message(readers.read_table, f, ("text", "", "score"), regression=True),
           f"{f}:3:", "column 'score'", "not a number")


def test_rows_keep_their_file_lines(tmp_path):
    f = _write(tmp_path / "a.csv", 'text,label\n"a cat\nsat",pos\n\nthe dog,neg\n')
    assert [e.source for e in readers.read_table(f)] == [f"{f}:2", f"{f}:5"]


# --- an unknown label at test time -----------------------------------------------------------


def test_unknown_tag_in_a_test_file_names_its_own_line(tmp_path):
    train = readers.read_conll(_write(tmp_path / "train.txt", "Paris B-LOC\nis O\n\nJohn B-PER\n"))
    test = readers.read_conll(_write(tmp_path / "test.txt",
                                     "-DOCSTART- O\n\nJohn B-PER\nis O\nin O\nRome B-LOCATION\n"))
    labels = fd.label_set(train)
    message = _message(fd.check_labels, test, labels, "test")
    _names(message, f"{tmp_path / 'test.txt'}:6:", "label 'B-LOCATION'", "finetune.labels",
           "test split")


# --- an empty split --------------------------------------------------------------------------


def test_empty_split_names_the_file_and_the_key(tmp_path):
    f = _write(tmp_path / "valid.csv", "text,label\n\n")
    _names(_message(readers.read_table, f), f"{f}:1:", "no examples",
           "finetune.validation_file")
    f = _write(tmp_path / "blank.jsonl", "\n\n")
    _names(_message(readers.read_table, f), f"{f}:1:", "no examples")
    examples = readers.read_table(_write(tmp_path / "tiny.csv",
                                         "text,label\nthe cat,pos\nthe dog,neg\n"))
    _names(_message(fd.split_by_group, examples, 0.1, 0.1, seed=1),
           f"{tmp_path / 'tiny.csv'}:2-3:", "split", "is empty", "_fraction", "_file")
    four = readers.read_table(_write(tmp_path / "four.csv",
                                     "text,label\n" + "".join(ROWS.splitlines(True)[:4])))
    assert len(four) == 4
    _names(_message(fd.split_by_group, four, 0.45, 0.44, seed=1),
           "four.csv:2-5:", "train split", "finetune.validation_fraction")
    assert fd.split_by_group(examples, 0.0, 0.0, seed=1)[0] == examples  # nothing asked: fine


# --- a label column that is all one class ----------------------------------------------------


def test_one_class_names_the_file_lines_label_and_key(tmp_path):
    f = _write(tmp_path / "one.csv", "text,label\n" + ROWS.replace("neg", "pos"))
    train = readers.read_table(f)
    for configured in (None, ["neg", "pos"]):  # with finetune.labels too: still one class
        _names(_message(fd.label_set, train, configured),
               f"{f}:2-21:", "label 'pos'", "finetune.label_column", "at least 2")
    tags = readers.read_conll(_write(tmp_path / "o.txt", "a O\nb O\n\nc O\n"))
    _names(_message(fd.label_set, tags), "o.txt:1-4:", "'O'",
           "finetune.conll_label_column")


# --- a pair task given one text column -------------------------------------------------------


def test_pair_task_needs_a_second_text_on_every_row(tmp_path):
    f = _write(tmp_path / "single.csv", "text,label\n" + ROWS)
    _names(_message(readers.read_table, f, ("text", "text2", "label")),
           f"{f}:1:", "no column 'text2'", "(finetune.text_pair_column)")
    _names(_message(readers.read_table, f, ("text", "text", "label")),
           f"{f}:1:", "text_pair_column = text_column = 'text'")
    f = _write(tmp_path / "pairs.tsv", "q\td\tlabel\nwho\tparis\tx\nwhat\t \ty\n")
    _names(_message(readers.read_table, f, ("q", "d", "label")),
           f"{f}:3:", "column 'd'", "(finetune.text_pair_column)", "is empty")
    f = _write(tmp_path / "pairs.jsonl", '{"q": "who", "d": "paris"}\n{"q": "what"}\n')
    _names(_message(readers.read_table, f, ("q", "d", "label"), require_label=False),
           f"{f}:2:", "no column 'd'", "(finetune.text_pair_column)")
    mrpc = _write(tmp_path / "MRPC" / "train.tsv", "Quality\t#1 ID\t#1 String\n1\t1\tA cat.\n")
    _names(_message(readers.read_glue_file, mrpc, "mrpc"),
           f"{mrpc}:1:", "'#2 String'", "finetune.glue_task")


# --- a QA example whose answer is not in its context -----------------------------------------


def _squad(**change) -> dict:
    qas = [{"id": "q1", "question": "What is big?", "answers": [{"text": "Paris",
                                                                 "answer_start": 0}]},
           {"id": "q2", "question": "What is old?", "answers": [{"text": "London",
                                                                 "answer_start": 14}]}]
    qas[1]["answers"][0].update(change)
    return {"data": [{"title": "t", "paragraphs": [{"context": "Paris is big. London is old.",
                                                    "qas": qas}]}]}


def _line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_qa_answer_not_in_its_context_names_file_line_question_and_key(tmp_path):
    good = _write(tmp_path / "good.json", json.dumps(_squad(), indent=1))
    assert [e.answers for e in readers.read_squad(good)] == [[("Paris", 0)], [("London", 14)]]
    for change, says in (({"answer_start": 3}, "the text is at character 14"),
                         ({"text": "Rome"}, "nowhere in the context"),
                         ({"answer_start": "three"}, "not a character offset")):
        f = _write(tmp_path / "bad.json", json.dumps(_squad(**change), indent=1))
        line = _line_of(f, '"id": "q2"')
        _names(_message(readers.read_squad, f),
               f"{f}:{line}:", "question 'q2'", "answers[0]", says, "fix answer_start")
    broken = _squad()
    del broken["data"][0]["paragraphs"][0]["qas"][1]["answers"][0]["text"]
    f = _write(tmp_path / "nokey.json", json.dumps(broken))  # one line, as SQuAD ships
    _names(_message(readers.read_squad, f),
           f"{f}:1:", "question 'q2'", "key 'text' is missing", "answers[0]")


# --- the CLI: exit 2, one line, the earlier outputs untouched --------------------------------


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    """A run directory with one good fine-tuning run's outputs in finetune/t/, and a helper
    that runs `python -m pipeline finetune` (in process) with the same settings."""
    import keras

    from models.bert import BertEncoder
    from pipeline import cli

    root = tmp_path_factory.mktemp("finetune_errors")
    vocab = write_vocab(root / "vocab.txt")
    keras.utils.set_random_seed(0)
    BertEncoder(vocabulary_size=len(vocab), num_layers=1, num_heads=2, hidden_dim=32,
                intermediate_dim=64, max_sequence_length=64, dropout=0.0).save(root / "enc.keras")

    def finetune(*overrides) -> int:
        return cli.main([
            "finetune", "--config", "configs/test_tiny.yaml", f"run_dir={root / 'run'}",
            f"tracking.tracking_uri=sqlite:///{root / 'm.db'}", "finetune.register_model=false",
            f"finetune.init_from={root / 'enc.keras'}", f"finetune.vocab_file={root / 'vocab.txt'}",
            "finetune.max_seq_length=24", "finetune.max_query_length=8", "finetune.batch_size=8",
            "finetune.max_steps=2", "finetune.epochs=1", "finetune.baselines=false",
            "finetune.random_init_baseline=false", "finetune.name=t", *overrides])

    train = _write(root / "train.csv", "text,label\n" + ROWS * 2)
    assert finetune("finetune.dataset=csv", f"finetune.train_file={train}") == 0
    assert (root / "run" / "finetune" / "t" / "model.keras").is_file()
    return root, finetune


def _snapshot(run: Path) -> dict:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()
            and p.relative_to(run).parts[0] not in ("logs", ".pipeline.lock")}


def _conll(t):
    train = _write(t / "train.txt", "Paris B-LOC\nis O\nbig O\n\nJohn B-PER\nran O\n\n" * 3)
    test = _write(t / "test.txt", "The O\ncat O\n\nRome B-LOC\nis O\nold B-AGE\n")
    return (["finetune.task=token_classification", "finetune.dataset=conll",
             f"finetune.train_file={train}", f"finetune.test_file={test}"],
            [f"{test}:6:", "label 'B-AGE'", "finetune.labels"])


def _squad_args(t):
    f = _write(t / "squad.json", json.dumps(_squad(answer_start=3), indent=1))
    line = _line_of(f, '"id": "q2"')
    return (["finetune.task=question_answering", "finetune.dataset=squad",
             f"finetune.train_file={f}"],
            [f"{f}:{line}:", "question 'q2'", "answers[0]", "answer_start"])


def _csv(name, body, *extra, names=()):
    def build(t):
        f = _write(t / name, body)
        return (["finetune.dataset=csv", f"finetune.train_file={f}", *extra],
                [f"{f}:" + names[0], *names[1:]])
    return build


CASES = [
    ("missing column", _csv("nolabel.csv", "text,tag\n" + ROWS,
                            names=("1:", "'label'", "finetune.label_column"))),
    ("unknown label at test time", _conll),
    ("empty split", _csv("tiny.csv", "text,label\nthe cat,pos\nthe dog,neg\n",
                         names=("2-3:", "validation split", "finetune.validation_fraction"))),
    ("label column all one class", _csv("one.csv", "text,label\n" + ROWS.replace("neg", "pos"),
                                        "finetune.labels=[neg,pos]",
                                        names=("2-21:", "'pos'", "finetune.label_column"))),
    ("pair task given one text column", _csv(
        "pairs.csv", "text,text2,label\n" + "".join(
            f"the cat {i},{'' if i == 7 else 'a dog'},{'pos' if i % 2 else 'neg'}\n"
            for i in range(20)), "finetune.text_pair_column=text2",
        names=("9:", "'text2'", "finetune.text_pair_column"))),
    ("QA answer not in its context", _squad_args),
]


@pytest.mark.parametrize("name,case", CASES, ids=[c[0] for c in CASES])
def test_bad_labelled_data_is_exit_2_one_line_and_keeps_the_earlier_outputs(
        name, case, good_run, tmp_path, capsys):
    root, finetune = good_run
    before = _snapshot(root / "run")
    assert "finetune/t/model.keras" in before
    overrides, names = case(tmp_path)
    capsys.readouterr()
    assert finetune(*overrides) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, (out + err)[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    _names(lines[0], *names)
    assert _snapshot(root / "run") == before  # the earlier outputs, byte for byte
