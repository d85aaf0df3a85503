"""What a fine-tuning task is: one class per task, registered by its `finetune.task` name.

A task owns everything that differs between tasks (Model Garden's Task, keras-hub's Task):

    config      `datasets` it reads, `check_config` (rules that tie finetune.* keys to it)
    inputs      `read_file` (a labelled file -> examples), `make_split` (examples -> features)
    model       `build_model` (encoder + head), `trainer` (what `fit` trains), `compile`
                (losses, metrics)
    evaluation  `evaluate` (metrics + per-example predictions), `keep` (the kept epoch's
                validation result), `baselines` (on the same test split),
                `test_artifacts` (e.g. the confusion matrix)
    outputs     `serving_module` (the raw-text SavedModel), `check_export`,
                `prediction_row` (test_predictions.jsonl), `predict_rows` (`make predict`)

Stages, tools, serving and evaluation ask the registry (`get(name)`) and call these; outside
pipeline/finetuning/tasks/ no code compares a task name. A new task is one file here plus its
tests: docs/adding-a-task.md shows how.

The registry itself is `pipeline.config.task_registry` (the config layer, which validation
asks when it checks a config and which may not import this layer): `register` adds a class
there. pipeline/__init__.py imports this package, so the built-in tasks are registered before
any config is loaded.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import numpy as np

from pipeline.config import task_registry

INPUTS = ("token_ids", "segment_ids", "padding_mask")


@dataclasses.dataclass
class Split:
    """One split's examples and features: model inputs `x`, targets `y`, per-output sample
    weights, and what evaluation needs to map predictions back (`meta`)."""
    examples: list
    x: dict
    y: dict | None = None
    sample_weight: dict | None = None
    meta: dict | None = None

    def __len__(self) -> int:
        return len(next(iter(self.x.values())))

    def batches(self, rows: dict, batch_size: int):
        """The split's rows (`FinetuneTask.rows`) in batches: dicts of numpy arrays."""
        for start in range(0, len(self), batch_size):
            yield {k: v[start:start + batch_size] for k, v in rows.items()}


def register(cls: type[FinetuneTask]) -> type[FinetuneTask]:
    """Class decorator: makes `cls` the task named `cls.name` (ValueError if another class
    has that name)."""
    task_registry.add(cls)
    return cls


def names() -> tuple[str, ...]:
    return task_registry.names()


def get(name: str, fc=None) -> FinetuneTask:
    """The task named `name`, for the finetune section `fc` (may be None for what needs no
    settings, e.g. reading a model folder's task.json)."""
    task_class = task_registry.lookup(name)
    if task_class is None:
        raise ValueError(f"finetune.task = {name!r} is not a fine-tuning task; choose one of: "
                         f"{', '.join(task_registry.names())}")
    return task_class(fc)


def softmax(logits) -> np.ndarray:
    logits = np.asarray(logits, np.float64)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def predict_outputs(model, x: dict, batch_size: int) -> dict:
    return {k: np.asarray(v) for k, v in model.predict(x, batch_size=batch_size, verbose=0).items()}


def predict_batch(model, x: dict) -> dict:
    """The model's outputs on one batch, as float32 numpy arrays."""
    return {k: np.asarray(v, np.float32) for k, v in model.predict_on_batch(x).items()}


def gather(task, model, split, outputs: tuple, keys: tuple) -> dict:
    """The model's `outputs` and the rows' `keys` over a whole split (in batches of twice
    finetune.batch_size), concatenated and put in example order (for outputs a row each;
    per-position outputs are reduced by the caller)."""
    parts: dict = {k: [] for k in (*outputs, *keys)}
    for rows, x in task.batches(split, 2 * task.fc.batch_size):
        predicted = predict_batch(model, x)
        for k in outputs:
            parts[k].append(predicted[k])
        for k in keys:
            parts[k].append(np.asarray(rows[k]))
    out = {k: np.concatenate(v) if v else np.zeros((0,)) for k, v in parts.items()}
    if "example_index" in out and len(out["example_index"]):
        order = np.argsort(out["example_index"].reshape(-1), kind="stable")
        out = {k: v[order] for k, v in out.items()}
    return out


class FinetuneTask(abc.ABC):
    """The base of every task; subclasses override what differs (see the module docstring).
    A class missing one of the abstract methods cannot be instantiated: `get` fails at once,
    not half-way through a run."""

    name: ClassVar[str] = ""
    datasets: ClassVar[tuple[str, ...]] = ()  # finetune.dataset values that can feed it
    metric: ClassVar[str] = "accuracy"  # the metric that selects the best epoch
    points: ClassVar[float] = 100.0  # points per unit of the metric (margins are in points)
    label_set: ClassVar[bool] = False  # classes from finetune.labels / the training data
    stratify: ClassVar[bool] = False  # seeded splits stratified by label
    always_pair: ClassVar[bool] = False  # the examples are always (text, text_pair)
    pooled: ClassVar[bool] = True  # the head reads the [CLS] pooler
    serving: ClassVar[bool] = True  # has a raw-text SavedModel (and is registered)
    multitask: ClassVar[bool] = False  # can share an encoder in multi-task training
    distillable: ClassVar[bool] = False  # can teach a student (pipeline/stages/distill.py)
    windows: ClassVar[bool] = False  # long documents in windows (finetune.long_doc_aggregation)
    requires_label: ClassVar[bool] = True  # a table row without a label is an error
    output: ClassVar[str] = "logits"  # the model output the loss is on
    # Row keys of the targets and sample weights, by model output (`rows`, `model_io`).
    targets: ClassVar[dict] = {"logits": "label"}
    weights: ClassVar[dict] = {}
    inputs: ClassVar[tuple[str, ...]] = ("text",)  # what `make predict` and the SavedModel take

    def __init__(self, fc=None):
        self.fc = fc

    # ---- config ----------------------------------------------------------------------
    @classmethod
    def check_config(cls, fc) -> str:
        """A contradiction between `fc` and this task ("" if none): the message after
        "<source>: key ..."."""
        return ""

    # ---- inputs ----------------------------------------------------------------------
    def selection_metric(self, dataset: str) -> str:
        return self.metric

    def read_file(self, path, fc) -> list:
        """Examples of a csv / tsv / jsonl file (columns from finetune.*)."""
        from pipeline.finetuning.readers import read_table

        return read_table(path, (fc.text_column, fc.text_pair_column, fc.label_column),
                          fmt=fc.dataset, regression=False, require_label=self.requires_label)

    @abc.abstractmethod
    def make_split(self, examples: list, pre, labels, pair: bool) -> Split:
        """Examples -> their features (model inputs, targets, weights, bookkeeping)."""

    def rows(self, split: Split, start: int = 0) -> dict:
        """The split's features as fixed-shape numpy arrays, one row per model example: the
        model inputs, the targets and weights (under their `targets` / `weights` keys) and
        "example_index" (the example a row comes from, counted from `start`), plus what the
        task's evaluation needs (`row_meta`). The rows are what the fine-tuning TFRecords hold
        (pipeline/finetuning/records.py) and what evaluation reads in batches."""
        out = dict(split.x)
        out.update({key: split.y[name] for name, key in self.targets.items()})
        out.update({key: split.sample_weight[name] for name, key in self.weights.items()})
        out["example_index"] = start + np.arange(len(split), dtype=np.int64)
        out.update(self.row_meta(split, start))
        return out

    def row_meta(self, split: Split, start: int) -> dict:
        """Task-specific bookkeeping arrays of `rows` (a row each)."""
        return {}

    def model_io(self, rows: dict, inputs) -> tuple:
        """(x, y, sample_weight) for Keras from rows (numpy or tensors); `inputs`: the model
        input keys."""
        x = {k: rows[k] for k in inputs}
        y = {name: rows[key] for name, key in self.targets.items()}
        weights = {name: rows[key] for name, key in self.weights.items()}
        return (x, y, weights) if weights else (x, y)

    def batches(self, split, batch_size: int):
        """(rows batch, model inputs batch) pairs of a split: an in-memory `Split` or the
        TFRecords of one (`records.RecordSplit`)."""
        if isinstance(split, Split):
            inputs = tuple(split.x)
            for batch in split.batches(self.rows(split), batch_size):
                yield batch, {k: batch[k] for k in inputs}
        else:
            yield from split.batches(batch_size)

    def notes(self, sample) -> list[str]:
        """Lines worth logging about the training split's features; `sample()` makes the Split
        of a sample of it (made only by a task that has something to say: it costs a trace)."""
        return []

    # ---- model -----------------------------------------------------------------------
    @abc.abstractmethod
    def build_model(self, backbone, num_labels: int):
        """The task model on `backbone` (models/heads.py), `freeze` applied."""

    def freeze(self, backbone) -> None:
        """`finetune.freeze`; a head that does not read the pooler leaves it untrained."""
        from models import heads

        heads.freeze_backbone(backbone, self.fc.freeze, self.fc.trainable_last_n)
        if not self.pooled:
            backbone.pooled_dense.trainable = False

    def trainer(self, model):
        """What `model.fit` trains: the task model itself, or a wrapper around it."""
        return model

    @abc.abstractmethod
    def losses(self) -> dict:
        """keras `compile` arguments: loss (and metrics / weighted_metrics, loss_weights)."""

    def compile(self, model, optimizer, loss_weight: float = 1.0, **options) -> None:
        """Compiles with this task's losses; `loss_weight` is its share in multi-task
        training; `options`: jit_compile, steps_per_execution, ..."""
        kwargs = {"jit_compile": False, **self.losses(), **options}
        if loss_weight != 1.0:
            kwargs["loss_weights"] = {self.output: float(loss_weight)}
        model.compile(optimizer=optimizer, **kwargs)

    # ---- evaluation ------------------------------------------------------------------
    @abc.abstractmethod
    def evaluate(self, model, split: Split, data, encoder=None) -> tuple[dict, dict]:
        """(metrics, per-example predictions) of `model` on one split."""

    def keep(self, validation: dict) -> None:
        """Told the kept epoch's validation metrics (`evaluate`'s first value) before the
        test split(s) of those weights are evaluated or they are exported: what evaluation
        chose on the validation split travels with that result (question answering: its
        null-score threshold). Most tasks choose nothing there."""

    def baselines(self, data, seed: int) -> dict:
        """{name: test metrics (+ "chosen", "validation")} of classical models on the same
        test split, their settings chosen on the validation split
        (pipeline/finetuning/baselines.py)."""
        return {}

    def test_artifacts(self, results: dict, predictions: dict, data, out, title: str) -> None:
        """Files beside the model made from the test predictions (e.g. a confusion matrix)."""

    @abc.abstractmethod
    def prediction_row(self, example, prediction: dict, i: int, data) -> dict:
        """Test example `i` and its prediction as one test_predictions.jsonl row."""

    # ---- outputs ---------------------------------------------------------------------
    def task_info(self, data) -> dict:
        """task.json entries of this task (besides the common ones)."""
        return {}

    def serving_module(self, model, pre, labels, pair: bool, info: dict):
        """The tf.Module whose `serve` takes raw strings (pipeline/serving/export.py)."""
        raise ValueError(f"task {self.name!r} has no raw-text SavedModel; write its "
                         f"`serving_module`, or set `serving = False` on the class")

    def export(self, model, pre, folder, info: dict) -> None:
        """The raw-text SavedModel of `model` in `folder`; `info`: task.json's entries (its
        "labels" and "pair" among them)."""
        from pipeline.serving import export

        export.save_serving_module(self.serving_module(
            model, pre, info.get("labels"), bool(info.get("pair")), info), folder,
            pre.functions()["tokenize"])

    def check_export(self, folder, model, pre, data, info: dict) -> dict:
        """{"export_max_abs_diff": ..., ...}: the SavedModel against the in-memory model."""
        return {}

    def predict_rows(self, predictor, texts: list, pairs) -> list[dict]:
        """`make predict --text`: one row per text from a model folder."""
        raise ValueError(f"a {self.name} model does not take --text; "
                         f"it takes {' / '.join('--' + i for i in self.inputs)}")
