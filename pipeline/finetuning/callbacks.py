"""Keras callbacks of fine-tuning: the validation metric after every epoch (the best epoch's
weights kept) and progress lines.
"""

from __future__ import annotations

import time

import keras
import numpy as np

from pipeline import logs as log_lib
from pipeline.tracking import outbox


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------
class EpochEvaluator(keras.callbacks.Callback):
    """After every epoch: the validation metrics, logged; the best epoch's weights kept."""

    def __init__(self, evaluate_fn, metric: str, log, to_mlflow: bool):
        super().__init__()
        self.evaluate_fn, self.metric, self.log = evaluate_fn, metric, log
        self.to_mlflow = to_mlflow
        self.best, self.best_epoch, self.best_weights, self.history = -np.inf, -1, None, []
        self.best_result = None
        self.start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        result = self.evaluate_fn()
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        entry = {"epoch": epoch + 1, "step": step,
                 "train_loss": float((logs or {}).get("loss", np.nan)),
                 **{f"val_{k}": v for k, v in result.items() if isinstance(v, float)}}
        self.history.append(entry)
        if self.to_mlflow:  # kept if the tracking store is down (pipeline/tracking/outbox.py)
            outbox.log_metrics({k: v for k, v in entry.items() if k not in ("epoch", "step")},
                               step=step)
        value = result[self.metric]
        self.log(f"finetune: epoch {epoch + 1}  step {step}  loss {entry['train_loss']:.4f}  "
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

    def __init__(self, every: int, total: int, batch_size: int, log):
        super().__init__()
        self.every, self.total, self.batch_size, self.log = every, total, batch_size, log
        self.last, self.began, self.bar = None, None, None

    def on_train_begin(self, logs=None):
        self.last = (time.time(), int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)))
        self.began = self.last
        self.bar = log_lib.Bar(self.total, self.last[1], "finetune", self.log, leave=False)

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
        outbox.log_metrics({"train_loss": loss, "examples_per_second": rate}, step=step)
        (self.bar.line if self.bar is not None else self.log)(
            f"finetune: step {step}/{self.total}  loss {loss:.4f}  {rate:,.0f} examples/s")
