"""Beam job: text -> masked-LM + next-sentence (NSP) or sentence-order (SOP) instances -> TFRecords.

    IndexDocuments     the --input files in byte ranges (compressed files as one stream):
                       (document id, ref) per document, document id = (file path, byte
                       offset), ref = (offset, length) (compressed input: the document's
                       zlib-compressed bytes); formats: google (sentence per line), text
                       (sentence splitting), jsonl (--text_field)
    AssignGroups       hash(seed, document id) -> one of ceil(input MB / --group_size_mb)
                       groups; GroupDocuments: GroupByKey (only refs are shuffled)
    CreateInstances    per group: read its documents, tokenize them (WordPiece with
                       BERT's rules: models.tokenizer, with a word cache), sort them by
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
import json
import logging
import sys
import uuid

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs import progress, reading, schema, transforms
from beam_jobs.example_encoder import ExampleEncoder
from beam_jobs.instances import (
    INSTANCE_FLAGS,
    InstanceCounters,
    InstanceSettings,
    SpecialIds,
    create_instances_for_group,
    document_group,
    finalize_stats,
    num_groups,
)
from beam_jobs.runners import (
    Collect,
    TaggedOutputs,
    absolute,
    check_paths,
    pipeline_options,
    release,
)
from beam_jobs.settings import (
    INPUT_FORMATS,
    DataSettings,
    ProgressSettings,
    VocabSettings,
    add_flags,
    check_flags,
    limit_error,
    limits,
)
from models.tokenizer import Tokenizer, read_vocab

_LOGGER = logging.getLogger(__name__)


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


class _GroupProgress:
    """What CreateInstancesFn tells beam_jobs/progress.py of one group, as `done`: the bytes of
    its documents (`reading.ref_bytes`), in shares by about the time each step takes (measured:
    tokenizing the documents about half as long as one pass of instances): 1 for the
    tokenization, told as the documents are read, and 2 x dupe_factor for each phase, told as
    its instances are written against an estimate of their number (at most 99% of its share),
    its whole share once its part file is complete. The shares add up to the group's bytes."""

    def __init__(self, reporter: progress.Reporter, refs, phases: list):
        self.reporter, self.total = reporter, sum(reading.ref_bytes(ref) for _, ref in refs)
        weights = [1] + [2 * p.settings.dupe_factor for p in phases]
        self.shares = [self.total * w // sum(weights) for w in weights]
        self.shares[-1] += self.total - sum(self.shares)
        self.step, self.told = 0, 0

    def tell(self, done: int, of: int, estimate: bool = False) -> None:
        """Step `self.step` is `done` of `of` along (`estimate`: `of` is a guess)."""
        share = self.shares[self.step]
        value = share * min(done, of) // max(of, 1)
        if estimate:
            value = min(value, share * 99 // 100)
        if value > self.told:
            self.reporter.add(done=value - self.told)
            self.told = value

    def next(self) -> None:
        """The step is complete: the rest of its share, then the next step."""
        self.reporter.add(done=self.shares[self.step] - self.told)
        self.step, self.told = self.step + 1, 0


def expected_instances(documents: list, settings: InstanceSettings) -> int:
    """About how many instances a group's documents make: a pass cuts each document's tokens
    into sequences of max_seq_length - 3 (shorter ones now and then), the last one shorter."""
    length = max(1, settings.max_seq_length - 3)
    per_pass = sum(-(-sum(len(sentence) for sentence in sentences) // length)
                   for _, sentences in documents)
    return max(1, settings.dupe_factor * per_pass)


class CreateInstancesFn(beam.DoFn):
    """(group, [(doc_id, ref)]) -> one part file per phase, and (phase index, group, part
    path, records) for each; counters on `stats`.

    Reads the group's documents (`transforms.DocumentLoader`), tokenizes them in batches
    (kept as compact arrays), then creates, encodes and writes each phase's instances.
    With `progress_dir`, tells beam_jobs/progress.py how far it is (`_GroupProgress`).
    """

    def __init__(self, phases: list, special: SpecialIds, temp_dir: str, vocab_file: str,
                 lowercase: bool, input_format: str = "google", text_field: str = "text",
                 progress_dir: str = ""):
        self._progress_dir = progress_dir
        self._phases = phases
        self._special = special
        self._temp_dir = temp_dir
        self._vocab_file, self._lowercase = vocab_file, lowercase
        self._format, self._text_field = input_format, text_field

    def setup(self):
        self._tokenizer = Tokenizer(read_vocab(self._vocab_file, FileSystems.open),
                                    self._lowercase, cache_words=transforms.TOKEN_CACHE_WORDS)
        self._encoders = [ExampleEncoder(p.settings.max_seq_length,
                                         p.settings.max_predictions_per_seq,
                                         self._special.vocab_size) for p in self._phases]
        self._reporter = progress.reporter(self._progress_dir)

    def load_group(self, refs, counters: dict, told: _GroupProgress | None = None) -> list:
        """[(doc_id, ref)] -> [(doc_id, [array of ids per sentence])], sorted by doc_id."""
        documents, batch, batch_sentences, read = [], [], 0, 0

        def flush():
            documents.extend(transforms.tokenize_documents(self._tokenizer, batch, counters))
            batch.clear()
            if told is not None:
                told.tell(read, told.total)

        with reading.DocumentLoader(self._format, self._text_field, counters) as loader:
            for doc_id, ref in sorted(refs, key=lambda item: item[0]):
                read += reading.ref_bytes(ref)
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
        reporter = getattr(self, "_reporter", None)
        told = None if reporter is None else _GroupProgress(reporter, refs, self._phases)
        documents = self.load_group(refs, counters, told)
        if told is not None:
            told.next()
        frame = transforms.tfrecord_frame
        for phase, encoder in zip(self._phases, self._encoders):
            settings, prefix = phase.settings, phase.prefix
            salt = f"/phase{phase.index}" if phase.index else ""
            phase_counters: dict = {}
            path = part_path(self._temp_dir, phase, group)
            written = 0
            counted = InstanceCounters(settings.max_seq_length, prefix)
            expected = expected_instances(documents, settings) if told is not None else 0
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
                        if told is not None:
                            told.tell(written, expected, estimate=True)
                out.write(b"".join(buffer))
                written += len(buffer)
            if told is not None:
                told.next()
            counted.add_to(counters)
            for key, value in phase_counters.items():
                counters[prefix + key] = counters.get(prefix + key, 0) + value
            yield phase.index, group, path, written
        if reporter is not None:
            reporter.flush()
        yield beam.pvalue.TaggedOutput(transforms.STATS_TAG, counters)


def shard_path(directory: str, split: str, shard: int, num_shards: int) -> str:
    return FileSystems.join(directory, f"{split}-{shard:05d}-of-{num_shards:05d}"
                                       f"{schema.SHARD_SUFFIX}")


def write_shard(task, phase: Phase, split: str, num_shards: int) -> tuple:
    """Writes shard `shard` of a phase: records [shard * N / S, (shard + 1) * N / S) of the
    groups' records in group order (N records, S shards). `task`: (shard, all parts).
    Returns ("shard", its path)."""
    shard, parts = task
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
    return "shard", final


def delete_temp(done, temp_dir: str) -> list:
    """Removes the part files and their folder; `done`: (None, [what was written]) once every
    shard and stats file is (the job's last step). Returns the paths written.

    The parts are found by a match, not below an existing folder: on an object store (gs://,
    s3://) the folder is only a prefix, which `exists` does not see."""
    written = sorted(path for _, path in done[1])
    parts = [m.path for m in FileSystems.match([FileSystems.join(temp_dir, "*")])[0]
             .metadata_list]
    if parts:
        FileSystems.delete(parts)
    if FileSystems.exists(temp_dir):  # a local folder
        FileSystems.delete([temp_dir])
    return written


def stats_path(output_dir: str, split: str) -> str:
    return FileSystems.join(output_dir, f"{split}-stats.json")


def read_stats(output_dir: str, split: str) -> dict:
    """The stats a finished run wrote to <output_dir>/<split>-stats.json."""
    with FileSystems.open(stats_path(output_dir, split)) as handle:
        return json.loads(handle.read().decode("utf-8"))


def write_stats(counters: dict, phase: Phase, settings: dict, split: str) -> tuple:
    """Writes a phase's <split>-stats.json; returns ("stats", its path)."""
    stats = finalize_stats(counters, settings, phase.prefix)
    path = stats_path(phase.directory, split)
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(json.dumps(stats, indent=2).encode("utf-8"))
    return "stats", path


def instance_settings(args, max_seq_length: int, max_predictions_per_seq: int) -> InstanceSettings:
    """The job's flags named like the fields of InstanceSettings, with a phase's lengths."""
    values = {name: getattr(args, name) for name in INSTANCE_FLAGS}
    return InstanceSettings(**{**values, "max_seq_length": max_seq_length,
                               "max_predictions_per_seq": max_predictions_per_seq})


def settings_dict(args, phase: Phase | None = None) -> dict:
    """What stats.json records: the instance settings (those of `phase` with --phases) and
    where the instances came from."""
    lengths = ((phase.settings.max_seq_length, phase.settings.max_predictions_per_seq)
               if phase is not None else (args.max_seq_length, args.max_predictions_per_seq))
    settings = {"split": args.split, "input": args.input, "input_format": args.input_format,
                "vocab_file": args.vocab_file, "lowercase": args.lowercase,
                **dataclasses.asdict(instance_settings(args, *lengths)),
                "num_shards": args.num_shards, "group_size_mb": args.group_size_mb,
                "phases": args.phases}
    if args.input_format == "jsonl":
        settings["text_field"] = args.text_field
    if phase is not None:
        settings["phase"] = phase.index + 1
    return settings


def make_phases(args) -> list[Phase]:
    if not args.phases:
        return [Phase(0, args.output_dir, instance_settings(
            args, args.max_seq_length, args.max_predictions_per_seq))]
    return [Phase(i, FileSystems.join(args.output_dir, f"phase{i + 1}"),
                  instance_settings(args, seq, pred))
            for i, (seq, pred) in enumerate(parse_phases(args.phases))]


def _key_by_group(document, seed: int, groups: int, root: str):
    (path, offset), _ = document
    return document_group((path[len(root):], offset), seed, groups), document


def input_root(paths) -> str:
    """The folder all input files share ("" for none), so that documents are grouped by their
    path below it: the same corpus gives the same TFRecords in any run directory."""
    folders = [path.rsplit("/", 1)[0] + "/" if "/" in path else "" for path in paths]
    root = min(folders, default="")
    for folder in folders:
        while not folder.startswith(root):
            root = root[:-1].rsplit("/", 1)[0] + "/" if "/" in root[:-1] else ""
    return root


def build_pipeline(pipeline, args, special: SpecialIds, ranges=None) -> dict:
    """Adds the job's steps to `pipeline`; returns its main PCollections by name
    (documents: the refs, parts, stats: the summed counters, shards: the paths of the shards
    and stats files written) for tests to assert on.

    Runner-neutral (see beam_jobs/runners.py): no tagged outputs of a ParDo, no side
    input, no output in finish_bundle, and one last step that depends on every other
    (DeleteParts), so the same graph runs on the FnApiRunner, Dataflow and the DaskRunner.
    """
    if ranges is None:
        ranges = reading.plan_input(args.input, int(args.read_chunk_mb * (1 << 20)))
    phases = make_phases(args)
    groups = num_groups(sum(r.size for r in ranges if r.start == 0), args.group_size_mb)
    # Part files go below the output folder, through FileSystems: workers on other machines
    # write and read them where the launcher's local disk is not (gs://, a shared mount).
    temp_dir = FileSystems.join(args.output_dir, f".tmp-{args.split}-{uuid.uuid4().hex[:12]}")

    # Only document references (path, offset, length) go through the shuffle; each group
    # reads its own documents (compressed inputs, which cannot be re-read at an offset,
    # send the document's compressed bytes instead).
    read = pipeline | "IndexDocuments" >> reading.ReadDocuments(
        ranges, args.input_format, args.text_field, index_only=True,
        progress_dir=args.progress_dir)
    created = (
        read.documents
        | "AssignGroups" >> beam.Map(_key_by_group, seed=args.seed, groups=groups,
                                     root=input_root(r.path for r in ranges))
        | "GroupDocuments" >> beam.GroupByKey()
        | "CreateInstances" >> TaggedOutputs(CreateInstancesFn(
            phases, special, temp_dir, args.vocab_file, args.lowercase, args.input_format,
            args.text_field, args.progress_dir), [transforms.STATS_TAG], main="parts"))
    # Every shard needs every part's record count: all parts (one small tuple per group and
    # phase) as one list, handed to each shard's writer (a Reshuffle spreads the writers).
    all_parts = created.parts | "CollectParts" >> Collect()
    written = []
    for phase in phases:
        name = f"Phase{phase.index + 1}" if args.phases else ""
        written.append(
            all_parts
            | f"{name}ShardTasks" >> beam.FlatMap(
                lambda parts, shards: [(shard, parts) for shard in range(shards)],
                shards=args.num_shards)
            | f"{name}SpreadShards" >> beam.Reshuffle()
            | f"{name}WriteShards" >> beam.Map(write_shard, phase=phase, split=args.split,
                                               num_shards=args.num_shards))
    shards = written[0] if len(written) == 1 else (written | "AllShards" >> beam.Flatten())

    counters = (
        (read.stats, created.stats)
        | "FlattenCounters" >> beam.Flatten()
        | "KeyCounters" >> beam.Map(lambda counters: (None, counters))
        | "SumCounters" >> beam.CombinePerKey(transforms.SumCounters())
        | "SummedCounters" >> beam.Values())
    stats = [counters | f"{'Phase%d' % (p.index + 1) if args.phases else ''}WriteStats" >> beam.Map(
        write_stats, phase=p, settings=settings_dict(args, p if args.phases else None),
        split=args.split) for p in phases]
    # Last: the part files go once every shard and stats file is written.
    _ = ((shards, *stats)
         | "AllWritten" >> beam.Flatten()
         | "KeyWritten" >> beam.Map(lambda written: (None, written))
         | "WaitForAll" >> beam.GroupByKey()
         | "DeleteParts" >> beam.Map(delete_temp, temp_dir=temp_dir))
    return {"documents": read.documents, "parts": created.parts, "stats": counters,
            "shards": shards}


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
    parser.add_argument("--input_format", default="google", choices=INPUT_FORMATS,
                        help="google: sentence per line, blank line between documents; text: "
                             "blank-line separated blocks split into sentences; jsonl: one "
                             "document per line in --text_field")
    parser.add_argument("--text_field", default="text", help="the text field of jsonl input")
    parser.add_argument("--output_dir", required=True, help="directory for the output")
    parser.add_argument("--split", default=schema.TRAIN_PREFIX,
                        help="shard name prefix: <output_dir>/<split>-00000-of-00004.tfrecord")
    parser.add_argument("--vocab_file", required=True, help="WordPiece vocab, one token a line")
    # The flags that are config keys (vocab.lowercase, data.*): type, default, choices, range and
    # help from their one declaration, beam_jobs/settings.py, which the config's sections are
    # too; the pipeline's data stage passes each from the config (pipeline/config/data_job.py).
    add_flags(parser, VocabSettings, names=("lowercase",))
    add_flags(parser, DataSettings)
    parser.add_argument("--phases", default="",
                        help="several outputs from one reading, e.g. '128:20,512:80' -> "
                             "<output_dir>/phase1, phase2 (overrides --max_seq_length and "
                             "--max_predictions_per_seq); absent: one output")
    parser.add_argument("--read_chunk_mb", type=float, default=16.0,
                        help="uncompressed files are read in ranges of this size")
    add_flags(parser, ProgressSettings)
    args, beam_args = parser.parse_known_args(argv)
    args.input, args.output_dir = absolute(args.input), absolute(args.output_dir)
    args.vocab_file = absolute(args.vocab_file)
    args.progress_dir = absolute(args.progress_dir)
    try:
        check_paths(input=args.input, output_dir=args.output_dir, vocab_file=args.vocab_file)
    except ValueError as err:
        parser.error(str(err))
    check_flags(parser, args, DataSettings)
    if args.read_chunk_mb <= 0:
        parser.error(f"--read_chunk_mb {args.read_chunk_mb} must be > 0")
    try:
        phases = parse_phases(args.phases)
    except ValueError as err:
        parser.error(f"--phases: {err}")
    for seq, pred in phases:  # each phase's lengths, within the declared ranges
        for name, value in (("max_seq_length", seq), ("max_predictions_per_seq", pred)):
            problem = limit_error(value, limits(DataSettings, name))
            if problem:
                parser.error(f"--phases {seq}:{pred}: {name} {problem}")
    return args, beam_args


def check_inputs(args):
    """Fails fast, before any pipeline starts: vocab missing or lacking a special token,
    or an --input glob that matches no file. Returns (SpecialIds, the input ranges)."""
    if not FileSystems.exists(args.vocab_file):
        raise FileNotFoundError(f"vocab file {args.vocab_file} not found (--vocab_file)")
    special = SpecialIds.from_vocab(read_vocab(args.vocab_file, FileSystems.open),
                                    args.vocab_file)
    ranges = reading.plan_input(args.input, int(args.read_chunk_mb * (1 << 20)))
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
    pipeline = beam.Pipeline(options=pipeline_options(beam_args))
    build_pipeline(pipeline, args, special, ranges)
    result = pipeline.run()
    result.wait_until_finish()
    release(result)
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
