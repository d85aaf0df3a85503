"""Beam transforms shared by the jobs: tokenize documents, TFRecord frames without
TensorFlow, sum counters. Reading the input (formats, byte ranges, document ids) is
beam_jobs/reading.py.

Tokenizing uses the Hugging Face `tokenizers` WordPiece (Rust) with the BERT
normaliser and pre-tokenizer — the same rules as google-research/bert's
`FullTokenizer` — behind a per-worker cache of whitespace-separated words, so
no TensorFlow is imported by the workers. Heavy resources are loaded in
`DoFn.setup`, once per worker, never pickled with the pipeline graph.
"""

from __future__ import annotations

import array
import io
import itertools
import re
import struct

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_jobs.reading import STATS_TAG, _skipper, decode_utf8

# Tokens every pretraining vocab must have (looked up by string, never by id).
REQUIRED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


# Sentences per tokenizer call.
TOKENIZE_BATCH_SENTENCES = 4096


# Distinct words remembered per worker by the tokenizer cache (bounds its memory, ~15 MB).
TOKEN_CACHE_WORDS = 100_000


# ---------------------------------------------------------------------------
# Plain functions (no Beam): used by the DoFns below and directly by tests.
# ---------------------------------------------------------------------------
def read_vocab(vocab_file: str) -> list[str]:
    """The vocab file's tokens in id order (one per line, trailing whitespace dropped).

    Works for any Beam filesystem path (gs://...).
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


# ---------------------------------------------------------------------------
# Tokenizing
# ---------------------------------------------------------------------------
# What BERT's normaliser treats as whitespace (Rust char::is_whitespace plus \t\n\r): words
# never span these, so tokenizing word by word (cached) gives the ids of the whole line.
_WHITESPACE = re.compile(
    "[\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")


_ASCII_SEPARATORS = re.compile("[\x1c-\x1f]")  # str.split splits on these, BERT does not


class WordPieceTokenizer:
    """BERT WordPiece tokenization (google-research/bert's rules) with a word cache.

    The Hugging Face `tokenizers` pipeline: BertNormalizer (clean control chars,
    space out CJK, lowercase + strip accents when `lowercase`), BertPreTokenizer
    (whitespace and punctuation), WordPiece (greedy longest match, "##"
    continuations, [UNK] for words over 100 characters or without a match).
    Words (whitespace-separated) already seen are looked up in a cache of at most
    `cache_words` entries, as packed ids; only new words go to the Rust tokenizer,
    in one batch.

    >>> tok = WordPieceTokenizer(["[PAD]", "[UNK]", "the", "cat", "##s", "."], lowercase=True)
    >>> tok.tokenize(["The cats.", "Dogs"])
    [[2, 3, 4, 5], [1]]
    >>> [ids.tolist() for ids in tok.tokenize_arrays(["The cats."])]
    [[2, 3, 4, 5]]
    """

    def __init__(self, vocab: list[str], lowercase: bool, cache_words: int = TOKEN_CACHE_WORDS):
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

        index = {}
        for i, token in enumerate(vocab):
            index[token] = i  # a repeated token keeps its last id, as the reference's load_vocab
        unk = "[UNK]" if "[UNK]" in index else vocab[0]
        tokenizer = Tokenizer(models.WordPiece(index, unk_token=unk, max_input_chars_per_word=100))
        tokenizer.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=lowercase,
            lowercase=lowercase)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        self._tokenizer = tokenizer
        self.typecode = "H" if len(vocab) <= 1 << 16 else "I"  # array type of the ids
        self._cache: dict = {"": b""}
        self._cache_words = cache_words

    def _words(self, sentences: list[str]) -> list[list[str]]:
        # str.split splits ASCII text on the same whitespace as BERT, except for the control
        # characters \x1c-\x1f (BERT deletes them): checked once for the whole batch.
        if _ASCII_SEPARATORS.search("".join(sentences)) is None:
            regex = _WHITESPACE.split
            return [s.split() if s.isascii() else regex(s) for s in sentences]
        return [_WHITESPACE.split(s) for s in sentences]

    def tokenize_packed(self, sentences: list[str]) -> list[bytes]:
        """[sentence] -> the ids of each as packed machine integers (array(self.typecode))."""
        cache = self._cache
        words = self._words(sentences)
        new = [word for word in set(itertools.chain.from_iterable(words)) if word not in cache]
        lookup = cache.__getitem__
        if new:
            encoded = self._tokenizer.encode_batch_fast(new, add_special_tokens=False)
            typecode = self.typecode
            packed = [array.array(typecode, e.ids).tobytes() for e in encoded]
            room = max(0, self._cache_words - len(cache))
            cache.update(zip(new[:room], packed))
            if len(new) > room:  # the cache is full: look the rest up beside it
                extra = dict(zip(new[room:], packed[room:]))
                lookup = lambda word: cache[word] if word in cache else extra[word]  # noqa: E731
        join = b"".join
        return [join(map(lookup, sentence)) for sentence in words]

    def tokenize_arrays(self, sentences: list[str]) -> list[array.array]:
        """[sentence] -> [array of ids] (empty for a sentence without tokens)."""
        out = []
        for data in self.tokenize_packed(sentences):
            ids = array.array(self.typecode)
            ids.frombytes(data)
            out.append(ids)
        return out

    def tokenize(self, sentences: list[str]) -> list[list[int]]:
        """[sentence] -> [[id, ...]] (empty for a sentence without tokens)."""
        return [ids.tolist() for ids in self.tokenize_arrays(sentences)]


def tokenize_documents(tokenizer: WordPieceTokenizer, documents, counters: dict):
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
        vocab = read_vocab(self._vocab_file)
        special_token_ids(vocab, self._vocab_file)
        self._tokenizer = WordPieceTokenizer(vocab, self._lowercase)

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
