"""How a fine-tuning run trains: pretraining's knobs (train.*), with the same finetune.* keys
and meanings, on the finetune stage's model.

    with_precision     the loaded encoder rebuilt to compute in finetune.precision (float32
                       variables; the heads of models/heads.py compute in float32 anyway)
    build_optimizer    AdamW, linear warmup and decay counted in updates, Keras' gradient
                       accumulation, dynamic loss scaling for mixed_float16 (as pretraining's)
    compile_options    what `compile` gets: jit_compile resolved, steps_per_execution
    epoch_order        one epoch's training order (of a split in memory; a TFRecord split's
                       `epoch_dataset` is seeded the same way), seeded by (finetune.seed,
                       epoch) alone: a resumed run sees the batches an uninterrupted one sees
    Checkpoints        <run_dir>/finetune/.checkpoints/<name>/ckpt-<step>/: the weights and
                       optimizer state, dropout's seed states, the epoch evaluator (history,
                       best epoch and its weights) and the epoch's running metrics; written
                       aside and renamed, the newest finetune.keep_checkpoints kept
    fit                `model.fit` one epoch at a time, from the latest checkpoint
    fit_best_epoch     `fit` with the progress lines, the validation metric after every epoch
                       and the best epoch kept: what fine-tuning, multi-task training and
                       distillation all train through (each a `keras.Model` with its own
                       `train_step` where the task needs one)

What `fit` trains on is a `Split` in memory (arrays) or a stream with an `epoch_dataset`
(`records.RecordSplit`: one task's TFRecords; `multitask.TaskMix`: the tasks' batches mixed);
`len` of either is the examples of one epoch.

A run killed at any moment and started again with the same settings resumes from its latest
checkpoint and ends with the weights, history and metrics of an uninterrupted run (bit for
bit on one device: tests/test_finetune_runtime.py). Other settings: the checkpoints are set
aside (`set_aside`, as pretraining's --force) and training starts over.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import shutil
from pathlib import Path

import keras
import numpy as np

from models.schedules import WarmupPolynomialDecay
from pipeline import artifacts
from pipeline.finetuning.tasks.base import Split
from pipeline.training import pretrainer
from pipeline.training.callbacks import (NonFiniteGuard, Progress, StopAt, prune, write_aside,
                                         write_weights)
from pipeline.training.checkpoints import (
    global_step,
    restore_seed_states,
    seed_states,
    seeds_file,
    set_aside,
)

log = logging.getLogger(__name__)

# finetune.jit_compile = auto on a machine without GPUs: off. Measured on the BERT-tiny
# classifier (2 layers, hidden 128; seq 128, batch 32; `fit` on 2 shared cores with AVX512_BF16
# and AMX, oneDNN on), the step time with XLA over without, median of 10 interleaved rounds of
# 10 steps: float32 1.01 (no gain, and ~5 s more compiling per run), mixed_bfloat16 1.98 (the
# compiled step does not reach the CPU's bfloat16 units, as pretraining found).
CPU_JIT_AUTO = False


def accumulation(fc) -> int:
    return fc.grad_accum_steps


def updates_per_epoch(n_train: int, fc) -> int:
    """Optimizer updates in one pass over `n_train` examples: batches of batch_size ×
    grad_accum_steps (the last one filled up, see `epoch_order`)."""
    return max(1, math.ceil(n_train / (fc.batch_size * accumulation(fc))))


def epoch_order(n_train: int, fc, epoch: int) -> np.ndarray:
    """The indices of the training examples in epoch `epoch`'s order: a permutation seeded by
    (finetune.seed, epoch). With gradient accumulation it is filled up with its own first
    examples to whole updates, so that every update averages grad_accum_steps full batches
    (without, the last batch of an epoch is short, as Keras' own shuffling makes it)."""
    order = np.random.default_rng([fc.seed, epoch]).permutation(n_train)
    if accumulation(fc) > 1:
        order = np.resize(order, updates_per_epoch(n_train, fc) * fc.batch_size
                          * accumulation(fc))
    return order


# ---------------------------------------------------------------------------
# Precision, optimizer, compile options
# ---------------------------------------------------------------------------
def with_precision(backbone, precision: str):
    """`backbone` computing in `precision` (finetune.precision): itself when its dtype policy
    is that already, else the same encoder rebuilt from its config with that policy and given
    its weights (a saved model keeps the policy it was trained in; Keras' global policy does
    not reach layers loaded with one). Variables stay float32; call in the strategy scope."""
    if backbone.dtype_policy.name == precision:
        return backbone
    config = backbone.get_config()
    config["dtype"] = precision
    rebuilt = type(backbone).from_config(config)
    rebuilt.set_weights(backbone.get_weights())
    return rebuilt


def build_optimizer(fc, total_steps: int, knobs: bool = True) -> keras.optimizers.Optimizer:
    """AdamW, linear warmup over `warmup_fraction` of the `total_steps` updates then linear
    decay to 0; no weight decay on LayerNorm parameters and biases (BERT's).

    With `knobs` (the finetune stage), as pretraining's `pretrainer.build_optimizer`:
    finetune.grad_accum_steps micro-batches averaged per update (Keras' gradient accumulation;
    the schedule counts updates, `micro_steps_per_update`; clipping by the global norm of the
    averaged gradient) and, for mixed_float16, a `LossScaleOptimizer` around it. Multi-task
    training and distillation count their batches as updates: `knobs=False`.
    """
    accum = accumulation(fc) if knobs else 1
    warmup = round(fc.warmup_fraction * total_steps)
    schedule = WarmupPolynomialDecay(fc.learning_rate, warmup, total_steps,
                                     micro_steps_per_update=accum)
    optimizer = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=fc.weight_decay,
                                       beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                                       global_clipnorm=fc.clipnorm or None,
                                       gradient_accumulation_steps=accum if accum > 1 else None)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    if knobs and fc.precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def resolve_jit_compile(fc, strategy) -> bool | str:
    """finetune.jit_compile: true / false as said; auto on a machine with GPUs is pretraining's
    rule (`pretrainer.resolve_jit_compile`: one replica XLA, several Keras' choice), on one
    without `CPU_JIT_AUTO` (off, measured: see there)."""
    import tensorflow as tf

    if fc.jit_compile != "auto" or tf.config.list_logical_devices("GPU"):
        return pretrainer.resolve_jit_compile(fc.jit_compile, strategy, fc.precision)
    return CPU_JIT_AUTO


def check_strategy(fc, strategy) -> None:
    """Refuses what Keras' own train step cannot do across replicas: its optimizer's gradient
    accumulation calls a cross-replica merge inside a conditional (a RuntimeError under the
    mirrored strategies, even with one replica; measured with TensorFlow 2.21 / Keras 3.15)."""
    from pipeline.finetuning.task_model import FinetuneError

    import tensorflow as tf

    mirrored = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
    if accumulation(fc) > 1 and isinstance(strategy, mirrored):
        raise FinetuneError(
            f"finetune.grad_accum_steps = {accumulation(fc)} under train.strategy = "
            f"{type(strategy).__name__} ({strategy.num_replicas_in_sync} replica(s)): Keras' "
            f"optimizer cannot accumulate gradients inside a mirrored step; set "
            f"finetune.grad_accum_steps = 1 and raise finetune.batch_size (the replicas split "
            f"it), or use train.strategy = default / one_device")


def compile_options(fc, strategy=None) -> dict:
    """The `compile` arguments of the runtime knobs: {"jit_compile", "steps_per_execution"}
    (`strategy`: the one the model is built under; default: the current one)."""
    import tensorflow as tf

    strategy = strategy or tf.distribute.get_strategy()
    return {"jit_compile": resolve_jit_compile(fc, strategy),
            "steps_per_execution": fc.steps_per_execution}


def describe(fc, model) -> str:
    """", batch 8 × 4 accumulated, mixed_bfloat16, XLA off" for the stage's log line."""
    accum = accumulation(fc)
    return (f"batch {fc.batch_size}" + (f" × {accum} accumulated" if accum > 1 else "")
            + f", {fc.precision}, XLA {'on' if model.jit_compile is True else 'off'}"
            + (f", {fc.steps_per_execution} steps per execution"
               if fc.steps_per_execution > 1 else ""))


# ---------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------
CHECKPOINT_RE = re.compile(r"^ckpt-(\d{8})$")
SETTINGS = "settings.json"
WEIGHTS = "ckpt.weights.h5"  # seeds_file(): ckpt.seeds.json beside it
# finetune.* keys that do not change what training computes (how it runs, what is reported).
NOT_SHAPING = frozenset({"jit_compile", "steps_per_execution", "checkpoint_every",
                         "keep_checkpoints", "baselines", "random_init_baseline",
                         "register_model", "registered_model", "sweep", "n_best",
                         "max_answer_length", "null_score_threshold", "max_seconds",
                         "recipe", "recipe_learning_rates", "recipe_search_fraction"})


def run_settings(ctx, splits: dict | None = None) -> dict:
    """What the checkpoints of the run of `ctx` (context.RunContext) belong to: every
    finetune.* key that shapes training, the sha256 of the encoder and vocab files it starts
    from, and the splits (`splits`, default the data's splits.json: seeds, counts, digests)."""
    from pipeline.config import to_dict

    fc = to_dict(ctx.config)["finetune"]
    splits = ctx.data.splits if splits is None else splits
    return {"finetune": {k: v for k, v in sorted(fc.items()) if k not in NOT_SHAPING},
            "init_model_sha256": artifacts.sha256_file(ctx.model_path),
            "vocab_sha256": artifacts.sha256_file(ctx.tokenizer.vocab_path),
            "splits": json.loads(json.dumps(splits, default=str))}


class Checkpoints:
    """The checkpoints of one fine-tuning (one output name) in `folder`, for `settings`.

    `write`: this process writes them (the chief of a multi-worker cluster; every worker
    reads them on resume). `every`: finetune.checkpoint_every (0: epoch ends only).
    """

    def __init__(self, folder: Path, settings: dict, keep: int = 2, every: int = 0,
                 write: bool = True):
        self.dir, self.settings = Path(folder), settings
        self.keep, self.every, self.write = max(1, keep), every, write

    @classmethod
    def for_run(cls, ctx):
        """The finetune stage's, <run_dir>/finetune/.checkpoints/<name>/, for the settings of
        the run of `ctx` (`run_settings`); written by the chief of a multi-worker cluster."""
        from pipeline.artifacts import Artifacts
        from pipeline.finetuning.task_model import output_name
        from pipeline.training import strategy as strategy_lib

        config, fc = ctx.config, ctx.fc
        write = config.train.strategy != "multi_worker" or strategy_lib.is_chief()
        return cls(Artifacts(config.run_dir).finetune_checkpoints(output_name(fc)),
                   run_settings(ctx), fc.keep_checkpoints, fc.checkpoint_every, write)

    def found(self) -> list[tuple[int, Path]]:
        """[(step, folder)] of the complete checkpoints, oldest first."""
        if not self.dir.is_dir():
            return []
        return sorted((int(m.group(1)), p) for p in self.dir.iterdir()
                      if (m := CHECKPOINT_RE.match(p.name)) and (p / WEIGHTS).is_file())

    def prepare(self) -> tuple[int, Path] | None:
        """The latest checkpoint of these settings (None if there is none). Checkpoints of other
        settings are set aside (kept in <name>.aside-<UTC time>), with a log line."""
        saved = _read_json(self.dir / SETTINGS)
        if self.found() and saved != self.settings and self.write:
            changed = sorted(k for k in set(saved or {}) | set(self.settings)
                             if (saved or {}).get(k) != self.settings.get(k))
            if "finetune" in changed:
                before, after = (saved or {}).get("finetune", {}), self.settings["finetune"]
                changed = [f"finetune.{k}: {before.get(k)!r} -> {after.get(k)!r}"
                           for k in after if before.get(k) != after[k]] + \
                          [k for k in changed if k != "finetune"]
            aside = set_aside(self.dir, self.dir / SETTINGS)
            log.info(f"finetune: the checkpoints in {self.dir} belong to other settings "
                     f"({'; '.join(map(str, changed[:4]))}); kept aside in {aside}, training "
                     f"starts over")
        if self.write:
            self.dir.mkdir(parents=True, exist_ok=True)
            artifacts.remove_strays(self.dir, ".tmp-*")  # a killed run's half checkpoint
            if _read_json(self.dir / SETTINGS) != self.settings:
                artifacts.write_text_atomic(self.dir / SETTINGS, json.dumps(self.settings))
        found = self.found()
        return found[-1] if found else None

    def save(self, model, evaluator) -> Path | None:
        """ckpt-<step>/ written aside (.tmp-*) and renamed; the oldest beyond `keep` removed."""
        step = global_step(model)
        final = self.dir / f"ckpt-{step:08d}"
        if not self.write or final.exists():
            return None

        def fill(tmp: Path) -> None:
            tmp.mkdir(parents=True)
            write_weights(model, tmp / WEIGHTS)
            seeds_file(tmp / WEIGHTS).write_text(json.dumps(seed_states(model)))
            state = {"step": step, "history": evaluator.history, "best": evaluator.best,
                     "best_epoch": evaluator.best_epoch, "best_result": evaluator.best_result}
            (tmp / "state.json").write_text(json.dumps(state, default=float))
            arrays = {f"metric_{i}": keras.ops.convert_to_numpy(v)
                      for i, v in enumerate(model.metrics_variables)}
            arrays.update({f"best_{i}": w for i, w in enumerate(evaluator.best_weights or [])})
            with open(tmp / "arrays.npz", "wb") as handle:
                np.savez(handle, **arrays)

        write_aside(final, fill)
        prune([path for _, path in self.found()], self.keep)
        return final

    def restore(self, model, evaluator, folder: Path) -> tuple[int, list]:
        """Loads `folder` into `model` (weights, optimizer, seed states) and `evaluator`;
        returns (step, the running metrics' values at that step)."""
        optimizer = model.optimizer
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        model.load_weights(str(folder / WEIGHTS))
        restore_seed_states(model, folder / WEIGHTS)  # dropout draws the masks it would have
        state = json.loads((folder / "state.json").read_text())
        with np.load(folder / "arrays.npz", allow_pickle=False) as arrays:
            metrics = [arrays[f"metric_{i}"] for i in range(len(arrays.files))
                       if f"metric_{i}" in arrays]
            best = [arrays[f"best_{i}"] for i in range(len(arrays.files))
                    if f"best_{i}" in arrays]
        evaluator.history, evaluator.best = state["history"], state["best"]
        evaluator.best_epoch, evaluator.best_result = state["best_epoch"], state["best_result"]
        evaluator.best_weights = best or None
        return global_step(model), metrics

    def remove(self) -> None:
        """Once the output folder is complete: the checkpoints are not needed any more."""
        if self.write:
            shutil.rmtree(self.dir, ignore_errors=True)


def _read_json(path: Path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def set_checkpoints_aside(config):
    """`--force` on finetune: its checkpoints move aside (<name>.aside-<UTC time>), so the
    run starts over and nothing is deleted."""
    from pipeline.artifacts import Artifacts
    from pipeline.finetuning.task_model import output_name

    folder = Artifacts(config.run_dir).finetune_checkpoints(output_name(config.finetune))
    aside = set_aside(folder, folder / SETTINGS)
    if aside is not None:
        log.info(f"--force: the previous checkpoints are kept aside in {aside}; "
                 f"training starts over")
    return aside


class _Saver(keras.callbacks.Callback):
    """A checkpoint every `every` updates inside an epoch (where the callbacks see an update
    boundary: they see every steps_per_execution-th micro-batch), and at every epoch end after
    the epoch's evaluation (put it after the EpochEvaluator); none once the evaluator's
    non-finite guard has tripped."""

    def __init__(self, checkpoints: Checkpoints, evaluator, fc, per_epoch: int, total: int):
        super().__init__()
        self.checkpoints, self.evaluator = checkpoints, evaluator
        self.accum, self.per_epoch, self.total = accumulation(fc), per_epoch, total
        self.offset, self.last = 0, 0

    def start(self, done_in_epoch: int, step: int) -> None:
        """Before each epoch's `fit`: updates of the epoch already done, the global step."""
        self.offset, self.last = done_in_epoch * self.accum, step

    def on_train_batch_end(self, batch, logs=None):
        every, micro = self.checkpoints.every, self.offset + batch + 1  # this epoch's so far
        if not every or micro % self.accum or micro // self.accum >= self.per_epoch:
            return  # inside an update, or the epoch's end (on_epoch_end saves, evaluated)
        step = global_step(self.model)
        if step < self.total and step // every > self.last // every:
            self.save()
            self.last = step

    def on_epoch_end(self, epoch, logs=None):
        self.save()
        self.last = global_step(self.model)

    def save(self) -> None:
        guard = self.evaluator.guard
        if guard is None or (self.checkpoints.write and guard.allows_save(self.model)):
            self.checkpoints.save(self.model, self.evaluator)


class _RunningMetrics(keras.callbacks.Callback):
    """Adds the running metrics' states (sums and counts since the epoch began) of a checkpoint
    taken inside an epoch to those of the resumed epoch, so that its train_loss (and metrics)
    are the whole epoch's. After the first step: Keras builds the compiled metrics in it, and
    addition in either order gives the same float (exact with steps_per_execution 1)."""

    def __init__(self, values: list):
        super().__init__()
        self.values = values

    def on_train_batch_end(self, batch, logs=None):
        variables, values = self.model.metrics_variables, self.values
        if values and len(variables) == len(values) and all(
                tuple(v.shape) == np.shape(value) for v, value in zip(variables, values)):
            for variable, value in zip(variables, values):
                variable.assign_add(np.asarray(value, variable.dtype))
        self.values = None  # once


def _take(arrays: dict | None, order: np.ndarray):
    return None if arrays is None else {k: np.asarray(v)[order] for k, v in arrays.items()}


@dataclasses.dataclass(frozen=True)
class FitPlan:
    """What one training trains for: the finetune section's knobs (`fc`), `total_steps`
    updates over `epochs` epochs, at most `max_seconds` of training (0: no limit), and the
    `checkpoints` it resumes from and writes (None: none)."""
    fc: object
    total_steps: int
    epochs: int
    max_seconds: float = 0.0
    checkpoints: Checkpoints | None = None


def fit(model, split, plan: FitPlan, evaluator, callbacks: list) -> int:
    """Trains `model` (compiled) on `split` for `plan.epochs` epochs of `updates_per_epoch`
    updates, at most `plan.total_steps`; `callbacks` (StopAt, the `evaluator`, progress) see
    every epoch. With `plan.checkpoints`: resumes from the latest and writes them (`_Saver`).
    One `model.fit` per epoch, on the examples in `epoch_order` (a resumed epoch without the
    updates already done). Returns the step it started from."""
    fc, total_steps, epochs = plan.fc, plan.total_steps, plan.epochs
    checkpoints = plan.checkpoints
    n = len(split)  # a Split in memory, or a stream (records.RecordSplit, multitask.TaskMix)
    per_epoch = updates_per_epoch(n, fc)
    start, running = 0, None
    latest = checkpoints.prepare() if checkpoints is not None else None
    if latest is not None:
        if not model.built:
            model(_take(split.x, np.arange(1)) if isinstance(split, Split)
                  else next(split.batches(1))[1])
        start, running = checkpoints.restore(model, evaluator, latest[1])
        log.info(f"{evaluator.label}: resuming from {latest[1].name} "
                 f"(step {start} of {total_steps}, epoch {start // per_epoch + 1})")
    if start >= total_steps:
        return start
    if model.built and not model.optimizer.built:
        # Its variables made here, not inside the first step: a tf.function that creates
        # variables is traced twice, and the train step is most of a short run's tracing.
        with model.distribute_strategy.scope():
            model.optimizer.build(model.trainable_variables)
    saver = ([_Saver(checkpoints, evaluator, fc, per_epoch, total_steps)]
             if checkpoints is not None else [])
    first, done = divmod(start, per_epoch)
    micro_batch = fc.batch_size
    for epoch in range(first, epochs):
        order = epoch_order(n, fc, epoch)[done * micro_batch * accumulation(fc):]
        extra = [_RunningMetrics(running)] if done and running else []
        for s in saver:
            s.start(done, global_step(model))
        if isinstance(split, Split):
            model.fit(_take(split.x, order), _take(split.y, order),
                      sample_weight=_take(split.sample_weight, order), batch_size=micro_batch,
                      epochs=epoch + 1, initial_epoch=epoch, shuffle=False,
                      callbacks=[*extra, *callbacks, *saver], verbose=0)
        else:  # a stream: the epoch's batches (the same seed, the same order)
            batches = per_epoch * accumulation(fc) if accumulation(fc) > 1 else None
            model.fit(split.epoch_dataset(micro_batch, [fc.seed, epoch], batches,
                                          skip=done * accumulation(fc)),
                      epochs=epoch + 1, initial_epoch=epoch, shuffle=False,
                      callbacks=[*extra, *callbacks, *saver], verbose=0)
        done = 0
        if model.stop_training or global_step(model) >= total_steps:
            break
    return start


def fit_best_epoch(model, train, plan: FitPlan, evaluator, keep_best: bool = True):
    """`fit` with `evaluator` (an EpochEvaluator: the validation metric after every epoch, the
    best epoch's weights kept), a `Progress` line every quarter epoch (at least every 10
    updates; a bar on a terminal), the non-finite guard (training stops at the first
    non-finite loss, a `FinetuneError` says so, the last good checkpoint stays the newest) and
    `StopAt` (`plan.total_steps` updates, or `plan.max_seconds` of training counted from the
    start or the resumption; the interrupted epoch is evaluated, `evaluator.stopped_for_time`
    says so). With `keep_best`, the best epoch's weights are put back into `model`. Returns
    `evaluator`."""
    import time

    label, fc, checkpoints = evaluator.label, plan.fc, plan.checkpoints
    total_steps, max_seconds = plan.total_steps, plan.max_seconds
    steps_per_epoch = updates_per_epoch(len(train), fc)
    began = time.time()
    stop = StopAt(total_steps, max_seconds, lambda: time.time() - began)
    guard = evaluator.guard = NonFiniteGuard()
    fit(model, train, plan, evaluator,
        [guard, stop, evaluator,
         Progress(max(10, steps_per_epoch // 4), total_steps, fc.batch_size * accumulation(fc),
                  to_mlflow=evaluator.to_mlflow, label=label)])
    if guard.bad_step is not None:
        from pipeline.finetuning.task_model import FinetuneError

        found = checkpoints.found() if checkpoints is not None else []
        key = "distill." if label.startswith("distill") else "finetune."
        raise FinetuneError(f"{label}: " + guard.error(found[-1] if found else None, (
            f"Lower {key}learning_rate (now {fc.learning_rate:g}) or raise {key}warmup_fraction "
            f"(now {fc.warmup_fraction:g}), clip with finetune.clipnorm (now {fc.clipnorm:g}), "
            f"or change finetune.precision (now {fc.precision})")))
    evaluator.stopped_for_time = stop.stopped_early
    if stop.stopped_early:
        step = evaluator.history[-1]["step"] if evaluator.history else 0
        log.info(f"{label}: stopped at step {step} of {total_steps} after {time.time() - began:.0f} "
                 f"s of training (finetune.max_seconds = {max_seconds:g}); the best epoch so far "
                 f"is kept")
    if keep_best:
        keep_best_epoch(model, evaluator)
    return evaluator


def keep_best_epoch(model, evaluator) -> None:
    """Puts the best epoch's weights back into `model` (when it is not the last one)."""
    if evaluator.best_weights is not None and evaluator.best_epoch != len(evaluator.history):
        model.set_weights(evaluator.best_weights)
        log.info(f"{evaluator.label}: keeping epoch {evaluator.best_epoch} (best validation "
                 f"{evaluator.metric} {evaluator.best:.4f})")
