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
    meta = vocab_stage.run(config, log=lambda *_: None)
    assert Artifacts(config.run_dir).vocab_file.read_text() == given.read_text()
    assert meta["vocab_size"] == len(vocab.SPECIAL_TOKENS) + 3
    with pytest.raises(ConfigError, match="vocab.from_file"):
        config_lib.load(None, [f"vocab.from_file={tmp_path / 'missing.txt'}"])
