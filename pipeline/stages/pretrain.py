"""Stage `pretrain`: TFRecords → a BERT trained on MLM + NSP, evaluated on held-out data, exported.

Reads top to bottom:
  1. check inputs (vocab, data stats agree with the config, no incompatible checkpoint);
  2. tf.data pipelines for training (repeated, shuffled) and held-out evaluation;
  3. inside the tf.distribute strategy: build the pretrainer, AdamW with warmup + linear decay,
     compile with MLM (weighted) + NSP losses;
  4. resume from the latest checkpoint in <run_dir>/pretrain/checkpoints if there is one;
  5. `model.fit` in chunks of `checkpoint_every` steps (a Keras epoch = one checkpoint interval),
     logging per-step metrics to MLflow and writing a checkpoint at the end of each chunk;
  6. held-out evaluation (MLM loss/accuracy, NSP accuracy) → eval.json;
  7. export `model.keras` and a SavedModel (both atomic), log them to MLflow.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import warnings
from pathlib import Path

import keras
import mlflow
import numpy as np
import tensorflow as tf
import yaml

import models
from beam_jobs import vocab as vocab_job
from models.schedules import WarmupPolynomialDecay
from pipeline import artifacts, inputs, strategy as strategy_lib
from pipeline import config as config_lib
from pipeline.artifacts import Artifacts
from pipeline.config import Config

CHECKPOINT_RE = re.compile(r"ckpt-(\d{8})\.weights\.h5$")


class PretrainError(ValueError):
    pass


# ---------------------------------------------------------------------------
# Building blocks (also used by tests and the other stages).
# ---------------------------------------------------------------------------
def build_model(config: Config, vocabulary_size: int) -> models.BertPretrainer:
    arch = config_lib.model_architecture(config)
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
    )
    return models.BertPretrainer(backbone)


def build_optimizer(tc: config_lib.TrainConfig) -> keras.optimizers.Optimizer:
    schedule = WarmupPolynomialDecay(tc.learning_rate, tc.warmup_steps, tc.steps,
                                     end_learning_rate=tc.end_learning_rate)
    optimizer = keras.optimizers.AdamW(
        learning_rate=schedule, weight_decay=tc.weight_decay, beta_1=tc.beta_1,
        beta_2=tc.beta_2, epsilon=tc.epsilon, global_clipnorm=tc.clipnorm or None)
    # BERT does not decay LayerNorm parameters or biases.
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return optimizer


def compile_model(model, optimizer):
    """MLM (weighted mean over real predictions) + NSP losses, weighted accuracies."""
    model.compile(optimizer=optimizer, loss=models.pretraining.pretraining_losses(),
                  weighted_metrics=models.pretraining.pretraining_metrics())


def latest_checkpoint(checkpoint_dir: Path) -> tuple[int, Path] | None:
    found = []
    for path in Path(checkpoint_dir).glob("ckpt-*.weights.h5"):
        match = CHECKPOINT_RE.search(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return max(found) if found else None


def global_step(model) -> int:
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


# ---------------------------------------------------------------------------
# Callbacks.
# ---------------------------------------------------------------------------
class Checkpointer(keras.callbacks.Callback):
    """Writes weights + optimizer state at the end of every chunk; keeps the newest `keep`."""

    def __init__(self, checkpoint_dir: Path, keep: int, config_yaml: str, write: bool):
        super().__init__()
        self.dir, self.keep, self.config_yaml, self.write = Path(checkpoint_dir), keep, config_yaml, write

    def save(self):
        step = global_step(self.model)
        if not self.write or (self.dir / f"ckpt-{step:08d}.weights.h5").exists():
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
    """Every `every` steps: losses, accuracies, learning rate and throughput to MLflow."""

    def __init__(self, every: int, total_steps: int, batch_size: int, seq_length: int,
                 log=print, to_mlflow: bool = True):
        super().__init__()
        self.every, self.total, self.batch_size, self.seq_length = every, total_steps, batch_size, seq_length
        self.log, self.to_mlflow = log, to_mlflow
        self.last_time, self.last_step = None, None
        self.history = []

    def on_train_begin(self, logs=None):
        self.last_time, self.last_step = time.time(), global_step(self.model)

    def on_train_batch_end(self, batch, logs=None):
        step = global_step(self.model)
        if step % self.every and step < self.total:
            return
        now = time.time()
        elapsed = max(now - self.last_time, 1e-9)
        steps = step - self.last_step
        metrics = {k: float(v) for k, v in (logs or {}).items() if np.isscalar(v) or np.ndim(v) == 0}
        metrics["learning_rate"] = float(keras.ops.convert_to_numpy(
            self.model.optimizer.learning_rate))
        metrics["examples_per_second"] = steps * self.batch_size / elapsed
        metrics["tokens_per_second"] = steps * self.batch_size * self.seq_length / elapsed
        self.last_time, self.last_step = now, step
        self.history.append((step, metrics))
        if self.to_mlflow and mlflow.active_run():
            mlflow.log_metrics(metrics, step=step)
        self.log(f"step {step}/{self.total}  loss {metrics.get('loss', float('nan')):.4f}  "
                 f"mlm_acc {metrics.get('mlm_accuracy', float('nan')):.3f}  "
                 f"nsp_acc {metrics.get('nsp_accuracy', float('nan')):.3f}  "
                 f"lr {metrics['learning_rate']:.2e}  {metrics['tokens_per_second']:,.0f} tok/s")


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
    for key in ("max_seq_length", "max_predictions_per_seq"):
        if made[key] != getattr(config.data, key):
            raise PretrainError(
                f"the TFRecords in {paths.data_dir} were made with data.{key} = {made[key]}, but the "
                f"config says {getattr(config.data, key)}; run `make data` again with this config")
    if config.data.max_seq_length > config.model.max_sequence_length:
        raise PretrainError(f"data.max_seq_length {config.data.max_seq_length} exceeds "
                            f"model.max_sequence_length {config.model.max_sequence_length}")
    if paths.pretrain_config.exists() or (paths.checkpoint_dir / "config.yaml").exists():
        saved_path = paths.checkpoint_dir / "config.yaml"
        if not saved_path.exists():
            saved_path = paths.pretrain_config
        saved = yaml.safe_load(saved_path.read_text())
        if saved.get("model") != config_lib.to_dict(config)["model"]:
            raise PretrainError(
                f"the checkpoints in {paths.pretrain_dir} were trained with another model config "
                f"({saved.get('model')}); use another run_dir or delete {paths.pretrain_dir} to "
                f"start over")
    return vocabulary_size, stats


def run(config: Config, log=print) -> dict:
    paths = Artifacts(config.run_dir)
    tc, dc = config.train, config.data
    vocabulary_size, stats = check_inputs(config, paths)
    keras.utils.set_random_seed(tc.seed)
    strategy = strategy_lib.make_strategy(tc.strategy, tc.tpu)
    chief = strategy_lib.is_chief()
    config_yaml = config_lib.dump_yaml(config)

    # Resume point (the shuffle seed moves with it, so a resumed run sees fresh batches).
    found = latest_checkpoint(paths.checkpoint_dir)
    start_step = found[0] if found else 0
    train_data = inputs.pretraining_dataset(
        paths.shard_pattern("train"), tc.batch_size, dc.max_seq_length, dc.max_predictions_per_seq,
        training=True, seed=tc.seed + start_step, shuffle_buffer=tc.shuffle_buffer)
    eval_data = inputs.pretraining_dataset(
        paths.shard_pattern("eval"), tc.batch_size, dc.max_seq_length, dc.max_predictions_per_seq,
        training=False)

    with strategy.scope():
        model = build_model(config, vocabulary_size)
        optimizer = build_optimizer(tc)
        compile_model(model, optimizer)
        optimizer.build(model.trainable_variables)
        if found:
            model.load_weights(str(found[1]))
            log(f"pretrain: resuming from {found[1].name} (step {global_step(model)})")
    start_step = global_step(model)
    params = model.count_params()
    log(f"pretrain: {config.model.preset} BERT, {params:,} parameters, "
        f"{strategy.num_replicas_in_sync} replica(s) under {type(strategy).__name__}")
    if mlflow.active_run():
        mlflow.log_params({"model.parameters": params, "train.replicas": strategy.num_replicas_in_sync,
                           "train.resumed_from_step": start_step})

    logger = StepLogger(tc.log_every, tc.steps, tc.batch_size, dc.max_seq_length, log=log,
                        to_mlflow=chief)
    if start_step < tc.steps:
        artifacts.write_text_atomic(paths.pretrain_config, config_yaml)
        chunk = tc.checkpoint_every
        model.fit(
            train_data,
            steps_per_epoch=chunk,
            initial_epoch=start_step // chunk,
            epochs=math.ceil(tc.steps / chunk),
            callbacks=[logger, StopAt(tc.steps),
                       Checkpointer(paths.checkpoint_dir, tc.keep_checkpoints, config_yaml, chief)],
            shuffle=False,  # tf.data shuffles
            verbose=0,
        )
    else:
        log(f"pretrain: already trained to step {start_step} (train.steps = {tc.steps}); "
            f"evaluating and exporting")

    # Held-out evaluation.
    with warnings.catch_warnings():  # a finite held-out set ends with an "out of data" warning
        warnings.filterwarnings("ignore", message=".*ran out of data")
        results = model.evaluate(eval_data, steps=tc.eval_batches or None, return_dict=True,
                                 verbose=0)
    results = {f"eval_{k}": float(v) for k, v in results.items()}
    results["step"] = global_step(model)
    log(f"pretrain: held-out MLM accuracy {results.get('eval_mlm_accuracy', float('nan')):.4f}, "
        f"NSP accuracy {results.get('eval_nsp_accuracy', float('nan')):.4f}, "
        f"MLM loss {results.get('eval_mlm_loss', float('nan')):.4f}")

    if chief:
        artifacts.write_text_atomic(paths.pretrain_eval, json.dumps(results, indent=2))
        artifacts.write_text_atomic(paths.pretrain_config, config_yaml)
        export(model, paths)
        if mlflow.active_run():
            mlflow.log_metrics({k: v for k, v in results.items() if k != "step"},
                               step=results["step"])
            mlflow.log_artifact(str(paths.pretrain_eval), "pretrain")
            mlflow.log_artifact(str(paths.pretrain_config), "pretrain")
            mlflow.log_artifact(str(paths.model_keras), "model")
            mlflow.log_artifacts(str(paths.saved_model), "model/saved_model")
    return {"parameters": params, "start_step": start_step,
            "history": logger.history, **results}


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
