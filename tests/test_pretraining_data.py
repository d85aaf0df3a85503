"""Tests of beam_jobs.pretraining_data (and the shared transforms it uses).

A tiny vocab and corpus are written into tmp_path; the Beam runs use the
in-process FnApiRunner so nothing tries to download the Prism runner.

Instance creation and masking on their own (against Google's reference algorithm):
tests/test_instances.py.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import random
import shutil
import subprocess
import sys

import pytest

apache_beam = pytest.importorskip("apache_beam")

from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline  # noqa: E402
from apache_beam.testing.util import assert_that, equal_to  # noqa: E402

from beam_jobs import (
    example_encoder,  # noqa: E402
    instances,
    reading,  # noqa: E402
    schema,
    transforms,
)
from beam_jobs import pretraining_data as pd
from models.tokenizer import read_vocab
from pipeline.training import inputs
from tests.test_instances import MAX_PRED, MAX_SEQ, special_ids  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNER = ["--runner=FnApiRunner", "--direct_running_mode=in_memory"]

WORDS = ("the a of and to in is was he she it that for on with as his her at by from this "
         "had not are but be they have one all were we when there can an which their said "
         "cafe river stone light house water under over quick brown fox jumps lazy dog "
         "jumping rivers stones").split()


def write_vocab(path, drop=()):
    """A small vocab in Google's order, but with 5 unused tokens so that the special ids
    are not Google's (the code must look them up by string). Has "##" pieces."""
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(5)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens = [t for t in tokens if t not in drop]
    letters = "abcdefghijklmnopqrstuvwxyz"
    tokens += list(letters) + [f"##{c}" for c in letters] + [".", ",", "'"]
    tokens += [w for w in dict.fromkeys(WORDS) if w not in tokens and w not in
               ("jumping", "rivers", "stones")]
    tokens += ["jump", "##ing", "##s"]  # jumping = jump ##ing; rivers = river ##s
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return str(path)


def make_documents(num_documents, seed=0):
    rng = random.Random(seed)
    documents = []
    for _ in range(num_documents):
        sentences = []
        for _ in range(rng.randint(2, 14)):
            words = [rng.choice(WORDS) for _ in range(rng.randint(3, 14))]
            sentences.append(" ".join(words).capitalize() + " .")
        documents.append(sentences)
    return documents


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """3 files, 60 documents: one single-sentence document, 2 extra blank lines
    (empty documents), an accented word, and a document that tokenizes to nothing."""
    root = tmp_path_factory.mktemp("corpus")
    vocab_file = write_vocab(root / "vocab.txt")
    documents = make_documents(59, seed=1)
    documents[3] = ["Café au lait ."]  # single sentence; accents stripped when lowercasing
    files = [documents[:20], documents[20:40], documents[40:]]
    texts = ["\n\n".join("\n".join(d) for d in docs) + "\n" for docs in files]
    texts[1] = texts[1].replace("\n\n", "\n\n\n", 2)  # two empty documents
    texts[2] += "\n\u200b\n"  # a document with no tokens (zero-width space only)
    (root / "in").mkdir()
    for i, text in enumerate(texts):
        (root / "in" / f"part-{i:05d}.txt").write_text(text, encoding="utf-8")
    return dict(root=root, vocab_file=vocab_file, documents=documents,
                pattern=str(root / "in" / "*.txt"))


def job_args(corpus, output_dir, *extra, seed=12345):
    return ["--input", corpus["pattern"], "--output_dir", str(output_dir), "--split", "train",
            "--vocab_file", corpus["vocab_file"], "--lowercase", "true",
            "--max_seq_length", str(MAX_SEQ), "--max_predictions_per_seq", str(MAX_PRED),
            "--masked_lm_prob", "0.15", "--short_seq_prob", "0.1", "--dupe_factor", "2",
            "--seed", str(seed), "--num_shards", "3", "--group_size_mb", "0.008",
            "--read_chunk_mb", "0.004", *extra]


def read_records(output_dir, split="train"):
    """(shard paths, records in file order) read without TensorFlow."""
    files = sorted(glob.glob(os.path.join(str(output_dir), f"{split}-*{schema.SHARD_SUFFIX}")))
    records = []
    for path in files:
        with open(path, "rb") as handle:
            for frame in transforms.iter_tfrecord_frames(handle):
                records.append(frame[12:-4])
    return files, records


def parse(records, max_seq=MAX_SEQ, max_pred=MAX_PRED):
    import tensorflow as tf

    parsed = tf.io.parse_example(tf.constant(records), inputs.parse_spec(max_seq, max_pred))
    return {name: value.numpy() for name, value in parsed.items()}


@pytest.fixture(scope="module")
def run_a(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("run_a")
    stats = pd.run(job_args(corpus, out, *RUNNER))
    return out, stats




# ---------------------------------------------------------------------------
# Reading and tokenizing
# ---------------------------------------------------------------------------
def test_split_documents_and_decode():
    text = "\n  \nA one .\r\nA two .\n\n\n\nB one .\n \t\nC one .\n\n"
    documents, empty = reading.split_documents(text)
    assert documents == [["A one .", "A two ."], ["B one ."], ["C one ."]]
    assert empty == 2  # the 2 extra blank lines between A and B
    with pytest.raises(ValueError, match=r"x\.txt: not valid UTF-8 at byte offset 3"):
        reading.decode_utf8(b"abc\xff", "x.txt")


def test_split_sentences():
    text = ('Mr. Smith met Dr. J. Watson at 5 p.m. in the U.S. yesterday. "Really?" she '
            'asked! It cost $3.50 (e.g. a lot). Fine.\nNew line here.')
    assert reading.split_sentences(text) == [
        "Mr. Smith met Dr. J. Watson at 5 p.m. in the U.S. yesterday.", '"Really?" she asked!',
        "It cost $3.50 (e.g. a lot).", "Fine.", "New line here."]
    assert reading.split_sentences("  ") == []


def test_ranges_of_any_size_read_the_same_documents(tmp_path):
    """A document belongs to the range holding its first byte: every range size gives the
    documents (ids = byte offsets) and empty-document counts of reading the whole file."""
    rng = random.Random(0)
    path = tmp_path / "f.txt"
    for trial in range(60):
        parts = []
        for _ in range(rng.randint(0, 12)):
            kind = rng.random()
            if kind < 0.3:
                parts.append("\n" * rng.randint(1, 4))
            elif kind < 0.4:
                parts.append("  \t\n")
            else:
                words = " ".join(f"w{rng.randint(0, 9)}" for _ in range(rng.randint(1, 6)))
                parts.append(words + ("\n" if rng.random() < 0.9 else "\r\n"))
        text = "".join(parts)
        path.write_bytes(text.encode())
        expected, empty = reading.split_documents(text)
        for chunk in (1, 2, 3, 7, 16, 10_000):
            counters: dict = {}
            documents = [doc for r in reading.plan_input(str(path), chunk)
                         for doc in reading.read_range(r, counters=counters)]
            assert [sentences for _, sentences in documents] == expected, (trial, chunk, text)
            assert counters.get("skipped/empty_documents", 0) == empty, (trial, chunk, text)
            for (doc_path, offset), sentences in documents:
                assert doc_path == str(path)
                assert text.encode()[offset:].decode().startswith(sentences[0][:2])


def test_input_formats_gzip_and_jsonl(tmp_path):
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(b"One .\nTwo .\n\n\nThree .\n"))
    lines = [json.dumps({"text": "First one. Second one.\nThird one."}), "not json",
             json.dumps({"body": "no text field"}), "", json.dumps({"text": "  "}),
             json.dumps({"text": "Last."})]
    (tmp_path / "b.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "c.txt").write_text("A wrapped paragraph. It goes\non. Here.\n\nNext block.\n")

    def read(pattern, fmt):
        counters: dict = {}
        docs = [d for r in reading.plan_input(str(tmp_path / pattern), 8)
                for d in reading.read_range(r, fmt, "text", counters)]
        return [sentences for _, sentences in docs], counters

    assert read("a.txt.gz", "google") == ([["One .", "Two ."], ["Three ."]],
                                          {"skipped/empty_documents": 1})
    assert read("b.jsonl", "jsonl") == (
        [["First one.", "Second one.", "Third one."], ["Last."]],
        {"skipped/jsonl_invalid_json": 1, "skipped/jsonl_missing_text_field": 1,
         "skipped/jsonl_empty_text": 1})
    assert read("c.txt", "text") == ([["A wrapped paragraph.", "It goes on.", "Here."],
                                      ["Next block."]], {})
    # a compressed file is one range, whatever the chunk size; its refs carry the bytes
    (ref_range,) = reading.plan_input(str(tmp_path / "a.txt.gz"), 1)
    assert ref_range.end is None
    refs = list(reading.index_range(ref_range))
    assert all(isinstance(ref, bytes) for _, ref in refs)


def test_tokenizer_cache_gives_the_ids_of_whole_lines(tmp_path):
    """Word-by-word with a cache (even a full one) = the contract's rules on whole lines."""
    from models.tokenizer import Tokenizer, basic_words, wordpiece

    vocab = read_vocab(write_vocab(tmp_path / "v.txt"))
    lines = ["The quick brown fox, jumping over rivers!", "Café\u3000au\xa0lait .",
             "ab\x1ccd\u200b ef\tgh", "中文 text", "x" * 250 + " dog", "[MASK] it's", "", "  ",
             "ΑΣ.Α ΑΣ", "a\x0bb\x85c\u2028d"]
    rng = random.Random(3)
    lines += [" ".join(rng.choice(WORDS + ["Xyz", "dogs!", "(it)"]) for _ in range(12))
              for _ in range(200)]
    index = {t: i for i, t in enumerate(vocab)}
    expected = [[i for w in basic_words(line, True) for i in wordpiece(w, index, index["[UNK]"])]
                for line in lines]
    full = Tokenizer(vocab, lowercase=True)
    assert full.tokenize(lines) == expected
    assert full.tokenize(lines) == expected  # now from the cache
    small = Tokenizer(vocab, lowercase=True, cache_words=5)
    assert small.tokenize(lines) == expected
    ids = {t: i for i, t in enumerate(vocab)}
    assert full.tokenize(["Jumping rivers"]) == [[ids["jump"], ids["##ing"], ids["river"],
                                                  ids["##s"]]]


def test_read_and_tokenize_transforms(tmp_path):
    vocab_file = write_vocab(tmp_path / "vocab.txt")
    vocab = read_vocab(vocab_file)
    ids = {token: i for i, token in enumerate(vocab)}
    path_a, path_b = tmp_path / "a.txt", tmp_path / "b.txt"
    path_a.write_text("The dog .\nA fox\n\n\n\nCafé ?\n", encoding="utf-8")
    path_b.write_text("\nit was\n", encoding="utf-8")
    expected_docs = [((str(path_a), 0), ["The dog .", "A fox"]),
                     ((str(path_a), 19), ["Café ?"]),
                     ((str(path_b), 1), ["it was"])]
    expected_ids = [((str(path_a), 0), [[ids["the"], ids["dog"], ids["."]],
                                        [ids["a"], ids["fox"]]]),
                    ((str(path_a), 19), [[ids["cafe"], ids["[UNK]"]]]),  # accent stripped
                    ((str(path_b), 1), [[ids["it"], ids["was"]]])]
    with BeamTestPipeline(options=PipelineOptions(RUNNER)) as p:
        read = p | "ReadDocuments" >> reading.ReadDocuments(f"{path_a},{tmp_path}/b*.txt")
        tokenized = read.documents | "Tokenize" >> transforms.TokenizeDocuments(vocab_file, True)
        assert_that(read.documents, equal_to(expected_docs), label="CheckDocuments")
        assert_that(tokenized.documents, equal_to(expected_ids), label="CheckIds")
        assert_that(read.stats, equal_to([{"skipped/empty_documents": 2}]), label="CheckSkips")


def test_example_encoder_is_byte_identical_to_schema_serialize():
    pytest.importorskip("tensorflow")
    rng = random.Random(1)
    special = special_ids(vocab_size=30_522)
    for max_seq, max_pred, vocab in ((MAX_SEQ, MAX_PRED, 30_522), (512, 80, 30_522),
                                     (8, 1, 300)):
        encoder = example_encoder.ExampleEncoder(max_seq, max_pred, vocab)
        for _ in range(40):
            n = rng.randint(5, max_seq)
            k = rng.randint(0, min(max_pred, n - 3))
            a_length = rng.randint(2, n - 2)
            instance = instances.TrainingInstance(
                token_ids=[special.cls] + [rng.randint(0, vocab - 1) for _ in range(n - 1)],
                a_length=a_length, label=rng.randint(0, 1),
                masked_lm_positions=sorted(rng.sample(range(1, n), k)),
                masked_lm_ids=[rng.randint(0, vocab - 1) for _ in range(k)],
                masked_lm_branches=[instances.MASK] * k)
            assert encoder.encode_instance(instance) == inputs.serialize(
                instance.features(), max_seq, max_pred)


def test_vocab_checks(tmp_path):
    vocab = read_vocab(write_vocab(tmp_path / "v.txt"))
    special = instances.SpecialIds.from_vocab(vocab)
    assert (special.pad, special.unk, special.cls, special.sep, special.mask) == (0, 6, 7, 8, 9)
    assert vocab.index("##ing") in special.continuation and vocab.index("jump") not in \
        special.continuation
    bad = write_vocab(tmp_path / "no_mask.txt", drop=("[MASK]",))
    with pytest.raises(ValueError, match=r"no_mask\.txt has no \[MASK\] token"):
        instances.SpecialIds.from_vocab(read_vocab(bad), bad)


# ---------------------------------------------------------------------------
# The whole job
# ---------------------------------------------------------------------------
def test_run_writes_shards_that_agree_with_stats(corpus, run_a):
    out, stats = run_a
    assert stats == pd.read_stats(str(out), "train")
    files, records = read_records(out)
    assert [os.path.basename(f) for f in files] == [
        f"train-{i:05d}-of-00003{schema.SHARD_SUFFIX}" for i in range(3)]
    assert len(records) == stats["instances"] > 100
    sizes = []
    for path in files:
        with open(path, "rb") as handle:
            sizes.append(sum(1 for _ in transforms.iter_tfrecord_frames(handle)))
    assert max(sizes) - min(sizes) <= 1  # equal shards
    assert not glob.glob(os.path.join(str(out), ".tmp-*"))  # part files removed

    parsed = parse(records)
    mask, weights = parsed["input_mask"], parsed["masked_lm_weights"]
    labels = parsed["next_sentence_labels"][:, 0]
    assert int(mask.sum()) == stats["tokens"]
    assert int(weights.sum()) == stats["masked_tokens"]
    assert int((labels == schema.NSP_IS_NEXT).sum()) == stats["nsp_is_next"]
    assert int((labels == schema.NSP_IS_RANDOM).sum()) == stats["nsp_is_random"]
    assert sum(stats["length_histogram"].values()) == stats["instances"]
    assert (parsed["input_ids"] * (1 - mask)).sum() == 0  # zero padding
    assert (parsed["input_ids"][:, 0] == 7).all()  # [CLS] of this vocab

    documents = corpus["documents"]
    assert stats["documents"] == len(documents)
    assert stats["sentences"] == sum(len(d) for d in documents)
    assert stats["single_sentence_documents"] == 1
    assert stats["skipped"] == {"empty_documents": 2, "documents_without_tokens": 1,
                                "sentences_without_tokens": 1}
    assert stats["groups"] >= 3  # ~30 KB of text in groups of 8 KB
    assert 0.12 < stats["masked_fraction"] < 0.16
    assert abs(stats["masked_as_mask_token"] - 0.8) < 0.05
    assert stats["settings"]["max_seq_length"] == MAX_SEQ
    assert stats["settings"]["dupe_factor"] == 2


def test_same_seed_same_bytes_other_seed_differs(corpus, run_a, tmp_path):
    files_a, _ = read_records(run_a[0])
    # the same job again, built on a caller's TestPipeline, reading in other ranges
    same = tmp_path / "same"
    same.mkdir()
    args = job_args(corpus, same)
    args[args.index("--read_chunk_mb") + 1] = "1"
    with BeamTestPipeline(options=PipelineOptions(RUNNER)) as p:
        assert pd.run(args, test_pipeline=p) is None
    files_same, _ = read_records(same)
    assert [open(f, "rb").read() for f in files_same] == [open(f, "rb").read() for f in files_a]
    assert pd.read_stats(str(same), "train") == run_a[1]

    other = tmp_path / "other"
    other.mkdir()
    pd.run(job_args(corpus, other, *RUNNER, seed=99))
    assert sorted(read_records(other)[1]) != sorted(read_records(run_a[0])[1])


def test_multi_process_runner_gives_the_same_bytes(corpus, run_a, tmp_path):
    pd.run(job_args(corpus, tmp_path, "--runner=FnApiRunner",
                    "--direct_running_mode=multi_processing", "--direct_num_workers=2"))
    files, _ = read_records(tmp_path)
    assert [open(f, "rb").read() for f in files] == [
        open(f, "rb").read() for f in read_records(run_a[0])[0]]


def test_the_same_corpus_elsewhere_gives_the_same_bytes(corpus, run_a, tmp_path):
    """Documents are grouped by their path below the input folder, not by absolute path: a
    copy of the corpus in another run directory gives byte-identical TFRecords."""
    elsewhere = tmp_path / "another" / "run" / "corpus"
    shutil.copytree(corpus["root"] / "in", elsewhere)
    moved = dict(corpus, pattern=str(elsewhere / "*.txt"))
    pd.run(job_args(moved, tmp_path / "out", *RUNNER))
    files, _ = read_records(tmp_path / "out")
    assert [open(f, "rb").read() for f in files] == [
        open(f, "rb").read() for f in read_records(run_a[0])[0]]


def test_phases_sop_whole_word_and_dynamic_masking(corpus, tmp_path):
    stats = pd.run(job_args(corpus, tmp_path, *RUNNER, "--phases", "32:5,64:10",
                            "--objective", "sop", "--whole_word_masking", "true"))
    assert [s["settings"]["max_seq_length"] for s in stats["phases"]] == [32, 64]
    vocab = read_vocab(corpus["vocab_file"])
    special = instances.SpecialIds.from_vocab(vocab)
    for i, (seq, pred) in enumerate(((32, 5), (64, 10))):
        folder = tmp_path / f"phase{i + 1}"
        phase_stats = pd.read_stats(str(folder), "train")
        assert phase_stats == stats["phases"][i] and phase_stats["objective"] == "sop"
        assert phase_stats["documents"] == stats["phases"][0]["documents"]
        files, records = read_records(folder)
        assert len(files) == 3 and len(records) == phase_stats["instances"] > 50
        parsed = parse(records, seq, pred)
        assert int(parsed["next_sentence_labels"].sum()) == phase_stats["sop_swapped"]
        assert 0.35 < phase_stats["sop_swapped_fraction"] < 0.65
        pieces = 0
        for ids, positions, labels, weights, length in zip(
                parsed["input_ids"], parsed["masked_lm_positions"], parsed["masked_lm_ids"],
                parsed["masked_lm_weights"], parsed["input_mask"].sum(axis=1)):
            chosen = {int(p) for p, w in zip(positions, weights) if w}
            assert 0 < len(chosen) <= min(pred, max(1, round(length * 0.15)))
            original = list(ids)
            for p, label in zip(positions, labels):
                original[p] = label
            # a "##" piece is masked exactly when the token before it is: whole words
            for p in range(2, int(length)):
                if original[p] in special.continuation and original[p - 1] not in (
                        special.cls, special.sep):
                    pieces += 1
                    assert (p in chosen) == (p - 1 in chosen), (original, chosen)
        assert pieces > 20
    assert not (tmp_path / "train-00000-of-00003.tfrecord").exists()  # only phase folders

    dynamic = tmp_path / "dynamic"
    dynamic.mkdir()
    stats = pd.run(job_args(corpus, dynamic, *RUNNER, "--masking", "dynamic"))
    parsed = parse(read_records(dynamic)[1])
    assert stats["masking"] == "dynamic" and stats["masked_tokens"] == 0
    assert parsed["masked_lm_weights"].sum() == 0 and parsed["masked_lm_positions"].sum() == 0
    assert (parsed["input_ids"] != special.mask).all()

    blocks = tmp_path / "mlm"
    blocks.mkdir()
    stats = pd.run(job_args(corpus, blocks, *RUNNER, "--objective", "mlm"))
    parsed = parse(read_records(blocks)[1])
    assert stats["objective"] == "mlm" and "nsp_is_random" not in stats
    assert parsed["segment_ids"].sum() == 0 and parsed["next_sentence_labels"].sum() == 0
    for ids, positions, labels, weights in zip(
            parsed["input_ids"], parsed["masked_lm_positions"], parsed["masked_lm_ids"],
            parsed["masked_lm_weights"]):
        original = ids.copy()  # (a random replacement may be [SEP])
        original[positions[weights > 0]] = labels[weights > 0]
        assert list(original).count(special.sep) == 1  # one segment each


def test_jsonl_and_gzip_input_through_the_job(corpus, tmp_path):
    documents = corpus["documents"]
    with gzip.open(tmp_path / "docs.jsonl.gz", "wt", encoding="utf-8") as handle:
        for doc in documents[:30]:
            handle.write(json.dumps({"body": " ".join(s.replace(" .", ".") for s in doc)}) + "\n")
        handle.write("{broken\n")
    out = tmp_path / "out"
    args = job_args(corpus, out, *RUNNER, "--input_format", "jsonl", "--text_field", "body")
    args[args.index("--input") + 1] = str(tmp_path / "*.jsonl.gz")
    stats = pd.run(args)
    assert stats["documents"] == 30 and stats["skipped"] == {"jsonl_invalid_json": 1}
    assert stats["sentences"] == sum(len(d) for d in documents[:30])
    assert len(read_records(out)[1]) == stats["instances"] > 50


def test_non_utf8_file_fails_naming_file_and_offset(corpus, tmp_path):
    bad_dir = tmp_path / "in"
    bad_dir.mkdir()
    (bad_dir / "good.txt").write_text("The dog .\nA fox .\n", encoding="utf-8")
    (bad_dir / "latin1.txt").write_bytes("The dog .\nCafé .\n".encode("latin-1"))
    args = job_args(corpus, tmp_path, *RUNNER)
    args[args.index("--input") + 1] = str(bad_dir / "*.txt")
    with pytest.raises(Exception, match=r"latin1\.txt: not valid UTF-8 at byte offset 13"):
        pd.run(args)


def test_bad_vocab_and_missing_input_fail_before_the_pipeline(corpus, tmp_path):
    args = job_args(corpus, tmp_path, *RUNNER)
    bad = write_vocab(tmp_path / "vocab_no_mask.txt", drop=("[MASK]",))
    args[args.index("--vocab_file") + 1] = bad
    with pytest.raises(ValueError, match=r"vocab_no_mask\.txt has no \[MASK\] token"):
        pd.run(args)
    args = job_args(corpus, tmp_path, *RUNNER)
    args[args.index("--input") + 1] = str(tmp_path / "nothing-*.txt")
    with pytest.raises(FileNotFoundError, match="matches no file"):
        pd.run(args)
    with pytest.raises(SystemExit):
        pd.parse_args(job_args(corpus, tmp_path, "--phases", "128-20"))


def test_module_help():
    result = subprocess.run([sys.executable, "-m", "beam_jobs.pretraining_data", "--help"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for flag in ("--group_size_mb", "--objective", "--whole_word_masking", "--masking",
                 "--phases", "--input_format", "--text_field"):
        assert flag in result.stdout, flag
    assert "PipelineOptions" in result.stdout


# ---------------------------------------------------------------------------
# The data stage's config keys and MLflow metrics
# ---------------------------------------------------------------------------
def test_data_stage_passes_the_config_keys_to_the_job(tmp_path):
    from pipeline import artifacts
    from pipeline import config as config_lib
    from pipeline.config import data_job
    from pipeline.tracking import runs as tracking

    config = config_lib.load("configs/test_tiny.yaml", [
        "data.objective=sop", "data.whole_word_masking=true", "data.masking=dynamic",
        "data.phases=[32/5, '64:10']", "data.group_size_mb=2"])
    assert config_lib.data_phases(config) == [(32, 5), (64, 10)]
    paths = artifacts.Artifacts(tmp_path)
    args = data_job.job_args(config, paths.corpus_glob("train"), str(paths.vocab_file),
                             str(tmp_path), "train")
    flags = dict(zip(args[::2], args[1::2]))
    assert flags["--objective"] == "sop" and flags["--whole_word_masking"] == "true"
    assert flags["--masking"] == "dynamic" and flags["--phases"] == "32:5,64:10"
    assert flags["--group_size_mb"] == "2.0"
    parsed, _ = pd.parse_args(args)  # the job accepts them, and every data.* setting arrives
    for name, value in data_job.instance_settings(config).items():
        assert getattr(parsed, name) == value or name.startswith("max_"), name
    for bad, message in (("data.phases=[128-20]", "is not max_seq_length"),
                         ("data.phases=[128/20]", "model.max_sequence_length"),
                         ("data.objective=mlp", "choose one of: nsp, sop, mlm"),
                         ("data.masking=online", "static, dynamic")):
        with pytest.raises(config_lib.ConfigError, match=message):
            config_lib.load("configs/test_tiny.yaml", [bad])
    assert tracking.flat_metrics({"instances": 3, "objective": "sop", "masking": "static",
                                  "whole_word_masking": True, "length_histogram": {"1-4": 2},
                                  "skipped": {"empty_documents": 1}, "settings": {"seed": 1}},
                                 "train_") == {"train_instances": 3,
                                               "train_length_histogram.1-4": 2,
                                               "train_skipped.empty_documents": 1}
