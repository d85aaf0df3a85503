"""Beam job: Google-format text -> masked-LM + next-sentence instances -> sharded TFRecords + stats.

    ReadDocuments      files matched by --input, read whole, split on blank lines;
                       document id = (file path, index in file)
    TokenizeDocuments  keras-hub WordPieceTokenizer on batches of ~4k sentences
    CountDocuments     number of documents (side input) -> number of groups =
                       ceil(documents / docs_per_group)
    AssignGroups       hash(seed, document id) -> group; GroupDocuments: GroupByKey
    CreateInstances    per group (documents sorted by id, one random.Random per
                       (seed, group, dupe pass)): NSP pairs + masking, exactly the
                       algorithm of google-research/bert create_pretraining_data.py,
                       with the random "B" document drawn from the same group
    WriteTFRecords     <output_dir>/<split>-SSSSS-of-NNNNN.tfrecord (beam_jobs.schema)
    WriteStats         <output_dir>/<split>-stats.json (counters summed by a combiner)

The output is a function of the input files (their paths and contents), the vocab
and the flags only: the same multiset of records on every runner and every run
(the order of records inside shards may differ). No worker holds more than one
group of documents (about docs_per_group documents) in memory.

Run it (flags the job does not know go to Beam's PipelineOptions):

    python -m beam_jobs.pretraining_data --input 'corpus/train/*.txt' --output_dir out \\
        --split train --vocab_file vocab.txt --runner=FnApiRunner

The instance functions are plain Python taking a `random.Random`:

    >>> import random
    >>> special = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4, vocab_size=50)
    >>> docs = [[[10, 11, 12], [13, 14]], [[20, 21], [22, 23, 24]]]
    >>> instances = create_instances_from_document(
    ...     docs, 0, max_seq_length=16, short_seq_prob=0.0, masked_lm_prob=0.15,
    ...     max_predictions_per_seq=3, special=special, rng=random.Random(1))
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
import sys

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs import schema, transforms

_LOGGER = logging.getLogger(__name__)

# Which of the three masking branches replaced a chosen token.
MASK, RANDOM, KEEP = "mask", "random", "keep"

# The sequence-length histogram in the stats has this many buckets.
HISTOGRAM_BUCKETS = 8


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """Ids of the special tokens (looked up by string in the vocab) and the vocab size."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int
    vocab_size: int

    @classmethod
    def from_vocab(cls, vocab: list[str], vocab_file: str = "<vocab>") -> "SpecialIds":
        ids = transforms.special_token_ids(vocab, vocab_file)
        return cls(pad=ids["[PAD]"], unk=ids["[UNK]"], cls=ids["[CLS]"], sep=ids["[SEP]"],
                   mask=ids["[MASK]"], vocab_size=len(vocab))


@dataclasses.dataclass(frozen=True)
class InstanceSettings:
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 1
    seed: int = 12345


@dataclasses.dataclass
class TrainingInstance:
    """One NSP pair after masking: `[CLS] A [SEP] B [SEP]` as ids (unpadded)."""

    token_ids: list[int]             # after masking
    segment_ids: list[int]           # 0 for [CLS] A [SEP], 1 for B [SEP]
    is_random_next: bool
    masked_lm_positions: list[int]   # sorted
    masked_lm_ids: list[int]         # the original ids at those positions
    masked_lm_branches: list[str]    # MASK / RANDOM / KEEP for each position
    random_from_same_document: bool = False  # B had to come from A's own document

    def features(self) -> dict:
        """The schema's features, unpadded (`schema.serialize` pads them)."""
        return {
            "input_ids": self.token_ids,
            "input_mask": [1] * len(self.token_ids),
            "segment_ids": self.segment_ids,
            "masked_lm_positions": self.masked_lm_positions,
            "masked_lm_ids": self.masked_lm_ids,
            "masked_lm_weights": [1.0] * len(self.masked_lm_positions),
            "next_sentence_labels": [schema.NSP_IS_RANDOM if self.is_random_next
                                     else schema.NSP_IS_NEXT],
        }


# ---------------------------------------------------------------------------
# Instance creation and masking (plain Python; google-research/bert's algorithm)
# ---------------------------------------------------------------------------
def truncate_seq_pair(tokens_a: list, tokens_b: list, max_num_tokens: int,
                      rng: random.Random) -> None:
    """Trims the longer list (B on ties) one token at a time, from the front or the back
    at random, until both fit in `max_num_tokens`. Modifies the lists in place."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def create_masked_lm_predictions(token_ids: list[int], masked_lm_prob: float,
                                 max_predictions_per_seq: int, special: SpecialIds,
                                 rng: random.Random):
    """Chooses the masked-LM positions of one sequence and replaces their tokens.

    num_to_predict = min(max_predictions_per_seq, max(1, round(len * masked_lm_prob)));
    [CLS] and [SEP] are never chosen; each chosen token becomes [MASK] with
    probability 0.8, a uniformly random vocab id with 0.1, and stays with 0.1.

    Returns (masked token ids, sorted positions, original ids, branch of each).
    """
    candidates = [i for i, token in enumerate(token_ids)
                  if token != special.cls and token != special.sep]
    num_to_predict = min(max_predictions_per_seq,
                         max(1, int(round(len(token_ids) * masked_lm_prob))))
    # The reference shuffles all candidates and takes the first num_to_predict;
    # rng.sample draws the same distribution (a uniform subset in random order) faster.
    output = list(token_ids)
    chosen = []
    for index in rng.sample(candidates, min(num_to_predict, len(candidates))):
        if rng.random() < 0.8:
            output[index], branch = special.mask, MASK
        elif rng.random() < 0.5:
            branch = KEEP
        else:
            output[index], branch = rng.randint(0, special.vocab_size - 1), RANDOM
        chosen.append((index, token_ids[index], branch))
    chosen.sort()
    positions = [index for index, _, _ in chosen]
    labels = [label for _, label, _ in chosen]
    branches = [branch for _, _, branch in chosen]
    return output, positions, labels, branches


def create_instances_from_document(all_documents: list, document_index: int,
                                   max_seq_length: int, short_seq_prob: float,
                                   masked_lm_prob: float, max_predictions_per_seq: int,
                                   special: SpecialIds,
                                   rng: random.Random) -> list[TrainingInstance]:
    """NSP instances of one document (a list of sentences, each a non-empty list of ids).

    Sentences are accumulated into a chunk until the target length is reached
    (max_seq_length - 3, or with probability short_seq_prob a random target in
    [2, max_seq_length - 3], drawn once per document as in the reference); the
    chunk is split at a random sentence boundary into A and B. With probability
    0.5 (always when the chunk has one sentence) B is taken instead from a random
    other document of `all_documents`, and the chunk's unused sentences are put
    back. The pair is truncated to fit, wrapped in [CLS] A [SEP] B [SEP] and masked.
    """
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3  # room for [CLS], [SEP], [SEP]
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances = []
    chunk: list[list[int]] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target_seq_length:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [token for sentence in chunk[:a_end] for token in sentence]
            tokens_b: list[int] = []
            same_document = False
            if len(chunk) == 1 or rng.random() < 0.5:
                is_random_next = True
                target_b_length = target_seq_length - len(tokens_a)
                for _ in range(10):  # a document other than this one, if there is one
                    random_index = rng.randint(0, len(all_documents) - 1)
                    if random_index != document_index:
                        break
                same_document = random_index == document_index
                random_document = all_documents[random_index]
                start = rng.randint(0, len(random_document) - 1)
                for sentence in random_document[start:]:
                    tokens_b.extend(sentence)
                    if len(tokens_b) >= target_b_length:
                        break
                i -= len(chunk) - a_end  # put the unused sentences back
            else:
                is_random_next = False
                tokens_b = [token for sentence in chunk[a_end:] for token in sentence]
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            assert tokens_a and tokens_b, "empty segment: sentences must be non-empty"

            tokens = [special.cls, *tokens_a, special.sep, *tokens_b, special.sep]
            segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
            masked, positions, labels, branches = create_masked_lm_predictions(
                tokens, masked_lm_prob, max_predictions_per_seq, special, rng)
            instances.append(TrainingInstance(
                token_ids=masked, segment_ids=segment_ids, is_random_next=is_random_next,
                masked_lm_positions=positions, masked_lm_ids=labels,
                masked_lm_branches=branches, random_from_same_document=same_document))
            chunk = []
            chunk_length = 0
        i += 1
    return instances


# ---------------------------------------------------------------------------
# Groups: documents are hashed into groups; B is drawn from the same group
# ---------------------------------------------------------------------------
def num_groups(num_documents: int, docs_per_group: int) -> int:
    return max(1, math.ceil(num_documents / docs_per_group))


def document_group(doc_id, seed: int, groups: int) -> int:
    """A stable hash of (seed, document id) -> group in [0, groups) (no PYTHONHASHSEED)."""
    digest = hashlib.blake2b(repr((seed, tuple(doc_id))).encode("utf-8"), digest_size=8)
    return int.from_bytes(digest.digest(), "big") % groups


def create_instances_for_group(documents: list, group: int, settings: InstanceSettings,
                               special: SpecialIds):
    """Yields the instances of one group: documents = [(doc_id, [[ids] per sentence])].

    Documents are sorted by id and then put in a seeded random order (as the
    reference shuffles its documents); each dupe pass has its own
    random.Random(seed, group, pass), so the result depends on nothing else.
    """
    documents = sorted(documents, key=lambda item: item[0])
    random.Random(f"{settings.seed}/{group}/order").shuffle(documents)
    all_documents = [sentences for _, sentences in documents]
    for dupe in range(settings.dupe_factor):
        rng = random.Random(f"{settings.seed}/{group}/{dupe}")
        for index in range(len(all_documents)):
            yield from create_instances_from_document(
                all_documents, index, settings.max_seq_length, settings.short_seq_prob,
                settings.masked_lm_prob, settings.max_predictions_per_seq, special, rng)


# ---------------------------------------------------------------------------
# Stats
# ---------------------------------------------------------------------------
def histogram_width(max_seq_length: int) -> int:
    return max(1, math.ceil(max_seq_length / HISTOGRAM_BUCKETS))


def add_instance_counters(counters: dict, instance: TrainingInstance, max_seq_length: int) -> None:
    """Adds one instance to flat counters (summed later by transforms.SumCounters)."""
    def add(key, value=1):
        counters[key] = counters.get(key, 0) + value

    length = len(instance.token_ids)
    add("instances")
    add("tokens", length)
    add("masked_tokens", len(instance.masked_lm_positions))
    for branch in instance.masked_lm_branches:
        add(f"masked_as/{branch}")
    add("nsp_is_random" if instance.is_random_next else "nsp_is_next")
    if instance.random_from_same_document:
        add("nsp_random_from_same_document")
    add(f"length_bucket/{(length - 1) // histogram_width(max_seq_length)}")


def finalize_stats(counters: dict, settings: dict) -> dict:
    """Summed counters + the job's settings -> the stats dict written to <split>-stats.json."""
    def count(key):
        return int(counters.get(key, 0))

    def fraction(part, whole):
        return round(part / whole, 6) if whole else 0.0

    max_seq_length = settings["max_seq_length"]
    width = histogram_width(max_seq_length)
    histogram = {}
    for bucket in range(math.ceil(max_seq_length / width)):
        low, high = bucket * width + 1, min((bucket + 1) * width, max_seq_length)
        histogram[f"{low}-{high}"] = count(f"length_bucket/{bucket}")
    instances, masked = count("instances"), count("masked_tokens")
    return {
        "split": settings["split"],
        "documents": count("documents"),
        "sentences": count("sentences"),
        "single_sentence_documents": count("single_sentence_documents"),
        "groups": count("groups"),
        "instances": instances,
        "tokens": count("tokens"),
        "masked_tokens": masked,
        "masked_fraction": fraction(masked, count("tokens")),
        "masked_as_mask_token": fraction(count(f"masked_as/{MASK}"), masked),
        "masked_as_random": fraction(count(f"masked_as/{RANDOM}"), masked),
        "masked_as_kept": fraction(count(f"masked_as/{KEEP}"), masked),
        "nsp_is_next": count("nsp_is_next"),
        "nsp_is_random": count("nsp_is_random"),
        "nsp_random_fraction": fraction(count("nsp_is_random"), instances),
        "nsp_random_from_same_document": count("nsp_random_from_same_document"),
        "length_histogram": histogram,
        "skipped": {key.split("/", 1)[1]: int(value)
                    for key, value in sorted(counters.items()) if key.startswith("skipped/")},
        "settings": dict(settings),
    }


# ---------------------------------------------------------------------------
# Beam
# ---------------------------------------------------------------------------
def serialize_instance(instance: TrainingInstance, max_seq_length: int,
                       max_predictions_per_seq: int) -> bytes:
    """One instance -> a tf.train.Example record (deterministic bytes, see schema.serialize)."""
    return schema.serialize(instance.features(), max_seq_length, max_predictions_per_seq)


class CreateInstancesFn(beam.DoFn):
    """(group, [(doc_id, tokenized document)]) -> serialized tf.train.Examples.

    Emits the group's counters on the `stats` output.
    """

    def __init__(self, settings: InstanceSettings, special: SpecialIds):
        self._settings = settings
        self._special = special

    def process(self, element):
        group, documents = element
        settings = self._settings
        counters = {"groups": 1}
        for instance in create_instances_for_group(list(documents), group, settings,
                                                   self._special):
            add_instance_counters(counters, instance, settings.max_seq_length)
            yield serialize_instance(instance, settings.max_seq_length,
                                     settings.max_predictions_per_seq)
        yield beam.pvalue.TaggedOutput(transforms.STATS_TAG, counters)


def _key_by_group(document, seed: int, docs_per_group: int, num_documents: int):
    doc_id, _ = document
    return document_group(doc_id, seed, num_groups(num_documents, docs_per_group)), document


def stats_path(output_dir: str, split: str) -> str:
    return FileSystems.join(output_dir, f"{split}-stats.json")


def read_stats(output_dir: str, split: str) -> dict:
    """The stats a finished run wrote to <output_dir>/<split>-stats.json."""
    with FileSystems.open(stats_path(output_dir, split)) as handle:
        return json.loads(handle.read().decode("utf-8"))


def settings_dict(args) -> dict:
    return {
        "split": args.split, "input": args.input, "vocab_file": args.vocab_file,
        "lowercase": args.lowercase, "max_seq_length": args.max_seq_length,
        "max_predictions_per_seq": args.max_predictions_per_seq,
        "masked_lm_prob": args.masked_lm_prob, "short_seq_prob": args.short_seq_prob,
        "dupe_factor": args.dupe_factor, "seed": args.seed, "num_shards": args.num_shards,
        "docs_per_group": args.docs_per_group,
    }


def build_pipeline(pipeline, args, special: SpecialIds) -> dict:
    """Adds the job's steps to `pipeline`; returns its main PCollections by name
    (documents, tokenized, records, stats) for tests to assert on."""
    settings = InstanceSettings(
        max_seq_length=args.max_seq_length, max_predictions_per_seq=args.max_predictions_per_seq,
        masked_lm_prob=args.masked_lm_prob, short_seq_prob=args.short_seq_prob,
        dupe_factor=args.dupe_factor, seed=args.seed)

    read = pipeline | "ReadDocuments" >> transforms.ReadDocuments(args.input)
    tokenized = read.documents | "TokenizeDocuments" >> transforms.TokenizeDocuments(
        args.vocab_file, args.lowercase)
    num_documents = tokenized.documents | "CountDocuments" >> beam.combiners.Count.Globally()
    created = (
        tokenized.documents
        | "AssignGroups" >> beam.Map(_key_by_group, seed=args.seed,
                                     docs_per_group=args.docs_per_group,
                                     num_documents=beam.pvalue.AsSingleton(num_documents))
        | "GroupDocuments" >> beam.GroupByKey()
        | "CreateInstances" >> beam.ParDo(CreateInstancesFn(settings, special)).with_outputs(
            transforms.STATS_TAG, main="records"))
    _ = created.records | "WriteTFRecords" >> beam.io.WriteToTFRecord(
        file_path_prefix=FileSystems.join(args.output_dir, args.split),
        file_name_suffix=schema.SHARD_SUFFIX, num_shards=args.num_shards)

    stats = (
        (read.stats, tokenized.stats, created.stats)
        | "FlattenCounters" >> beam.Flatten()
        | "SumCounters" >> beam.CombineGlobally(transforms.SumCounters())
        | "FinalizeStats" >> beam.Map(finalize_stats, settings=settings_dict(args)))
    _ = (stats
         | "StatsToJson" >> beam.Map(lambda s: json.dumps(s, indent=2))
         | "WriteStats" >> beam.io.WriteToText(
             FileSystems.join(args.output_dir, f"{args.split}-stats"), file_name_suffix=".json",
             shard_name_template="", num_shards=1))
    return {"documents": read.documents, "tokenized": tokenized.documents,
            "records": created.records, "stats": stats}


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
        description="Google-format text -> BERT pretraining TFRecords (masked LM + NSP) and "
                    "<output_dir>/<split>-stats.json. Flags not listed here go to Beam's "
                    "PipelineOptions (e.g. --runner=DataflowRunner --project=...).")
    parser.add_argument("--input", required=True,
                        help="glob of Google-format text files, or comma-separated globs")
    parser.add_argument("--output_dir", required=True, help="existing directory for the output")
    parser.add_argument("--split", default=schema.TRAIN_PREFIX,
                        help="shard name prefix: <output_dir>/<split>-00000-of-00004.tfrecord")
    parser.add_argument("--vocab_file", required=True, help="WordPiece vocab, one token a line")
    parser.add_argument("--lowercase", type=_bool, default=True,
                        help="true: lowercase and strip accents (uncased); false: text untouched")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--max_predictions_per_seq", type=int, default=20)
    parser.add_argument("--masked_lm_prob", type=float, default=0.15)
    parser.add_argument("--short_seq_prob", type=float, default=0.1)
    parser.add_argument("--dupe_factor", type=int, default=1,
                        help="passes over the data, each with different masks")
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--num_shards", type=int, default=4)
    parser.add_argument("--docs_per_group", type=int, default=2000,
                        help="documents per group; the random B segment comes from the group")
    args, beam_args = parser.parse_known_args(argv)
    checks = [
        (args.max_seq_length >= 5, "--max_seq_length must be at least 5"),
        (args.max_predictions_per_seq >= 1, "--max_predictions_per_seq must be at least 1"),
        (0.0 < args.masked_lm_prob <= 1.0, "--masked_lm_prob must be in (0, 1]"),
        (0.0 <= args.short_seq_prob <= 1.0, "--short_seq_prob must be in [0, 1]"),
        (args.dupe_factor >= 1, "--dupe_factor must be at least 1"),
        (args.num_shards >= 1, "--num_shards must be at least 1"),
        (args.docs_per_group >= 1, "--docs_per_group must be at least 1"),
    ]
    for ok, message in checks:
        if not ok:
            parser.error(message)
    return args, beam_args


def check_inputs(args) -> SpecialIds:
    """Fails fast, before any pipeline starts: vocab missing or lacking a special token,
    or an --input glob that matches no file."""
    if not FileSystems.exists(args.vocab_file):
        raise FileNotFoundError(f"vocab file {args.vocab_file} not found (--vocab_file)")
    special = SpecialIds.from_vocab(transforms.read_vocab(args.vocab_file), args.vocab_file)
    for pattern in (p.strip() for p in args.input.split(",") if p.strip()):
        matches = FileSystems.match([pattern])[0].metadata_list
        if not matches:
            raise FileNotFoundError(f"--input pattern {pattern!r} matches no file")
    return special


def run(argv=None, test_pipeline=None):
    """Runs the job; returns the stats dict it wrote to <output_dir>/<split>-stats.json.

    With `test_pipeline`, the steps are only added to it (the flags Beam would
    get are ignored) and None is returned: the caller runs the pipeline (e.g.
    leaving `with TestPipeline() as p:`) and then calls `read_stats`.
    """
    args, beam_args = parse_args(argv)
    special = check_inputs(args)
    if test_pipeline is not None:
        build_pipeline(test_pipeline, args, special)
        return None
    pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
    build_pipeline(pipeline, args, special)
    pipeline.run().wait_until_finish()
    stats = read_stats(args.output_dir, args.split)
    _LOGGER.info("%s: %d instances from %d documents written to %s", args.split,
                 stats["instances"], stats["documents"], args.output_dir)
    return stats


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    result = run(sys.argv[1:])
    print(json.dumps(result, indent=2))
