import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_jobs import vocab


def test_split_words_normalizes_like_bert_uncased():
    with TestPipeline(runner="DirectRunner") as p:
        words = (p | beam.Create(["Héllo, World!", "  ", "Naïve café"])
                   | beam.ParDo(vocab.SplitWords(lowercase=True)))
        assert_that(words, equal_to(["hello", ",", "world", "!", "naive", "cafe"]))


def test_split_words_cased_keeps_text():
    with TestPipeline(runner="DirectRunner") as p:
        words = p | beam.Create(["Héllo World"]) | beam.ParDo(vocab.SplitWords(lowercase=False))
        assert_that(words, equal_to(["Héllo", "World"]))


def test_vocab_job_writes_google_layout(tmp_path, corpus_dir):
    out = tmp_path / "v" / "vocab.txt"
    meta = vocab.run(["--input", f"{corpus_dir}/*.txt", "--output", str(out), "--vocab_size", "200",
                      "--min_word_count", "1", "--runner=DirectRunner"])
    tokens = out.read_text().split("\n")[:-1]
    assert len(tokens) == meta["vocab_size"] <= 200
    assert tokens[0] == "[PAD]" and tokens[1] == "[unused0]" and tokens[99] == "[unused98]"
    assert tokens[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert meta["special_token_ids"] == {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102,
                                         "[MASK]": 103}
    assert len(set(tokens)) == len(tokens)
    assert any(t.startswith("##") for t in tokens)  # word pieces, not just words
    # Every frequent word of the corpus is either a token or splits into tokens.
    assert "the" in tokens and "." in tokens
    vocab.check_vocab(str(out))


def test_vocab_without_mask_is_refused(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    with pytest.raises(ValueError) as info:
        vocab.check_vocab(str(path))
    assert str(path) in str(info.value) and "[MASK]" in str(info.value)


def test_too_small_corpus_for_min_count(tmp_path):
    (tmp_path / "a.txt").write_text("one two three\n")
    with pytest.raises(Exception, match="min_word_count"):
        vocab.run(["--input", f"{tmp_path}/a.txt", "--output", str(tmp_path / "v.txt"),
                   "--min_word_count", "5", "--runner=DirectRunner"])


def test_vocab_stage_can_take_an_existing_vocab(tmp_path):
    from pipeline import config as config_lib
    from pipeline.artifacts import Artifacts
    from pipeline.config import ConfigError
    from pipeline.stages import vocab as vocab_stage

    given = tmp_path / "given.txt"
    given.write_text("\n".join(vocab.SPECIAL_TOKENS + ["the", "cat", "##s"]) + "\n")
    config = config_lib.load(None, [f"run_dir={tmp_path / 'run'}", f"vocab.from_file={given}"])
    (tmp_path / "run" / "corpus" / "train").mkdir(parents=True)
    (tmp_path / "run" / "corpus" / "train" / "a.txt").write_text("The cats.\n")
    (tmp_path / "run" / "corpus" / "manifest.json").write_text("{}")
    meta = vocab_stage.run(config)
    assert Artifacts(config.run_dir).vocab_file.read_text() == given.read_text()
    assert meta["vocab_size"] == len(vocab.SPECIAL_TOKENS) + 3
    with pytest.raises(ConfigError, match="vocab.from_file"):
        config_lib.load(None, [f"vocab.from_file={tmp_path / 'missing.txt'}"])


# ---------------------------------------------------------------------------
# The count on disk (beam_jobs/word_counts.py): spills, merges, the top words
# ---------------------------------------------------------------------------
def _zipf_corpus(folder, files=3, lines=80, seed=7):
    """Text files of made-up words with Zipf-like counts: ~300 distinct words, many counted
    the same number of times (ties at every cut), a few hundred times for the commonest."""
    import random

    rng = random.Random(seed)
    letters = "abcdefghijklmnoprstuvwyzéß"
    words = sorted({"".join(rng.choice(letters) for _ in range(rng.randint(1, 8)))
                    for _ in range(400)})
    weights = [1 / (rank + 1) for rank in range(len(words))]
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        text = [" ".join(rng.choices(words, weights, k=rng.randint(3, 15))).capitalize() + "."
                for _ in range(lines)]
        (folder / f"part-{f}.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
    return sorted(folder.glob("*.txt"))


def _in_memory_reference(paths, max_words, vocab_size, min_word_count):
    """What the job did before the count went to disk: every word counted in one Counter,
    Beam's Top by (count, word), then the learner on that list."""
    import collections

    from models.tokenizer import basic_words

    counts = collections.Counter()
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            counts.update(basic_words(line, True))
    ranked = sorted(counts.items(), key=lambda wc: (wc[1], wc[0]), reverse=True)
    top = ranked[:max_words]
    tokens = vocab.learn_wordpiece(top, vocab_size, min_word_count)
    return tokens, ranked, sum(n for _, n in top)


def test_count_spilled_and_merged_in_levels_gives_the_in_memory_vocab(tmp_path):
    from beam_jobs import reading

    paths = _zipf_corpus(tmp_path / "raw")
    chunk_mb = 0.0005  # ~500-byte ranges: a dozen per file
    ranges = reading.plan_input(f"{tmp_path}/raw/*.txt", int(chunk_mb * (1 << 20)))
    assert vocab.merge_levels(len(ranges), 2) >= 3
    expected, ranked, occurrences = _in_memory_reference(paths, 150, 300, 2)
    assert ranked[149][1] == ranked[150][1]  # the cut falls inside a tie

    def job(name, *flags):
        out = tmp_path / name / "vocab.txt"
        meta = vocab.run(["--input", f"{tmp_path}/raw/*.txt", "--output", str(out),
                          "--vocab_size", "300", "--max_words", "150", *flags,
                          "--runner=FnApiRunner"])
        assert sorted(p.name for p in out.parent.iterdir()) == ["vocab.json", "vocab.txt"]
        return out.read_text(encoding="utf-8"), meta

    # A spill every 5 distinct words, merges 2 runs at a time, in 4 levels.
    small, meta = job("small", "--spill_words", "5", "--merge_fan_in", "2",
                      "--read_chunk_mb", str(chunk_mb))
    assert small == "\n".join(expected) + "\n"
    assert (meta["distinct_words_used"], meta["word_occurrences_used"]) == (150, occurrences)
    assert job("default")[0] == small


def test_count_words_spills_runs_and_emits_their_sum(tmp_path):
    import collections

    from beam_jobs import reading, word_counts
    from models.tokenizer import basic_words

    path = _zipf_corpus(tmp_path / "raw", files=1)[0]
    counter = collections.Counter(w for line in path.read_text(encoding="utf-8").splitlines()
                                  for w in basic_words(line, True))
    (input_range,) = reading.plan_input(str(path))
    fn = vocab.CountWords(True, str(tmp_path / "runs"), spill_words=10, fan_in=3)
    fn.setup()
    ((index, run),) = list(fn.process((7, input_range)))
    assert index == 7
    assert list(word_counts.read_run(run)) == sorted(counter.items())
    spilled = list((tmp_path / "runs").glob("count-000007-0*.tsv"))
    assert len(spilled) >= len(counter) // 10
    word_counts.remove_dir(str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()


def test_top_cut_keeps_what_beams_top_keeps():
    import random

    from beam_jobs import word_counts

    rng = random.Random(3)
    for trial in range(200):
        pairs = sorted({f"w{rng.randint(0, 60)}": rng.choice((1, 1, 2, 2, 3, 5, 8))
                        for _ in range(rng.randint(1, 40))}.items())
        max_words = rng.randint(1, 45)
        expected = sorted(sorted(pairs, key=lambda wc: (wc[1], wc[0]),
                                 reverse=True)[:max_words])
        cut = word_counts.top_cut(lambda: iter(pairs), max_words)
        assert list(word_counts.top_words(pairs, cut)) == expected, (trial, pairs, max_words)


def test_learner_fed_a_word_at_a_time_or_in_pieces_learns_the_same(monkeypatch):
    """The learner gets a frequent word as several sequences of at most _FEED_REPEATS copies
    (bounded memory); the trainer adds them up: the same tokens as one sequence per word."""
    counts = [("low", 500), ("lower", 300), ("newest", 450), ("widest", 200), ("new", 2),
              ("lowest", 17)]
    monkeypatch.setattr(vocab, "_FEED_REPEATS", 1 << 30)
    whole = vocab.learn_wordpiece(counts, vocab_size=130)
    monkeypatch.setattr(vocab, "_FEED_REPEATS", 7)
    assert vocab.learn_wordpiece(counts, vocab_size=130) == whole
    assert len(whole) > 120
