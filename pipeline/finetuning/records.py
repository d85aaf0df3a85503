"""A fine-tuning task's features as TFRecords: written once by a Beam job, streamed by tf.data.

    examples (raw, per split) ──► beam_jobs/finetune_data.py (RowEncoder: the task's
    `make_split` + `rows` on the pure-Python preprocessor) ──► <run_dir>/finetune_features/<key>/
        <split>-SSSSS-of-NNNNN.tfrecord, spec.json, lineage.json, checksums.json
    ──► RecordSplit: tf.data (parallel reads, shuffle buffer, prefetch) for training, batches
        of rows for evaluation.

The key is a hash of everything the features depend on (the task and its feature settings,
the vocabulary, the casing, the examples of every split), so a second run with the same data
and tokenizer reuses the folder (after its checksums pass) and a change makes a new one.
No split's features are held in Python: the stage holds the raw examples, the Beam job
encodes them in batches, training and evaluation read the records in batches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np

from pipeline import artifacts
from pipeline.finetuning import readers

log = logging.getLogger(__name__)

SPEC = "spec.json"
SHUFFLE_BUFFER = 10_000  # training records shuffled at a time (BERT's run_classifier: 100)
LINEAGE = "lineage.json"


# ---------------------------------------------------------------------------
# Examples as JSON lines (the Beam job's input) and back
# ---------------------------------------------------------------------------
EXAMPLE_TYPES = {cls.__name__: cls for cls in (readers.TextExample, readers.TokenExample,
                                                readers.QAExample)}


def example_json(index: int, example) -> str:
    return json.dumps({"index": index, "type": type(example).__name__,
                       "fields": dataclasses.asdict(example)}, ensure_ascii=False)


def example_from_json(item: dict):
    return EXAMPLE_TYPES[item["type"]](**item["fields"])


# ---------------------------------------------------------------------------
# The encoder the Beam workers run (pure Python: no TensorFlow)
# ---------------------------------------------------------------------------
class RowEncoder:
    """Examples -> feature rows of one task: its `make_split` on the pure-Python
    preprocessor (pipeline/text/packing.py), then its `rows`, as {key: (kind, values)}."""

    def __init__(self, task_name: str, fc, tokenizer, labels, pair: bool):
        self.task_name, self.fc = task_name, fc  # tokenizer: its vocab and casing travel
        self.vocab, self.lowercase = list(tokenizer.vocab), tokenizer.lowercase
        self.labels, self.pair = labels, pair
        self._task = self._pre = None

    def setup(self) -> None:
        from pipeline.finetuning import tasks
        from pipeline.text.packing import PythonPreprocessor

        self._task = tasks.get(self.task_name, self.fc)
        self._pre = PythonPreprocessor(self.vocab, self.lowercase, self.fc.max_seq_length)

    def row_arrays(self, items: list[dict]) -> tuple[dict, list[str]]:
        """(the rows of a batch of JSON examples as numpy arrays, with example_index from
        their "index"; the model input keys among them)."""
        if self._task is None:
            self.setup()
        examples = [example_from_json(item) for item in items]
        split = self._task.make_split(examples, self._pre, self.labels, self.pair)
        rows = self._task.rows(split)
        indices = np.asarray([item["index"] for item in items], np.int64)
        rows["example_index"] = indices[rows["example_index"]]
        return rows, list(split.x)

    def encode(self, items: list[dict]) -> list[dict]:
        rows, _ = self.row_arrays(items)
        n = len(rows["example_index"])
        kinds = {k: "float" if np.issubdtype(v.dtype, np.floating) else "int64"
                 for k, v in rows.items()}
        flat = {k: np.asarray(v).reshape(n, -1).tolist() for k, v in rows.items()}
        return [{k: (kinds[k], flat[k][i]) for k in rows} for i in range(n)]


def spec_of(rows: dict) -> dict:
    """{key: {"dtype", "shape"}} of one row, from rows as numpy arrays."""
    return {k: {"dtype": "float32" if np.issubdtype(v.dtype, np.floating) else "int64",
                "shape": list(np.asarray(v).shape[1:])} for k, v in rows.items()}


# ---------------------------------------------------------------------------
# Writing (once) and finding the records of a task's splits
# ---------------------------------------------------------------------------
def features_key(task_name: str, settings: dict, vocab_path: Path, lowercase: bool,
                 example_files: dict) -> str:
    """What the features depend on, hashed: a change of any of them makes a new folder."""
    digest = hashlib.sha256(json.dumps({
        "task": task_name, "settings": settings, "lowercase": lowercase,
        "vocab": artifacts.sha256_file(Path(vocab_path)),
        "examples": {split: artifacts.sha256_file(path) for split, path in
                     sorted(example_files.items())},
        "format": 1}, sort_keys=True).encode()).hexdigest()
    return digest[:20]


def feature_settings(fc, labels, pair: bool) -> dict:
    """The finetune.* settings that change the features (not the training)."""
    keys = ("max_seq_length", "max_query_length", "doc_stride", "long_doc_aggregation",
            "window_stride", "max_windows")
    return {**{k: getattr(fc, k) for k in keys}, "labels": labels, "pair": pair}


def write_or_reuse(config, task, data, tokenizer) -> dict:
    """{split: RecordSplit} of every split of `data`, tokenized by `tokenizer`
    (context.TokenizerBundle): the features folder of this key,
    written now by the Beam job if there is none (or its checksums fail), else reused. The
    job runs with the data stage's runner options (data.beam_args; data.workers processes
    on a direct runner, by the examples' size); while its workers run on this machine
    (`data_job.runs_locally`), a progress bar or plain lines say how much of the examples'
    bytes they have encoded (pipeline/beam_progress.py)."""
    from beam_jobs import finetune_data
    from pipeline import beam_progress
    from pipeline.config import data_job

    fc = config.finetune
    vocab_path, lowercase = tokenizer.vocab_path, tokenizer.lowercase
    paths = artifacts.Artifacts(config.run_dir)
    splits = {"train": data.train, "validation": data.validation, **data.tests}
    staging = paths.root / "finetune_features" / f".examples-{os.getpid()}"
    staging.mkdir(parents=True, exist_ok=True)
    try:
        files = {}
        for split, examples in splits.items():  # the raw examples, one JSON line each
            files[split] = staging / f"{split}.jsonl"
            with open(files[split], "w", encoding="utf-8") as handle:
                handle.writelines(example_json(i, example) + "\n"
                                  for i, example in enumerate(examples))
        settings = feature_settings(fc, data.labels, data.pair)
        key = features_key(task.name, settings, vocab_path, lowercase, files)
        folder = paths.root / "finetune_features" / key
        if folder.is_dir() and _usable(folder):
            log.info(f"finetune: reusing the features in {folder} (same task settings, vocab and "
                     f"examples)")
            return open_splits(folder, task, splits)
        encoder = RowEncoder(task.name, fc, tokenizer, data.labels, data.pair)
        size = sum(p.stat().st_size for p in files.values())
        beam_args = data_job.beam_args(config, size)
        with artifacts.atomic_dir(folder) as tmp:
            # The bytes of the JSON lines encoded, against their files' size (known now).
            with beam_progress.watch("finetune: encoding features", size,
                                     data_job.runs_locally(config), measure="done") as told:
                counts = finetune_data.run([
                    "--input_dir", str(staging), "--output_dir", str(tmp), "--splits",
                    ",".join(f"{split}:{shards(len(examples)) if split == 'train' else 1}"
                             for split, examples in splits.items()),
                    *data_job.progress_args(told), *beam_args], encoder=encoder)
            probe, inputs = encoder.row_arrays([json.loads(example_json(0, splits["train"][0]))])
            (tmp / SPEC).write_text(json.dumps({"rows": spec_of(probe), "inputs": inputs,
                                                "counts": counts}, indent=2))
            (tmp / LINEAGE).write_text(json.dumps({
                "task": task.name, "settings": settings, "lowercase": lowercase,
                "vocab_file": str(vocab_path), "vocab_sha256": artifacts.sha256_file(vocab_path),
                "examples_sha256": {s: artifacts.sha256_file(p) for s, p in files.items()},
                "files": data.splits.get("files", {})}, indent=2, default=str))
            artifacts.write_checksums(tmp)
        rows = sum(c["rows"] for c in counts.values())
        log.info(f"finetune: wrote {rows:,} feature rows of {len(splits)} splits to {folder} "
                 f"(Beam)")
        return open_splits(folder, task, splits)
    finally:
        for path in staging.glob("*"):
            path.unlink()
        staging.rmdir()


def _usable(folder: Path) -> bool:
    try:
        artifacts.verify_checksums(folder, "make finetune ARGS=--force")
    except artifacts.AlteredArtifact:
        return False
    return (folder / SPEC).is_file()


def shards(examples: int) -> int:
    """Training shards: enough for parallel reads, ~10k examples each at most."""
    return max(1, min(16, examples // 10_000 + 1))


def open_splits(folder: Path, task, splits: dict) -> dict:
    spec = json.loads((folder / SPEC).read_text())
    return {name: RecordSplit(task, sorted(folder.glob(f"{name}-*.tfrecord")), spec, name,
                              examples) for name, examples in splits.items()}


# ---------------------------------------------------------------------------
# Reading: tf.data
# ---------------------------------------------------------------------------
class RecordSplit:
    """One split's records: `dataset` for `fit`, `batches` for evaluation; `examples` are
    the split's raw examples (what predictions are mapped back to). `spec`: the folder's
    spec.json (the rows' keys and shapes, the model inputs, every split's row count)."""

    def __init__(self, task, files: list, spec: dict, name: str, examples: list):
        self.task, self.files, self.spec = task, [str(f) for f in files], spec["rows"]
        self.inputs, self.examples = tuple(spec["inputs"]), examples
        self.rows = spec["counts"][name]["rows"]

    def __len__(self) -> int:
        return self.rows

    def _records(self, shuffle_buffer: int = 0, seed: int = 0, repeat: bool = False):
        import tensorflow as tf

        files = tf.data.Dataset.from_tensor_slices(self.files)
        if shuffle_buffer:
            files = files.shuffle(len(self.files), seed=seed, reshuffle_each_iteration=True)
        records = files.interleave(tf.data.TFRecordDataset, cycle_length=min(4, len(self.files)),
                                   num_parallel_calls=tf.data.AUTOTUNE,
                                   deterministic=True)
        if shuffle_buffer:
            records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        return records.repeat() if repeat else records

    def _parse(self, serialized):
        import tensorflow as tf

        features = {k: tf.io.FixedLenFeature(v["shape"], getattr(tf, v["dtype"]))
                    for k, v in self.spec.items()}
        parsed = tf.io.parse_example(serialized, features)
        return {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in parsed.items()}

    def _model_io(self, batches):
        """Batches of serialized records -> (x, y[, sample_weight]) batches for Keras."""
        import tensorflow as tf

        return (batches.map(self._parse, num_parallel_calls=tf.data.AUTOTUNE)
                .map(lambda rows: self.task.model_io(rows, self.inputs),
                     num_parallel_calls=tf.data.AUTOTUNE)
                .prefetch(tf.data.AUTOTUNE))

    def dataset(self, batch_size: int, shuffle_buffer: int, seed: int):
        """Endless shuffled training batches of (x, y[, sample_weight]) for Keras."""
        return self._model_io(self._records(shuffle_buffer, seed, repeat=True)
                              .batch(batch_size, drop_remainder=False))

    def epoch_dataset(self, batch_size: int, seed, batches: int | None = None, skip: int = 0,
                      shuffle_buffer: int = SHUFFLE_BUFFER):
        """One epoch of training batches (x, y[, sample_weight]): the records shuffled by
        `seed` (the same seed, the same order: a resumed epoch restarts exactly), the first
        `skip` batches left out. `batches`: exactly that many full batches (the records
        repeated as needed: whole updates under gradient accumulation); None: one pass."""
        import tensorflow as tf

        seed = int(np.random.default_rng(seed).integers(1 << 31))
        records = self._records(shuffle_buffer, seed)
        if batches is not None:
            data = records.repeat().batch(batch_size, drop_remainder=True).take(batches)
        else:
            data = records.batch(batch_size)
            batches = -(-self.rows // batch_size)
        known = tf.data.experimental.assert_cardinality(max(0, batches - skip))
        return self._model_io(data.skip(skip).apply(known))

    def batches(self, batch_size: int):
        """(rows, model inputs) numpy batches, every record once, in file order."""
        import tensorflow as tf

        data = (self._records().batch(batch_size).map(self._parse).prefetch(tf.data.AUTOTUNE))
        for rows in data.as_numpy_iterator():
            yield rows, {k: rows[k] for k in self.inputs}
