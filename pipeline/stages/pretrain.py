"""Stage `pretrain`: TFRecords → a BERT trained on MLM + NSP, evaluated on held-out data, exported.

Reads top to bottom:
  1. check inputs (vocab, data stats agree with the config, no incompatible checkpoint);
  2. the strategy (`train.strategy`), the peak FLOP/s of this machine (for MFU), tf.data
     pipelines for training (repeated, shuffled, sharded per worker; on resume the batches
     already consumed are skipped) and held-out evaluation;
  3. inside the tf.distribute strategy: build the pretrainer (in `train.precision`), AdamW or
     LAMB with warmup + linear/polynomial decay, gradient accumulation and clipping, compile
     with MLM (weighted) + NSP losses and our train step (`PretrainingStep`);
  4. resume from the latest checkpoint in <run_dir>/pretrain/checkpoints if there is one,
     else copy the weights of `model.init_from` (an imported checkpoint) if it is set;
  5. `model.fit` in chunks of `checkpoint_every` steps (a Keras epoch = one checkpoint interval),
     logging per-step metrics to MLflow and writing a checkpoint at the end of each chunk;
     a non-finite loss stops training without writing a checkpoint; running out of memory
     ends with a message naming the knobs;
  6. held-out evaluation (MLM loss/accuracy, NSP accuracy) → eval.json;
  7. export `model.keras` and a SavedModel (both atomic), log them to MLflow.

Two-phase pretraining (`data.phases`, `train.phases`; see `plan_phases`): steps 2-6 run once per
phase, phase i reading data/phase<i>/ and checkpointing to pretrain/checkpoints/phase<i>/; each
phase after the first starts from the previous phase's final weights with a fresh optimizer and
schedule, each is its own MLflow run under the pipeline run, and a phase whose checkpoints
already reach its steps is skipped. The model exported in step 7 is the last phase's.

MLflow on resume: the id of the stage run (and of each phase run) is kept beside the
checkpoints (mlflow_run.json); the CLI reopens the stage run (`resumable_run_id`) and
`phase_run` the phase's, so an interrupted training's metrics continue in the same run.

Steps are optimizer updates everywhere (`train.steps`, checkpoints, logs, the LR schedule):
with `train.grad_accum_steps = k` one step is k forward/backward passes of `train.batch_size`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import math
import os
import re
import time
import types
import warnings
from pathlib import Path

import keras
import mlflow
import numpy as np
import tensorflow as tf
import yaml
from tensorflow.python.framework import config as tf_config

import models
from beam_jobs import vocab as vocab_job
from models.flops import training_flops_per_token
from models.optimizers import Lamb
from models.schedules import WarmupPolynomialDecay
from pipeline import artifacts, inputs, strategy as strategy_lib, tracking
from pipeline import config as config_lib
from pipeline.artifacts import Artifacts
from pipeline.config import Config

CHECKPOINT_RE = re.compile(r"ckpt-(\d{8})\.weights\.h5$")


class PretrainError(ValueError):
    pass


# ---------------------------------------------------------------------------
# Building blocks (also used by tests, benchmarks and the other stages).
# ---------------------------------------------------------------------------
def build_model(config: Config, vocabulary_size: int) -> models.BertPretrainer:
    """The pretrainer of `config.model`, computing in `config.train.precision`."""
    arch = config_lib.model_architecture(config)
    precision = config.train.precision
    backbone = models.BertEncoder(
        vocabulary_size=vocabulary_size,
        num_layers=arch["num_layers"],
        num_heads=arch["num_heads"],
        hidden_dim=arch["hidden_dim"],
        intermediate_dim=arch["intermediate_dim"],
        dropout=config.model.dropout,
        max_sequence_length=config.model.max_sequence_length,
        num_segments=config.model.num_segments,
        activation=config.model.activation,
        layer_norm_epsilon=config.model.layer_norm_epsilon,
        embedding_dim=config.model.embedding_size,  # ALBERT options (default: BERT)
        share_layers=config.model.share_layers,
        dtype=None if precision == "float32" else precision,
    )
    return models.BertPretrainer(backbone)


def build_optimizer(tc: config_lib.TrainConfig) -> keras.optimizers.Optimizer:
    """AdamW or LAMB on BERT's schedule; accumulation, clipping and loss scaling from `tc`.

    The schedule counts optimizer updates (`micro_steps_per_update` undoes Keras' counting
    of micro-batches under gradient accumulation). Clipping is by the global norm of the
    averaged gradient of one update: over all replicas (see `PretrainingStep`) and all
    accumulated micro-batches (Keras clips after accumulating).
    """
    accum = tc.grad_accum_steps
    schedule = WarmupPolynomialDecay(tc.learning_rate, tc.warmup_steps, tc.steps,
                                     end_learning_rate=tc.end_learning_rate,
                                     power=tc.decay_power, micro_steps_per_update=accum)
    kwargs = dict(learning_rate=schedule, weight_decay=tc.weight_decay, beta_1=tc.beta_1,
                  beta_2=tc.beta_2, epsilon=tc.epsilon, global_clipnorm=tc.clipnorm or None,
                  gradient_accumulation_steps=accum if accum > 1 else None)
    optimizer = Lamb(**kwargs) if tc.optimizer == "lamb" else keras.optimizers.AdamW(**kwargs)
    # BERT does not decay LayerNorm parameters or biases (LAMB: nor adapt their step).
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    if tc.precision == "mixed_float16":
        # float16 gradients under/overflow without it; steps with inf/NaN gradients are
        # skipped and the scale lowered.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def resolve_jit_compile(setting: str, strategy) -> bool | str:
    """`train.jit_compile` for this strategy: "true" / "false" as said; "auto" is XLA on for
    a single replica (one CPU or one GPU) and Keras' own choice ("auto") otherwise.

    Keras' "auto" turns XLA off on every CPU-only machine and under any tf.distribute
    strategy, one-device included, but the XLA-compiled BERT step is the faster one on CPU
    too (BERT-small, seq 128, batch 32 on 2 cores: about 20% more tokens/s,
    `bench/bench_train.py --jit true` vs `--jit false`) and on one GPU. Several replicas and
    TPUs keep Keras' choice: TPUs compile anyway, and Keras does not XLA-compile a step that
    all-reduces across replicas. Also off when op determinism is enabled (not every op
    has a deterministic XLA kernel; Keras does the same).
    """
    if setting != "auto":
        return {"true": True, "false": False}[str(setting)]
    if tf_config.is_op_determinism_enabled():
        return False
    if strategy.num_replicas_in_sync == 1 and not isinstance(
            strategy, (tf.distribute.TPUStrategy, tf.distribute.MultiWorkerMirroredStrategy)):
        return True
    return "auto"


def compile_model(model, optimizer, jit_compile: str = "auto"):
    """MLM + NSP losses, weighted accuracies, our train step (`PretrainingStep`).

    The MLM loss is the weighted mean over the real predictions of the whole global batch,
    on any number of replicas: the input batches carry weights already divided by their
    global sum (`normalize_mlm_weights`), and the loss sums loss × weight over the
    replica's slots / their count. (models.pretraining's own MLM loss divides by each
    replica's sum of weights instead, which is the same on one device only.)
    """
    losses = {models.pretraining.MLM_OUTPUT: keras.losses.SparseCategoricalCrossentropy(
                  from_logits=True, reduction="sum_over_batch_size", name="mlm_loss"),
              models.pretraining.NSP_OUTPUT: models.pretraining.nsp_loss()}
    model.compile(optimizer=optimizer, loss=losses,
                  weighted_metrics=models.pretraining.pretraining_metrics(),
                  jit_compile=resolve_jit_compile(jit_compile, tf.distribute.get_strategy()))
    PretrainingStep.install(model)


def normalize_mlm_weights(x, y, sample_weight):
    """A global batch's MLM weights × (slots / sum of weights), before it is split.

    With the "sum_over_batch_size" MLM loss of `compile_model`, each of n replicas then
    computes n × (its sum of loss × weight) / (the global sum of weights), Keras divides by
    n, and the replicas' gradients add up to those of the global weighted mean.
    """
    weights = sample_weight[models.pretraining.MLM_OUTPUT]
    scale = tf.cast(tf.size(weights), weights.dtype) / tf.maximum(tf.reduce_sum(weights), 1e-6)
    return x, y, {**sample_weight, models.pretraining.MLM_OUTPUT: weights * scale}


class PretrainingStep:
    """The train step `model.fit` runs (installed on the model instance, not its class).

    Keras' own step, except for what happens to the gradients between the backward pass and
    the optimizer: they are densified (the position/segment embeddings give IndexedSlices),
    summed over the replicas HERE (each replica's loss is already divided by the replica
    count, so the sum is the global batch's gradient), and only then handed to the optimizer,
    whose own all-reduce is turned off. Keras would otherwise clip each replica's local
    gradient before its all-reduce, which is not clipping by the global norm. It also adds
    `grad_norm` to the logs: the global norm of the gradient the next update uses
    (unscaled, averaged over the accumulated micro-batches; before clipping).
    """

    @staticmethod
    def install(model):
        optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
        if not hasattr(optimizer, "_all_reduce_sum_gradients"):
            raise PretrainError(
                f"this Keras ({keras.__version__}) has no Optimizer._all_reduce_sum_gradients; "
                f"pipeline/stages/pretrain.py PretrainingStep needs updating")
        # The gradients arrive summed over replicas already (see the class docstring).
        optimizer._all_reduce_sum_gradients = lambda grads_and_vars: list(grads_and_vars)
        model.train_step = types.MethodType(PretrainingStep.train_step, model)
        model.test_step = types.MethodType(PretrainingStep.test_step, model)

    @staticmethod
    def prebuild(model, element_spec):
        """Builds the model, losses and metrics from the dataset's element spec, up front.

        Under a strategy Keras' fit/evaluate otherwise pull a first batch and
        `strategy.reduce` it to build them, which fails for dict batches under
        MultiWorkerMirroredStrategy (Keras 3.15); with everything built there is nothing
        left for that step to do, so it is skipped.
        """
        with model.distribute_strategy.scope():
            model._symbolic_build(data_batch=element_spec)
        model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None

    @staticmethod
    def train_step(model, data):
        from keras.src.losses import loss as loss_module
        from keras.src.trainers.data_adapters import data_adapter_utils

        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                       training=True)
            batch = tf.shape(x["token_ids"])[0]
            model._loss_tracker.update_state(loss_module.unscale_loss_for_distribution(loss),
                                             sample_weight=batch)
            scaled_loss = model.optimizer.scale_loss(loss)
        variables = model.trainable_weights
        grads = tape.gradient(scaled_loss, variables)
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            present = [i for i, g in enumerate(grads) if g is not None]
            reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, [grads[i] for i in present])
            for i, g in zip(present, reduced):
                grads[i] = g
        grad_norm = PretrainingStep.update_norm(model.optimizer, grads, variables)
        model.optimizer.apply(grads, variables)
        logs = model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        logs["grad_norm"] = grad_norm
        return PretrainingStep.reducible(model, logs)

    @staticmethod
    def test_step(model, data):
        return PretrainingStep.reducible(model, type(model).test_step(model, data))

    @staticmethod
    def reducible(model, logs):
        """Under a multi-worker cluster, every log value as shape (1,).

        Keras 3.15 reduces a step's outputs over the workers with
        `strategy.reduce(MEAN, value, axis=0)`, which fails for the scalars every metric
        returns; with a leading axis of 1 it is the mean over the workers.
        """
        strategy = model.distribute_strategy
        if not (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
                and strategy.extended._in_multi_worker_mode()):
            return logs
        return {k: tf.reshape(v, [1]) for k, v in logs.items()}

    @staticmethod
    def update_norm(optimizer, grads, variables):
        """Global norm of the (unscaled, accumulated) gradient the optimizer is about to see."""
        scale = None
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            scale = optimizer.dynamic_scale
            optimizer = optimizer.inner_optimizer
        elif optimizer.loss_scale_factor:
            scale = optimizer.loss_scale_factor
        accum = optimizer.gradient_accumulation_steps
        squares = []
        for g, v in zip(grads, variables):
            if g is None:
                continue
            g = tf.cast(g, tf.float32)
            if scale is not None:
                g = g / tf.cast(scale, tf.float32)
            if accum:
                stored = optimizer._accumulated_gradients[optimizer._get_variable_index(v)]
                g = (g + tf.cast(stored, tf.float32)) / accum
            squares.append(tf.reduce_sum(tf.square(g)))
        return tf.sqrt(tf.add_n(squares)) if squares else tf.constant(0.0)


def latest_checkpoint(checkpoint_dir: Path) -> tuple[int, Path] | None:
    found = []
    for path in Path(checkpoint_dir).glob("ckpt-*.weights.h5"):
        match = CHECKPOINT_RE.search(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return max(found) if found else None


def global_step(model) -> int:
    """Optimizer updates so far (Keras' `iterations` counts updates, not micro-batches)."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def weights_digest(model) -> str:
    """sha256 of every weight's bytes, in order (equal on all workers of a synchronous run)."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    return digest.hexdigest()


PEAK_DTYPES = {"float32": tf.float32, "mixed_bfloat16": tf.bfloat16,
               "mixed_float16": tf.float16}


def measure_peak_flops(seconds: float = 1.0, dtype=tf.float32, size: int = 2048) -> float:
    """FLOP/s of a large square matmul on the default device, timed for about `seconds`.

    The best of several timed rounds (other processes share the machine): the rate MFU is
    relative to. 2·n³ FLOPs per matmul.
    """
    a = tf.random.normal((size, size), dtype=tf.float32)
    a, b = tf.cast(a, dtype), tf.cast(tf.transpose(a), dtype)

    @tf.function
    def matmuls(a, b, n):
        total = tf.zeros((), tf.float32)
        for _ in tf.range(n):
            total += tf.cast(tf.reduce_sum(tf.matmul(a, b)[:1, :1]), tf.float32)
        return total

    matmuls(a, b, tf.constant(1)).numpy()  # trace and warm up
    start = time.perf_counter()
    matmuls(a, b, tf.constant(1)).numpy()
    once = max(time.perf_counter() - start, 1e-6)
    per_round = max(1, int(seconds / 4 / once))
    best, deadline = 0.0, time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        matmuls(a, b, tf.constant(per_round)).numpy()
        best = max(best, 2.0 * size ** 3 * per_round / (time.perf_counter() - start))
        if time.perf_counter() >= deadline:
            return best


def flops_per_token(config: Config, vocabulary_size: int) -> float:
    arch = config_lib.model_architecture(config)
    return training_flops_per_token(
        num_layers=arch["num_layers"], hidden_dim=arch["hidden_dim"],
        intermediate_dim=arch["intermediate_dim"], vocabulary_size=vocabulary_size,
        seq_length=config.data.max_seq_length, num_predictions=config.data.max_predictions_per_seq,
        embedding_dim=config.model.embedding_size)


def oom_message(config: Config, strategy) -> str:
    tc, dc = config.train, config.data
    replicas = strategy.num_replicas_in_sync
    half = max(1, tc.batch_size // 2)
    lines = [f"out of memory training {config.model.preset} BERT with train.batch_size = "
             f"{tc.batch_size} ({tc.batch_size // replicas} per replica), data.max_seq_length = "
             f"{dc.max_seq_length}, train.precision = {tc.precision}. Turn one of these knobs:",
             f"  - train.batch_size={half} train.grad_accum_steps={tc.grad_accum_steps * 2} "
             f"(same effective batch of {tc.batch_size * tc.grad_accum_steps}, half the memory "
             f"for activations)"]
    if tc.precision == "float32":
        lines.append("  - train.precision=mixed_bfloat16 (or mixed_float16 on GPUs older than "
                     "Ampere): activations take half the memory")
    lines.append(f"  - a shorter data.max_seq_length (now {dc.max_seq_length}; attention memory "
                 f"grows with its square), which means re-running `make data`")
    lines.append("  - more replicas (train.strategy=mirrored or multi_worker) to split the batch")
    return "\n".join(lines)


# What the config calls each architecture field, for the init_from messages.
CONFIG_KEY_OF = {
    "vocabulary_size": "the run's vocab size", "num_layers": "model.num_layers",
    "hidden_dim": "model.hidden_dim", "num_heads": "model.num_heads",
    "intermediate_dim": "model.intermediate_dim",
    "max_sequence_length": "model.max_sequence_length", "num_segments": "model.num_segments",
    "activation": "model.activation", "layer_norm_epsilon": "model.layer_norm_epsilon",
    "embedding_dim": "model.embedding_size", "share_layers": "model.share_layers",
}


def init_from_checkpoint(model, config: Config, vocab_file: Path, log=print) -> None:
    """Copies the weights of `config.model.init_from` into `model` (built from the config).

    The checkpoint (a .keras file, a Hugging Face or a Google directory; see
    models.convert) must have the architecture this config builds and the run's
    vocab: a different vocabulary size, size, activation, epsilon, position or
    segment count, or a vocab.txt with other tokens, raises PretrainError naming
    both values.
    """
    from models import convert

    source = config.model.init_from
    try:
        imported = convert.load_pretrainer(source)
    except (convert.ConversionError, OSError) as err:
        raise PretrainError(f"model.init_from = {source}: {err}") from err
    ours, theirs = convert.architecture_of(model), imported.architecture
    if ours["vocabulary_size"] != theirs["vocabulary_size"]:
        raise PretrainError(
            f"model.init_from = {source} has a vocabulary of {theirs['vocabulary_size']} tokens "
            f"but the run's vocab {vocab_file} has {ours['vocabulary_size']}; tokenize the data "
            f"with the checkpoint's own vocab.txt (and its casing)")
    mismatches = convert.architecture_mismatches(ours, theirs)
    if mismatches:
        details = "; ".join(f"{CONFIG_KEY_OF[key]}: config {a!r}, checkpoint {b!r}"
                            for key, a, b in mismatches)
        fix = " ".join(f"{CONFIG_KEY_OF[key]}={b}" for key, _, b in mismatches)
        raise PretrainError(
            f"model.init_from = {source} does not match the model this config builds ({details}); "
            f"set {fix} or start from another checkpoint")
    if imported.vocab:
        run_vocab = convert.read_vocab(vocab_file)
        for i, (a, b) in enumerate(zip(run_vocab, imported.vocab)):
            if a != b:
                raise PretrainError(
                    f"model.init_from = {source}: its vocab differs from the run's vocab "
                    f"{vocab_file} (id {i}: {b!r} in the checkpoint, {a!r} in the run); the data "
                    f"must be tokenized with the checkpoint's vocab.txt")
    convert.assign_weights(model, convert.keras_weights(imported.model), source=source)
    log(f"pretrain: initialised from {source} ({len(model.weights)} variables)")


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
    gradient norm); the Checkpointer then writes nothing, so the last good checkpoint stays
    the newest."""

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


class Checkpointer(keras.callbacks.Callback):
    """Writes weights + optimizer state at the end of every chunk; keeps the newest `keep`.

    Only the chief writes (Keras' .weights.h5 reads each worker's local copy of the
    variables, no collective ops, so the other workers need not save anywhere). Nothing
    is written once `guard` has seen a non-finite loss.
    """

    def __init__(self, checkpoint_dir: Path, keep: int, config_yaml: str, write: bool,
                 guard: NonFiniteGuard | None = None):
        super().__init__()
        self.dir, self.keep, self.config_yaml, self.write = Path(checkpoint_dir), keep, config_yaml, write
        self.guard = guard

    def save(self):
        if self.guard is not None and self.guard.bad_step is not None:
            return
        step = global_step(self.model)
        if not self.write or (self.dir / f"ckpt-{step:08d}.weights.h5").exists():
            return
        if self.guard is not None and not all(
                np.isfinite(keras.ops.convert_to_numpy(w)).all() for w in self.model.weights):
            self.guard.bad_step, self.guard.what = step, "a weight became inf or NaN"
            self.model.stop_training = True
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".tmp-{os.getpid()}.weights.h5"
        self.model.save_weights(str(tmp))
        os.replace(tmp, self.dir / f"ckpt-{step:08d}.weights.h5")
        artifacts.write_text_atomic(self.dir / "config.yaml", self.config_yaml)
        artifacts.write_text_atomic(self.dir / "latest.json", json.dumps({"step": step}))
        old = sorted(p for p in self.dir.glob("ckpt-*.weights.h5") if CHECKPOINT_RE.search(p.name))
        for path in old[:-self.keep]:
            path.unlink()

    def on_epoch_end(self, epoch, logs=None):
        self.save()

    def on_train_end(self, logs=None):
        self.save()


class StepLogger(keras.callbacks.Callback):
    """Every `every` optimizer updates: losses, accuracies, learning rate, gradient norm,
    examples/s, tokens/s and model FLOP utilisation to MLflow and the log.

    `examples_per_update` = global batch × accumulation steps. `mfu` = model FLOPs per second
    (`flops_per_token` × tokens/s, see models/flops.py) over `peak_flops` (omitted if 0).
    `loss`, `mlm_loss`, ... are Keras' running means since the start of the current chunk.
    """

    def __init__(self, every: int, total_steps: int, batch_size: int, seq_length: int,
                 log=print, to_mlflow: bool = True, examples_per_update: int | None = None,
                 flops_per_token: float = 0.0, peak_flops: float = 0.0):
        super().__init__()
        self.every, self.total, self.batch_size, self.seq_length = every, total_steps, batch_size, seq_length
        self.examples_per_update = examples_per_update or batch_size
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.log, self.to_mlflow = log, to_mlflow
        self.last_time, self.last_step = None, None
        self.history = []

    def on_train_begin(self, logs=None):
        self.last_time, self.last_step = time.time(), global_step(self.model)

    def on_train_batch_end(self, batch, logs=None):
        step = global_step(self.model)
        if step == self.last_step or (step % self.every and step < self.total):
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
        if self.to_mlflow and mlflow.active_run():
            mlflow.log_metrics(metrics, step=step)
        mfu = f"  mfu {metrics['mfu']:.1%}" if "mfu" in metrics else ""
        self.log(f"step {step}/{self.total}  loss {metrics.get('loss', float('nan')):.4f}  "
                 f"mlm_acc {metrics.get('mlm_accuracy', float('nan')):.3f}  "
                 f"nsp_acc {metrics.get('nsp_accuracy', float('nan')):.3f}  "
                 f"lr {metrics['learning_rate']:.2e}  "
                 f"gnorm {metrics.get('grad_norm', float('nan')):.3g}  "
                 f"{metrics['tokens_per_second']:,.0f} tok/s{mfu}")


class StopAt(keras.callbacks.Callback):
    def __init__(self, total_steps: int):
        super().__init__()
        self.total = total_steps

    def on_train_batch_end(self, batch, logs=None):
        if global_step(self.model) >= self.total:
            self.model.stop_training = True


# ---------------------------------------------------------------------------
# The stage.
# ---------------------------------------------------------------------------
def check_inputs(config: Config, paths: Artifacts) -> tuple[int, dict]:
    artifacts.require(paths.vocab_file, "the vocab", "vocab")
    vocab_job.check_vocab(str(paths.vocab_file))
    vocabulary_size = sum(1 for _ in open(paths.vocab_file, encoding="utf-8"))
    stats = json.loads(artifacts.require(paths.data_stats, "the pretraining data", "data").read_text())
    made = stats["settings"]
    keys = ("max_seq_length", "max_predictions_per_seq", "masking")
    if config.data.phases:  # the shape of each phase, against data.phases
        made_phases = [f"{p['max_seq_length']}/{p['max_predictions_per_seq']}"
                       for p in stats.get("phases", [])]
        wanted = [f"{seq}/{pred}" for seq, pred in config_lib.data_phases(config)]
        if made_phases != wanted:
            raise PretrainError(
                f"the TFRecords in {paths.data_dir} were made with data.phases = "
                f"{made_phases or '[] (one phase)'}, but the config says {wanted}; run `make data` "
                f"again with this config")
        keys = ("masking",)
    for key in keys:
        if made.get(key, "static") != getattr(config.data, key):
            raise PretrainError(
                f"the TFRecords in {paths.data_dir} were made with data.{key} = {made.get(key, 'static')}, but the "
                f"config says {getattr(config.data, key)}; run `make data` again with this config")
    if not config.data.phases and config.data.max_seq_length > config.model.max_sequence_length:
        raise PretrainError(f"data.max_seq_length {config.data.max_seq_length} exceeds "
                            f"model.max_sequence_length {config.model.max_sequence_length}")
    if paths.pretrain_config.exists() or (paths.checkpoint_dir / "config.yaml").exists():
        saved_path = paths.checkpoint_dir / "config.yaml"
        if not saved_path.exists():
            saved_path = paths.pretrain_config
        saved = yaml.safe_load(saved_path.read_text())
        # Keys added since the checkpoint was written take their defaults.
        saved_model = {**config_lib.to_dict(Config())["model"], **(saved.get("model") or {})}
        if saved_model != config_lib.to_dict(config)["model"]:
            raise PretrainError(
                f"the checkpoints in {paths.pretrain_dir} were trained with another model config "
                f"({saved.get('model')}); use another run_dir or delete {paths.pretrain_dir} to "
                f"start over")
    return vocabulary_size, stats


def masking_args(config: Config, paths: Artifacts) -> dict:
    """`masking=` for inputs.pretraining_dataset when the records are unmasked
    (data.masking = dynamic): tf.data masks each batch, seeded by the batch's index, so
    skipping consumed batches on resume also reproduces their masks."""
    dc = config.data
    if getattr(dc, "masking", "static") != "dynamic":
        return {}
    return {"masking": inputs.DynamicMasking.from_vocab(
        str(paths.vocab_file), masked_lm_prob=dc.masked_lm_prob,
        whole_word=getattr(dc, "whole_word_masking", False), seed=config.train.seed)}


def training_data(config: Config, paths: Artifacts, start_step: int, log=print,
                  data_dir: Path | None = None, prefix: str = "pretrain"):
    """The repeated, shuffled training batches, positioned after `start_step` updates.

    resume_data = skip: the same seed as a fresh run, minus the batches already consumed
    (start_step × grad_accum_steps global batches), so a resumed run continues the
    uninterrupted run's batch sequence (exact on one worker and with data sharding).
    reseed: a fresh order seeded with seed + start_step. `data_dir`: a phase's records
    (default data/).
    """
    tc, dc = config.train, config.data
    reseed = tc.resume_data == "reseed"
    pattern = paths.shard_pattern("train", data_dir)
    data = inputs.pretraining_dataset(
        pattern, tc.batch_size, dc.max_seq_length, dc.max_predictions_per_seq,
        training=True, seed=tc.seed + (start_step if reseed else 0),
        shuffle_buffer=tc.shuffle_buffer, **masking_args(config, paths))
    consumed = start_step * tc.grad_accum_steps
    if consumed and not reseed and start_step < tc.steps:
        log(f"{prefix}: skipping the {consumed:,} batches consumed before step {start_step}")
        data = data.skip(consumed)
    data = data.map(normalize_mlm_weights, num_parallel_calls=tf.data.AUTOTUNE)
    files = len(tf.io.gfile.glob(pattern))
    return data.with_options(strategy_lib.shard_options(tc.data_sharding, files))


@dataclasses.dataclass
class Phase:
    """One pretraining phase: its config (data.max_seq_length / max_predictions_per_seq and
    train.* of the phase), where its records are and where its checkpoints go.

    index 0 is the single phase of a run without data.phases (data/, pretrain/checkpoints/);
    with data.phases, phase i (1-based) reads data/phase<i>/ and checkpoints to
    pretrain/checkpoints/phase<i>/ (pipeline/artifacts.py).
    """
    index: int
    config: Config
    data_dir: Path
    checkpoint_dir: Path

    @property
    def name(self) -> str:
        return f"phase{self.index}" if self.index else ""

    @property
    def prefix(self) -> str:
        """How the log lines of this phase start."""
        return f"pretrain {self.name}" if self.index else "pretrain"

    @property
    def shape(self) -> str:
        return f"{self.config.data.max_seq_length}/{self.config.data.max_predictions_per_seq}"


def plan_phases(config: Config, paths: Artifacts) -> list[Phase]:
    """The phases `run` trains, in order: one without data.phases, else one per data phase
    with its train.phases entry applied (config.train_phases)."""
    if not config.data.phases:
        return [Phase(0, config, paths.data_dir, paths.checkpoint_dir)]
    out = []
    for i, ((seq, pred), tc) in enumerate(zip(config_lib.data_phases(config),
                                              config_lib.train_phases(config)), start=1):
        data = dataclasses.replace(config.data, max_seq_length=seq, max_predictions_per_seq=pred)
        out.append(Phase(i, dataclasses.replace(config, data=data, train=tc),
                         paths.data_phase_dir(i), paths.phase_checkpoint_dir(i)))
    return out


def resumable_run_id(config: Config) -> str:
    """The MLflow run of the pretrain stage that an interrupted training recorded beside its
    checkpoints ("" if there are no checkpoints yet or no record for this store): the CLI
    reopens it (tracking.stage_run) instead of starting a new run."""
    paths = Artifacts(config.run_dir)
    if not any(CHECKPOINT_RE.search(p.name) for p in paths.checkpoint_dir.rglob("ckpt-*")):
        return ""
    return tracking.read_run_file(paths.pretrain_run_file)


def phase_run(phase: Phase, stage_run, resume: bool):
    """The MLflow run of one phase: a child of the pipeline run (the stage run's parent), or
    the phase's recorded run reopened when it resumes from a checkpoint."""
    tags = mlflow.MlflowClient().get_run(stage_run.info.run_id).data.tags
    parent = tags.get("mlflow.parentRunId") or stage_run.info.run_id
    resume_id = tracking.read_run_file(Artifacts.run_file(phase.checkpoint_dir)) if resume else ""
    return tracking.child_run(
        f"pretrain {phase.name}", parent, resume_run_id=resume_id,
        tags={"pipeline.stage": f"pretrain.{phase.name}", "pretrain.phase": str(phase.index),
              "pretrain.stage_run_id": stage_run.info.run_id,
              "mlflow.source.git.commit": tracking.git_commit(),
              "mlflow.note.content": f"Pretraining {phase.name}: sequences of "
                                     f"{phase.config.data.max_seq_length} tokens, "
                                     f"{phase.config.train.steps} steps, from "
                                     f"{phase.data_dir}."})


def run(config: Config, log=print) -> dict:
    """Trains every phase in turn (one without data.phases), then evaluates the final model on
    held-out data and exports it. With data.phases, each phase starts from the previous one's
    final weights with a fresh optimizer and schedule, and is its own MLflow run under the
    pipeline run; a phase whose checkpoints already reach its steps is skipped."""
    paths = Artifacts(config.run_dir)
    tc = config.train
    phases = plan_phases(config, paths)
    vocabulary_size, stats = check_inputs(config, paths)
    keras.utils.set_random_seed(tc.seed)
    strategy = strategy_lib.make_strategy(tc.strategy, tc.tpu)
    for phase in phases:
        try:
            strategy_lib.per_replica_batch(phase.config.train.batch_size, strategy)
        except strategy_lib.StrategyError as err:
            where = f" (train.phases[{phase.index - 1}])" if phase.index else ""
            raise PretrainError(f"{err}{where}") from err
    chief = strategy_lib.is_chief()
    config_yaml = config_lib.dump_yaml(config)
    stage_run = mlflow.active_run() if chief else None
    if stage_run is not None:  # a re-run after an interruption continues this run
        tracking.write_run_file(paths.pretrain_run_file, stage_run.info.run_id)

    peak = 0.0
    if tc.peak_flops_seconds:
        peak = measure_peak_flops(tc.peak_flops_seconds, PEAK_DTYPES[tc.precision])
        log(f"pretrain: peak {peak / 1e9:,.0f} GFLOP/s per replica "
            f"({tc.precision.replace('mixed_', '')} matmul, {tc.peak_flops_seconds:g} s)")
        peak *= strategy.num_replicas_in_sync

    previous = None  # where the next phase starts from: weights (a list), or a checkpoint path
    for phase in phases:
        final = phase is phases[-1]
        found = latest_checkpoint(phase.checkpoint_dir)
        steps = phase.config.train.steps
        if not final and found and found[0] >= steps:
            log(f"{phase.prefix}: already trained ({found[1].name}, step {found[0]} of {steps}); "
                f"going on to phase{phase.index + 1}")
            previous = found[1]
            continue
        trains = not found or found[0] < steps
        tracked = bool(phase.index) and trains and stage_run is not None
        with (phase_run(phase, stage_run, resume=found is not None) if tracked
              else contextlib.nullcontext()) as run_of_phase:
            if run_of_phase is not None:
                tracking.write_run_file(Artifacts.run_file(phase.checkpoint_dir),
                                        run_of_phase.info.run_id)
                tracking.log_params({"phase": phase.index, "phase.data_dir": str(phase.data_dir),
                                     **{k: v for k, v in
                                        config_lib.to_flat_dict(phase.config).items()
                                        if k.startswith(("train.", "data.", "model."))}})
                mlflow.MlflowClient().set_tag(stage_run.info.run_id,
                                              f"pretrain.{phase.name}.run_id",
                                              run_of_phase.info.run_id)
            if phase.index:
                keras.utils.set_random_seed(tc.seed + phase.index - 1)
                log(f"{phase.prefix}: {phase.shape} (max_seq_length/max_predictions_per_seq) "
                    f"from {phase.data_dir}, {steps} steps")
            outcome = train_phase(phase, paths, strategy, vocabulary_size, peak, chief,
                                  config_yaml, found, previous, log)
        if not final:  # keep only the weights: the model and its optimizer state are freed
            previous = outcome.pop("model").get_weights()
            outcome = None
            gc.collect()

    model, results, history = outcome["model"], outcome["results"], outcome["history"]
    digest = outcome["weights_sha256"]
    if chief:
        artifacts.write_text_atomic(paths.pretrain_eval, json.dumps(results, indent=2))
        artifacts.write_text_atomic(paths.pretrain_config, config_yaml)
        export(model, paths)
        if mlflow.active_run():
            mlflow.set_tag("pretrain.weights_sha256", digest)
            mlflow.log_metrics({k: v for k, v in results.items() if k != "step"},
                               step=results["step"])
            mlflow.log_artifact(str(paths.pretrain_eval), "pretrain")
            mlflow.log_artifact(str(paths.pretrain_config), "pretrain")
            mlflow.log_artifact(str(paths.model_keras), "model")
            mlflow.log_artifacts(str(paths.saved_model), "model/saved_model")
            review_plots(model, config, paths, history, log)
    return {"parameters": outcome["parameters"], "start_step": outcome["start_step"],
            "weights_sha256": digest, "history": history,
            "phases": len(phases) if config.data.phases else 0, **results}


def start_from_previous_phase(model, previous, log=print, prefix: str = "pretrain") -> None:
    """Copies the model weights (not the optimizer state) of the previous phase into `model`:
    the weights of the model trained in this process (a list of arrays), or those of the
    phase's final checkpoint (a path)."""
    if isinstance(previous, Path):
        from keras.src.saving import saving_lib

        saving_lib.load_weights_only(model, str(previous), objects_to_skip=[model.optimizer])
        log(f"{prefix}: starting from the previous phase's {previous.parent.name}/{previous.name} "
            f"(fresh optimizer and schedule)")
    else:
        model.set_weights(previous)
        log(f"{prefix}: starting from the previous phase's final weights (fresh optimizer and "
            f"schedule)")


def train_phase(phase: Phase, paths: Artifacts, strategy, vocabulary_size: int, peak: float,
                chief: bool, config_yaml: str, found, previous, log=print) -> dict:
    """Trains one phase to its train.steps (resuming from `found`, its latest checkpoint;
    else starting from `previous`, the previous phase's model or checkpoint; else from
    model.init_from or random weights), then evaluates it on its held-out records."""
    config, prefix = phase.config, phase.prefix
    tc, dc = config.train, config.data
    train_data = training_data(config, paths, found[0] if found else 0, log=log,
                               data_dir=phase.data_dir, prefix=prefix)
    eval_data = inputs.pretraining_dataset(
        paths.shard_pattern("eval", phase.data_dir), tc.batch_size, dc.max_seq_length,
        dc.max_predictions_per_seq, training=False,
        **masking_args(config, paths)).map(normalize_mlm_weights).with_options(
            strategy_lib.shard_options("data"))

    with strategy.scope():
        model = build_model(config, vocabulary_size)
        optimizer = build_optimizer(tc)
        compile_model(model, optimizer, tc.jit_compile)
        optimizer.build(model.trainable_variables)
        PretrainingStep.prebuild(model, train_data.element_spec)
        if found:
            model.load_weights(str(found[1]))
            log(f"{prefix}: resuming from {found[1].name} (step {global_step(model)})")
        elif previous is not None:
            start_from_previous_phase(model, previous, log, prefix)
        elif config.model.init_from:
            init_from_checkpoint(model, config, paths.vocab_file, log=log)
    start_step = global_step(model)
    params = model.count_params()
    per_token = flops_per_token(config, vocabulary_size)
    log(f"{prefix}: {config.model.preset} BERT, {params:,} parameters, "
        f"{strategy.num_replicas_in_sync} replica(s) under {type(strategy).__name__} "
        f"({strategy_lib.worker_name()}), batch {tc.batch_size}"
        + (f" × {tc.grad_accum_steps} accumulated" if tc.grad_accum_steps > 1 else "")
        + f", {tc.precision}, XLA {'on' if model.jit_compile else 'off'}, "
        f"{per_token / 1e6:,.1f} MFLOP per token")
    if chief and mlflow.active_run():
        # tracking.log_params: a resumed run keeps its params (a change is recorded as a tag).
        tracking.log_params({"model.parameters": params,
                             "train.replicas": strategy.num_replicas_in_sync,
                             "train.effective_batch": tc.batch_size * tc.grad_accum_steps,
                             "train.flops_per_token": per_token, "train.peak_flops": peak})
        mlflow.set_tag("train.resumed_from_step", str(start_step))
        if start_step:
            mlflow.log_metric("resumed_from_step", start_step, step=start_step)
        models.params.log_to_mlflow(model)  # params/params.{json,txt}, params_* metrics

    logger = StepLogger(tc.log_every, tc.steps, tc.batch_size, dc.max_seq_length, log=log,
                        to_mlflow=chief, examples_per_update=tc.batch_size * tc.grad_accum_steps,
                        flops_per_token=per_token, peak_flops=peak)
    guard = NonFiniteGuard(check_grad_norm=tc.precision != "mixed_float16")
    if start_step < tc.steps:
        if chief:
            artifacts.write_text_atomic(paths.pretrain_config, config_yaml)
        chunk = tc.checkpoint_every
        try:
            model.fit(
                train_data,
                steps_per_epoch=chunk * tc.grad_accum_steps,  # micro-batches per chunk
                initial_epoch=start_step // chunk,
                epochs=math.ceil(tc.steps / chunk),
                callbacks=[logger, guard, StopAt(tc.steps),
                           Checkpointer(phase.checkpoint_dir, tc.keep_checkpoints, config_yaml,
                                        chief, guard)],
                shuffle=False,  # tf.data shuffles
                verbose=0,
            )
        except tf.errors.ResourceExhaustedError as err:
            raise PretrainError(oom_message(config, strategy)) from err
        if guard.bad_step is not None:
            last = latest_checkpoint(phase.checkpoint_dir)
            kept = (f"the last good checkpoint {last[1].name} (step {last[0]}) is kept and a "
                    f"re-run resumes from it" if last else "no checkpoint was written")
            key = f"train.phases[{phase.index - 1}]." if phase.index else "train."
            raise PretrainError(
                f"{'' if not phase.index else phase.name + ': '}"
                f"training stopped at step {guard.bad_step}: {guard.what} (not finite); {kept}. "
                f"Lower {key}learning_rate (now {tc.learning_rate:g}) or lengthen "
                f"{key}warmup_steps (now {tc.warmup_steps}), clip harder with train.clipnorm "
                f"(now {tc.clipnorm:g}; 1.0 is BERT's), or change train.precision (now "
                f"{tc.precision}; mixed_float16 overflows most easily, float32 least)")
    else:
        log(f"{prefix}: already trained to step {start_step} (train.steps = {tc.steps}); "
            f"evaluating and exporting")

    # Held-out evaluation.
    with warnings.catch_warnings():  # a finite held-out set ends with an "out of data" warning
        warnings.filterwarnings("ignore", message=".*ran out of data")
        try:
            results = model.evaluate(eval_data, steps=tc.eval_batches or None, return_dict=True,
                                     verbose=0)
        except tf.errors.ResourceExhaustedError as err:
            raise PretrainError(oom_message(config, strategy)) from err
    results = {f"eval_{k}": v for k, v in scalar_logs(results).items()}
    results["step"] = global_step(model)
    log(f"{prefix}: held-out MLM accuracy {results.get('eval_mlm_accuracy', float('nan')):.4f}, "
        f"NSP accuracy {results.get('eval_nsp_accuracy', float('nan')):.4f}, "
        f"MLM loss {results.get('eval_mlm_loss', float('nan')):.4f}")
    digest = weights_digest(model)
    log(f"{prefix}: final weights sha256 {digest[:16]}… ({strategy_lib.worker_name()})")
    if chief and phase.index and mlflow.active_run():
        mlflow.set_tag("pretrain.weights_sha256", digest)
        mlflow.log_metrics({k: v for k, v in results.items() if k != "step"},
                           step=results["step"])
    return {"model": model, "parameters": params, "start_step": start_step,
            "weights_sha256": digest, "history": logger.history, "results": results}


def review_plots(model, config: Config, paths: Artifacts, history: list, log=print) -> None:
    """Images for reviewers in the MLflow UI: the loss curves of this run and attention maps of
    a few fixed probe sentences. A plotting failure is reported, never fatal to a finished run."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        if history:
            figure = Figure(figsize=(9, 3.5))
            FigureCanvasAgg(figure)
            steps = [step for step, _ in history]
            for index, keys in enumerate((("loss", "mlm_loss", "nsp_loss"),
                                          ("mlm_accuracy", "nsp_accuracy"))):
                axes = figure.add_subplot(1, 2, index + 1)
                for key in keys:
                    axes.plot(steps, [m.get(key, float("nan")) for _, m in history], label=key)
                axes.set_xlabel("step")
                axes.legend()
            figure.tight_layout()
            mlflow.log_figure(figure, "plots/training_curves.png")
        from pipeline import inspect as inspect_lib

        out_dir = paths.pretrain_dir / "attention"
        inspect_lib.log_attention_probes(model, paths.vocab_file, out_dir,
                                         lowercase=config.vocab.lowercase)
        mlflow.log_artifacts(str(out_dir), "plots/attention")
    except Exception as err:  # noqa: BLE001 - the model is already saved; plots are extras
        log(f"pretrain: could not draw the review plots: {err!r}")


def export(model, paths: Artifacts) -> None:
    """model.keras and a SavedModel, each written beside and renamed into place."""
    paths.pretrain_dir.mkdir(parents=True, exist_ok=True)
    tmp = paths.pretrain_dir / f".tmp-{os.getpid()}-{paths.model_keras.name}"
    model.save(str(tmp))
    os.replace(tmp, paths.model_keras)
    with artifacts.atomic_dir(paths.saved_model) as tmp_dir:
        model.export(str(tmp_dir / "export"), format="tf_saved_model", verbose=False)
        for item in (tmp_dir / "export").iterdir():
            item.rename(tmp_dir / item.name)
        (tmp_dir / "export").rmdir()
