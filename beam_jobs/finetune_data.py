"""Labelled examples -> sharded TFRecords of a fine-tuning task's features.

    python -m beam_jobs.finetune_data --input_dir examples --output_dir out \
        --splits train:4,validation:1,test:1   (plus any Beam flags: --runner=DaskRunner ...)

Input: <input_dir>/<split>.jsonl, one example a line, `{"index": i, ...}`. The job does not
know the tasks: the caller passes `encoder`, a picklable object with `setup()` (called once
per worker: the vocabulary and tokenizer) and `encode(examples) -> [{key: ("int64" |
"float", values)}]` (a list of examples in, their feature rows out, in pure Python:
pipeline/finetuning/records.py `RowEncoder`). Output, per split:
<output_dir>/<split>-SSSSS-of-NNNNN.tfrecord, every record a tf.train.Example of one row (the
workers write part files, named by their first example and their counts of examples and rows,
merged into the shards at the end); `run` returns the counts. Workers import no TensorFlow.

Progress: with --progress_dir (only for workers on this machine: pipeline/finetuning/records.py
passes it for `data_job.runs_locally` runners), each worker adds the bytes of the JSON lines it
has encoded and written as `done` (beam_jobs/progress.py), one count per batch; the total is
the input files' size, known before the job starts (every line's bytes and its line break).
The outputs are the same bytes with or without it.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import shutil

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_jobs import progress
from beam_jobs.example_encoder import encode_features
from beam_jobs.runners import absolute, pipeline_options, release
from beam_jobs.settings import ProgressSettings, add_flags
from beam_jobs.transforms import tfrecord_frame

_LOGGER = logging.getLogger(__name__)
ENCODE_BATCH = 1024  # examples per encoder call and part file


class EncodeAndWrite(beam.DoFn):
    """A batch of JSON lines -> their records, written straight to a part file named by the
    batch's first example and its counts (<output_dir>/<split>-part-<index>-<examples>-<rows>
    .tfrecord, written aside and renamed: a retried bundle writes the same file again); emits
    its path. Nothing but names leaves the worker, so no runner holds a split's records in
    memory, and the job has no step after the writing (a small job pays seconds for each).
    With `progress_dir`, tells beam_jobs/progress.py the batch's input bytes as `done` once
    its part file is in place."""

    def __init__(self, encoder, output_dir: str, split: str, progress_dir: str = ""):
        self._encoder, self._output_dir, self._split = encoder, output_dir, split
        self._progress_dir = progress_dir

    def setup(self):
        self._encoder.setup()
        self._reporter = progress.reporter(self._progress_dir)

    def process(self, lines):
        examples = [json.loads(line) for line in lines]
        rows = self._encoder.encode(examples)
        first = min(item["index"] for item in examples)
        final = FileSystems.join(self._output_dir, f"{self._split}-part-{first:09d}-"
                                                    f"{len(examples)}-{len(rows)}.tfrecord")
        aside = final + f".tmp-{os.getpid()}"
        with FileSystems.create(aside) as handle:
            for row in rows:
                handle.write(tfrecord_frame(encode_features(row)))
        FileSystems.rename([aside], [final])
        if self._reporter is not None:  # the lines' bytes in the input file, breaks included
            self._reporter.add(done=sum(len(line.encode("utf-8")) + 1 for line in lines))
            self._reporter.flush()
        yield final


def merge_parts(output_dir: str, split: str, shards: int) -> dict:
    """The part files of a split, concatenated (TFRecord files concatenate byte for byte)
    into `shards` files <split>-SSSSS-of-NNNNN.tfrecord, parts in index order, spread
    evenly; the parts are removed. Returns {"examples", "rows"}: the sums of the parts'."""
    parts = sorted(glob.glob(os.path.join(output_dir, f"{split}-part-*.tfrecord")))
    counts = [os.path.basename(part)[:-len(".tfrecord")].split("-")[-2:] for part in parts]
    shards = max(1, min(shards, len(parts))) if parts else 1
    for shard in range(shards):
        path = os.path.join(output_dir, f"{split}-{shard:05d}-of-{shards:05d}.tfrecord")
        with open(path, "wb") as out:
            for part in parts[shard * len(parts) // shards:(shard + 1) * len(parts) // shards]:
                with open(part, "rb") as handle:
                    shutil.copyfileobj(handle, out, 1 << 20)
                os.remove(part)
    return {"examples": sum(int(c[0]) for c in counts), "rows": sum(int(c[1]) for c in counts)}


def parse_args(argv=None):
    """-> (the job's arguments, the remaining flags for Beam's PipelineOptions)."""
    parser = argparse.ArgumentParser(
        prog="python -m beam_jobs.finetune_data",
        description="Fine-tuning examples (JSON lines) -> TFRecords of their features. Flags "
                    "not listed here go to Beam's PipelineOptions.")
    parser.add_argument("--input_dir", required=True,
                        help="folder of <split>.jsonl files, one example per line")
    parser.add_argument("--output_dir", required=True, help="directory for the output")
    parser.add_argument("--splits", required=True,
                        help="comma-separated split:shards, e.g. train:4,validation:1,test:1 "
                             "(shards 0: the runner chooses)")
    # --progress_dir: the one declaration of the jobs' progress flag, beam_jobs/settings.py.
    add_flags(parser, ProgressSettings)
    args, beam_args = parser.parse_known_args(argv)
    args.progress_dir = absolute(args.progress_dir)
    return args, beam_args


def split_shards(value: str) -> dict[str, int]:
    out = {}
    for item in value.split(","):
        name, _, shards = item.partition(":")
        out[name.strip()] = int(shards or 1)
    return out


def build_pipeline(pipeline, args, encoder):
    """One branch per split, all in one pipeline (one start-up for every split)."""
    for split in split_shards(args.splits):
        _ = (
            pipeline
            | f"Read[{split}]" >> beam.io.ReadFromText(os.path.join(args.input_dir,
                                                                    f"{split}.jsonl"))
            | f"Batch[{split}]" >> beam.BatchElements(min_batch_size=ENCODE_BATCH,
                                                      max_batch_size=ENCODE_BATCH)
            | f"EncodeAndWrite[{split}]" >> beam.ParDo(
                EncodeAndWrite(encoder, args.output_dir, split, args.progress_dir)))


def run(argv=None, test_pipeline=None, encoder=None) -> dict | None:
    """Runs the job; returns {split: {"examples", "rows"}} written. With `test_pipeline`, the
    steps are only added to it and None is returned."""
    if encoder is None:
        raise ValueError("finetune_data.run needs an encoder (pipeline/finetuning/records.py)")
    args, beam_args = parse_args(argv)
    if test_pipeline is not None:
        build_pipeline(test_pipeline, args, encoder)
        return None
    pipeline = beam.Pipeline(options=pipeline_options(beam_args))
    build_pipeline(pipeline, args, encoder)
    result = pipeline.run()
    result.wait_until_finish()
    release(result)
    counts = {}
    for split, shards in split_shards(args.splits).items():
        counts[split] = merge_parts(args.output_dir, split, shards)
        _LOGGER.info("%s: %d rows from %d examples written to %s", split,
                     counts[split]["rows"], counts[split]["examples"], args.output_dir)
    return counts
