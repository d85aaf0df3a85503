"""Tests of beam_jobs.pretraining_data (and the shared transforms it uses).

A tiny vocab and corpus are written into tmp_path; the Beam runs use the
in-process FnApiRunner so nothing tries to download the Prism runner.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import random
import subprocess
import sys

import pytest

apache_beam = pytest.importorskip("apache_beam")
tf = pytest.importorskip("tensorflow")

from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline  # noqa: E402
from apache_beam.testing.util import assert_that, equal_to  # noqa: E402

from beam_jobs import pretraining_data as pd  # noqa: E402
from beam_jobs import schema, transforms  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNER = ["--runner=FnApiRunner", "--direct_running_mode=in_memory"]
MAX_SEQ, MAX_PRED = 64, 10

WORDS = ("the a of and to in is was he she it that for on with as his her at by from this "
         "had not are but be they have one all were we when there can an which their said "
         "cafe river stone light house water under over quick brown fox jumps lazy dog").split()


def write_vocab(path, drop=()):
    """A small vocab in Google's order, but with 5 unused tokens so that the special ids
    are not Google's (the code must look them up by string)."""
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(5)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens = [t for t in tokens if t not in drop]
    letters = "abcdefghijklmnopqrstuvwxyz"
    tokens += list(letters) + [f"##{c}" for c in letters] + [".", ",", "'"]
    tokens += [w for w in dict.fromkeys(WORDS) if w not in tokens]
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
            "--seed", str(seed), "--num_shards", "3", "--docs_per_group", "16", *extra]


def read_records(output_dir, split="train"):
    files = sorted(glob.glob(os.path.join(str(output_dir), f"{split}-*{schema.SHARD_SUFFIX}")))
    return files, [r.numpy() for r in tf.data.TFRecordDataset(files)]


@pytest.fixture(scope="module")
def run_a(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("run_a")
    stats = pd.run(job_args(corpus, out, *RUNNER))
    return out, stats


# ---------------------------------------------------------------------------
# Plain functions
# ---------------------------------------------------------------------------
def test_split_documents_and_decode():
    text = "\n  \nA one .\r\nA two .\n\n\n\nB one .\n \t\nC one .\n\n"
    documents, empty = transforms.split_documents(text)
    assert documents == [["A one .", "A two ."], ["B one ."], ["C one ."]]
    assert empty == 2  # the 2 extra blank lines between A and B
    with pytest.raises(ValueError, match=r"x\.txt: not valid UTF-8 at byte offset 3"):
        transforms.decode_utf8(b"abc\xff", "x.txt")


def special_ids(vocab_size=1000):
    return pd.SpecialIds(pad=0, unk=100, cls=101, sep=102, mask=103, vocab_size=vocab_size)


def test_masking_proportions_and_rules():
    special = special_ids()
    rng = random.Random(7)
    branches = collections.Counter()
    masked_total = candidates_total = 0
    capped = 0
    for _ in range(4000):
        len_a, len_b = rng.randint(1, 60), rng.randint(1, 60)
        tokens = ([special.cls] + [rng.randint(104, 999) for _ in range(len_a)] + [special.sep]
                  + [rng.randint(104, 999) for _ in range(len_b)] + [special.sep])
        output, positions, labels, kinds = pd.create_masked_lm_predictions(
            tokens, 0.15, MAX_PRED, special, rng)
        expected = min(MAX_PRED, max(1, round(len(tokens) * 0.15)))
        assert len(positions) == expected <= MAX_PRED
        capped += expected == MAX_PRED
        assert positions == sorted(set(positions))
        assert labels == [tokens[p] for p in positions]
        for p, kind in zip(positions, kinds):
            assert tokens[p] not in (special.cls, special.sep)
            if kind == pd.MASK:
                assert output[p] == special.mask
            elif kind == pd.KEEP:
                assert output[p] == tokens[p]
            else:
                assert 0 <= output[p] < special.vocab_size
        # tokens not chosen are untouched, [CLS]/[SEP] stay where they were
        assert all(output[i] == t for i, t in enumerate(tokens) if i not in set(positions))
        branches.update(kinds)
        masked_total += len(positions)
        candidates_total += len(tokens) - 3
    assert capped > 0  # the cap was exercised
    assert 0.12 < masked_total / candidates_total < 0.18
    assert abs(branches[pd.MASK] / masked_total - 0.8) < 0.01
    assert abs(branches[pd.RANDOM] / masked_total - 0.1) < 0.01
    assert abs(branches[pd.KEEP] / masked_total - 0.1) < 0.01


def test_truncate_seq_pair():
    rng = random.Random(0)
    for _ in range(200):
        a, b = list(range(rng.randint(1, 50))), list(range(100, 100 + rng.randint(1, 50)))
        a0, b0 = list(a), list(b)
        pd.truncate_seq_pair(a, b, 20, rng)
        assert len(a) + len(b) <= 20 and a and b
        for kept, full in ((a, a0), (b, b0)):  # a contiguous slice of the original
            start = full.index(kept[0])
            assert full[start:start + len(kept)] == kept


def test_instances_nsp_segments_and_lengths():
    """Each document uses its own id range, so the source document of every token is known."""
    special = special_ids(vocab_size=200_000)
    rng = random.Random(3)
    documents = []
    for d in range(300):
        base = 1000 + d * 500
        documents.append(((f"doc{d:03d}", 0), [[base + rng.randint(0, 499)
                                                for _ in range(rng.randint(3, 25))]
                                               for _ in range(rng.randint(2, 20))]))
    settings = pd.InstanceSettings(max_seq_length=MAX_SEQ, max_predictions_per_seq=MAX_PRED,
                                   dupe_factor=2, seed=11)
    instances = list(pd.create_instances_for_group(documents, 0, settings, special))
    assert len(instances) > 2000
    owner = lambda token: (token - 1000) // 500  # noqa: E731
    random_next = 0
    for inst in instances:
        tokens = list(inst.token_ids)
        for p, label in zip(inst.masked_lm_positions, inst.masked_lm_ids):
            tokens[p] = label  # undo the masking
        assert len(tokens) <= MAX_SEQ and len(inst.segment_ids) == len(tokens)
        assert tokens[0] == special.cls and tokens[-1] == special.sep
        first_sep = tokens.index(special.sep)
        assert tokens.count(special.sep) == 2 and first_sep >= 2 and first_sep < len(tokens) - 2
        assert inst.segment_ids == [0] * (first_sep + 1) + [1] * (len(tokens) - first_sep - 1)
        a_docs = {owner(t) for t in tokens[1:first_sep]}
        b_docs = {owner(t) for t in tokens[first_sep + 1:-1]}
        assert len(a_docs) == 1 and len(b_docs) == 1
        if inst.is_random_next:
            random_next += 1
            assert a_docs != b_docs or inst.random_from_same_document
        else:
            assert a_docs == b_docs
        features = inst.features()
        assert features["next_sentence_labels"] == [
            schema.NSP_IS_RANDOM if inst.is_random_next else schema.NSP_IS_NEXT]
    # 50/50, plus the chunks with a single sentence, which always get a random B
    assert 0.45 < random_next / len(instances) < 0.6
    # the same inputs give the same instances; another seed gives others
    again = list(pd.create_instances_for_group(list(reversed(documents)), 0, settings, special))
    assert [i.features() for i in again] == [i.features() for i in instances]
    other = pd.InstanceSettings(**{**settings.__dict__, "seed": 12})
    assert [i.features() for i in pd.create_instances_for_group(documents, 0, other, special)] \
        != [i.features() for i in instances]


def test_vocab_checks(tmp_path):
    vocab = transforms.read_vocab(write_vocab(tmp_path / "v.txt"))
    special = pd.SpecialIds.from_vocab(vocab)
    assert (special.pad, special.unk, special.cls, special.sep, special.mask) == (0, 6, 7, 8, 9)
    bad = write_vocab(tmp_path / "no_mask.txt", drop=("[MASK]",))
    with pytest.raises(ValueError, match=r"no_mask\.txt has no \[MASK\] token"):
        pd.SpecialIds.from_vocab(transforms.read_vocab(bad), bad)


# ---------------------------------------------------------------------------
# Beam transforms
# ---------------------------------------------------------------------------
def test_read_and_tokenize_transforms(tmp_path):
    vocab_file = write_vocab(tmp_path / "vocab.txt")
    vocab = transforms.read_vocab(vocab_file)
    ids = {token: i for i, token in enumerate(vocab)}
    path_a, path_b = tmp_path / "a.txt", tmp_path / "b.txt"
    path_a.write_text("The dog .\nA fox\n\n\n\nCafé ?\n", encoding="utf-8")
    path_b.write_text("\nit was\n", encoding="utf-8")
    expected_docs = [((str(path_a), 0), ["The dog .", "A fox"]),
                     ((str(path_a), 1), ["Café ?"]),
                     ((str(path_b), 0), ["it was"])]
    expected_ids = [((str(path_a), 0), [[ids["the"], ids["dog"], ids["."]],
                                        [ids["a"], ids["fox"]]]),
                    ((str(path_a), 1), [[ids["cafe"], ids["[UNK]"]]]),  # accent stripped
                    ((str(path_b), 0), [[ids["it"], ids["was"]]])]
    with BeamTestPipeline(options=PipelineOptions(RUNNER)) as p:
        read = p | "ReadDocuments" >> transforms.ReadDocuments(f"{path_a},{tmp_path}/b*.txt")
        tokenized = read.documents | "Tokenize" >> transforms.TokenizeDocuments(vocab_file, True)
        assert_that(read.documents, equal_to(expected_docs), label="CheckDocuments")
        assert_that(tokenized.documents, equal_to(expected_ids), label="CheckIds")
        assert_that(read.stats, equal_to([{"skipped/empty_documents": 2}]), label="CheckSkips")


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

    parsed = tf.io.parse_example(tf.constant(records), schema.parse_spec(MAX_SEQ, MAX_PRED))
    mask = parsed["input_mask"].numpy()
    weights = parsed["masked_lm_weights"].numpy()
    labels = parsed["next_sentence_labels"].numpy()[:, 0]
    assert int(mask.sum()) == stats["tokens"]
    assert int(weights.sum()) == stats["masked_tokens"]
    assert int((labels == schema.NSP_IS_NEXT).sum()) == stats["nsp_is_next"]
    assert int((labels == schema.NSP_IS_RANDOM).sum()) == stats["nsp_is_random"]
    assert sum(stats["length_histogram"].values()) == stats["instances"]
    assert (parsed["input_ids"].numpy() * (1 - mask)).sum() == 0  # zero padding
    one = schema.parse_numpy(records[0], MAX_SEQ, MAX_PRED)
    assert one["input_ids"][0] == 7  # [CLS] of this vocab

    documents = corpus["documents"]
    assert stats["documents"] == len(documents)
    assert stats["sentences"] == sum(len(d) for d in documents)
    assert stats["single_sentence_documents"] == 1
    assert stats["skipped"] == {"empty_documents": 2, "documents_without_tokens": 1,
                                "sentences_without_tokens": 1}
    assert stats["groups"] == 4  # ceil(59 / 16) groups, each non-empty here
    assert 0.12 < stats["masked_fraction"] < 0.16
    assert abs(stats["masked_as_mask_token"] - 0.8) < 0.05
    assert stats["settings"]["max_seq_length"] == MAX_SEQ
    assert stats["settings"]["dupe_factor"] == 2


def test_same_seed_same_records_other_seed_differs(corpus, run_a, tmp_path):
    _, records_a = read_records(run_a[0])
    # the same job again, built on a caller's TestPipeline this time
    same = tmp_path / "same"
    same.mkdir()
    with BeamTestPipeline(options=PipelineOptions(RUNNER)) as p:
        assert pd.run(job_args(corpus, same), test_pipeline=p) is None
    _, records_same = read_records(same)
    assert sorted(records_same) == sorted(records_a)
    assert pd.read_stats(str(same), "train") == run_a[1]

    other = tmp_path / "other"
    other.mkdir()
    pd.run(job_args(corpus, other, *RUNNER, seed=99))
    _, records_other = read_records(other)
    assert sorted(records_other) != sorted(records_a)


@pytest.mark.slow  # ~30 s: each worker process imports TensorFlow
def test_multi_process_runner_gives_the_same_records(corpus, run_a, tmp_path):
    pd.run(job_args(corpus, tmp_path, "--runner=FnApiRunner",
                    "--direct_running_mode=multi_processing", "--direct_num_workers=2"))
    _, records = read_records(tmp_path)
    assert sorted(records) == sorted(read_records(run_a[0])[1])


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


def test_module_help():
    result = subprocess.run([sys.executable, "-m", "beam_jobs.pretraining_data", "--help"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--docs_per_group" in result.stdout and "PipelineOptions" in result.stdout
