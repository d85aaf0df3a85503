"""Beam job: corpus text → WordPiece vocabulary (`vocab.txt` in Google's format).

    python -m beam_jobs.vocab --input 'runs/default/corpus/train/*.txt' \
        --output runs/default/vocab/vocab.txt --vocab_size 8000 --lowercase true \
        [--runner=DataflowRunner --project=... any other Beam flag]

How it scales — a distributed word count on disk, then a learner over the top words:

  1. Ranges / CountWords: the input files in byte ranges (`--read_chunk_mb`; a
     compressed file is one range), one per element; every worker reads the lines of
     its ranges, normalises + pre-tokenizes them into words, as BERT will
     (SplitWords), counts them, and writes the counts as a run (beam_jobs/word_counts.py:
     one `word<TAB>count` line per distinct word, sorted by word) through Beam's
     FileSystems into a folder beside the output (`--temp_dir`), deleted at the end. At
     most `--spill_words` distinct words are held in memory: past that, a worker writes a
     run and starts afresh, and merges a range's runs into one.
  2. GroupRuns / MergeRuns (as many levels as needed): the runs summed `--merge_fan_in`
     at a time, in parallel; a merge reads its runs line by line (a k-way merge). It is an
     exact count of the whole corpus, not a sample: a sample would miss the rare words that
     decide the tail of the vocabulary; and no process holds every distinct word (the
     in-process runner held them all in Beam's shuffle: 8x the demo corpus, 120k words).
  3. AllRuns / LearnAndWrite (one worker): the last runs (at most `--merge_fan_in`) merged
     as they are read, four times over: the number of words per count value (to find
     where the `max_words` most frequent words end), the words kept, their characters, and
     the learning. The Hugging Face `tokenizers` WordPiece trainer (Rust; ~1.5 s for 40k
     distinct words) learns the pieces from the counts of the `max_words` most frequent
     words (ties: the larger words, as Beam's Top ranks (count, word)); its memory grows
     with the distinct words counted `min_word_count` times or more, ~0.7 KB each (22 MB
     for the demo corpus' 26k, 54 MB at 8x, 71k), not with the corpus; `max_words` caps
     it. When the counts add up to more than
     `--max_learner_tokens`, they are scaled down proportionally first (the learner only
     compares frequencies). The result is reproducible, byte for byte (see
     `learn_wordpiece`), whatever the runner, the ranges, spills and merges.

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
import contextlib
import json
import math
import os
import re
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_jobs import progress, reading, word_counts
from beam_jobs.runners import absolute, check_paths, pipeline_options, release
from beam_jobs.settings import ProgressSettings, VocabSettings, add_flags, check_flags

SPECIAL_TOKENS = (["[PAD]"] + [f"[unused{i}]" for i in range(99)]
                  + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"])
REQUIRED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# What the learner's WhitespaceSplit splits on (Rust's char::is_whitespace, Unicode White_Space).
_WHITESPACE = re.compile("[\t-\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")
_FEED_REPEATS = 1000  # copies of a word in one sequence handed to the learner
_PARALLELISM = "TOKENIZERS_PARALLELISM"


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
    """(index, input range) (`reading.InputRange`) -> (index, path of a run): the counts of
    the words (`SplitWords`') of the lines that start in the range, one pair per distinct word,
    sorted by word, in a run file (`word_counts`) in `runs_dir`; nothing for a range without
    words.

    Counting a range's words in the worker first sends one pair per distinct word, not one
    element per occurrence, on (the combiner lifting that the FnApiRunner and Dataflow do for
    CountPerElement, which Beam 2.77's DaskRunner does not: there the per-occurrence count took
    73 s for Brown's 1.1M words). In memory: at most `spill_words` distinct words; past that the
    counts so far go to a run of their own, and the range's runs are merged into one before it
    is emitted. The counts, hence the vocab, are those of a count per occurrence.
    With `progress_dir`, the bytes read go to beam_jobs/progress.py as `read`.
    """

    def __init__(self, lowercase: bool, runs_dir: str, spill_words: int, fan_in: int,
                 progress_dir: str = ""):
        self._split_words = SplitWords(lowercase)
        self.runs_dir, self.spill_words, self.fan_in = runs_dir, spill_words, fan_in
        self.progress_dir = progress_dir

    def setup(self):
        self._split_words.setup()
        self._reporter = progress.reporter(self.progress_dir)

    def process(self, element):
        index, input_range = element
        prefix = FileSystems.join(self.runs_dir, f"count-{index:06d}")
        runs: list[str] = []
        counts: collections.Counter = collections.Counter()
        reporter = getattr(self, "_reporter", None)
        for line in reading.read_lines(input_range, reporter):
            counts.update(self._split_words.process(line))
            if len(counts) >= self.spill_words:
                runs.append(word_counts.write_run(f"{prefix}-{len(runs):05d}.tsv",
                                                  sorted(counts.items())))
                counts = collections.Counter()
        if counts:
            runs.append(word_counts.write_run(f"{prefix}-{len(runs):05d}.tsv",
                                              sorted(counts.items())))
        if reporter is not None:
            reporter.flush()
        if runs:
            yield index, word_counts.merge_to_one(runs, f"{prefix}-merge", self.fan_in)


class MergeRuns(beam.DoFn):
    """(group, [paths of runs]) -> (group, path of one run summing them), written in
    `runs_dir` (one level of the merge: at most `fan_in` runs a group)."""

    def __init__(self, runs_dir: str, level: int, fan_in: int):
        self.runs_dir, self.level, self.fan_in = runs_dir, level, fan_in

    def process(self, element):
        group, paths = element
        prefix = FileSystems.join(self.runs_dir, f"level-{self.level}-{group:06d}")
        yield group, word_counts.merge_to_one(sorted(paths), prefix, self.fan_in)


def merge_levels(runs: int, fan_in: int) -> int:
    """The levels of `MergeRuns` that bring `runs` runs down to at most `fan_in` (which the
    last step merges as it reads them).

    >>> merge_levels(5, 64), merge_levels(65, 64), merge_levels(9, 2)
    (0, 1, 3)
    """
    levels = 0
    while runs > fan_in:
        runs, levels = -(-runs // fan_in), levels + 1
    return levels


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
    totals: dict[str, int] = {}
    for word, count in word_counts:
        totals[word] = totals.get(word, 0) + count
    kept = sorted(totals.items())
    return learn_wordpiece_streamed(lambda: iter(kept), vocab_size, min_word_count,
                                    max_learner_tokens)


def learn_wordpiece_streamed(stream, vocab_size: int, min_word_count: int = 2,
                             max_learner_tokens: int = 50_000_000) -> list[str]:
    """`learn_wordpiece` on `stream()`, a fresh iterator of distinct (word, count) pairs
    sorted by word (called twice: the characters first, then the learning), the same tokens.

    Memory: the character sets here, and the Hugging Face trainer's own structures (a word map
    of the distinct words counted `min_word_count` times or more, each once); a word is handed
    to the trainer at most `_FEED_REPEATS` times a sequence (its count adds up across them), not
    as one sequence of `count` copies, which the trainer splits into a string per copy (300 MB
    at 8x the demo corpus, where "." occurs 507,230 times).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    total = kept = 0
    chars: set[str] = set()
    continued: set[str] = set()
    for word, count in stream():
        if count < min_word_count:
            continue
        kept += 1
        total += count
        for piece in _WHITESPACE.split(word):  # the pieces WhitespaceSplit will make
            chars.update(piece)
            continued.update(piece[1:])
    if not kept:
        raise ValueError(f"no word occurs at least {min_word_count} times (vocab.min_word_count); "
                         f"the corpus is too small or the setting too high")
    scale = min(1.0, max_learner_tokens / total)
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fixed = SPECIAL_TOKENS + sorted(chars) + ["##" + c for c in sorted(continued)]
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=1, special_tokens=fixed,
        continuing_subword_prefix="##", show_progress=False)

    def repeated():
        for word, count in stream():
            if count < min_word_count:
                continue
            left = max(1, math.ceil(count * scale))
            while left > 0:
                yield " ".join([word] * min(left, _FEED_REPEATS))
                left -= _FEED_REPEATS

    with _one_thread():
        tokenizer.train_from_iterator(repeated(), trainer=trainer)
    by_id = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    tokens = [token for token, _ in by_id]
    assert tokens[:len(fixed)] == fixed, tokens[:5]
    return tokens


@contextlib.contextmanager
def _one_thread():
    """The Hugging Face trainer on one thread (it reads TOKENIZERS_PARALLELISM at each call):
    in parallel, its partial pair counts per thread add ~10 MB at 8x the demo corpus (64 MB
    instead of 54), for 0.5 s less. The tokens are the same."""
    before = os.environ.get(_PARALLELISM)
    os.environ[_PARALLELISM] = "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ[_PARALLELISM]
        else:
            os.environ[_PARALLELISM] = before


def check_vocab(path: str) -> dict:
    """Reads a vocab.txt (any Beam filesystem: a local path, gs://, s3://); raises ValueError
    naming the file if a special token is missing.

    Returns {token: id} for the special tokens.
    """
    from models.tokenizer import read_vocab

    if not FileSystems.exists(path):
        raise FileNotFoundError(f"vocab file {path} not found")
    tokens = read_vocab(path, FileSystems.open)
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
    parser = argparse.ArgumentParser(
        prog="python -m beam_jobs.vocab", description=__doc__.split("\n")[0],
        epilog="Flags not listed here go to Beam's PipelineOptions (e.g. --runner=DaskRunner).")
    parser.add_argument("--input", required=True, help="glob(s) of text files, comma-separated")
    parser.add_argument("--output", required=True, help="path of vocab.txt to write")
    # The flags that are config keys (vocab.*): type, default, range and help from their one
    # declaration, beam_jobs/settings.py (the config's vocab section is the same declaration).
    add_flags(parser, VocabSettings)
    # The job's own tuning, no config key.
    parser.add_argument("--max_learner_tokens", type=int, default=50_000_000,
                        help="counts adding up to more are scaled down before the learner")
    parser.add_argument("--read_chunk_mb", type=float, default=16.0,
                        help="uncompressed files are read (and their words counted) in "
                             "ranges of this size")
    parser.add_argument("--temp_dir", default=None,
                        help="folder for the run files (any Beam filesystem; default: a "
                             "hidden folder beside --output), deleted at the end")
    add_flags(parser, ProgressSettings)
    args, beam_args = parser.parse_known_args(argv)
    check_flags(parser, args, VocabSettings)
    for flag in ("max_learner_tokens", "read_chunk_mb"):
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag} {getattr(args, flag)} must be > 0")
    args.input, args.output = absolute(args.input), absolute(args.output)
    args.progress_dir = absolute(args.progress_dir)
    check_paths(input=args.input, output=args.output)
    # Beside the vocab, on any Beam filesystem (the step that writes it may run on a worker).
    out_dir = FileSystems.split(args.output)[0] or "."
    meta_path = FileSystems.join(out_dir, "vocab.json")
    # The run files: one folder per run of the job (its name is in no output).
    runs_dir = FileSystems.join(absolute(args.temp_dir) if args.temp_dir else out_dir,
                                f".word-counts-{uuid.uuid4().hex[:12]}")
    if args.temp_dir:
        check_paths(temp_dir=runs_dir)

    def write_outputs(element):
        _, paths = element
        paths = sorted(paths)  # the counts of every word: at most merge_fan_in runs

        def merged():
            return word_counts.merge_runs(paths)

        cut = word_counts.top_cut(merged, args.max_words)

        def top():  # the max_words most frequent words, by word
            return word_counts.top_words(merged(), cut)

        distinct = occurrences = 0
        for _, count in top():
            distinct, occurrences = distinct + 1, occurrences + count
        beam.metrics.Metrics.counter("vocab", "distinct_words").inc(distinct)
        tokens = learn_wordpiece_streamed(top, args.vocab_size, args.min_word_count,
                                          args.max_learner_tokens)
        with FileSystems.create(args.output) as handle:
            handle.write(("\n".join(tokens) + "\n").encode("utf-8"))
        meta = {
            "vocab_size": len(tokens),
            "requested_vocab_size": args.vocab_size,
            "lowercase": args.lowercase,
            "strip_accents": args.lowercase,
            "distinct_words_used": distinct,
            "word_occurrences_used": occurrences,
            "special_token_ids": {t: tokens.index(t) for t in REQUIRED_TOKENS},
        }
        with FileSystems.create(meta_path) as handle:
            handle.write(json.dumps(meta, indent=2).encode("utf-8"))
        yield meta

    ranges = reading.plan_input(args.input, int(args.read_chunk_mb * (1 << 20)))
    pipeline = test_pipeline or beam.Pipeline(options=pipeline_options(beam_args))
    try:
        with pipeline as p:
            runs = (
                p
                | "Ranges" >> beam.Create(list(enumerate(ranges)), reshuffle=len(ranges) > 1)
                | "CountWords" >> beam.ParDo(CountWords(args.lowercase, runs_dir,
                                                        args.spill_words, args.merge_fan_in,
                                                        args.progress_dir))
            )
            # The runs (one per range) summed, merge_fan_in at a time, in parallel.
            for level in range(merge_levels(len(ranges), args.merge_fan_in)):
                runs = (
                    runs
                    | f"GroupRuns{level}" >> beam.Map(lambda ir, k=args.merge_fan_in:
                                                      (ir[0] // k, ir[1]))
                    | f"GroupByRun{level}" >> beam.GroupByKey()
                    | f"MergeRuns{level}" >> beam.ParDo(MergeRuns(runs_dir, level,
                                                                  args.merge_fan_in))
                )
            _ = (
                runs
                | "KeyWithNone" >> beam.Map(lambda ir: (None, ir[1]))
                | "AllRuns" >> beam.GroupByKey()
                | "LearnAndWrite" >> beam.FlatMap(write_outputs)
            )
        if test_pipeline is None:
            release(pipeline.result)
    finally:
        word_counts.remove_dir(runs_dir)
    if not FileSystems.exists(meta_path):  # no word at all reached the learner
        raise ValueError(f"no word in {args.input} (--input): the corpus is empty")
    with FileSystems.open(meta_path) as handle:
        return json.loads(handle.read().decode("utf-8"))


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
