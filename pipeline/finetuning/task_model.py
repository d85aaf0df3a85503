"""The task model of a fine-tuning run: the pretrained encoder it starts from, the head on it
(models/heads.py), the freeze strategy, the optimizer, and the features of each split.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import keras
import numpy as np

import models
from models import heads
from models.schedules import WarmupPolynomialDecay
from pipeline import artifacts
from pipeline.artifacts import Artifacts
from pipeline.config import Config
from pipeline.finetuning import features
from models import preprocessor

INPUTS = ("token_ids", "segment_ids", "padding_mask")


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
    """(the .keras file to start from, the vocab.txt that goes with it)."""
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
    if fc.init_from:
        model_path = Path(fc.init_from)
        if not model_path.is_file() or model_path.suffix != ".keras":
            raise FinetuneError(f"finetune.init_from = {fc.init_from!r} is not a .keras file; give "
                                f"a model saved by the pretrain or finetune stage (model.keras)")
    else:
        model_path = artifacts.require(paths.model_keras, "the pretrained model", "train")
    if fc.vocab_file:
        vocab = Path(fc.vocab_file)
    elif fc.init_from and (model_path.parent / "vocab.txt").is_file():
        vocab = model_path.parent / "vocab.txt"
    else:
        vocab = artifacts.require(paths.vocab_file, "the vocab", "vocab")
    return model_path, vocab


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


def build_task_model(task: str, backbone, num_labels: int, fc):
    """The task model of models/heads.py on `backbone`, with the freeze strategy applied."""
    heads.freeze_backbone(backbone, fc.freeze, fc.trainable_last_n)
    if task in ("token_classification", "question_answering", "semantic_search"):
        backbone.pooled_dense.trainable = False  # these heads do not use the [CLS] pooler
    if task == "classification" and windowed(fc):
        from models.window_heads import BertWindowClassifier

        return BertWindowClassifier(backbone, num_labels, fc.long_doc_aggregation,
                                    dropout=fc.dropout)
    if task == "classification":
        return heads.BertClassifier(backbone, num_labels, dropout=fc.dropout)
    if task == "regression":
        return heads.BertRegressor(backbone, dropout=fc.dropout)
    if task == "token_classification":
        return heads.BertTokenClassifier(backbone, num_labels, dropout=fc.dropout)
    if task == "question_answering":
        return heads.BertSpanExtractor(backbone)
    return heads.BertSentenceEncoder(backbone)


def build_optimizer(fc, total_steps: int) -> keras.optimizers.Optimizer:
    """AdamW, linear warmup over `warmup_fraction` of the steps then linear decay to 0."""
    warmup = int(round(fc.warmup_fraction * total_steps))
    schedule = WarmupPolynomialDecay(fc.learning_rate, warmup, total_steps)
    optimizer = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=fc.weight_decay,
                                       beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                                       global_clipnorm=fc.clipnorm or None)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return optimizer


# ---------------------------------------------------------------------------
# Features per task: (x, y, sample_weight) numpy dicts, plus what evaluation needs
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Split:
    examples: list
    x: dict
    y: dict | None = None
    sample_weight: dict | None = None
    meta: dict | None = None


def windowed(fc) -> bool:
    """Long-document classification: every window of a text, predictions aggregated."""
    return getattr(fc, "long_doc_aggregation", "none") != "none"


def make_split(task: str, examples: list, pre: preprocessor.TextPreprocessor, labels, fc,
               pair: bool) -> Split:
    if task == "classification" and windowed(fc):  # one example = all windows of a document
        from pipeline.text.windows import text_windows

        f = text_windows([e.text for e in examples], pre, fc.window_stride, fc.max_windows)
        index = {name: i for i, name in enumerate(labels)}
        y = {"logits": np.array([index[e.label] for e in examples], np.int32)}
        return Split(examples, {k: f[k] for k in (*INPUTS, "window_mask")}, y, None,
                     {"n_windows": f["n_windows"], "truncated_documents": f["truncated_documents"]})
    if task in ("classification", "regression"):
        x = pre.features([e.text for e in examples],
                         [e.text_pair for e in examples] if pair else None)
        if task == "classification":
            index = {name: i for i, name in enumerate(labels)}
            y = {"logits": np.array([index[e.label] for e in examples], np.int32)}
        else:
            y = {"score": np.array([e.label for e in examples], np.float32)}
        return Split(examples, x, y)
    if task == "token_classification":
        f = features.token_features(examples, pre, labels)
        return Split(examples, {k: f[k] for k in INPUTS}, {"logits": f["labels"]},
                     {"logits": f["weights"]}, f)
    if task == "question_answering":
        f = features.qa_features(examples, pre, fc.max_query_length, fc.doc_stride)
        return Split(examples, {k: f[k] for k in INPUTS},
                     {"start_logits": f["start_positions"], "end_logits": f["end_positions"]},
                     None, f)
    # semantic search: both sides packed as single texts
    a = pre.features([e.text for e in examples])
    b = pre.features([e.text_pair for e in examples])
    x = {**{"a_" + k: v for k, v in a.items()}, **{"b_" + k: v for k, v in b.items()}}
    return Split(examples, x, {"similarity": np.zeros(len(examples), np.float32)})


def compile_task(model, task: str, optimizer, jit_compile=False, loss_weight: float = 1.0):
    """Loss (and metrics) per task. XLA is off by default: on CPU it made no reliable
    difference to the step time and costs seconds of compilation per run."""
    ce = keras.losses.SparseCategoricalCrossentropy
    accuracy = keras.metrics.SparseCategoricalAccuracy
    kwargs = {"optimizer": optimizer, "jit_compile": jit_compile}
    if loss_weight != 1.0 and task != "question_answering":  # multi-task: this task's share
        output = {"regression": "score", "semantic_search": "similarity"}.get(task, "logits")
        kwargs["loss_weights"] = {output: float(loss_weight)}
    if task == "classification":
        model.compile(loss={"logits": ce(from_logits=True)},
                      metrics={"logits": [accuracy("accuracy")]}, **kwargs)
    elif task == "regression":
        model.compile(loss={"score": keras.losses.MeanSquaredError()}, **kwargs)
    elif task == "token_classification":
        # Only first word pieces carry a label (weight 1): the mean is over those.
        model.compile(loss={"logits": ce(from_logits=True, reduction="mean_with_sample_weight")},
                      weighted_metrics={"logits": [accuracy("accuracy")]}, **kwargs)
    elif task == "question_answering":
        model.compile(loss={"start_logits": ce(from_logits=True),
                            "end_logits": ce(from_logits=True)},
                      loss_weights={"start_logits": 0.5, "end_logits": 0.5}, **kwargs)
    else:
        model.compile(loss={"similarity": heads.InBatchNegativesLoss()}, **kwargs)


# ---------------------------------------------------------------------------
# Evaluation per task
# ---------------------------------------------------------------------------
def predict_outputs(model, x: dict, batch_size: int) -> dict:
    return {k: np.asarray(v) for k, v in model.predict(x, batch_size=batch_size, verbose=0).items()}
