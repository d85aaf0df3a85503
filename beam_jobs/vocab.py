"""Beam job: corpus text → WordPiece vocabulary (`vocab.txt` in Google's format).

    python -m beam_jobs.vocab --input 'runs/default/corpus/train/*.txt' \
        --output runs/default/vocab/vocab.txt --vocab_size 8000 --lowercase true \
        [--runner=DataflowRunner --project=... any other Beam flag]

How it scales — a distributed word count, then a learner over the top words:

  1. Ranges / CountWords: the input files in byte ranges (`--read_chunk_mb`; a
     compressed file is one range), one per element; every worker reads the lines of
     its ranges, normalises + pre-tokenizes them into words, as BERT will
     (SplitWords), and counts them (one pair per distinct word of the range).
  2. SumCounts: Beam sums the counts per word (a shuffle by word), so the corpus is
     never in one place. It is an exact count of the whole corpus, not a sample: a
     sample would miss the rare words that decide the tail of the vocabulary, and
     the count is cheap to scale.
  3. TopWords: only the `max_words` most frequent words (a bounded heap per worker,
     merged; on the DaskRunner, which does not lift combiners, one heap) reach the
     last step. Its size grows with the number of distinct words kept, not with the
     corpus.
  4. LearnAndWrite (one worker): the Hugging Face `tokenizers` WordPiece trainer
     (Rust; ~1.5 s for 40k distinct words) learns the pieces from those counts.
     When they add up to more than `--max_learner_tokens`, they are scaled down
     proportionally first (the learner only compares frequencies). The result is
     reproducible, byte for byte (see `learn_wordpiece`).

Progress: Beam counters `vocab/lines`, `vocab/words` (SplitWords) and
`vocab/distinct_words` (words reaching the learner) show in the runner's UI
(e.g. Dataflow's job page) while it runs; the final figures are in vocab.json.

The vocab layout is Google's: [PAD]=0, [unused0]..[unused98]=1..99, [UNK]=100,
[CLS]=101, [SEP]=102, [MASK]=103, then single characters and word pieces
(continuations prefixed with ##). Words are counted as the tokenizer will
see them at training time (`models.tokenizer`, Google's rules; uncased, `--lowercase true`:
lowercased, accents stripped; cased: text untouched).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_jobs import reading
from beam_jobs.runners import absolute, check_paths, pipeline_options, release

SPECIAL_TOKENS = (["[PAD]"] + [f"[unused{i}]" for i in range(99)]
                  + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"])
REQUIRED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# What the learner's WhitespaceSplit splits on (Rust's char::is_whitespace, Unicode White_Space).
_WHITESPACE = re.compile("[\t-\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


class SplitWords(beam.DoFn):
    """A line of text → its words as WordPiece will see them (`models.tokenizer` rules 1-4:
    cleaned, split on whitespace, punctuation and CJK; uncased: lowercased, accents stripped)."""

    def __init__(self, lowercase: bool):
        self.lowercase = lowercase

    def setup(self):
        from models.tokenizer import basic_words

        basic_words("warm up", self.lowercase)  # builds the character classes, once per worker
        self._split = basic_words
        self._lines = beam.metrics.Metrics.counter("vocab", "lines")
        self._words = beam.metrics.Metrics.counter("vocab", "words")

    def process(self, line: str):
        if not line.strip():
            return
        words = self._split(line, self.lowercase)
        self._lines.inc()
        self._words.inc(len(words))
        yield from words


class CountWords(beam.DoFn):
    """An input range (`reading.InputRange`) -> (word, count) for each distinct word of the
    lines that start in it (`SplitWords`' words), sorted by word.

    Counting a range's words in the worker first sends one pair per distinct word, not one
    element per occurrence, into the shuffle: the combiner lifting that the FnApiRunner and
    Dataflow do for CountPerElement, which Beam 2.77's DaskRunner does not (there the
    per-occurrence count took 73 s for Brown's 1.1M words). The counts, hence the vocab, are
    those of a count per occurrence.
    """

    def __init__(self, lowercase: bool):
        self._split_words = SplitWords(lowercase)

    def setup(self):
        self._split_words.setup()

    def process(self, input_range):
        counts: collections.Counter = collections.Counter()
        for line in reading.read_lines(input_range):
            counts.update(self._split_words.process(line))
        yield from sorted(counts.items())


def learn_wordpiece(word_counts, vocab_size: int, min_word_count: int = 2,
                    max_learner_tokens: int = 50_000_000) -> list[str]:
    """(word, count) pairs → WordPiece tokens in Google's layout (special tokens first).

    Reproducible: the same counts give the same list, byte for byte, in any process, whatever
    PYTHONHASHSEED and whatever the order of `word_counts` (counts of a repeated word add up).
    The Hugging Face trainer alone is not: it numbers the `##x` pieces in the order of a Rust
    hash map (seeded at random per process), and it breaks ties between equally frequent merges
    by those numbers, so both the order and, when counts tie, the set of pieces varied. Here
    every single character and `##x` piece is handed to the trainer upfront (as "special"
    tokens, which it numbers in the order given), so all ids, hence all tie-breaks, are fixed.

    The order after [MASK] (103): the single characters sorted by code point, then the `##x`
    pieces sorted by code point, then the longer pieces in the order they were learned (most
    frequent merge first; equal counts: the merged pair with the smaller ids first).

    >>> vocab = learn_wordpiece([("low", 5), ("lower", 3), ("newest", 4)], vocab_size=130)
    >>> vocab[:1] + vocab[100:104]
    ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
    >>> vocab[104:109]
    ['e', 'l', 'n', 'o', 'r']
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    totals: dict[str, int] = {}
    for word, count in word_counts:
        totals[word] = totals.get(word, 0) + count
    kept = sorted((w, n) for w, n in totals.items() if n >= min_word_count)
    if not kept:
        raise ValueError(f"no word occurs at least {min_word_count} times (vocab.min_word_count); "
                         f"the corpus is too small or the setting too high")
    total = sum(n for _, n in kept)
    scale = min(1.0, max_learner_tokens / total)
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    pieces = set(_WHITESPACE.split(" ".join(w for w, _ in kept))) - {""}
    chars = sorted(set("".join(pieces)))
    continuations = ["##" + c for c in sorted(set("".join(p[1:] for p in pieces)))]
    fixed = SPECIAL_TOKENS + chars + continuations
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=1, special_tokens=fixed,
        continuing_subword_prefix="##", show_progress=False)

    def repeated():
        for word, count in kept:
            yield " ".join([word] * max(1, math.ceil(count * scale)))

    tokenizer.train_from_iterator(repeated(), trainer=trainer)
    by_id = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    tokens = [token for token, _ in by_id]
    assert tokens[:len(fixed)] == fixed, tokens[:5]
    return tokens


def check_vocab(path: str) -> dict:
    """Reads a vocab.txt (any Beam filesystem: a local path, gs://, s3://); raises ValueError
    naming the file if a special token is missing.

    Returns {token: id} for the special tokens.
    """
    from models.tokenizer import vocab_tokens

    if not FileSystems.exists(path):
        raise FileNotFoundError(f"vocab file {path} not found")
    with FileSystems.open(path) as handle:
        tokens = vocab_tokens(reading.decode_utf8(handle.read(), path))
    ids = {token: i for i, token in enumerate(tokens)}
    missing = [t for t in REQUIRED_TOKENS if t not in ids]
    if missing:
        raise ValueError(f"vocab file {path} has no {', '.join(missing)} token(s); BERT needs "
                         f"{', '.join(REQUIRED_TOKENS)}: rebuild it with `make vocab` or add them")
    if len(tokens) != len(ids):
        dupes = sorted({t for t in tokens if tokens.count(t) > 1})[:5]
        raise ValueError(f"vocab file {path} has duplicate tokens ({', '.join(dupes)}); "
                         f"each line must be a distinct token")
    return {t: ids[t] for t in REQUIRED_TOKENS}


def run(argv=None, test_pipeline=None):
    """Runs the vocab job; returns the metadata dict also written beside the vocab
    (…/vocab.json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", required=True, help="glob(s) of text files, comma-separated")
    parser.add_argument("--output", required=True, help="path of vocab.txt to write")
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--lowercase", type=_bool, default=True)
    parser.add_argument("--min_word_count", type=int, default=2)
    parser.add_argument("--max_words", type=int, default=200_000)
    parser.add_argument("--max_learner_tokens", type=int, default=50_000_000)
    parser.add_argument("--read_chunk_mb", type=float, default=16.0,
                        help="uncompressed files are read (and their words counted) in "
                             "ranges of this size")
    args, beam_args = parser.parse_known_args(argv)
    args.input, args.output = absolute(args.input), absolute(args.output)
    check_paths(input=args.input, output=args.output)
    # Beside the vocab, on any Beam filesystem (the step that writes it may run on a worker).
    meta_path = FileSystems.join(FileSystems.split(args.output)[0] or ".", "vocab.json")

    def write_outputs(top_words):
        word_counts = list(top_words)  # one list of (word, count)
        beam.metrics.Metrics.counter("vocab", "distinct_words").inc(len(word_counts))
        tokens = learn_wordpiece(word_counts, args.vocab_size, args.min_word_count,
                                 args.max_learner_tokens)
        with FileSystems.create(args.output) as handle:
            handle.write(("\n".join(tokens) + "\n").encode("utf-8"))
        meta = {
            "vocab_size": len(tokens),
            "requested_vocab_size": args.vocab_size,
            "lowercase": args.lowercase,
            "strip_accents": args.lowercase,
            "distinct_words_used": len(word_counts),
            "word_occurrences_used": sum(n for _, n in word_counts),
            "special_token_ids": {t: tokens.index(t) for t in REQUIRED_TOKENS},
        }
        with FileSystems.create(meta_path) as handle:
            handle.write(json.dumps(meta, indent=2).encode("utf-8"))
        yield meta

    ranges = reading.plan_input(args.input, int(args.read_chunk_mb * (1 << 20)))
    pipeline = test_pipeline or beam.Pipeline(options=pipeline_options(beam_args))
    with pipeline as p:
        _ = (
            p
            | "Ranges" >> beam.Create(ranges, reshuffle=len(ranges) > 1)
            | "CountWords" >> beam.ParDo(CountWords(args.lowercase))
            | "SumCounts" >> beam.CombinePerKey(sum)
            # Top.PerKey under one key, not Top.Of: Top.Of emits in finish_bundle, which
            # Beam 2.77's DaskRunner drops (see beam_jobs/runners.py); the same list.
            | "KeyWithNone" >> beam.Map(lambda wc: (None, wc))
            | "TopWords" >> beam.combiners.Top.PerKey(args.max_words, key=lambda wc: (wc[1], wc[0]))
            | "TopList" >> beam.Values()
            | "LearnAndWrite" >> beam.FlatMap(write_outputs)
        )
    if test_pipeline is None:
        release(pipeline.result)
    if not FileSystems.exists(meta_path):  # no word at all reached the learner
        raise ValueError(f"no word in {args.input} (--input): the corpus is empty")
    with FileSystems.open(meta_path) as handle:
        return json.loads(handle.read().decode("utf-8"))


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
