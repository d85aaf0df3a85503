"""Beam transforms shared by the jobs: tokenize documents, TFRecord frames without
TensorFlow, sum counters. Reading the input (formats, byte ranges, document ids) is
beam_jobs/reading.py.

Tokenizing uses `models.tokenizer.Tokenizer`, the project's one tokenizer contract (Google's
`FullTokenizer` rules) in pure Python behind a per-worker cache of whitespace-separated words,
so no TensorFlow is imported by the workers. Heavy resources are loaded in
`DoFn.setup`, once per worker, never pickled with the pipeline graph.
"""

from __future__ import annotations

import struct

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_jobs.reading import STATS_TAG, _skipper
from models.tokenizer import Tokenizer, read_vocab

# Tokens every pretraining vocab must have (looked up by string, never by id).
REQUIRED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


# Sentences per tokenizer call.
TOKENIZE_BATCH_SENTENCES = 4096


# Distinct words remembered per worker by the tokenizer cache (bounds its memory, ~15 MB).
TOKEN_CACHE_WORDS = 100_000


# ---------------------------------------------------------------------------
# Plain functions (no Beam): used by the DoFns below and directly by tests.
# ---------------------------------------------------------------------------
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


def tokenize_documents(tokenizer: Tokenizer, documents, counters: dict):
    """[(doc_id, [sentence])] -> [(doc_id, [array of token ids per sentence])] in one
    tokenizer call.

    Sentences with no tokens are dropped, and so are documents left with no sentences;
    both are counted in `counters` along with documents, sentences, document_tokens and
    single_sentence_documents.
    """
    token_ids = tokenizer.tokenize_arrays([s for _, document in documents for s in document])
    skip = _skipper(counters)
    out, position = [], 0
    for doc_id, document in documents:
        tokenized = [ids for ids in token_ids[position:position + len(document)] if ids]
        position += len(document)
        skip("sentences_without_tokens", len(document) - len(tokenized))
        if not tokenized:
            skip("documents_without_tokens")
            continue
        counters["documents"] = counters.get("documents", 0) + 1
        counters["sentences"] = counters.get("sentences", 0) + len(tokenized)
        counters["document_tokens"] = counters.get("document_tokens", 0) + sum(
            map(len, tokenized))
        if len(tokenized) == 1:
            counters["single_sentence_documents"] = counters.get(
                "single_sentence_documents", 0) + 1
        out.append((doc_id, tokenized))
    return out


class TokenizeDocumentsFn(beam.DoFn):
    """Batches of (doc_id, [sentence]) -> (doc_id, [[token id, ...] per sentence]);
    counters on `stats` (see `tokenize_documents`)."""

    def __init__(self, vocab_file: str, lowercase: bool):
        self._vocab_file = vocab_file
        self._lowercase = lowercase
        self._tokenizer = None

    def setup(self):
        vocab = read_vocab(self._vocab_file, FileSystems.open)  # any Beam path (gs://...)
        special_token_ids(vocab, self._vocab_file)
        self._tokenizer = Tokenizer(vocab, self._lowercase, cache_words=TOKEN_CACHE_WORDS)

    def process(self, batch):
        counters: dict = {}
        for doc_id, sentences in tokenize_documents(self._tokenizer, batch, counters):
            yield doc_id, [ids.tolist() for ids in sentences]
        if batch:
            yield beam.pvalue.TaggedOutput(STATS_TAG, counters)


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
# TFRecords without TensorFlow
# ---------------------------------------------------------------------------
def _crc32c_function():
    try:
        import crcmod.predefined

        return crcmod.predefined.mkPredefinedCrcFun("crc-32c")
    except ImportError:  # pragma: no cover - apache-beam[tfrecord] brings crcmod
        from apache_beam.io.tfrecordio import _default_crc32c_fn

        return _default_crc32c_fn


_crc32c = _crc32c_function()


def _masked_crc(data: bytes) -> bytes:
    crc = _crc32c(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def tfrecord_frame(record: bytes) -> bytes:
    """One record framed as in a TFRecord file: length, its masked CRC-32C, data, its CRC."""
    length = struct.pack("<Q", len(record))
    return length + _masked_crc(length) + record + _masked_crc(record)


def iter_tfrecord_frames(handle):
    """Yields the raw frames (header + data + crc) of a TFRecord file, unchecked."""
    while True:
        header = handle.read(12)
        if not header:
            return
        if len(header) < 12:
            raise ValueError("truncated TFRecord file")
        (length,) = struct.unpack_from("<Q", header)
        body = handle.read(length + 4)
        if len(body) < length + 4:
            raise ValueError("truncated TFRecord file")
        yield header + body


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
