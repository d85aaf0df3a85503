"""Beam job: text -> masked-LM + next-sentence (NSP) or sentence-order (SOP) instances -> TFRecords.

    IndexDocuments     the --input files in byte ranges (compressed files as one stream):
                       (document id, ref) per document, document id = (file path, byte
                       offset), ref = (offset, length) (compressed input: the document's
                       zlib-compressed bytes); formats: google (sentence per line), text
                       (sentence splitting), jsonl (--text_field)
    AssignGroups       hash(seed, document id) -> one of ceil(input MB / --group_size_mb)
                       groups; GroupDocuments: GroupByKey (only refs are shuffled)
    CreateInstances    per group: read its documents, tokenize them (WordPiece with
                       BERT's rules: Hugging Face `tokenizers` + a word cache), sort them by
                       id and shuffle them with a seeded random.Random; one random.Random
                       per (seed, group, dupe pass, phase): the algorithm of
                       google-research/bert create_pretraining_data.py (random "B" from the
                       same group), or ALBERT's SOP; masking (optionally whole-word) or none
                       (--masking dynamic: tf.data masks each epoch); each phase's records
                       go to one part file per group
    WriteShards        per phase: <dir>/<split>-SSSSS-of-NNNNN.tfrecord, the records of
                       all groups in group order cut into --num_shards equal runs
    WriteStats         per phase: <dir>/<split>-stats.json (counters summed by a combiner)

<dir> is --output_dir, or --output_dir/phase<i> for each of --phases (e.g. "128:20,512:80"
writes phase1/ with seq 128 and 20 predictions and phase2/ with 512 and 80, from one
reading and tokenization of the corpus).

The output is a function of the input files (paths and contents), the vocab and the
flags only: the same bytes in the same shards on every runner and every run. No worker
holds more than one group (about --group_size_mb of text) or one document being read;
TensorFlow is not imported (records are encoded by `ExampleEncoder`, byte-identical to
`schema.serialize`).

Run it (flags the job does not know go to Beam's PipelineOptions):

    python -m beam_jobs.pretraining_data --input 'corpus/train/*.txt' --output_dir out \\
        --split train --vocab_file vocab.txt --runner=FnApiRunner

The instance functions are plain Python taking a `random.Random`:

    >>> import random
    >>> special = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4, vocab_size=50)
    >>> docs = [[[10, 11, 12], [13, 14]], [[20, 21], [22, 23, 24]]]
    >>> settings = InstanceSettings(max_seq_length=16, max_predictions_per_seq=3,
    ...                             short_seq_prob=0.0)
    >>> instances = create_instances_from_document(docs, 0, settings, special, random.Random(1))
    >>> first = instances[0]
    >>> first.token_ids[0] == special.cls, first.segment_ids[0], len(first.masked_lm_positions)
    (True, 0, 1)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
import random
import struct
import sys
import uuid

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs import schema, transforms

_LOGGER = logging.getLogger(__name__)

# Which of the three masking branches replaced a chosen token.
MASK, RANDOM, KEEP = "mask", "random", "keep"

OBJECTIVES = ("nsp", "sop")
MASKINGS = ("static", "dynamic")
SOP_IN_ORDER, SOP_SWAPPED = 0, 1

# The sequence-length histogram in the stats has this many buckets.
HISTOGRAM_BUCKETS = 8


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """Ids of the special tokens (looked up by string in the vocab), the vocab size, and the
    ids of "##" continuation pieces (for whole-word masking)."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int
    vocab_size: int
    continuation: frozenset = frozenset()

    @classmethod
    def from_vocab(cls, vocab: list[str], vocab_file: str = "<vocab>") -> "SpecialIds":
        ids = transforms.special_token_ids(vocab, vocab_file)
        return cls(pad=ids["[PAD]"], unk=ids["[UNK]"], cls=ids["[CLS]"], sep=ids["[SEP]"],
                   mask=ids["[MASK]"], vocab_size=len(vocab),
                   continuation=frozenset(i for i, t in enumerate(vocab) if t.startswith("##")))


@dataclasses.dataclass(frozen=True)
class InstanceSettings:
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 1
    seed: int = 12345
    objective: str = "nsp"            # nsp | sop
    whole_word_masking: bool = False
    masking: str = "static"           # static | dynamic (no masks written)


@dataclasses.dataclass
class TrainingInstance:
    """One pair after masking: `[CLS] A [SEP] B [SEP]` as ids (unpadded).

    label: NSP 0 = B follows A, 1 = B is random; SOP 0 = in order, 1 = swapped.
    """

    token_ids: list[int]             # after masking
    a_length: int                    # tokens of [CLS] A [SEP] (segment 0)
    label: int
    masked_lm_positions: list[int]   # sorted
    masked_lm_ids: list[int]         # the original ids at those positions
    masked_lm_branches: list[str]    # MASK / RANDOM / KEEP for each position
    random_from_same_document: bool = False  # NSP: B had to come from A's own document

    @property
    def segment_ids(self) -> list[int]:
        return [0] * self.a_length + [1] * (len(self.token_ids) - self.a_length)

    @property
    def is_random_next(self) -> bool:
        return self.label == schema.NSP_IS_RANDOM

    def features(self) -> dict:
        """The schema's features, unpadded (`schema.serialize` pads them)."""
        return {
            "input_ids": self.token_ids,
            "input_mask": [1] * len(self.token_ids),
            "segment_ids": self.segment_ids,
            "masked_lm_positions": self.masked_lm_positions,
            "masked_lm_ids": self.masked_lm_ids,
            "masked_lm_weights": [1.0] * len(self.masked_lm_positions),
            "next_sentence_labels": [self.label],
        }


# ---------------------------------------------------------------------------
# Instance creation and masking (plain Python; google-research/bert's algorithm)
# ---------------------------------------------------------------------------
def truncate_seq_pair(tokens_a: list, tokens_b: list, max_num_tokens: int,
                      rng: random.Random) -> None:
    """Trims the longer list (B on ties) one token at a time, from the front or the back
    at random, until both fit in `max_num_tokens`. Modifies the lists in place.

    (The reference deletes token by token; counting the cuts first and slicing once
    draws the same random numbers and gives the same result.)
    """
    len_a, len_b = len(tokens_a), len(tokens_b)
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return
    cuts = [0, 0, 0, 0]  # A front, A back, B front, B back
    random_ = rng.random
    for _ in range(excess):
        if len_a > len_b:
            cuts[0 if random_() < 0.5 else 1] += 1
            len_a -= 1
        else:
            cuts[2 if random_() < 0.5 else 3] += 1
            len_b -= 1
    if cuts[0] or cuts[1]:
        tokens_a[:] = tokens_a[cuts[0]:len(tokens_a) - cuts[1]]
    if cuts[2] or cuts[3]:
        tokens_b[:] = tokens_b[cuts[2]:len(tokens_b) - cuts[3]]


def num_to_predict(length: int, masked_lm_prob: float, max_predictions_per_seq: int) -> int:
    """min(max_predictions_per_seq, max(1, round(length * masked_lm_prob))), as the reference."""
    return min(max_predictions_per_seq, max(1, int(round(length * masked_lm_prob))))


def word_candidates(token_ids: list[int], special: SpecialIds, whole_word: bool) -> list:
    """Maskable positions grouped into words: [[i], [j, j+1], ...] ([CLS]/[SEP] excluded).

    With `whole_word`, a "##" piece joins the word of the token just before it (when that
    token is itself maskable); otherwise every position is its own group.
    """
    cls, sep = special.cls, special.sep
    if not whole_word:
        return [[i] for i, t in enumerate(token_ids) if t != cls and t != sep]
    continuation = special.continuation
    groups: list[list[int]] = []
    previous_maskable = False
    for i, token in enumerate(token_ids):
        if token == cls or token == sep:
            previous_maskable = False
            continue
        if previous_maskable and token in continuation:
            groups[-1].append(i)
        else:
            groups.append([i])
        previous_maskable = True
    return groups


def create_masked_lm_predictions(token_ids: list[int], masked_lm_prob: float,
                                 max_predictions_per_seq: int, special: SpecialIds,
                                 rng: random.Random, whole_word: bool = False,
                                 a_length: int | None = None):
    """Chooses the masked-LM positions of one sequence and replaces their tokens.

    num_to_predict = min(max_predictions_per_seq, max(1, round(len * masked_lm_prob)));
    [CLS] and [SEP] are never chosen; each chosen token becomes [MASK] with
    probability 0.8, a uniformly random vocab id with 0.1, and stays with 0.1.
    With `whole_word`, words (a token and its following "##" pieces) are chosen in a
    random order and a word that would exceed the count is skipped, as in the reference.
    `a_length` (len([CLS] A [SEP]) of a `[CLS] A [SEP] B [SEP]` sequence) lets the
    candidates be known without scanning for [CLS]/[SEP].

    Returns (masked token ids, sorted positions, original ids, branch of each).
    """
    count = num_to_predict(len(token_ids), masked_lm_prob, max_predictions_per_seq)
    if whole_word:
        groups = word_candidates(token_ids, special, True)
        rng.shuffle(groups)
        positions: list[int] = []
        for group in groups:
            if len(positions) >= count:
                break
            if len(positions) + len(group) > count:
                continue
            positions.extend(group)
    elif a_length is not None:
        # The reference shuffles all candidates and takes the first `count`; a partial
        # Fisher-Yates shuffle draws the same distribution (a uniform subset) faster.
        # Candidates: 1 .. a_length-2 (A) and a_length .. len-2 (B): j or j + 1 for j in
        # [1, len - 3].
        pool = list(range(1, len(token_ids) - 2))
        size = len(pool)
        random_ = rng.random
        for i in range(min(count, size)):
            j = i + int(random_() * (size - i))
            pool[i], pool[j] = pool[j], pool[i]
        last_a = a_length - 2
        positions = [j if j <= last_a else j + 1 for j in pool[:min(count, size)]]
    else:
        cls, sep = special.cls, special.sep
        candidates = [i for i, t in enumerate(token_ids) if t != cls and t != sep]
        positions = rng.sample(candidates, min(count, len(candidates)))
    positions.sort()
    output = list(token_ids)
    labels = [token_ids[p] for p in positions]
    branches = []
    random_ = rng.random
    mask, vocab_size = special.mask, special.vocab_size
    for p in positions:
        if random_() < 0.8:
            output[p] = mask
            branches.append(MASK)
        elif random_() < 0.5:
            branches.append(KEEP)
        else:
            output[p] = int(random_() * vocab_size)  # uniform in [0, vocab_size)
            branches.append(RANDOM)
    return output, positions, labels, branches


def _flatten(sentences) -> list[int]:
    out: list[int] = []
    for sentence in sentences:
        out.extend(sentence)
    return out


def create_instances_from_document(all_documents: list, document_index: int,
                                   settings: InstanceSettings, special: SpecialIds,
                                   rng: random.Random,
                                   counters: dict | None = None) -> list[TrainingInstance]:
    """The instances of one document (a list of sentences, each a non-empty list of ids).

    Sentences are accumulated into a chunk until the target length is reached
    (max_seq_length - 3, or with probability short_seq_prob a random target in
    [2, max_seq_length - 3], drawn once per document as in the reference); the
    chunk is split at a random sentence boundary into A and B.

    NSP: with probability 0.5 (always when the chunk has one sentence) B is taken
    instead from a random other document of `all_documents`, and the chunk's unused
    sentences are put back. SOP (ALBERT): B is always A's continuation, and with
    probability 0.5 the two are swapped (label 1); a one-sentence chunk is split at
    a random token (one of a single token is skipped, counted in `counters`).

    The pair is truncated to fit, wrapped in [CLS] A [SEP] B [SEP] and masked
    (unless settings.masking is "dynamic").
    """
    document = [list(sentence) for sentence in all_documents[document_index]]
    max_num_tokens = settings.max_seq_length - 3  # room for [CLS], [SEP], [SEP]
    target_seq_length = max_num_tokens
    if rng.random() < settings.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    sop = settings.objective == "sop"
    static = settings.masking == "static"

    instances = []
    chunk: list = []
    chunk_length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target_seq_length:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            same_document = False
            if sop:
                if len(chunk) >= 2:
                    tokens_a, tokens_b = _flatten(chunk[:a_end]), _flatten(chunk[a_end:])
                elif len(chunk[0]) >= 2:
                    split = rng.randint(1, len(chunk[0]) - 1)
                    tokens_a, tokens_b = list(chunk[0][:split]), list(chunk[0][split:])
                else:
                    if counters is not None:
                        counters["skipped/sop_single_token_chunks"] = (
                            counters.get("skipped/sop_single_token_chunks", 0) + 1)
                    chunk, chunk_length = [], 0
                    i += 1
                    continue
                label = SOP_IN_ORDER
                if rng.random() < 0.5:
                    tokens_a, tokens_b, label = tokens_b, tokens_a, SOP_SWAPPED
            else:
                tokens_a = _flatten(chunk[:a_end])
                if len(chunk) == 1 or rng.random() < 0.5:
                    label = schema.NSP_IS_RANDOM
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):  # a document other than this one, if there is one
                        random_index = rng.randint(0, len(all_documents) - 1)
                        if random_index != document_index:
                            break
                    same_document = random_index == document_index
                    random_document = all_documents[random_index]
                    tokens_b = []
                    for j in range(rng.randint(0, len(random_document) - 1),
                                   len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    i -= len(chunk) - a_end  # put the unused sentences back
                else:
                    label = schema.NSP_IS_NEXT
                    tokens_b = _flatten(chunk[a_end:])
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            assert tokens_a and tokens_b, "empty segment: sentences must be non-empty"

            tokens = [special.cls, *tokens_a, special.sep, *tokens_b, special.sep]
            if static:
                masked, positions, labels, branches = create_masked_lm_predictions(
                    tokens, settings.masked_lm_prob, settings.max_predictions_per_seq, special,
                    rng, settings.whole_word_masking, a_length=len(tokens_a) + 2)
            else:
                masked, positions, labels, branches = tokens, [], [], []
            instances.append(TrainingInstance(
                token_ids=masked, a_length=len(tokens_a) + 2, label=label,
                masked_lm_positions=positions, masked_lm_ids=labels,
                masked_lm_branches=branches, random_from_same_document=same_document))
            chunk = []
            chunk_length = 0
        i += 1
    return instances


# ---------------------------------------------------------------------------
# Groups: documents are hashed into groups; B is drawn from the same group
# ---------------------------------------------------------------------------
def num_groups(input_bytes: int, group_size_mb: float) -> int:
    """ceil(input size / group size), at least 1."""
    return max(1, math.ceil(input_bytes / (group_size_mb * (1 << 20))))


def document_group(doc_id, seed: int, groups: int) -> int:
    """A stable hash of (seed, document id) -> group in [0, groups) (no PYTHONHASHSEED)."""
    digest = hashlib.blake2b(repr((seed, tuple(doc_id))).encode("utf-8"), digest_size=8)
    return int.from_bytes(digest.digest(), "big") % groups


def create_instances_for_group(documents: list, group: int, settings: InstanceSettings,
                               special: SpecialIds, salt: str = "",
                               counters: dict | None = None):
    """Yields the instances of one group: documents = [(doc_id, [[ids] per sentence])].

    Documents are sorted by id and then put in a seeded random order (as the
    reference shuffles its documents); each dupe pass has its own
    random.Random(seed, group, pass, salt), so the result depends on nothing else.
    """
    documents = sorted(documents, key=lambda item: item[0])
    random.Random(f"{settings.seed}/{group}/order").shuffle(documents)
    all_documents = [sentences for _, sentences in documents]
    for dupe in range(settings.dupe_factor):
        rng = random.Random(f"{settings.seed}/{group}/{dupe}{salt}")
        for index in range(len(all_documents)):
            yield from create_instances_from_document(all_documents, index, settings, special,
                                                      rng, counters)


# ---------------------------------------------------------------------------
# tf.train.Example bytes without TensorFlow
# ---------------------------------------------------------------------------
def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class ExampleEncoder:
    """Instance -> serialized tf.train.Example, byte-identical to `schema.serialize`
    (deterministic protobuf encoding: map entries sorted by key), with no TensorFlow.

    An Example is `features {feature {key: "input_ids" value {int64_list {value: [...]}}} ...}`:
    length-delimited fields all the way down, int64 values as packed varints, floats as
    packed little-endian 32-bit values. The fixed-size features (input_mask, segment_ids,
    masked_lm_weights, next_sentence_labels) have a constant header, precomputed here.
    """

    INT64, FLOAT = 3, 2  # Feature's field numbers for int64_list and float_list

    def __init__(self, max_seq_length: int, max_predictions_per_seq: int, vocab_size: int):
        seq, pred = max_seq_length, max_predictions_per_seq
        self.max_seq_length, self.max_predictions = seq, pred
        self._varints = [_varint(i) for i in range(max(vocab_size, seq, 2, 1 << 14))]
        self._heads: dict = {}  # (key, payload length) -> header
        one, zero = struct.pack("<f", 1.0), struct.pack("<f", 0.0)
        # Headers of the features whose payload length is fixed.
        self._mask_head = self._header(b"input_mask", self.INT64, seq)
        self._segment_head = self._header(b"segment_ids", self.INT64, seq)
        self._weights = [self._header(b"masked_lm_weights", self.FLOAT, 4 * pred)
                         + one * k + zero * (pred - k) for k in range(pred + 1)]
        self._labels = [self._header(b"next_sentence_labels", self.INT64, 1) + bytes([label])
                        for label in (0, 1)]

    @staticmethod
    def _header(key: bytes, field: int, payload_length: int) -> bytes:
        """Bytes of one map entry of Features up to its payload (values) of this length."""
        values_head = b"\x0a" + _varint(payload_length)               # Int64List / FloatList
        feature_length = len(values_head) + payload_length
        feature_head = bytes([field << 3 | 2]) + _varint(feature_length)   # Feature
        entry = b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(
            len(feature_head) + feature_length)                          # map entry
        entry_length = len(entry) + len(feature_head) + len(values_head) + payload_length
        return b"\x0a" + _varint(entry_length) + entry + feature_head + values_head

    def _ints(self, key: bytes, values, length: int) -> bytes:
        payload = b"".join(map(self._varints.__getitem__, values)) + b"\x00" * (
            length - len(values))
        head = self._heads.get((key, len(payload)))
        if head is None:
            head = self._heads[key, len(payload)] = self._header(key, self.INT64, len(payload))
        return head + payload

    def _length(self, n: int) -> bytes:
        return self._varints[n] if n < len(self._varints) else _varint(n)

    def encode(self, token_ids, a_length: int, masked_lm_positions, masked_lm_ids,
               label: int) -> bytes:
        """The padded features of one instance -> serialized Example bytes."""
        seq, pred = self.max_seq_length, self.max_predictions
        n, k = len(token_ids), len(masked_lm_positions)
        if n > seq or k > pred:
            raise ValueError(f"instance of {n} tokens / {k} predictions exceeds {seq} / {pred}")
        features = b"".join((  # sorted by key, as deterministic serialization orders a map
            self._ints(b"input_ids", token_ids, seq),
            self._mask_head, b"\x01" * n, b"\x00" * (seq - n),
            self._ints(b"masked_lm_ids", masked_lm_ids, pred),
            self._ints(b"masked_lm_positions", masked_lm_positions, pred),
            self._weights[k],
            self._labels[label],
            self._segment_head, b"\x00" * a_length, b"\x01" * (n - a_length),
            b"\x00" * (seq - n),
        ))
        return b"\x0a" + self._length(len(features)) + features

    def encode_instance(self, instance: TrainingInstance) -> bytes:
        return self.encode(instance.token_ids, instance.a_length, instance.masked_lm_positions,
                           instance.masked_lm_ids, instance.label)


def serialize_instance(instance: TrainingInstance, max_seq_length: int,
                       max_predictions_per_seq: int) -> bytes:
    """One instance -> a tf.train.Example record via TensorFlow (`schema.serialize`)."""
    return schema.serialize(instance.features(), max_seq_length, max_predictions_per_seq)


# ---------------------------------------------------------------------------
# Stats
# ---------------------------------------------------------------------------
def histogram_width(max_seq_length: int) -> int:
    return max(1, math.ceil(max_seq_length / HISTOGRAM_BUCKETS))


class InstanceCounters:
    """Counts instances into the flat counters of the stats (names prefixed by `prefix`)."""

    def __init__(self, max_seq_length: int, prefix: str = ""):
        self.prefix, self.width = prefix, histogram_width(max_seq_length)
        self.instances = self.tokens = self.masked = self.same_document = 0
        self.branches = {MASK: 0, RANDOM: 0, KEEP: 0}
        self.labels = [0, 0]
        self.buckets: dict = {}

    def add(self, instance: TrainingInstance) -> None:
        length = len(instance.token_ids)
        self.instances += 1
        self.tokens += length
        branches = instance.masked_lm_branches
        if branches:
            self.masked += len(branches)
            for name in self.branches:
                self.branches[name] += branches.count(name)
        self.labels[instance.label] += 1
        self.same_document += instance.random_from_same_document
        bucket = (length - 1) // self.width
        self.buckets[bucket] = self.buckets.get(bucket, 0) + 1

    def add_to(self, counters: dict) -> dict:
        p = self.prefix
        items = {f"{p}instances": self.instances, f"{p}tokens": self.tokens,
                 f"{p}masked_tokens": self.masked,
                 f"{p}nsp_random_from_same_document": self.same_document}
        items.update({f"{p}masked_as/{name}": n for name, n in self.branches.items()})
        items.update({f"{p}label/{label}": n for label, n in enumerate(self.labels)})
        items.update({f"{p}length_bucket/{b}": n for b, n in self.buckets.items()})
        for key, value in items.items():
            if value:
                counters[key] = counters.get(key, 0) + value
        return counters


def add_instance_counters(counters: dict, instance: TrainingInstance, max_seq_length: int,
                          prefix: str = "") -> None:
    """Adds one instance to flat counters (summed later by transforms.SumCounters)."""
    one = InstanceCounters(max_seq_length, prefix)
    one.add(instance)
    one.add_to(counters)


def finalize_stats(counters: dict, settings: dict, prefix: str = "") -> dict:
    """Summed counters + the job's settings -> the stats dict written to <split>-stats.json.

    `prefix` selects one phase's instance counters; document counters are shared.
    """
    def count(key):
        return int(counters.get(key, 0))

    def fraction(part, whole):
        return round(part / whole, 6) if whole else 0.0

    max_seq_length = settings["max_seq_length"]
    width = histogram_width(max_seq_length)
    histogram = {}
    for bucket in range(math.ceil(max_seq_length / width)):
        low, high = bucket * width + 1, min((bucket + 1) * width, max_seq_length)
        histogram[f"{low}-{high}"] = count(f"{prefix}length_bucket/{bucket}")
    instances, masked = count(f"{prefix}instances"), count(f"{prefix}masked_tokens")
    label_0, label_1 = count(f"{prefix}label/0"), count(f"{prefix}label/1")
    stats = {
        "split": settings["split"],
        "documents": count("documents"),
        "sentences": count("sentences"),
        "document_tokens": count("document_tokens"),
        "single_sentence_documents": count("single_sentence_documents"),
        "groups": count("groups"),
        "instances": instances,
        "tokens": count(f"{prefix}tokens"),
        "masking": settings["masking"],
        "whole_word_masking": settings["whole_word_masking"],
        "masked_tokens": masked,
        "masked_fraction": fraction(masked, count(f"{prefix}tokens")),
        "masked_as_mask_token": fraction(count(f"{prefix}masked_as/{MASK}"), masked),
        "masked_as_random": fraction(count(f"{prefix}masked_as/{RANDOM}"), masked),
        "masked_as_kept": fraction(count(f"{prefix}masked_as/{KEEP}"), masked),
        "objective": settings["objective"],
    }
    if settings["objective"] == "nsp":
        stats.update({
            "nsp_is_next": label_0,
            "nsp_is_random": label_1,
            "nsp_random_fraction": fraction(label_1, instances),
            "nsp_random_from_same_document": count(f"{prefix}nsp_random_from_same_document"),
        })
    else:
        stats.update({"sop_in_order": label_0, "sop_swapped": label_1,
                      "sop_swapped_fraction": fraction(label_1, instances)})
    skipped = {}  # the documents' (unprefixed) and this phase's skips
    for key, value in sorted(counters.items()):
        for head in ("skipped/", f"{prefix}skipped/"):
            if key.startswith(head):
                skipped[key[len(head):]] = int(value)
    stats.update({"length_histogram": histogram, "skipped": skipped,
                  "settings": dict(settings)})
    return stats


# ---------------------------------------------------------------------------
# Beam
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Phase:
    """One output: its directory and the settings of its instances."""

    index: int          # 0-based
    directory: str      # where its shards and stats go
    settings: InstanceSettings

    @property
    def prefix(self) -> str:  # its instance counters
        return f"phase{self.index + 1}|"


def parse_phases(text: str) -> list[tuple[int, int]]:
    """ "128:20,512:80" (or "128/20 512/80") -> [(128, 20), (512, 80)]."""
    phases = []
    for item in text.replace(",", " ").split():
        parts = item.replace("/", ":").split(":")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"phase {item!r} is not max_seq_length:max_predictions_per_seq "
                             f"(e.g. 128:20)")
        phases.append((int(parts[0]), int(parts[1])))
    return phases


def part_path(temp_dir: str, phase: Phase, group: int) -> str:
    return FileSystems.join(temp_dir, f"phase{phase.index + 1}-group{group:06d}.tfrecord")


class CreateInstancesFn(beam.DoFn):
    """(group, [(doc_id, ref)]) -> one part file per phase, and (phase index, group, part
    path, records) for each; counters on `stats`.

    Reads the group's documents (`transforms.DocumentLoader`), tokenizes them in batches
    (kept as compact arrays), then creates, encodes and writes each phase's instances.
    """

    def __init__(self, phases: list, special: SpecialIds, temp_dir: str, vocab_file: str,
                 lowercase: bool, input_format: str = "google", text_field: str = "text"):
        self._phases = phases
        self._special = special
        self._temp_dir = temp_dir
        self._vocab_file, self._lowercase = vocab_file, lowercase
        self._format, self._text_field = input_format, text_field

    def setup(self):
        self._tokenizer = transforms.WordPieceTokenizer(
            transforms.read_vocab(self._vocab_file), self._lowercase)
        self._encoders = [ExampleEncoder(p.settings.max_seq_length,
                                         p.settings.max_predictions_per_seq,
                                         self._special.vocab_size) for p in self._phases]

    def load_group(self, refs, counters: dict) -> list:
        """[(doc_id, ref)] -> [(doc_id, [array of ids per sentence])], sorted by doc_id."""
        documents, batch, batch_sentences = [], [], 0

        def flush():
            documents.extend(transforms.tokenize_documents(self._tokenizer, batch, counters))
            batch.clear()

        with transforms.DocumentLoader(self._format, self._text_field, counters) as loader:
            for doc_id, ref in sorted(refs, key=lambda item: item[0]):
                sentences = loader.load(doc_id, ref)
                if sentences is None:
                    continue
                batch.append((doc_id, sentences))
                batch_sentences += len(sentences)
                if batch_sentences >= transforms.TOKENIZE_BATCH_SENTENCES:
                    flush()
                    batch_sentences = 0
            flush()
        return documents

    def process(self, element):
        group, refs = element
        counters = {"groups": 1}
        documents = self.load_group(refs, counters)
        frame = transforms.tfrecord_frame
        for phase, encoder in zip(self._phases, self._encoders):
            settings, prefix = phase.settings, phase.prefix
            salt = f"/phase{phase.index}" if phase.index else ""
            phase_counters: dict = {}
            path = part_path(self._temp_dir, phase, group)
            written = 0
            counted = InstanceCounters(settings.max_seq_length, prefix)
            with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as out:
                buffer = []
                for instance in create_instances_for_group(documents, group, settings,
                                                           self._special, salt, phase_counters):
                    counted.add(instance)
                    buffer.append(frame(encoder.encode_instance(instance)))
                    if len(buffer) >= 256:
                        out.write(b"".join(buffer))
                        written += len(buffer)
                        buffer = []
                out.write(b"".join(buffer))
                written += len(buffer)
            counted.add_to(counters)
            for key, value in phase_counters.items():
                counters[prefix + key] = counters.get(prefix + key, 0) + value
            yield phase.index, group, path, written
        yield beam.pvalue.TaggedOutput(transforms.STATS_TAG, counters)


def shard_path(directory: str, split: str, shard: int, num_shards: int) -> str:
    return FileSystems.join(directory, f"{split}-{shard:05d}-of-{num_shards:05d}"
                                       f"{schema.SHARD_SUFFIX}")


def write_shard(shard: int, parts, phase: Phase, split: str, num_shards: int) -> str:
    """Writes shard `shard` of a phase: records [shard * N / S, (shard + 1) * N / S) of the
    groups' records in group order (N records, S shards). Returns its path."""
    parts = sorted((group, path, count) for index, group, path, count in parts
                   if index == phase.index)
    total = sum(count for _, _, count in parts)
    low, high = shard * total // num_shards, (shard + 1) * total // num_shards
    final = shard_path(phase.directory, split, shard, num_shards)
    temp = final + f".tmp-{uuid.uuid4().hex[:8]}"
    with FileSystems.create(temp, compression_type=CompressionTypes.UNCOMPRESSED) as out:
        first = 0  # global index of the part's first record
        for _, path, count in parts:
            if first + count <= low or first >= high or not count:
                first += count
                continue
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as part:
                buffer = []
                for index, frame in enumerate(transforms.iter_tfrecord_frames(part), first):
                    if index >= high:
                        break
                    if index >= low:
                        buffer.append(frame)
                        if len(buffer) >= 256:
                            out.write(b"".join(buffer))
                            buffer = []
                out.write(b"".join(buffer))
            first += count
    if FileSystems.exists(final):
        FileSystems.delete([final])
    FileSystems.rename([temp], [final])
    return final


def delete_temp(temp_dir: str, parts, shards) -> None:
    """Removes the part files once every shard is written (`shards`: a side input)."""
    paths = [path for _, _, path, _ in parts if FileSystems.exists(path)]
    if paths:
        FileSystems.delete(paths)
    if FileSystems.exists(temp_dir):
        FileSystems.delete([temp_dir])


def stats_path(output_dir: str, split: str) -> str:
    return FileSystems.join(output_dir, f"{split}-stats.json")


def read_stats(output_dir: str, split: str) -> dict:
    """The stats a finished run wrote to <output_dir>/<split>-stats.json."""
    with FileSystems.open(stats_path(output_dir, split)) as handle:
        return json.loads(handle.read().decode("utf-8"))


def write_stats(counters: dict, phase: Phase, settings: dict, split: str) -> dict:
    stats = finalize_stats(counters, settings, phase.prefix)
    with FileSystems.create(stats_path(phase.directory, split),
                            compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(json.dumps(stats, indent=2).encode("utf-8"))
    return stats


def settings_dict(args, phase: Phase | None = None) -> dict:
    settings = {
        "split": args.split, "input": args.input, "input_format": args.input_format,
        "vocab_file": args.vocab_file, "lowercase": args.lowercase,
        "max_seq_length": args.max_seq_length,
        "max_predictions_per_seq": args.max_predictions_per_seq,
        "masked_lm_prob": args.masked_lm_prob, "short_seq_prob": args.short_seq_prob,
        "dupe_factor": args.dupe_factor, "seed": args.seed, "num_shards": args.num_shards,
        "group_size_mb": args.group_size_mb, "objective": args.objective,
        "whole_word_masking": args.whole_word_masking, "masking": args.masking,
        "phases": args.phases,
    }
    if args.input_format == "jsonl":
        settings["text_field"] = args.text_field
    if phase is not None:
        settings["max_seq_length"] = phase.settings.max_seq_length
        settings["max_predictions_per_seq"] = phase.settings.max_predictions_per_seq
        settings["phase"] = phase.index + 1
    return settings


def make_phases(args) -> list[Phase]:
    base = dict(masked_lm_prob=args.masked_lm_prob, short_seq_prob=args.short_seq_prob,
                dupe_factor=args.dupe_factor, seed=args.seed, objective=args.objective,
                whole_word_masking=args.whole_word_masking, masking=args.masking)
    if not args.phases:
        return [Phase(0, args.output_dir, InstanceSettings(
            max_seq_length=args.max_seq_length,
            max_predictions_per_seq=args.max_predictions_per_seq, **base))]
    return [Phase(i, FileSystems.join(args.output_dir, f"phase{i + 1}"),
                  InstanceSettings(max_seq_length=seq, max_predictions_per_seq=pred, **base))
            for i, (seq, pred) in enumerate(parse_phases(args.phases))]


def _key_by_group(document, seed: int, groups: int):
    return document_group(document[0], seed, groups), document


def build_pipeline(pipeline, args, special: SpecialIds, ranges=None) -> dict:
    """Adds the job's steps to `pipeline`; returns its main PCollections by name
    (documents: the refs, parts, stats, shards) for tests to assert on."""
    if ranges is None:
        ranges = transforms.plan_input(args.input, int(args.read_chunk_mb * (1 << 20)))
    phases = make_phases(args)
    groups = num_groups(sum(r.size for r in ranges if r.start == 0), args.group_size_mb)
    temp_dir = FileSystems.join(args.output_dir, f".tmp-{args.split}-{uuid.uuid4().hex[:12]}")

    # Only document references (path, offset, length) go through the shuffle; each group
    # reads its own documents (compressed inputs, which cannot be re-read at an offset,
    # send the document's compressed bytes instead).
    read = pipeline | "IndexDocuments" >> transforms.ReadDocuments(
        ranges, args.input_format, args.text_field, index_only=True)
    created = (
        read.documents
        | "AssignGroups" >> beam.Map(_key_by_group, seed=args.seed, groups=groups)
        | "GroupDocuments" >> beam.GroupByKey()
        | "CreateInstances" >> beam.ParDo(CreateInstancesFn(
            phases, special, temp_dir, args.vocab_file, args.lowercase, args.input_format,
            args.text_field)).with_outputs(transforms.STATS_TAG, main="parts"))
    parts = beam.pvalue.AsList(created.parts)
    written = []
    for phase in phases:
        name = f"Phase{phase.index + 1}" if args.phases else ""
        written.append(
            pipeline
            | f"{name}ShardIds" >> beam.Create(list(range(args.num_shards)))
            | f"{name}WriteShards" >> beam.Map(write_shard, parts, phase=phase, split=args.split,
                                               num_shards=args.num_shards))
    shards = written[0] if len(written) == 1 else (written | "AllShards" >> beam.Flatten())
    _ = (pipeline
         | "TempDir" >> beam.Create([temp_dir])
         | "DeleteParts" >> beam.Map(delete_temp, parts, beam.pvalue.AsList(shards)))

    counters = (
        (read.stats, created.stats)
        | "FlattenCounters" >> beam.Flatten()
        | "SumCounters" >> beam.CombineGlobally(transforms.SumCounters()))
    stats = [counters | f"{'Phase%d' % (p.index + 1) if args.phases else ''}WriteStats" >> beam.Map(
        write_stats, phase=p, settings=settings_dict(args, p if args.phases else None),
        split=args.split) for p in phases]
    return {"documents": read.documents, "parts": created.parts, "stats": stats[0],
            "shards": shards}


def _bool(value: str) -> bool:
    lowered = str(value).strip().lower()
    if lowered in ("true", "1", "yes", "y"):
        return True
    if lowered in ("false", "0", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def parse_args(argv=None):
    """-> (the job's arguments, the remaining flags for Beam's PipelineOptions)."""
    parser = argparse.ArgumentParser(
        prog="python -m beam_jobs.pretraining_data",
        description="Text -> BERT pretraining TFRecords (masked LM + NSP or SOP) and "
                    "<output_dir>/<split>-stats.json. Flags not listed here go to Beam's "
                    "PipelineOptions (e.g. --runner=DataflowRunner --project=...).")
    parser.add_argument("--input", required=True,
                        help="glob of input files (any Beam filesystem: gs://, s3://; .gz "
                             "read transparently), or comma-separated globs")
    parser.add_argument("--input_format", default="google", choices=transforms.INPUT_FORMATS,
                        help="google: sentence per line, blank line between documents; text: "
                             "blank-line separated blocks split into sentences; jsonl: one "
                             "document per line in --text_field")
    parser.add_argument("--text_field", default="text", help="the text field of jsonl input")
    parser.add_argument("--output_dir", required=True, help="directory for the output")
    parser.add_argument("--split", default=schema.TRAIN_PREFIX,
                        help="shard name prefix: <output_dir>/<split>-00000-of-00004.tfrecord")
    parser.add_argument("--vocab_file", required=True, help="WordPiece vocab, one token a line")
    parser.add_argument("--lowercase", type=_bool, default=True,
                        help="true: lowercase and strip accents (uncased); false: text untouched")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--max_predictions_per_seq", type=int, default=20)
    parser.add_argument("--phases", default="",
                        help="several outputs from one reading, e.g. '128:20,512:80' -> "
                             "<output_dir>/phase1, phase2 (overrides --max_seq_length and "
                             "--max_predictions_per_seq)")
    parser.add_argument("--masked_lm_prob", type=float, default=0.15)
    parser.add_argument("--short_seq_prob", type=float, default=0.1)
    parser.add_argument("--dupe_factor", type=int, default=1,
                        help="passes over the data, each with different masks")
    parser.add_argument("--objective", default="nsp", choices=OBJECTIVES,
                        help="nsp: B follows A or is random (label 1); sop: B follows A, or "
                             "the two are swapped (label 1)")
    parser.add_argument("--whole_word_masking", type=_bool, default=False,
                        help="mask all the pieces of a word together")
    parser.add_argument("--masking", default="static", choices=MASKINGS,
                        help="static: masks written in the records; dynamic: no masks "
                             "written (masked_lm_weights all 0), tf.data masks each epoch")
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--num_shards", type=int, default=4)
    parser.add_argument("--group_size_mb", type=float, default=4.0,
                        help="documents are hashed into groups of about this much input; "
                             "the random B segment comes from the group")
    parser.add_argument("--read_chunk_mb", type=float, default=16.0,
                        help="uncompressed files are read in ranges of this size")
    args, beam_args = parser.parse_known_args(argv)
    checks = [
        (args.max_seq_length >= 5, "--max_seq_length must be at least 5"),
        (args.max_predictions_per_seq >= 1, "--max_predictions_per_seq must be at least 1"),
        (0.0 < args.masked_lm_prob <= 1.0, "--masked_lm_prob must be in (0, 1]"),
        (0.0 <= args.short_seq_prob <= 1.0, "--short_seq_prob must be in [0, 1]"),
        (args.dupe_factor >= 1, "--dupe_factor must be at least 1"),
        (args.num_shards >= 1, "--num_shards must be at least 1"),
        (args.group_size_mb > 0, "--group_size_mb must be positive"),
        (args.read_chunk_mb > 0, "--read_chunk_mb must be positive"),
    ]
    for ok, message in checks:
        if not ok:
            parser.error(message)
    try:
        for seq, pred in parse_phases(args.phases):
            if seq < 5 or pred < 1:
                parser.error(f"--phases {seq}:{pred}: max_seq_length must be at least 5 and "
                             f"max_predictions_per_seq at least 1")
    except ValueError as err:
        parser.error(f"--phases: {err}")
    return args, beam_args


def check_inputs(args):
    """Fails fast, before any pipeline starts: vocab missing or lacking a special token,
    or an --input glob that matches no file. Returns (SpecialIds, the input ranges)."""
    if not FileSystems.exists(args.vocab_file):
        raise FileNotFoundError(f"vocab file {args.vocab_file} not found (--vocab_file)")
    special = SpecialIds.from_vocab(transforms.read_vocab(args.vocab_file), args.vocab_file)
    ranges = transforms.plan_input(args.input, int(args.read_chunk_mb * (1 << 20)))
    return special, ranges


def run(argv=None, test_pipeline=None):
    """Runs the job; returns the stats dict it wrote to <output_dir>/<split>-stats.json
    (with --phases: {"phases": [the stats of each phase]}).

    With `test_pipeline`, the steps are only added to it (the flags Beam would
    get are ignored) and None is returned: the caller runs the pipeline (e.g.
    leaving `with TestPipeline() as p:`) and then calls `read_stats`.
    """
    args, beam_args = parse_args(argv)
    special, ranges = check_inputs(args)
    if test_pipeline is not None:
        build_pipeline(test_pipeline, args, special, ranges)
        return None
    pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
    build_pipeline(pipeline, args, special, ranges)
    pipeline.run().wait_until_finish()
    phases = make_phases(args)
    all_stats = [read_stats(p.directory, args.split) for p in phases]
    for phase, stats in zip(phases, all_stats):
        _LOGGER.info("%s: %d instances from %d documents written to %s", args.split,
                     stats["instances"], stats["documents"], phase.directory)
    return {"phases": all_stats} if args.phases else all_stats[0]


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    result = run(sys.argv[1:])
    print(json.dumps(result, indent=2))
