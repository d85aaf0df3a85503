"""Keras callbacks of both trainers, pretraining (training/loop.py) and fine-tuning
(finetuning/runtime.py): progress (a bar on a terminal, periodic lines, the step metrics to
MLflow through the outbox: `StepLogger`, fine-tuning's `Progress`), the non-finite guard,
checkpoint writing (`write_aside`, `prune`; pretraining's `Checkpointer`), `StopAt` (N updates
or a time budget); fine-tuning's `EpochEvaluator`, pretraining's schedule clock and probe.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import shutil
import time
from pathlib import Path

import keras
import numpy as np

from pipeline import artifacts
from pipeline import logs as log_lib
from pipeline.tracking import outbox
from pipeline.training.checkpoints import CHECKPOINT_RE, global_step, seed_states, seeds_file

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# Callbacks.
# ---------------------------------------------------------------------------
def scalar_logs(logs) -> dict:
    """The single-number entries of Keras logs as floats (size-1 arrays included)."""
    out = {}
    for key, value in (logs or {}).items():
        value = np.asarray(value)
        if value.size == 1:
            out[key] = float(value.reshape(-1)[0])
    return out


class NonFiniteGuard(keras.callbacks.Callback):
    """Stops training at the first non-finite loss (or, unless float16 loss scaling is on,
    gradient norm) or weight (`allows_save`); the checkpoint writers then write nothing, so
    the last good checkpoint stays the newest; `error` says so in one line."""

    def __init__(self, check_grad_norm: bool = True):
        super().__init__()
        self.check_grad_norm = check_grad_norm
        self.bad_step, self.what = None, ""

    def on_train_batch_end(self, batch, logs=None):
        logs = scalar_logs(logs)
        checks = [("loss", logs.get("loss"))]
        if self.check_grad_norm:
            checks.append(("gradient norm", logs.get("grad_norm")))
        for what, value in checks:
            if value is not None and not math.isfinite(value):
                self.bad_step, self.what = global_step(self.model), f"the {what} became {value}"
                self.model.stop_training = True
                return

    def allows_save(self, model) -> bool:
        """Whether `model` may be checkpointed: nothing non-finite seen, every weight finite."""
        if self.bad_step is None and not all(
                np.isfinite(keras.ops.convert_to_numpy(w)).all() for w in model.weights):
            self.bad_step, self.what = global_step(model), "a weight became inf or NaN"
            model.stop_training = True
        return self.bad_step is None

    def error(self, latest: tuple | None, advice: str) -> str:
        """What stopped training, where, the checkpoint kept (`latest`: (step, path)), `advice`."""
        kept = (f"the last good checkpoint {latest[1].name} (step {latest[0]}) is kept"
                if latest else "no checkpoint was written")
        return (f"training stopped at step {self.bad_step}: {self.what} (not finite); {kept}. "
                f"{advice}")


class StepLogger(keras.callbacks.Callback):
    """Progress of a training, pretraining's lines and metrics: every `every` optimizer
    updates (and at the last, `total_steps`) losses, accuracies, learning rate, gradient norm,
    examples/s, tokens/s and model FLOP utilisation to MLflow (through the outbox: kept if the
    store is down) and a line to the log; `history` keeps (step, metrics).

    `examples_per_update` = global batch × accumulation steps. `mfu` = model FLOPs per second
    (`flops_per_token` × tokens/s, see models/flops.py) over `peak_flops` (omitted if 0).
    `loss`, `mlm_loss`, ... are Keras' running means since the start of the current chunk.
    When stdout is a terminal a progress bar (ETA, loss, tokens/s) moves every update and
    those lines go to the log file only (pipeline/logs.py `progress_bar`).
    """

    # the bar's name, kept once done; a line at the last step; {metric: MLflow name} (None: all)
    label, leave, at_last, tracked = "train", True, True, None

    def __init__(self, every: int, total_steps: int, batch_size: int, seq_length: int,
                 to_mlflow: bool = True, examples_per_update: int | None = None,
                 flops_per_token: float = 0.0, peak_flops: float = 0.0,
                 max_seconds: float = 0.0, clock=None):
        super().__init__()
        # train.max_seconds and the training clock (StopAt's): the ETA of a run that stops
        # for time before its last step is that of the budget
        self.max_seconds, self.clock = max_seconds, clock
        self.every, self.total, self.batch_size, self.seq_length = every, total_steps, batch_size, seq_length
        self.examples_per_update = examples_per_update or batch_size
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.to_mlflow = to_mlflow
        self.last_time, self.last_step = None, None
        self.history = []
        self.bar, self.began = None, (0.0, 0)

    def on_train_begin(self, logs=None):
        self.last_time, self.last_step = time.time(), global_step(self.model)
        self.began = (self.last_time, self.last_step)
        self.bar = log_lib.Bar(self.total, self.last_step, self.label, leave=self.leave)

    def on_train_end(self, logs=None):
        if self.bar is not None:
            self.bar.close()

    def _left(self, step: int) -> tuple[float, int] | None:
        """(seconds, the step training will end at): at the rate since `fit` began, capped by
        the time budget; None before the first update."""
        done, seconds = step - self.began[1], time.time() - self.began[0]
        if done <= 0 or seconds <= 0:
            return None
        rate = done / seconds
        left = (self.total - step) / rate
        if self.max_seconds and self.clock is not None:
            left = min(left, max(0.0, self.max_seconds - self.clock()))
        return left, min(self.total, step + int(round(left * rate)))

    def _postfix(self, step: int, batch_logs) -> str:
        seconds = max(time.time() - self.began[0], 1e-9)
        examples = (step - self.began[1]) * self.examples_per_update / seconds
        loss = scalar_logs({"loss": (batch_logs or {}).get("loss", np.nan)})["loss"]
        if not self.seq_length:
            return f"loss {loss:.4f}, {examples:,.0f} examples/s"
        return f"loss {loss:.4f}, {examples * self.seq_length:,.0f} tok/s"

    def on_train_batch_end(self, batch, logs=None):
        step = global_step(self.model)
        if self.bar is not None and self.bar.active and step != self.last_step:
            if self.max_seconds and step % 10 == 0 and (left := self._left(step)):
                self.bar.expect(left[1])
            self.bar.update(step, lambda: self._postfix(step, logs))
        if step == self.last_step or (step % self.every and (step < self.total
                                                            or not self.at_last)):
            return  # a micro-batch inside an update, or not a logging step
        now = time.time()
        elapsed = max(now - self.last_time, 1e-9)
        steps = step - self.last_step
        metrics = scalar_logs(logs)
        metrics["learning_rate"] = float(keras.ops.convert_to_numpy(
            self.model.optimizer.learning_rate))
        metrics["examples_per_second"] = steps * self.examples_per_update / elapsed
        metrics["tokens_per_second"] = metrics["examples_per_second"] * self.seq_length
        if self.flops_per_token and self.peak_flops:
            metrics["mfu"] = (metrics["tokens_per_second"] * self.flops_per_token
                              / self.peak_flops)
        self.last_time, self.last_step = now, step
        self.history.append((step, metrics))
        if self.to_mlflow:  # kept if the store is down
            outbox.log_metrics(metrics if self.tracked is None else {
                name: metrics.get(key, np.nan) for key, name in self.tracked.items()}, step=step)
        (self.bar.line if self.bar is not None else log.info)(self.line(step, metrics))

    def line(self, step: int, metrics: dict) -> str:
        mfu = f"  mfu {metrics['mfu']:.1%}" if "mfu" in metrics else ""
        left = self._left(step) if step < self.total else None
        eta = f"  eta {int(left[0]) // 60}m {int(left[0]) % 60:02d}s" if left else ""
        # no NSP accuracy without the NSP loss (train.nsp_weight 0, data.objective: mlm)
        nsp = f"nsp_acc {metrics['nsp_accuracy']:.3f}  " if "nsp_accuracy" in metrics else ""
        return (f"step {step}/{self.total}  loss {metrics.get('loss', float('nan')):.4f}  "
                f"mlm_acc {metrics.get('mlm_accuracy', float('nan')):.3f}  {nsp}"
                f"lr {metrics['learning_rate']:.2e}  "
                f"gnorm {metrics.get('grad_norm', float('nan')):.3g}  "
                f"{metrics['tokens_per_second']:,.0f} tok/s{mfu}{eta}")


class Progress(StepLogger):
    """Fine-tuning's progress (multi-task training's, distillation's): every `every` updates
    `<label>: step N/M  loss L  R examples/s`, `train_loss` and `examples_per_second` to
    MLflow; `batch_size`: the examples of one update. One `fit` per epoch: a bar per epoch."""

    leave, at_last = False, False
    tracked = {"loss": "train_loss", "examples_per_second": "examples_per_second"}

    def __init__(self, every: int, total: int, batch_size: int, to_mlflow: bool = True,
                 label: str = "finetune"):
        super().__init__(every, total, batch_size, 0, to_mlflow)
        self.label = label

    def line(self, step: int, metrics: dict) -> str:
        return (f"{self.label}: step {step}/{self.total}  loss "
                f"{metrics.get('loss', np.nan):.4f}  {metrics['examples_per_second']:,.0f} "
                f"examples/s")


class EpochEvaluator(keras.callbacks.Callback):
    """Fine-tuning's validation after every epoch: the metrics, logged (the line and MLflow,
    through the outbox); the best epoch's weights kept.
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
        self.guard = None  # the trainer's NonFiniteGuard: no evaluation once it has tripped
        self.start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        if self.guard is not None and self.guard.bad_step is not None:
            return
        result = self.evaluate_fn()
        step = global_step(self.model)
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


class StopAt(keras.callbacks.Callback):
    """Stops training after `total_steps` optimizer updates, or once `clock()` (training
    seconds) reaches `max_seconds` (0: no time limit); `stopped_early` says which."""

    def __init__(self, total_steps: int, max_seconds: float = 0.0, clock=None):
        super().__init__()
        self.total, self.max_seconds, self.clock = total_steps, max_seconds, clock
        self.stopped_early = False

    def on_train_batch_end(self, batch, logs=None):
        if global_step(self.model) >= self.total:
            self.model.stop_training = True
        elif self.max_seconds and self.clock is not None and self.clock() >= self.max_seconds:
            self.model.stop_training = self.stopped_early = True


class ScheduleClock(keras.callbacks.Callback):
    """Before every batch, hands the training seconds (`clock()`) to a time-budgeted learning-rate
    schedule (`WarmupPolynomialDecay.set_seconds`; train.decay_over = max_seconds)."""

    def __init__(self, schedule, clock):
        super().__init__()
        self.schedule, self.clock = schedule, clock

    def on_train_batch_begin(self, batch, logs=None):
        self.schedule.set_seconds(self.clock())


class Checkpointer(keras.callbacks.Callback):
    """Writes weights + optimizer state at the end of every chunk; keeps the newest `keep`.

    Only the chief writes (Keras' .weights.h5 reads each worker's local copy of the
    variables, no collective ops, so the other workers need not save anywhere). Nothing
    is written once `guard` has seen a non-finite loss.
    """

    def __init__(self, checkpoint_dir: Path, keep: int, config_yaml: str, write: bool,
                 guard: NonFiniteGuard | None = None, clock=None):
        super().__init__()
        self.dir, self.keep, self.config_yaml, self.write = Path(checkpoint_dir), keep, config_yaml, write
        self.guard = guard
        self.clock = clock  # training seconds so far (HeldOutProbe.train_seconds), kept beside

    def save(self):
        step = global_step(self.model)
        final = self.dir / f"ckpt-{step:08d}.weights.h5"
        if not self.write or final.exists():
            return
        if self.guard is not None and not self.guard.allows_save(self.model):
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        artifacts.remove_strays(self.dir, ".tmp-*.weights.h5")  # a killed run's half checkpoint
        artifacts.write_text_atomic(seeds_file(final), json.dumps(seed_states(self.model)))
        write_aside(final, lambda tmp: write_weights(self.model, tmp))
        artifacts.write_text_atomic(self.dir / "config.yaml", self.config_yaml)
        latest = {"step": step, **({"train_seconds": self.clock()} if self.clock else {})}
        artifacts.write_text_atomic(self.dir / "latest.json", json.dumps(latest))
        prune(sorted(p for p in self.dir.glob("ckpt-*.weights.h5")
                     if CHECKPOINT_RE.search(p.name)), self.keep)

    def on_epoch_end(self, epoch, logs=None):
        self.save()

    def on_train_end(self, logs=None):
        self.save()



class _WeightsBuffer(io.BytesIO):
    """An in-memory file that Keras' save_weights takes for a `.weights.h5` path."""

    def __str__(self) -> str:
        return "checkpoint.weights.h5"


def write_weights(model, path: Path) -> None:
    """`model`'s (and its optimizer's) `.weights.h5` at `path`, the HDF5 written in memory and
    the bytes to disk by plain Python: a failed write (a full disk) is an ordinary OSError,
    with no HDF5 file left half-open (whose flush fails again at exit, crashing Python)."""
    buffer = _WeightsBuffer()
    model.save_weights(buffer)
    Path(path).write_bytes(buffer.getbuffer())


def write_aside(final: Path, fill) -> None:
    """A checkpoint (file or folder) written by `fill(tmp)` beside `final` as
    `.tmp-<pid>-<name>`, then renamed to `final`: whole or absent."""
    tmp = final.parent / f".tmp-{os.getpid()}-{final.name}"
    try:
        fill(tmp)
        os.replace(tmp, final)
    except BaseException:  # no half-written checkpoint stays behind
        _remove(tmp)
        raise


def prune(checkpoints: list[Path], keep: int) -> None:
    """Deletes all but the newest `keep` of `checkpoints` (oldest first)."""
    for path in checkpoints[:-keep]:
        _remove(path)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
        seeds_file(path).unlink(missing_ok=True)


# Held-out MLM accuracy levels whose first crossing is recorded (time to accuracy).
ACCURACY_LEVELS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.72, 0.8, 0.9)


def masked_lm_accuracy(model, batches) -> float:
    """MLM accuracy of `model` on `batches` ((x, y, sample_weight) as the pretrainer takes
    them): correct masked predictions over real ones (weight > 0), the model in inference mode."""
    correct = total = 0.0
    for x, y, weights in batches:
        logits = model(x, training=False)["mlm"]  # (batch, predictions, vocab)
        predicted = np.argmax(keras.ops.convert_to_numpy(logits), axis=-1)
        mask = keras.ops.convert_to_numpy(weights["mlm"]) > 0
        correct += float(np.sum((predicted == keras.ops.convert_to_numpy(y["mlm"])) & mask))
        total += float(mask.sum())
    return correct / max(total, 1.0)


class HeldOutProbe(keras.callbacks.Callback):
    """Every `every` optimizer updates (and at the end): MLM accuracy on a fixed sample of
    held-out batches, and the training seconds at which it first reached each level of
    `levels`: time to accuracy, comparable across recipes in the MLflow UI.

    MLflow: `heldout_mlm_accuracy` and `train_seconds` at each probed step;
    `time_to_mlm_acc_<level>` (seconds) once a level is reached. Training seconds run from
    the start of `fit` (plus `seconds_before`, a resumed run's earlier seconds) and exclude
    the probes themselves. `curve` keeps (step, seconds, accuracy).
    """

    def __init__(self, batches: list, every: int, total_steps: int,
                 to_mlflow: bool = True, levels=ACCURACY_LEVELS, seconds_before: float = 0.0,
                 prefix: str = "pretrain", at_start: bool = False, general=None):
        super().__init__()
        # general: batches of general text scored with every probe (training/general_text.py)
        self.general, self.general_curve = general, []
        # at_start: also probe before the first update (step 0) when training starts from
        # step 0: what an imported checkpoint already knows about this corpus.
        self.at_start = at_start
        self.batches, self.every, self.total = batches, every, total_steps
        self.to_mlflow, self.levels, self.prefix = to_mlflow, levels, prefix
        self.seconds_before = seconds_before
        self.start, self.probe_seconds, self.last_step = None, 0.0, None
        self.reached: dict[float, float] = {}
        self.curve: list[tuple[int, float, float]] = []

    def train_seconds(self) -> float:
        return self.seconds_before + time.time() - self.start - self.probe_seconds

    def on_train_begin(self, logs=None):
        self.start, self.probe_seconds = time.time(), 0.0
        self.last_step = global_step(self.model)
        if self.at_start and self.last_step == 0 and not self.curve:
            accuracy = self.probe(0)
            log.info(f"{self.prefix}: held-out MLM accuracy before the first update (step 0): "
                     f"{accuracy:.4f}")

    def on_train_batch_end(self, batch, logs=None):
        step = global_step(self.model)
        if step != self.last_step and (step % self.every == 0 or step >= self.total):
            self.probe(step)
        self.last_step = step

    def on_train_end(self, logs=None):
        step = global_step(self.model)
        if not self.curve or self.curve[-1][0] != step:  # stopped between probes (a time limit)
            self.probe(step)

    def probe(self, step: int) -> float:
        seconds = self.train_seconds()
        started = time.time()
        accuracy = masked_lm_accuracy(self.model, self.batches)
        self.curve.append((step, seconds, accuracy))
        metrics = {"heldout_mlm_accuracy": accuracy, "train_seconds": seconds}
        if self.general:
            general = masked_lm_accuracy(self.model, self.general)
            self.general_curve.append((step, general))
            metrics["general_mlm_accuracy"] = general
        self.probe_seconds += time.time() - started
        for level in self.levels:
            if accuracy >= level and level not in self.reached:
                self.reached[level] = seconds
                metrics[f"time_to_mlm_acc_{level:g}"] = seconds
                log.info(f"{self.prefix}: held-out MLM accuracy reached {level:g} at step {step}, "
                         f"{seconds:,.0f} s of training")
        if self.to_mlflow:
            outbox.log_metrics(metrics, step=step)
        return accuracy
