"""Distillation: a smaller student trained on a fine-tuned classifier's soft targets
(models/distill.py): the teacher read and checked, the student built, its configuration from
the teacher's, the `Distiller` that `fit` trains (the teacher's logits computed inside its
`train_step`, the teacher frozen), the teacher-vs-student summary and inference speed.

Training goes through fine-tuning's `runtime.fit_best_epoch`: checkpoints in
<run_dir>/distill/.checkpoints/<name>/ (a run killed and started again resumes there), the
progress lines, the validation metric after every epoch with the best epoch kept, and the
metrics through the outbox (pipeline/tracking/outbox.py).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import json
from pathlib import Path

import keras

import models
from models import distill as distill_lib
from models import heads
from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.artifacts import Artifacts, FinetuneArtifacts
from pipeline.config import Config
from pipeline.finetuning import data as fd
from pipeline.finetuning import runtime, tasks
from pipeline.finetuning.context import RunContext, TokenizerBundle
from pipeline.tracking import outbox, runs
from pipeline.training.callbacks import EpochEvaluator

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
        grad_accum_steps=1,  # a batch is an update (the optimizer without the knobs)
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
# The teacher and the student
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Teacher:
    """A fine-tuned classifier as the finetune stage wrote it: its folder, task.json, config
    and model."""
    dir: Path
    info: dict
    config: Config
    model: object

    @property
    def paths(self) -> FinetuneArtifacts:
        return FinetuneArtifacts(self.dir)


def load_teacher(config: Config) -> Teacher:
    """distill.teacher read and checked: its files as the finetune stage wrote them (an altered
    file is named), a classification task, a BertClassifier."""
    folder = teacher_folder(config)
    artifacts.verify_checksums(folder, f"make finetune ARGS=--force  (the teacher {folder.name})")
    paths = FinetuneArtifacts(folder)
    info = json.loads(paths.task_json.read_text())
    if not tasks.get(info.get("task")).distillable:
        raise DistillError(f"distill.teacher = {folder} is a {info.get('task')!r} model; "
                           f"distillation here needs a classification teacher (finetune.task = "
                           f"classification)")
    model = models.load_keras(paths.model_keras, compile=False)
    if not isinstance(model, heads.BertClassifier):
        raise DistillError(f"{paths.model_keras} holds a {type(model).__name__}, not a "
                           f"BertClassifier")
    return Teacher(folder, info, config_lib.load(paths.config), model)


def check_data(teacher: Teacher, data) -> None:
    if data.labels != teacher.info["labels"]:
        raise DistillError(f"the labels of the teacher's data ({data.labels}) differ from its "
                           f"task.json ({teacher.info['labels']}); was the data changed since "
                           f"{teacher.dir} was trained?")


def prepare(config: Config) -> tuple[Teacher, RunContext]:
    """(the teacher, read and checked; the student's run context): the student's config (the
    teacher's finetune section with the distill hyperparameters: `student_finetune_config`),
    the teacher's data, splits and tokenizer, the student's features (written once by the Beam
    job, else reused) and its output folder <run_dir>/distill/<name>/."""
    teacher = load_teacher(config)
    name = output_name(config, teacher.dir)
    fc = student_finetune_config(config, teacher.config.finetune, teacher.dir, name)
    student_config = dataclasses.replace(config, finetune=fc)
    keras.utils.set_random_seed(config.distill.seed)
    data = fd.load_task(fc)
    check_data(teacher, data)
    tokenizer = TokenizerBundle.read(teacher.paths.vocab_file, teacher.info["lowercase"],
                                     teacher.info["max_seq_length"])
    ctx = RunContext(student_config, tokenizer, teacher.paths.model_keras,
                     paths=Artifacts(config.run_dir).distill(name),
                     task=tasks.get("classification", fc), data=data)
    return teacher, ctx.with_features()


@dataclasses.dataclass
class Student:
    """The student classifier, its sizes and the teacher layers it starts from (or None)."""
    model: object
    sizes: dict
    copied: list | None


def build_student(teacher, ctx: RunContext) -> Student:
    """The student: a smaller encoder (distill.student_preset / num_layers / hidden_dim / ...)
    with a BertClassifier head for the labels of `ctx.data`; with equal widths it starts from
    the teacher's embeddings, pooler, every other layer and classifier
    (distill.init_from_teacher)."""
    dc = ctx.config.distill
    tb = teacher.backbone
    sizes = distill_lib.student_sizes(tb, dc.student_preset, num_layers=dc.num_layers,
                                      hidden_dim=dc.hidden_dim, num_heads=dc.num_heads,
                                      intermediate_dim=dc.intermediate_dim)
    if sizes["hidden_dim"] % sizes["num_heads"]:
        raise DistillError(f"student hidden size {sizes['hidden_dim']} is not divisible by "
                           f"{sizes['num_heads']} heads; set distill.num_heads")
    backbone = distill_lib.build_student(tb, sizes)
    can_copy = (distill_lib.same_widths(backbone, tb) and backbone.num_layers <= tb.num_layers)
    if dc.init_from_teacher == "true" and not can_copy:
        raise DistillError(f"distill.init_from_teacher = true needs the student's widths "
                           f"(hidden/heads/intermediate {sizes['hidden_dim']}/{sizes['num_heads']}/"
                           f"{sizes['intermediate_dim']}) equal to the teacher's ({tb.hidden_dim}/"
                           f"{tb.num_heads}/{tb.intermediate_dim}) and no more layers; use auto "
                           f"or false")
    copied = (distill_lib.init_from_teacher(backbone, tb)
              if dc.init_from_teacher != "false" and can_copy else None)
    student = heads.BertClassifier(backbone, len(ctx.data.labels), dropout=ctx.fc.dropout)
    if copied is not None:  # the teacher's classifier too, when the student starts from it
        student.output_dense.set_weights(teacher.output_dense.get_weights())
    return Student(student, sizes, copied)


def describe(teacher: Teacher, student: Student, dc, total_steps: int) -> None:
    """The log line and MLflow params of the teacher and the student."""
    tb, sizes, copied = teacher.model.backbone, student.sizes, student.copied
    log.info(f"distill: teacher {teacher.dir} ({tb.num_layers} layers, hidden {tb.hidden_dim}, "
             f"{teacher.model.count_params():,} parameters) -> student ({sizes['num_layers']} "
             f"layers, hidden {sizes['hidden_dim']}, {student.model.count_params():,} parameters, "
             + (f"initialised from teacher layers {copied}" if copied is not None
                else "random init")
             + f"); T={dc.temperature} alpha={dc.alpha} hidden={dc.hidden_loss}"
             f"{'/' + dc.hidden_match if dc.hidden_loss != 'none' else ''}; {total_steps} steps")
    runs.log_params({
        "distill.teacher_dir": str(teacher.dir),
        **{f"distill.student.{k}": v for k, v in sizes.items()},
        "distill.initialised_from_layers": str(copied), "distill.total_steps": total_steps})


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------
LOSSES = ("loss", "soft_loss", "hard_loss", "hidden_loss")


class Distiller(keras.Model):
    """The student trained against a frozen teacher: `train_step` computes the teacher's
    logits (inference mode, no gradient) and the student's on the same batch, the
    distillation loss (models/distill.py) and optionally the hidden-state loss through a
    learned projection when the widths differ, and updates the student (and projections).
    Its metrics are the epoch's mean losses (`LOSSES`)."""

    def __init__(self, teacher, student, dc, **kwargs):
        super().__init__(name="distiller", **kwargs)
        self.hidden = dc.hidden_loss != "none" and dc.hidden_weight > 0
        self.temperature, self.alpha = float(dc.temperature), float(dc.alpha)
        self.hidden_kind, self.hidden_match = dc.hidden_loss, dc.hidden_match
        self.hidden_weight = float(dc.hidden_weight)
        self.teacher = distill_lib.with_hidden_states(teacher) if self.hidden else teacher
        self.teacher.trainable = False
        self.student = distill_lib.with_hidden_states(student) if self.hidden else student
        self.pairs, self.projections = [], []
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
        self.trackers = [keras.metrics.Mean(name=name) for name in LOSSES]
        self.built = True  # of built parts: nothing to build on a first call

    @property
    def metrics(self):
        return list(self.trackers)

    def call(self, inputs, training=False):
        return self.student(inputs, training=training)

    def distillation_losses(self, x, labels, training: bool) -> dict:
        import tensorflow as tf

        t_out = self.teacher(x, training=False)
        s_out = self.student(x, training=training)
        t_logits = t_out["logits"]
        total, soft, hard = distill_lib.distillation_loss(
            labels, tf.stop_gradient(t_logits), s_out["logits"], self.temperature, self.alpha)
        hidden = tf.constant(0.0)
        if self.hidden:
            parts = []
            for k, (i, j) in enumerate(self.pairs):
                s_h, t_h = s_out["layers"][i], tf.stop_gradient(t_out["layers"][j])
                mask = x["padding_mask"]
                if self.hidden_match == "cls":
                    s_h, t_h, mask = s_h[:, 0, :], t_h[:, 0, :], None
                if self.projections:
                    s_h = self.projections[k](s_h)
                parts.append(distill_lib.hidden_state_loss(s_h, t_h, self.hidden_kind, mask))
            hidden = tf.add_n(parts) / len(parts)
            total = total + self.hidden_weight * hidden
        return {"loss": total, "soft_loss": soft, "hard_loss": hard, "hidden_loss": hidden}

    def train_step(self, data):
        import tensorflow as tf

        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        labels = y["logits"] if isinstance(y, dict) else y
        with tf.GradientTape() as tape:
            losses = self.distillation_losses(x, labels, training=True)
        variables = self.trainable_variables
        self.optimizer.apply(tape.gradient(losses["loss"], variables), variables)
        for tracker in self.trackers:
            tracker.update_state(losses[tracker.name])
        return {tracker.name: tracker.result() for tracker in self.trackers}


def checkpoints(ctx: RunContext) -> runtime.Checkpoints:
    """<run_dir>/distill/.checkpoints/<name>/, for the settings that shape the student's
    training: the distill section, the student's finetune section, the teacher's and vocab's
    digests and the splits."""
    config, fc = ctx.config, ctx.fc
    settings = runtime.run_settings(ctx)  # the teacher's model and vocab files
    settings["distill"] = {k: v for k, v in sorted(config_lib.to_dict(config)["distill"].items())
                           if k != "register_model"}
    folder = Artifacts(config.run_dir).distill_root / ".checkpoints" / fc.name
    return runtime.Checkpoints(folder, settings, fc.keep_checkpoints, fc.checkpoint_every)


def train_student(ctx: RunContext, distiller: Distiller, student, total_steps: int,
                  saved: runtime.Checkpoints | None = None) -> tuple[list[dict], int]:
    """`total_steps` updates over epochs of the training split (fine-tuning's `fit` path: the
    student's validation metric after every epoch, the best epoch kept); returns (the history,
    the kept epoch), an entry per epoch: {"epoch", "step", "loss", "soft_loss", "hard_loss", "hidden_loss",
    "val_<metric>", ...} (the losses: the epoch's means)."""
    task, splits, data, fc = ctx.task, ctx.splits, ctx.data, ctx.fc

    def evaluate_validation():
        return task.evaluate(student, splits["validation"], data)[0]

    evaluator = EpochEvaluator(evaluate_validation, data.metric, to_mlflow=True, label="distill",
                               train_logs={k: f"train_{k}" for k in LOSSES[1:]})
    epochs = math.ceil(total_steps / runtime.updates_per_epoch(len(splits["train"]), fc))
    runtime.fit_best_epoch(distiller, splits["train"],
                           runtime.FitPlan(fc, total_steps, epochs, checkpoints=saved), evaluator)
    history = [{("loss" if k == "train_loss" else k.removeprefix("train_")): v
                for k, v in entry.items()} for entry in evaluator.history]
    return history, evaluator.best_epoch


# ---------------------------------------------------------------------------
# The summary
# ---------------------------------------------------------------------------
def compare(ctx: RunContext, teacher: Teacher, built: Student, results: dict,
            total_steps: int) -> dict:
    """Teacher and student on the same splits (the teacher's metrics into
    results["teacher"]) and the same inputs (examples/s); the summary distill.json holds,
    logged to the log and MLflow."""
    task, splits, data, fc, dc = ctx.task, ctx.splits, ctx.data, ctx.fc, ctx.config.distill
    student, sizes, copied = built.model, built.sizes, built.copied
    teacher_results = {split: task.evaluate(teacher.model, splits[split], data)[0]
                       for split in ("validation", *data.tests)}
    results["teacher"] = teacher_results
    tb = teacher.model.backbone
    params = {"teacher": teacher.model.count_params(), "student": student.count_params()}
    speed_batch = 2 * fc.batch_size
    speed_x = next(splits["test"].batches(SPEED_EXAMPLES))[1]
    speed = {"teacher": examples_per_second(teacher.model, speed_x, speed_batch),
             "student": examples_per_second(student, speed_x, speed_batch)}
    metric = data.metric
    summary = {
        "metric": f"test_{metric}",
        "teacher": {"dir": str(teacher.dir), f"test_{metric}": teacher_results["test"][metric],
                    "parameters": params["teacher"], "examples_per_second": speed["teacher"],
                    "num_layers": tb.num_layers, "hidden_dim": tb.hidden_dim},
        "student": {f"test_{metric}": results["test"][metric], "parameters": params["student"],
                    "examples_per_second": speed["student"], **sizes,
                    "initialised_from_teacher_layers": copied},
        "parameter_ratio": params["student"] / params["teacher"],
        "speedup": speed["student"] / speed["teacher"],
        "test_examples": len(data.test), "speed_batch_size": speed_batch,
        "speed_examples": len(speed_x["token_ids"]),
        "temperature": dc.temperature, "alpha": dc.alpha, "hidden_loss": dc.hidden_loss,
        "hidden_match": dc.hidden_match, "total_steps": total_steps,
    }
    log.info(f"distill: test {metric}: teacher {summary['teacher'][f'test_{metric}']:.4f}, student "
             f"{summary['student'][f'test_{metric}']:.4f}; parameters {params['teacher']:,} -> "
             f"{params['student']:,} ({summary['parameter_ratio']:.2f}x); "
             f"{speed['teacher']:,.0f} -> {speed['student']:,.0f} examples/s "
             f"({summary['speedup']:.2f}x)")
    outbox.log_metrics({
        f"teacher_test_{metric}": summary["teacher"][f"test_{metric}"],
        f"student_test_{metric}": summary["student"][f"test_{metric}"],
        "teacher_parameters": params["teacher"], "student_parameters": params["student"],
        "teacher_examples_per_second": speed["teacher"],
        "student_examples_per_second": speed["student"],
        "parameter_ratio": summary["parameter_ratio"], "speedup": summary["speedup"],
        **{f"teacher_{split}_{k}": v for split, r in teacher_results.items()
           for k, v in r.items() if isinstance(v, float)}})
    return summary
