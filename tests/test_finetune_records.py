"""Fine-tuning features written once by a Beam job and streamed (pipeline/finetuning/records.py,
beam_jobs/finetune_data.py): the pure-Python features equal the in-graph ones for every task,
the records parse back to them, a second run reuses the folder, and evaluation over the
records equals evaluation in memory."""

from __future__ import annotations

import json
import random
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from beam_jobs.example_encoder import encode_features
from models import preprocessor
from models.bert import BertEncoder
from pipeline import config as config_lib
from pipeline.finetuning import data as fd
from pipeline.finetuning import readers, records, tasks
from pipeline.finetuning.context import TokenizerBundle
from pipeline.text.packing import PythonPreprocessor, round_robin
from tests.conftest import PipelineLines
from tests.test_finetune_data import WORDS, write_vocab

SEQ = 24


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    return path, write_vocab(path)


def _text(rng, n):
    words = [rng.choice(WORDS + ["Zebra", "cats", "ran,", "naïve", "3.5"]) for _ in range(n)]
    return " ".join(words)


def test_python_preprocessor_equals_the_in_graph_one(vocab):
    """Single texts and pairs, short and truncated (round robin), words with pieces and [UNK]."""
    _, tokens = vocab
    rng = random.Random(3)
    graph = preprocessor.TextPreprocessor(tokens, True, SEQ)
    python = PythonPreprocessor(tokens, True, SEQ)
    texts = [_text(rng, rng.randint(0, 30)) for _ in range(60)]
    pairs = [_text(rng, rng.randint(0, 30)) for _ in range(60)]
    for a, b in ((graph.features(texts), python.features(texts)),
                 (graph.features(texts, pairs), python.features(texts, pairs))):
        for key in ("token_ids", "segment_ids", "padding_mask"):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert graph.tokenize_words(texts) == python.tokenize_words(texts)
    assert round_robin([10, 2], 8) == [6, 2] and round_robin([5, 5], 7) == [4, 3]


def test_encode_features_parses_back_with_tensorflow():
    row = {"ids": ("int64", [0, 5, 300, -1, 2 ** 40]), "w": ("float", [0.5, -2.0]),
           "label": ("int64", [3])}
    parsed = tf.io.parse_single_example(encode_features(row), {
        "ids": tf.io.FixedLenFeature([5], tf.int64), "w": tf.io.FixedLenFeature([2], tf.float32),
        "label": tf.io.FixedLenFeature([], tf.int64)})
    assert parsed["ids"].numpy().tolist() == [0, 5, 300, -1, 2 ** 40]
    assert parsed["w"].numpy().tolist() == [0.5, -2.0] and int(parsed["label"]) == 3


def _examples(task: str, rng) -> tuple[list, list | None, bool]:
    """(examples, labels, pair) of each task's shape."""
    if task in ("classification", "long_documents"):
        n = 30 if task == "long_documents" else 8
        return ([readers.TextExample(_text(rng, rng.randint(3, 40 if n == 30 else 12)),
                                     label=rng.choice(["x", "y"])) for _ in range(n)],
                ["x", "y"], False)
    if task == "regression":
        return ([readers.TextExample(_text(rng, 8), text_pair=_text(rng, 20), label=rng.random())
                 for _ in range(8)], None, True)
    if task == "token_classification":
        out = []
        for _ in range(8):
            words = _text(rng, rng.randint(1, 30)).split() or ["cat"]
            out.append(readers.TokenExample(words, [rng.choice(["B-X", "O"]) for _ in words]))
        return out, ["B-X", "O"], False
    if task == "question_answering":
        out = []
        for i in range(6):
            context = _text(rng, 60) + " the red house ."
            answers = [] if i % 3 == 0 else [("red house", context.index("red house"))]
            out.append(readers.QAExample(f"q{i}", _text(rng, 5), context, answers,
                                         is_impossible=not answers))
        return out, None, False
    return ([readers.TextExample(_text(rng, 6), text_pair=_text(rng, 10))
             for _ in range(8)], None, True)


@pytest.mark.parametrize("name", ["classification", "long_documents", "regression",
                                  "token_classification", "question_answering",
                                  "semantic_search"])
def test_beam_rows_equal_the_in_memory_rows(vocab, name):
    """What the Beam workers write (RowEncoder: pure Python, examples in JSON) equals the
    task's rows from the in-graph preprocessor, every key, for every task's features."""
    _, tokens = vocab
    overrides = {"long_documents": {"task": "classification", "long_doc_aggregation": "mean",
                                    "window_stride": 8, "max_windows": 3},
                 "question_answering": {"task": name, "max_query_length": 6, "doc_stride": 8}}
    fc = config_lib.FinetuneConfig(**overrides.get(name, {"task": name}),
                                   max_seq_length=SEQ)
    task = tasks.get(fc.task, fc)
    examples, labels, pair = _examples(name, random.Random(hash(name) % 100))
    graph = preprocessor.TextPreprocessor(tokens, True, SEQ)
    expected = task.rows(task.make_split(examples, graph, labels, pair))
    tokenizer = TokenizerBundle(tokens, Path("vocab.txt"), True, SEQ)
    encoder = records.RowEncoder(fc.task, fc, tokenizer, labels, pair)
    items = [json.loads(records.example_json(i, e)) for i, e in enumerate(examples)]
    got, inputs = encoder.row_arrays(items)
    assert set(got) == set(expected) and set(inputs) <= set(got)
    for key in expected:
        np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(expected[key]),
                                      err_msg=key)
    if name == "question_answering":  # several windows per question: rows are windows
        assert len(got["example_index"]) > len(examples)


def write_animal_place_csv(folder) -> None:
    """folder/train.csv: 60 seeded rows, "animal" and "place" texts in turn."""
    rng = random.Random(0)
    rows = ["text,label"] + [f"{'the cat ' if i % 2 else 'a red house '}"
                             f"{' '.join(rng.choice(WORDS) for _ in range(6))},"
                             f"{'animal' if i % 2 else 'place'}" for i in range(60)]
    (folder / "train.csv").write_text("\n".join(rows) + "\n")


def _classification_config(tmp_path, model, vocab_path, *overrides):
    write_animal_place_csv(tmp_path)
    return config_lib.load(None, [
        f"run_dir={tmp_path}/run", f"finetune.init_from={model}",
        f"finetune.vocab_file={vocab_path}", "finetune.dataset=csv",
        f"finetune.train_file={tmp_path}/train.csv", f"finetune.max_seq_length={SEQ}",
        "finetune.batch_size=8", *overrides])


def test_records_are_written_once_reused_and_read_back(tmp_path, vocab):
    """The Beam job writes every split with a spec, lineage and checksums; the second run
    with the same data and tokenizer reuses the folder; a changed setting makes a new one;
    tf.data reads training batches and evaluation rows equal to the in-memory features."""
    vocab_path, tokens = vocab
    keras.utils.set_random_seed(0)
    model = tmp_path / "encoder.keras"
    BertEncoder(vocabulary_size=len(tokens), num_layers=1, num_heads=2, hidden_dim=16,
                intermediate_dim=32, max_sequence_length=SEQ, dropout=0.0).save(model)
    config = _classification_config(tmp_path, model, vocab_path)
    task = tasks.get("classification", config.finetune)
    data = fd.load_task(config.finetune)
    tokenizer = TokenizerBundle(tokens, vocab_path, True, SEQ)
    with PipelineLines() as lines:
        splits = records.write_or_reuse(config, task, data, tokenizer)
    folder = next((tmp_path / "run" / "finetune_features").iterdir())
    assert "wrote" in lines[-1] and (folder / "checksums.json").is_file()
    lineage = json.loads((folder / records.LINEAGE).read_text())
    assert lineage["task"] == "classification" and lineage["settings"]["max_seq_length"] == SEQ
    assert len(splits["train"]) == len(data.train) and len(splits["test"]) == len(data.test)

    with PipelineLines() as lines:
        again = records.write_or_reuse(config, task, data, tokenizer)
    assert "reusing" in lines[-1] and again["train"].files == splits["train"].files
    changed = dataclass_replace(config, max_seq_length=SEQ - 4)
    records.write_or_reuse(changed, tasks.get("classification", changed.finetune), data,
                           tokenizer)
    assert len(list((tmp_path / "run" / "finetune_features").iterdir())) == 2

    # Evaluation rows from the records == the in-memory rows, in example order.
    graph = preprocessor.TextPreprocessor(tokens, True, SEQ)
    memory = task.rows(task.make_split(data.test, graph, data.labels, data.pair))
    streamed = {k: np.concatenate([r[k] for r, _ in splits["test"].batches(4)])
                for k in memory}
    order = np.argsort(streamed["example_index"])
    for key in memory:
        np.testing.assert_array_equal(streamed[key][order], memory[key], err_msg=key)
    # Training batches: (x, y) with the model's inputs, shuffled, endless.
    x, y = next(iter(splits["train"].dataset(8, 100, seed=1)))
    assert set(x) == {"token_ids", "segment_ids", "padding_mask"} and x["token_ids"].shape == (8, SEQ)
    assert set(y) == {"logits"}


def dataclass_replace(config, **finetune):
    import dataclasses

    return dataclasses.replace(config, finetune=dataclasses.replace(config.finetune, **finetune))


PEAK_RSS = """
import resource, sys
from pipeline import cli
code = cli.main(sys.argv[1:])
print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def _peak_rss_mb(tmp_path, name, model, vocab_path, examples: int, seq: int) -> float:
    import subprocess
    import sys

    rng = random.Random(examples)
    folder = tmp_path / name
    folder.mkdir()
    rows = ["text,label"] + [f"{' '.join(rng.choice(WORDS) for _ in range(6))},"
                             f"{rng.choice(['a', 'b'])}" for _ in range(examples)]
    (folder / "train.csv").write_text("\n".join(rows) + "\n")
    args = ["finetune", f"run_dir={folder}/run", f"finetune.init_from={model}",
            f"finetune.vocab_file={vocab_path}", "finetune.dataset=csv",
            f"finetune.train_file={folder}/train.csv", f"finetune.max_seq_length={seq}",
            "finetune.batch_size=8", "finetune.max_steps=4", "finetune.baselines=false",
            # no SavedModel: its size does not depend on the data (test_finetune.py tests it)
            "finetune.export=false", "finetune.register_model=false",
            f"tracking.tracking_uri=sqlite:///{folder}/m.db",
            "finetune.validation_fraction=0.02", "finetune.test_fraction=0.02"]
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, *args], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("PEAK_RSS_KB"))
    return int(line.split()[1]) / 1024


@pytest.mark.slow  # two fine-tuning processes
def test_features_stream_so_memory_does_not_grow_with_the_data(tmp_path, vocab):
    """8x the training examples at seq 512: held in memory as int32 features they would add
    `grown` MB (3 arrays of examples x 512); streamed from the Beam job's TFRecords the
    process's peak RSS grows by less than half of that (the raw examples stay in memory)."""
    vocab_path, tokens = vocab
    keras.utils.set_random_seed(0)
    model = tmp_path / "encoder.keras"
    BertEncoder(vocabulary_size=len(tokens), num_layers=1, num_heads=2, hidden_dim=16,
                intermediate_dim=32, max_sequence_length=512, dropout=0.0).save(model)
    small, large, seq = 2_000, 16_000, 512
    grown = (large - small) * seq * 3 * 4 / 2 ** 20  # the features' MB, in memory
    base = _peak_rss_mb(tmp_path, "small", model, vocab_path, small, seq)
    big = _peak_rss_mb(tmp_path, "large", model, vocab_path, large, seq)
    print(f"peak RSS {base:.0f} MB at {small:,} examples, {big:.0f} MB at {large:,}; "
          f"in-memory features would add {grown:.0f} MB")
    assert big - base < grown / 2, (base, big, grown)
