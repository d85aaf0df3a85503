"""What every fine-tuning run starts from: the pretrained encoder and its vocab, the output
name (the optimizer and the runtime knobs: pipeline/finetuning/runtime.py). What differs by task (features, head, losses, evaluation, export) is the
task's class: pipeline/finetuning/tasks/.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import models
from pipeline import artifacts
from pipeline.artifacts import Artifacts
from pipeline.config import Config
from pipeline.finetuning.tasks import INPUTS, Split  # noqa: F401 - Split: distillation's type


class FinetuneError(ValueError):
    """The fine-tuning inputs do not fit together; the message says how to fix it."""


def output_name(fc) -> str:
    """`finetune.name`, else brown_genre / brown_pos / the GLUE task / the task name."""
    if fc.name:
        return fc.name
    if fc.dataset == "glue":
        return fc.glue_task
    return fc.dataset if fc.dataset.startswith("brown_") else fc.task


# ---------------------------------------------------------------------------
# The pretrained encoder and its vocab
# ---------------------------------------------------------------------------
def _safe_name(uri: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in uri)


def resolve_init(config: Config) -> tuple[Path, Path]:
    """(the .keras file to start from, the vocab.txt that goes with it: finetune.vocab_file,
    else the model's own (`model_vocab`), else the run's vocab/vocab.txt). The casing is
    the vocab.json beside that vocab.txt (`pipeline.text.vocab.vocab_lowercase`)."""
    paths = Artifacts(config.run_dir)
    fc = config.finetune
    if fc.init_from.startswith(("models:/", "runs:/")):  # a model in the MLflow store
        from pipeline.serving.mlflow_model import download_model_files

        try:
            model_path, vocab = download_model_files(
                fc.init_from, paths.root / "downloads" / _safe_name(fc.init_from))
        except Exception as err:  # noqa: BLE001 - MLflow raises several kinds
            raise FinetuneError(f"finetune.init_from = {fc.init_from!r}: cannot fetch it from "
                                f"the MLflow store ({err}); give a registered model "
                                f"(models:/<name>@<alias> or models:/<name>/<version>) or a "
                                f"run's artifact (runs:/<run id>/model/model.keras)") from err
        return model_path, Path(fc.vocab_file) if fc.vocab_file else (
            vocab or artifacts.require(paths.vocab_file, "the vocab", "vocab"))
    if fc.init_from and Path(fc.init_from).is_dir():  # a Hugging Face or Google checkpoint
        model_path = import_checkpoint_dir(Path(fc.init_from), paths.root / "imported")
        return model_path, Path(fc.vocab_file) if fc.vocab_file else model_path.parent / "vocab.txt"
    if fc.init_from:
        model_path = Path(fc.init_from)
        if not model_path.is_file() or model_path.suffix != ".keras":
            raise FinetuneError(f"finetune.init_from = {fc.init_from!r} is neither a .keras file "
                                f"nor a checkpoint directory; give a model saved by the pretrain "
                                f"or finetune stage (model.keras), or a Hugging Face / Google "
                                f"BERT directory")
    else:
        model_path = artifacts.require(paths.model_keras, "the pretrained model", "train")
    if fc.vocab_file:
        return model_path, Path(fc.vocab_file)
    if not fc.init_from:
        return model_path, artifacts.require(paths.vocab_file, "the vocab", "vocab")
    vocab = model_vocab(model_path)
    if vocab is None and paths.vocab_file.is_file():
        vocab = paths.vocab_file
    if vocab is None:
        raise FinetuneError(
            f"finetune.init_from = {fc.init_from!r} has no vocab.txt beside it (nor in "
            f"its run's vocab/, nor {paths.vocab_file}); put the vocab.txt "
            f"(and vocab.json, its casing) it was trained with beside it, or set "
            f"finetune.vocab_file")
    return model_path, vocab


def model_vocab(model_path: Path) -> Path | None:
    """The vocab.txt a .keras file was trained with: beside it (every model the stages write
    has its vocab.txt and vocab.json there), else, for a pretrain run's model.keras written
    before that, its run's vocab/vocab.txt; None when neither exists."""
    beside = model_path.parent / "vocab.txt"
    if beside.is_file():
        return beside
    of_its_run = Artifacts(Path(model_path).resolve().parent.parent).vocab_file
    if Path(model_path).parent.name == "pretrain" and of_its_run.is_file():
        return of_its_run
    return None


def import_checkpoint_dir(directory: Path, cache: Path) -> Path:
    """A Hugging Face or Google BERT directory, imported once into
    <cache>/<name>-<fingerprint>/ (model.keras, vocab.txt, vocab.json with its casing) and
    reused while the directory's files are unchanged; returns that model.keras."""
    import hashlib
    import json

    from models import convert
    from models.convert.describe import describe

    files = sorted(p for p in directory.iterdir() if p.is_file())
    fingerprint = hashlib.sha256(json.dumps(
        [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]).encode()).hexdigest()
    target = cache / f"{_safe_name(directory.resolve().name)}-{fingerprint[:12]}"
    if (target / "model.keras").is_file() and (target / "vocab.txt").is_file():
        return target / "model.keras"
    try:
        described = describe(directory)
        with warnings.catch_warnings():  # an encoder-only checkpoint: the heads are not used
            warnings.filterwarnings("ignore", message=".*keep their random initialisation.*")
            imported = convert.load_pretrainer(directory)
    except (convert.ConversionError, OSError) as err:
        raise FinetuneError(f"finetune.init_from = {str(directory)!r}: {err}") from err
    if not imported.vocab:
        raise FinetuneError(f"finetune.init_from = {str(directory)!r} has no vocab.txt; put the "
                            f"vocab released with the checkpoint there")
    with artifacts.atomic_dir(target) as tmp:
        imported.model.save(str(tmp / "model.keras"))
        convert.write_vocab(imported.vocab, tmp / "vocab.txt")
        (tmp / "vocab.json").write_text(json.dumps(
            {"lowercase": described.lowercase, "casing_from": described.casing_from,
             "imported_from": str(directory)}, indent=2), encoding="utf-8")
    return target / "model.keras"


def load_backbone(model_path: Path):
    """The BERT encoder inside a saved model (a pretrainer, a task model or an encoder)."""
    with warnings.catch_warnings():  # the pretrainer's optimizer state is not needed here
        warnings.filterwarnings("ignore", message=".*Skipping variable loading for optimizer.*")
        try:
            model = models.load_keras(model_path, compile=False)
        except ValueError as err:
            if "safe_mode" not in str(err):
                raise
            raise FinetuneError(
                f"{model_path} holds Python code (a Lambda layer's function): not loaded, "
                f"Keras safe mode; give a model written by the pretrain or finetune stage") from err
    if hasattr(model, "backbone"):
        return model.backbone
    if all(name in getattr(model, "input", {}) for name in INPUTS):
        return model
    raise FinetuneError(f"{model_path} holds a {type(model).__name__} without a BERT encoder "
                        f"(no .backbone); give a model written by the pretrain/finetune stage")
