"""Pretraining instances in plain Python: google-research/bert's algorithm (NSP pairs or ALBERT's
SOP, masking with the 80/10/10 rule, optionally whole-word), the document groups, and the
counters behind stats.json.

No Beam and no TensorFlow here: the Beam job (beam_jobs/pretraining_data.py) calls these in
its workers, and tests call them directly with a seeded `random.Random`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random

from beam_jobs import schema, transforms
from beam_jobs.settings import DataSettings, same_as

# Which of the three masking branches replaced a chosen token.
MASK, RANDOM, KEEP = "mask", "random", "keep"


OBJECTIVES = {f.name: f for f in dataclasses.fields(DataSettings)}["objective"].metadata["choices"]


MASKINGS = {f.name: f for f in dataclasses.fields(DataSettings)}["masking"].metadata["choices"]


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
    """How instances are made: one declaration, which is also the Beam job's flags
    (`--<field>`, pretraining_data.parse_args) and what stats.json records."""
    max_seq_length: int = same_as(DataSettings, "max_seq_length")
    max_predictions_per_seq: int = same_as(DataSettings, "max_predictions_per_seq")
    masked_lm_prob: float = same_as(DataSettings, "masked_lm_prob")
    short_seq_prob: float = same_as(DataSettings, "short_seq_prob")
    dupe_factor: int = same_as(DataSettings, "dupe_factor")
    seed: int = same_as(DataSettings, "seed")
    objective: str = same_as(DataSettings, "objective")
    whole_word_masking: bool = same_as(DataSettings, "whole_word_masking")
    masking: str = same_as(DataSettings, "masking")


# The flags of InstanceSettings' fields, and the choices of those that have them.
INSTANCE_FLAGS = tuple(field.name for field in dataclasses.fields(InstanceSettings))


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
    if settings.objective == "mlm":
        return create_single_segment_instances(all_documents[document_index], settings,
                                               special, rng)
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


def create_single_segment_instances(document: list, settings: InstanceSettings,
                                    special: SpecialIds,
                                    rng: random.Random) -> list[TrainingInstance]:
    """objective mlm (no sentence-level task): the document's pieces cut into consecutive
    blocks, each `[CLS] block [SEP]`, label 0 (the pretrainer gives the sentence-level loss no
    weight). A block has max_seq_length - 2 pieces, or with probability short_seq_prob a
    random length from 2 (drawn per block, so each dupe pass cuts elsewhere); blocks start
    mid-sentence, as the packed blocks of transformers' run_mlm do."""
    pieces = _flatten(document)
    max_num_tokens = settings.max_seq_length - 2  # room for [CLS], [SEP]
    instances, start = [], 0
    while start < len(pieces):
        length = max_num_tokens
        if rng.random() < settings.short_seq_prob:
            length = rng.randint(2, max_num_tokens)
        tokens = [special.cls, *pieces[start:start + length], special.sep]
        start += length
        masked, positions, labels, branches = tokens, [], [], []
        if settings.masking == "static":
            masked, positions, labels, branches = create_masked_lm_predictions(
                tokens, settings.masked_lm_prob, settings.max_predictions_per_seq, special,
                rng, settings.whole_word_masking)
        instances.append(TrainingInstance(
            token_ids=masked, a_length=len(tokens), label=0, masked_lm_positions=positions,
            masked_lm_ids=labels, masked_lm_branches=branches))
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
    elif settings["objective"] == "sop":
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
