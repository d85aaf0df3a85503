"""Keras callbacks of fine-tuning: the validation metric after every epoch (the best epoch's
weights kept) and progress lines.
"""

from __future__ import annotations

import logging
import time

import keras
import numpy as np

from pipeline import logs as log_lib
from pipeline.tracking import outbox

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------
class EpochEvaluator(keras.callbacks.Callback):
    """After every epoch: the validation metrics, logged; the best epoch's weights kept.
    `train_logs`: more of the epoch's training logs to keep in the history, {log key: history
    key} (a model whose `train_step` reports several losses)."""

    def __init__(self, evaluate_fn, metric: str, to_mlflow: bool, label: str = "finetune",
                 train_logs: dict | None = None):
        super().__init__()
        self.evaluate_fn, self.metric = evaluate_fn, metric
        self.to_mlflow, self.label = to_mlflow, label
        self.train_logs = dict(train_logs or {})
        self.best, self.best_epoch, self.best_weights, self.history = -np.inf, -1, None, []
        self.best_result = None
        self.stopped_for_time = False  # set by the trainer: finetune.max_seconds ended training
        self.start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        result = self.evaluate_fn()
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        entry = {"epoch": epoch + 1, "step": step,
                 "train_loss": float((logs or {}).get("loss", np.nan)),
                 **{key: float((logs or {}).get(k, np.nan)) for k, key in self.train_logs.items()},
                 **{f"val_{k}": v for k, v in result.items() if isinstance(v, float)}}
        self.history.append(entry)
        if self.to_mlflow:  # kept if the tracking store is down (pipeline/tracking/outbox.py)
            outbox.log_metrics({k: v for k, v in entry.items() if k not in ("epoch", "step")},
                               step=step)
        value = result[self.metric]
        log.info(f"{self.label}: epoch {epoch + 1}  step {step}  loss {entry['train_loss']:.4f}  "
                 f"validation {self.metric} {value:.4f}  ({time.time() - self.start:.0f} s)")
        if value > self.best:
            self.best, self.best_epoch, self.best_result = value, epoch + 1, result
            self.best_weights = self.model.get_weights()


class Progress(keras.callbacks.Callback):
    """Every `every` steps: loss and throughput (to the log and MLflow). `batch_size`: the
    examples of one update (batch × accumulation); once per update, from the step `fit`
    starts at (fine-tuning runs one `fit` per epoch, and resumes). When stdout is a terminal,
    a progress bar per epoch (ETA, loss, examples/s) instead, those lines to the log file only.
    """

    def __init__(self, every: int, total: int, batch_size: int, to_mlflow: bool = True,
                 label: str = "finetune"):
        super().__init__()
        self.to_mlflow, self.label = to_mlflow, label
        self.every, self.total, self.batch_size = every, total, batch_size
        self.last, self.began, self.bar = None, None, None

    def on_train_begin(self, logs=None):
        self.last = (time.time(), int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)))
        self.began = self.last
        self.bar = log_lib.Bar(self.total, self.last[1], self.label, leave=False)

    def on_train_end(self, logs=None):
        if self.bar is not None:
            self.bar.close()

    def _postfix(self, step: int, batch_logs) -> str:
        rate = (step - self.began[1]) * self.batch_size / max(time.time() - self.began[0], 1e-9)
        return f"loss {float((batch_logs or {}).get('loss', np.nan)):.4f}, {rate:,.0f} examples/s"

    def on_train_batch_end(self, batch, logs=None):
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        if self.bar is not None and self.bar.active:
            self.bar.update(step, lambda: self._postfix(step, logs))
        if step % self.every or step == self.last[1]:
            return
        now = time.time()
        rate = (step - self.last[1]) * self.batch_size / max(now - self.last[0], 1e-9)
        self.last = (now, step)
        loss = float((logs or {}).get("loss", np.nan))
        if self.to_mlflow:
            outbox.log_metrics({"train_loss": loss, "examples_per_second": rate}, step=step)
        (self.bar.line if self.bar is not None else log.info)(
            f"{self.label}: step {step}/{self.total}  loss {loss:.4f}  {rate:,.0f} examples/s")
