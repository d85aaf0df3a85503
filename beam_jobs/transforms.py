"""Beam transforms shared by the jobs: read Google-format documents, tokenize them, sum counters.

Google-format text is one sentence per line with a blank line between documents.
A document's id is `(file path, index of the document in that file)`, so every
later step can sort and hash documents deterministically whatever the runner.

    >>> split_documents("One.\\nTwo.\\n\\nThree.\\n")
    ([['One.', 'Two.'], ['Three.']], 0)

Heavy resources (the vocabulary, the keras-hub tokenizer) are loaded in
`DoFn.setup`, once per worker, never pickled with the pipeline graph.
"""

from __future__ import annotations

import io

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems

# Tokens every pretraining vocab must have (looked up by string, never by id).
REQUIRED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# Sentences per tokenizer call: one call on a batch is ~10x faster than one per sentence.
TOKENIZE_BATCH_SENTENCES = 4096

STATS_TAG = "stats"


# ---------------------------------------------------------------------------
# Plain functions (no Beam): used by the DoFns below and directly by tests.
# ---------------------------------------------------------------------------
def read_vocab(vocab_file: str) -> list[str]:
    """The vocab file's tokens in id order (one per line, trailing whitespace dropped).

    Lines are split exactly as keras-hub's WordPieceTokenizer splits a vocab file,
    so ids agree with the tokenizer. Works for any Beam filesystem path (gs://...).
    """
    with FileSystems.open(vocab_file) as handle:
        data = handle.read()
    text = decode_utf8(data, vocab_file)
    return [line.rstrip() for line in io.StringIO(text, newline=None)]


def special_token_ids(vocab: list[str], vocab_file: str = "<vocab>") -> dict[str, int]:
    """{"[PAD]": id, "[UNK]": id, ...} looked up by token string; ValueError if one is missing."""
    index = {token: i for i, token in enumerate(vocab)}
    for token in REQUIRED_TOKENS:
        if token not in index:
            raise ValueError(
                f"vocab file {vocab_file} has no {token} token; a BERT pretraining vocab needs "
                f"all of {', '.join(REQUIRED_TOKENS)} (one token per line, e.g. Google's layout "
                f"[PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103)")
    return {token: index[token] for token in REQUIRED_TOKENS}


def decode_utf8(data: bytes, path: str) -> str:
    """Decodes `data` as UTF-8, or raises ValueError naming the file and the byte offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = data[err.start:err.start + 4]
        raise ValueError(
            f"{path}: not valid UTF-8 at byte offset {err.start} (bytes {bad!r}: {err.reason}); "
            f"re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)") from None


def split_documents(text: str) -> tuple[list[list[str]], int]:
    """Google-format text -> (documents as lists of stripped sentences, number of empty ones).

    Lines are stripped; blank (whitespace-only) lines separate documents. Extra
    blank lines between two documents would be empty documents: they are
    dropped and counted (blank lines at the start or end of a file are not).
    """
    documents: list[list[str]] = []
    current: list[str] = []
    blank_run = 0
    empty = 0
    for line in io.StringIO(text, newline=None):
        line = line.strip()
        if not line:
            blank_run += 1
            continue
        if blank_run:
            if current:
                documents.append(current)
                current = []
            if documents:
                empty += blank_run - 1
            blank_run = 0
        current.append(line)
    if current:
        documents.append(current)
    return documents, empty


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------
class SplitDocumentsFn(beam.DoFn):
    """ReadableFile -> ((path, index), [sentence, ...]) per non-empty document.

    Also emits {"skipped/empty_documents": n} on the `stats` output.
    """

    def process(self, readable_file):
        path = readable_file.metadata.path
        text = decode_utf8(readable_file.read(), path)
        documents, empty = split_documents(text)
        for index, sentences in enumerate(documents):
            yield (path, index), sentences
        if empty:
            yield beam.pvalue.TaggedOutput(STATS_TAG, {"skipped/empty_documents": empty})


class ReadDocuments(beam.PTransform):
    """Globs (a list, or one comma-separated string) -> documents keyed by (path, index).

    Returns a DoOutputsTuple: the main output holds the documents, `.stats` the counters.
    """

    def __init__(self, patterns):
        super().__init__()
        if isinstance(patterns, str):
            patterns = [p.strip() for p in patterns.split(",") if p.strip()]
        self._patterns = list(patterns)

    def expand(self, pbegin):
        return (
            pbegin
            | "Patterns" >> beam.Create(self._patterns)
            | "MatchFiles" >> fileio.MatchAll()
            | "ReadMatches" >> fileio.ReadMatches()
            | "SplitDocuments" >> beam.ParDo(SplitDocumentsFn()).with_outputs(STATS_TAG,
                                                                             main="documents"))


# ---------------------------------------------------------------------------
# Tokenizing
# ---------------------------------------------------------------------------
class TokenizeDocumentsFn(beam.DoFn):
    """Batches of (doc_id, [sentence]) -> (doc_id, [[token id, ...] per sentence]).

    Uses keras-hub's WordPieceTokenizer, traced once with `tf.function` (its
    TensorFlow path, the same one tf.data uses) and called on whole batches of
    sentences. Sentences with no tokens are dropped, and so are documents left
    with no sentences; both are counted on the `stats` output along with
    documents, sentences and single_sentence_documents.
    """

    def __init__(self, vocab_file: str, lowercase: bool):
        self._vocab_file = vocab_file
        self._lowercase = lowercase
        self._tokenize = None

    def setup(self):
        import keras_hub
        import tensorflow as tf

        vocab = read_vocab(self._vocab_file)
        special_token_ids(vocab, self._vocab_file)
        tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=vocab, lowercase=self._lowercase, strip_accents=self._lowercase,
            oov_token="[UNK]")
        self._tokenize = tf.function(
            tokenizer, input_signature=[tf.TensorSpec([None], tf.string)])
        self._tf = tf

    def tokenize_sentences(self, sentences: list[str]) -> list[list[int]]:
        """[sentence] -> [[id, ...]] in one tokenizer call."""
        if not sentences:
            return []
        ragged = self._tokenize(self._tf.constant(sentences))  # [num_sentences, (tokens)]
        ids = ragged.flat_values.numpy().tolist()
        splits = ragged.row_splits.numpy().tolist()
        return [ids[start:end] for start, end in zip(splits[:-1], splits[1:])]

    def process(self, batch):
        sentences = [sentence for _, document in batch for sentence in document]
        token_ids = self.tokenize_sentences(sentences)
        counts = {"documents": 0, "sentences": 0, "single_sentence_documents": 0}
        position = 0
        for doc_id, document in batch:
            tokenized = [ids for ids in token_ids[position:position + len(document)] if ids]
            position += len(document)
            dropped = len(document) - len(tokenized)
            if dropped:
                counts["skipped/sentences_without_tokens"] = (
                    counts.get("skipped/sentences_without_tokens", 0) + dropped)
            if not tokenized:
                counts["skipped/documents_without_tokens"] = (
                    counts.get("skipped/documents_without_tokens", 0) + 1)
                continue
            counts["documents"] += 1
            counts["sentences"] += len(tokenized)
            counts["single_sentence_documents"] += len(tokenized) == 1
            yield doc_id, tokenized
        if batch:
            yield beam.pvalue.TaggedOutput(STATS_TAG, counts)


class TokenizeDocuments(beam.PTransform):
    """(doc_id, [sentence]) -> (doc_id, [[token id]]), batching ~4k sentences per tokenizer call.

    Returns a DoOutputsTuple: the main output holds the documents, `.stats` the counters.
    """

    def __init__(self, vocab_file: str, lowercase: bool,
                 batch_sentences: int = TOKENIZE_BATCH_SENTENCES):
        super().__init__()
        self._vocab_file = vocab_file
        self._lowercase = lowercase
        self._batch_sentences = batch_sentences

    def expand(self, documents):
        return (
            documents
            | "BatchDocuments" >> beam.BatchElements(
                min_batch_size=self._batch_sentences, max_batch_size=self._batch_sentences,
                element_size_fn=lambda document: len(document[1]))
            | "Tokenize" >> beam.ParDo(
                TokenizeDocumentsFn(self._vocab_file, self._lowercase)).with_outputs(
                    STATS_TAG, main="documents"))


# ---------------------------------------------------------------------------
# Counters
# ---------------------------------------------------------------------------
class SumCounters(beam.CombineFn):
    """Sums flat {name: number} dicts key by key (missing keys count as 0)."""

    def create_accumulator(self):
        return {}

    def add_input(self, accumulator, counters):
        for key, value in counters.items():
            accumulator[key] = accumulator.get(key, 0) + value
        return accumulator

    def merge_accumulators(self, accumulators):
        merged = {}
        for accumulator in accumulators:
            self.add_input(merged, accumulator)
        return merged

    def extract_output(self, accumulator):
        return dict(sorted(accumulator.items()))

