"""Distillation: a smaller student trained on a fine-tuned classifier's soft targets
(models/distill.py), its configuration from the teacher's, and its inference speed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path

import keras
import mlflow
import numpy as np

from models import distill as distill_lib
from pipeline import artifacts
from pipeline.artifacts import Artifacts, FinetuneArtifacts
from pipeline.config import Config

log = logging.getLogger(__name__)

SPEED_EXAMPLES = 1024  # inference speed: the first test inputs, the same for both models


class DistillError(ValueError):
    """The teacher or the student settings cannot be used; the message says how to fix it."""


def teacher_folder(config: Config) -> Path:
    folder = Path(config.distill.teacher) if config.distill.teacher else \
        Artifacts(config.run_dir).finetune("brown_genre").dir
    if not folder.is_absolute() and not folder.exists():
        folder = artifacts.RUN_ROOT / folder
    paths = FinetuneArtifacts(folder)
    for path in (paths.model_keras, paths.task_json, paths.vocab_file, paths.config):
        if not path.is_file():
            raise artifacts.MissingArtifact(
                f"distill.teacher: {path} not found; give a folder written by the finetune stage "
                f"(`make finetune`, e.g. runs/default/finetune/brown_genre)")
    return folder


def output_name(config: Config, teacher: Path) -> str:
    return config.distill.name or f"{teacher.name}_student"


def student_finetune_config(config: Config, teacher_fc, teacher: Path, name: str):
    """The teacher's finetune section (same data and splits) with the distill hyperparameters."""
    dc = config.distill
    paths = FinetuneArtifacts(teacher)
    return dataclasses.replace(
        teacher_fc, name=name, learning_rate=dc.learning_rate, batch_size=dc.batch_size,
        epochs=dc.epochs, max_steps=dc.max_steps, warmup_fraction=dc.warmup_fraction,
        weight_decay=dc.weight_decay, seed=dc.seed, freeze="none", baselines=False,
        init_from=str(paths.model_keras), vocab_file=str(paths.vocab_file),
        register_model=dc.register_model, registered_model="bert-" + name.replace("_", "-"), sweep=[])


def examples_per_second(model, x: dict, batch_size: int, repeats: int = 3) -> float:
    """Inference throughput of `model.predict` on `x` (best of `repeats`, after a warm-up)."""
    n = len(next(iter(x.values())))
    model.predict({k: v[:batch_size] for k, v in x.items()}, batch_size=batch_size, verbose=0)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        model.predict(x, batch_size=batch_size, verbose=0)
        best = min(best, time.perf_counter() - start)
    return n / best


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------
class Distiller:
    """The student's training step against a fixed teacher."""

    def __init__(self, teacher, student, dc, optimizer):
        self.dc = dc
        self.hidden = dc.hidden_loss != "none" and dc.hidden_weight > 0
        self.teacher = distill_lib.with_hidden_states(teacher) if self.hidden else teacher
        self.student = distill_lib.with_hidden_states(student) if self.hidden else student
        self.optimizer = optimizer
        self.projections = []
        if self.hidden:
            t_dim, s_dim = teacher.backbone.hidden_dim, student.backbone.hidden_dim
            n_s, n_t = student.backbone.num_layers, teacher.backbone.num_layers
            self.pairs = ([(n_s - 1, n_t - 1)] if dc.hidden_match == "cls" else
                          [(i, distill_lib.teacher_layer_for_match(i, n_s, n_t))
                           for i in range(n_s)])
            if s_dim != t_dim:  # a learned projection student width -> teacher width per pair
                self.projections = [keras.layers.Dense(t_dim, name=f"hidden_projection_{i}")
                                    for i in range(len(self.pairs))]
                for p in self.projections:
                    p.build((None, s_dim))
        self.variables = list(self.student.trainable_variables) + [
            v for p in self.projections for v in p.trainable_variables]
        optimizer.build(self.variables)
        self._step = None

    def losses(self, x, y, training: bool):
        import tensorflow as tf

        dc = self.dc
        t_out = self.teacher(x, training=False)
        s_out = self.student(x, training=training)
        total, soft, hard = distill_lib.distillation_loss(
            y, tf.stop_gradient(t_out["logits"]), s_out["logits"], dc.temperature, dc.alpha)
        hidden = tf.constant(0.0)
        if self.hidden:
            parts = []
            for k, (i, j) in enumerate(self.pairs):
                s_h, t_h = s_out["layers"][i], tf.stop_gradient(t_out["layers"][j])
                mask = x["padding_mask"]
                if dc.hidden_match == "cls":
                    s_h, t_h, mask = s_h[:, 0, :], t_h[:, 0, :], None
                if self.projections:
                    s_h = self.projections[k](s_h)
                parts.append(distill_lib.hidden_state_loss(s_h, t_h, dc.hidden_loss, mask))
            hidden = tf.add_n(parts) / len(parts)
            total = total + dc.hidden_weight * hidden
        return total, {"loss": total, "soft_loss": soft, "hard_loss": hard, "hidden_loss": hidden}

    def train_step(self, x, y):
        import tensorflow as tf

        if self._step is None:
            @tf.function(reduce_retracing=True)
            def step(x, y):
                with tf.GradientTape() as tape:
                    total, parts = self.losses(x, y, training=True)
                grads = tape.gradient(total, self.variables)
                self.optimizer.apply(grads, self.variables)
                return parts

            self._step = step
        return {k: float(v) for k, v in self._step(x, y).items()}


def train_student(distiller: Distiller, split, batch_size: int, total_steps: int,
                  seed: int, every: int = 0) -> list[dict]:
    """`total_steps` steps over shuffled epochs of `split`; returns the loss history (the mean
    of each `every`-step window, logged to MLflow)."""
    import tensorflow as tf

    if hasattr(split, "dataset"):  # TFRecords (records.RecordSplit), streamed
        from pipeline.finetuning.records import SHUFFLE_BUFFER

        ds = split.dataset(batch_size, SHUFFLE_BUFFER, seed).map(lambda x, y: (x, y["logits"]))
    else:
        n = len(split.y["logits"])
        ds = tf.data.Dataset.from_tensor_slices((split.x, split.y["logits"]))
        ds = ds.shuffle(n, seed=seed, reshuffle_each_iteration=True).repeat().batch(batch_size)
    every = every or max(1, min(50, total_steps // 10))
    history, window, started = [], [], time.time()
    for step, (x, y) in enumerate(ds.take(total_steps), start=1):
        window.append(distiller.train_step(x, y))
        if step % every == 0 or step == total_steps:
            entry = {"step": step, **{k: float(np.mean([w[k] for w in window]))
                                      for k in window[0]}}
            history.append(entry)
            window = []
            rate = step * batch_size / max(time.time() - started, 1e-9)
            log.info(f"distill: step {step}/{total_steps}  loss {entry['loss']:.4f} (soft "
                     f"{entry['soft_loss']:.4f}, hard {entry['hard_loss']:.4f}, hidden "
                     f"{entry['hidden_loss']:.4f})  {rate:,.0f} examples/s")
            if mlflow.active_run():
                mlflow.log_metrics({f"train_{k}": v for k, v in entry.items() if k != "step"},
                                   step=step)
    return history
