"""Multi-task fine-tuning: one shared encoder, a head per task, batches mixed across tasks by
ratio, each task also trained alone as a baseline; the comparison table.

Training goes through fine-tuning's `runtime.fit_best_epoch`: the `MultitaskModel` routes each
batch of the `TaskMix` stream to its task's model; checkpoints in
<run_dir>/multitask/.checkpoints/<name>/ (a run killed and started again resumes there), the
progress lines, the tasks' mean validation metric after every epoch with the best epoch kept,
and the metrics through the outbox (pipeline/tracking/outbox.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math

import keras
import numpy as np

from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.config import Config
from pipeline.finetuning import data as fd
from pipeline.finetuning import outputs, readers, records, runtime
from pipeline.finetuning import tasks as task_registry
from pipeline.finetuning.context import RunContext, TokenizerBundle
from pipeline.finetuning.task_model import FinetuneError
from pipeline.text import vocab as vocab_lib
from pipeline.tracking import outbox, runs
from pipeline.training.callbacks import EpochEvaluator

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Task:
    """One task of the run: its config entry, data, features and (once built) model."""
    spec: config_lib.MultitaskTask
    data: readers.TaskData
    splits: dict
    model: object = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.spec.finetune.task

    @property
    def task(self) -> task_registry.FinetuneTask:
        """The task's class (pipeline/finetuning/tasks/) with this task's finetune settings."""
        return task_registry.get(self.kind, self.spec.finetune)


# ---------------------------------------------------------------------------
# Batches: per-task streams and the weighted schedule across them
# ---------------------------------------------------------------------------
def normalized_ratios(ratios) -> list[float]:
    total = float(sum(ratios))
    return [float(r) / total for r in ratios]


def task_schedule(ratios, seed: int):
    """An endless tf.data stream of task indices, index i drawn with probability ratio_i."""
    import tensorflow as tf

    streams = [tf.data.Dataset.from_tensors(np.int32(i)).repeat() for i in range(len(ratios))]
    return tf.data.Dataset.sample_from_datasets(streams, weights=normalized_ratios(ratios),
                                                seed=seed, stop_on_empty_dataset=False)


def _seed(seed, *more) -> int:
    return int(np.random.default_rng([*np.atleast_1d(seed).tolist(), *more]).integers(1 << 31))


@dataclasses.dataclass
class TaskMix:
    """The training stream of a multi-task run, for `runtime.fit`: an epoch is as many batches
    as every task's training split has (`len`: that many batches' examples); each batch is one
    task's, the task drawn with probability ratio_i. An element is (task index, slots): slot i
    the drawn task's (x, y[, sample_weight]) batch, every other slot an empty batch of its
    task's shapes (one element structure for all tasks). Seeded by (finetune.seed, epoch): a
    resumed epoch sees the batches an uninterrupted one sees."""
    splits: list
    ratios: list
    batch_size: int

    def batches_per_epoch(self) -> int:
        return sum(math.ceil(len(s) / self.batch_size) for s in self.splits)

    def __len__(self) -> int:
        return self.batches_per_epoch() * self.batch_size

    def epoch_dataset(self, batch_size: int, seed, batches: int | None = None, skip: int = 0):
        import tensorflow as tf

        # Each task's records: endless, reshuffled (x, y[, sample_weight]) batches.
        streams = [split.dataset(batch_size, records.SHUFFLE_BUFFER, _seed(seed, i))
                   for i, split in enumerate(self.splits)]
        empty = [tf.nest.map_structure(
            lambda spec: tf.zeros([d or 0 for d in spec.shape.as_list()], spec.dtype),
            stream.element_spec) for stream in streams]

        def slotted(i):
            return lambda *batch: (tf.constant(i, tf.int32), tuple(
                batch if j == i else empty[j] for j in range(len(streams))))

        slotted_streams = [stream.map(slotted(i)) for i, stream in enumerate(streams)]
        schedule = task_schedule(self.ratios, _seed(seed, len(streams)))
        batches = self.batches_per_epoch() if batches is None else batches
        choices = schedule.take(batches).map(lambda i: tf.cast(i, tf.int64))
        mixed = tf.data.Dataset.choose_from_datasets(slotted_streams, choices)
        known = tf.data.experimental.assert_cardinality(max(0, batches - skip))
        return mixed.skip(skip).apply(known).prefetch(tf.data.AUTOTUNE)


# ---------------------------------------------------------------------------
# The model `fit` trains
# ---------------------------------------------------------------------------
class MultitaskModel(keras.Model):
    """The task models (one shared encoder) as one model for `fit`: `train_step` takes a
    `TaskMix` element and routes it to the drawn task's model (`tf.switch_case`), whose
    compiled loss (scaled by the task's weight) updates the encoder and that task's head with
    the one optimizer. Its metrics: the epoch's mean loss, overall and per task
    ("<task>.loss"); `batch_counts` the batches each task has had (kept in checkpoints)."""

    def __init__(self, task_models: list, names: list, **kwargs):
        super().__init__(name="multitask", **kwargs)
        self.task_models = list(task_models)
        self.task_names = list(names)
        self.trackers = [keras.metrics.Mean(name="loss")] + [
            keras.metrics.Mean(name=f"{name}.loss") for name in names]
        self.batch_counts = self.add_weight(shape=(len(names),), initializer="zeros",
                                            trainable=False, name="batch_counts")
        self.built = True  # of built parts: nothing to build on a first call

    @property
    def metrics(self):
        return list(self.trackers)

    def _task_step(self, i: int, batch):
        import tensorflow as tf

        model = self.task_models[i]
        x, y, weights = keras.utils.unpack_x_y_sample_weight(batch)
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=weights,
                                      training=True)
        variables = model.trainable_variables
        # A token task's step leaves the shared pooler alone: no gradient there.
        pairs = [(g, v) for g, v in zip(tape.gradient(loss, variables), variables)
                 if g is not None]
        self.optimizer.apply([g for g, _ in pairs], [v for _, v in pairs])
        self.trackers[i + 1].update_state(loss)
        self.batch_counts.assign_add(tf.one_hot(i, len(self.task_models)))
        return tf.cast(loss, "float32")

    def train_step(self, data):
        import tensorflow as tf

        index, slots = data
        loss = tf.switch_case(index, [lambda i=i: self._task_step(i, slots[i])
                                      for i in range(len(self.task_models))])
        self.trackers[0].update_state(loss)
        return {tracker.name: tracker.result() for tracker in self.trackers}


def train_mixed(tasks: list[Task], steps: int, run_fc, label: str = "multitask",
                saved=None) -> dict:
    """`steps` optimizer updates of `run_fc.batch_size` examples (seeded by `run_fc.seed`)
    through fine-tuning's `fit` path (`runtime.fit_best_epoch`: progress lines, checkpoints
    when `saved` is given, the mean of the tasks' validation metrics after every epoch, the
    best epoch kept), each update on one batch of the task the schedule draws. Returns
    {"batches": {task: count}, "train_loss": {task: the last epoch's mean loss},
    "best_epoch", "history"}."""
    batch_size, seed = run_fc.batch_size, run_fc.seed
    fc = dataclasses.replace(tasks[0].spec.finetune, batch_size=batch_size, seed=seed,
                             grad_accum_steps=1)
    names = [t.name for t in tasks]
    with tasks[0].model.distribute_strategy.scope():  # the task models' strategy
        model = MultitaskModel([t.model for t in tasks], names)
    model.compile(optimizer=tasks[0].model.optimizer,
                  **{**runtime.compile_options(fc), "jit_compile": False})
    for i, task in enumerate(tasks):  # each compiled loss built outside the routed step
        x, y, weights = keras.utils.unpack_x_y_sample_weight(
            next(iter(task.splits["train"].dataset(2, records.SHUFFLE_BUFFER, seed))))
        task.model.compute_loss(x=x, y=y, y_pred=task.model(x, training=False),
                                sample_weight=weights, training=False)
    mix = TaskMix([t.splits["train"] for t in tasks], [t.spec.sampling_ratio for t in tasks],
                  batch_size)

    def evaluate_validation():
        scores = {f"{t.name}.{t.data.metric}": float(
            t.task.evaluate(t.model, t.splits["validation"], t.data)[0][t.data.metric])
            for t in tasks}
        return {"mean_task_metric": float(np.mean(list(scores.values()))), **scores}

    evaluator = EpochEvaluator(evaluate_validation, "mean_task_metric", to_mlflow=True,
                               label=label,
                               train_logs={f"{n}.loss": f"{n}.train_loss" for n in names})
    epochs = math.ceil(steps / mix.batches_per_epoch())
    runtime.fit_best_epoch(model, mix, runtime.FitPlan(fc, steps, epochs, checkpoints=saved),
                           evaluator, keep_best=False)
    counts = keras.ops.convert_to_numpy(model.batch_counts)
    last = evaluator.history[-1] if evaluator.history else {}
    runtime.keep_best_epoch(model, evaluator)
    return {"batches": {n: int(round(float(c))) for n, c in zip(names, counts)},
            "train_loss": {n: float(last.get(f"{n}.train_loss", float("nan"))) for n in names},
            "best_epoch": evaluator.best_epoch, "history": evaluator.history}


def checkpoints(ctx: RunContext, tasks: list[Task], name: str) -> runtime.Checkpoints:
    """<run_dir>/multitask/.checkpoints/<multitask.name>/<name>/ (name: "mixed", or a
    task's for its single-task baseline), for the settings that shape training: the multitask
    and finetune sections, the encoder's and vocab's digests, every task's splits."""
    config, fc = ctx.config, ctx.fc
    settings = {**runtime.run_settings(ctx, {t.name: t.data.splits for t in tasks}),
                "multitask": config_lib.to_dict(config)["multitask"]}
    folder = ctx.paths.dir.parent / ".checkpoints" / config.multitask.name / name
    return runtime.Checkpoints(folder, settings, fc.keep_checkpoints, fc.checkpoint_every)


# ---------------------------------------------------------------------------
# Building the models
# ---------------------------------------------------------------------------
def context(config: Config) -> RunContext:
    """The run's context: the shared encoder's file and tokenizer, the strategy of train.*,
    the output folder <run_dir>/multitask/<name>/ (each `Task` has its own data and splits)."""
    if not config.multitask.tasks:
        raise FinetuneError("multitask.tasks is empty; list the tasks, e.g. [{name: genre, "
                            "dataset: brown_genre}, {name: pos, task: token_classification, "
                            "dataset: brown_pos}] (see configs/multitask_brown.yaml)")
    return RunContext.shared(config, artifacts.Artifacts(config.run_dir).multitask(
        config.multitask.name))


def load_tasks(config: Config, tokenizer: TokenizerBundle) -> list[Task]:
    """Data and features of every task: the finetune stage's readers, and its features written
    once by the Beam job and streamed (pipeline/finetuning/records.py)."""
    out = []
    for spec in config_lib.multitask_tasks(config):
        fc = spec.finetune
        data = fd.load_task(fc)
        splits = records.write_or_reuse(dataclasses.replace(config, finetune=fc),
                                        task_registry.get(fc.task, fc), data, tokenizer)
        counts = data.splits["counts"]
        log.info(f"multitask: task {spec.name}: {fc.task} on {fc.dataset}: "
                 f"{counts['train']:,} train / {counts['validation']:,} validation / "
                 f"{counts['test']:,} test examples"
                 + (f", {len(data.labels)} labels" if data.labels else "")
                 + f"; loss weight {spec.weight}, sampling ratio {spec.sampling_ratio}")
        out.append(Task(spec, data, splits))
    return out


def build_models(tasks: list[Task], backbone, fc, total_steps: int):
    """One task model per task on the shared `backbone`, one optimizer over all of them."""
    optimizer = runtime.build_optimizer(fc, total_steps, knobs=False)  # a batch = an update
    for task in tasks:
        task.model = task.task.build_model(backbone, len(task.data.labels or []))
    if fc.freeze != "encoder" and any(t.task.pooled for t in tasks):
        # A task whose head skips the [CLS] pooler freezes it; a pooled head here uses it.
        backbone.pooled_dense.trainable = True
    for task in tasks:
        task.task.compile(task.model, optimizer, loss_weight=task.spec.weight)
    # One optimizer shared by the task models: built over every trainable variable (the
    # encoder once, each head), so each task's step updates the encoder and its own head.
    variables, seen = [], set()
    for task in tasks:
        for v in task.model.trainable_variables:
            if id(v) not in seen:
                seen.add(id(v))
                variables.append(v)
    optimizer.build(variables)
    return optimizer


def default_steps(tasks: list[Task], fc) -> int:
    """`finetune.epochs` passes over every task's training batches (capped by max_steps)."""
    steps = fc.epochs * sum(math.ceil(len(t.data.train) / fc.batch_size) for t in tasks)
    return min(steps, fc.max_steps) if fc.max_steps else steps


def evaluate_tasks(tasks: list[Task]) -> dict:
    """{task: {"metric", "validation": {...}, "test": {...}}} with the finetune evaluation."""
    out = {}
    for task in tasks:
        result = {"task": task.kind, "metric": task.data.metric}
        for split in ("validation", *task.data.tests):
            result[split] = task.task.evaluate(task.model, task.splits[split], task.data)[0]
        out[task.name] = result
    return out


def _floats(d: dict) -> dict:
    return {k: float(v) for k, v in d.items() if isinstance(v, (float, np.floating))}


def log_task_metrics(results: dict) -> None:
    flat = {}
    for name, result in results.items():
        for split in ("validation", "test"):
            flat.update({f"{name}.{split}_{k}": v for k, v in _floats(result[split]).items()})
    outbox.log_metrics(flat)


def single_task_baseline(ctx: RunContext, tasks: list[Task], task: Task, steps: int,
                         saved=None) -> dict:
    """`task` (one of `tasks`) alone, from a fresh copy of the same encoder, for the same
    steps, as a nested run (`saved`: its checkpoints)."""

    fc = ctx.fc
    keras.utils.set_random_seed(fc.seed)
    backbone = ctx.load_encoder(max(t.spec.finetune.max_seq_length for t in tasks))
    alone = Task(dataclasses.replace(task.spec, weight=1.0, sampling_ratio=1.0), task.data,
                 task.splits)
    with ctx.strategy.scope():
        build_models([alone], backbone, fc, steps)
    with runs.nested_run(f"single-task: {task.name}",
                         tags={"pipeline.stage": "multitask-single-task",
                               "multitask.task": task.name}) as child:
        if child is not None:
            runs.log_params({
                "multitask.task": task.name, "multitask.total_steps": steps,
                "finetune.learning_rate": fc.learning_rate,
                "finetune.batch_size": fc.batch_size, "finetune.seed": fc.seed})
        log.info(f"multitask: single-task baseline {task.name}: {steps} steps")
        train_mixed([alone], steps, fc, label=f"single {task.name}", saved=saved)
        result = evaluate_tasks([alone])[task.name]
        if child is not None:
            log_task_metrics({task.name: result})
            result["mlflow_run_id"] = child
    return result


def comparison(results: dict, tasks: list[Task]) -> list[dict]:
    """Per task: the selection metric on test, single-task vs multi-task, and the delta."""
    rows = []
    for task in tasks:
        metric = task.data.metric
        multi = float(results["multitask"][task.name]["test"][metric])
        single = float(results["single_task"][task.name]["test"][metric])
        rows.append({"task": task.name, "type": task.kind, "metric": metric,
                     "single_task": single, "multitask": multi, "delta": multi - single,
                     "weight": task.spec.weight,
                     "batches_multitask": results["batches"][task.name],
                     "batches_single_task": results["steps"]})
    return rows


def comparison_markdown(rows: list[dict]) -> str:
    lines = ["| task | type | test metric | single-task | multi-task | delta | "
             "batches (multi / single) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['type']} | {r['metric']} | {r['single_task']:.4f} | "
                     f"{r['multitask']:.4f} | {r['delta']:+.4f} | {r['batches_multitask']} / "
                     f"{r['batches_single_task']} |")
    return "\n".join(lines)


def write_and_log(ctx: RunContext, tasks: list[Task], results: dict) -> None:
    """<run_dir>/multitask/<name>/ (`ctx.paths`) written whole, then its files logged to
    MLflow."""
    config, paths, tokenizer = ctx.config, ctx.paths, ctx.tokenizer
    lowercase = tokenizer.lowercase
    with artifacts.atomic_dir(paths.dir) as tmp:
        out = artifacts.MultitaskArtifacts(tmp)
        for task in tasks:
            fc = task.spec.finetune
            folder = out.task(task.name)
            folder.dir.mkdir(parents=True)
            task.model.save(str(folder.model_keras))
            vocab_lib.write_beside_model(tokenizer.vocab_path, lowercase, folder.dir)
            task_config = dataclasses.replace(config, finetune=fc)
            info = outputs.task_info(task_config, task.data, lowercase, ctx.model_path)
            info["multitask"] = config.multitask.name
            folder.task_json.write_text(json.dumps(info, indent=2))
            folder.splits.write_text(json.dumps(task.data.splits, indent=2))
            folder.metrics.write_text(json.dumps(results["multitask"][task.name], indent=2,
                                                 default=float))
            if task.task.serving:  # `make predict` serves it as a finetune folder
                own = dataclasses.replace(tokenizer, max_seq_length=fc.max_seq_length)
                task.task.export(task.model, own.preprocessor, folder.saved_model, info)
        out.metrics.write_text(json.dumps(results, indent=2, default=float))
        out.config.write_text(config_lib.dump_yaml(config))
        if "comparison" in results:
            out.comparison_json.write_text(json.dumps(results["comparison"], indent=2))
            out.comparison_md.write_text(comparison_markdown(results["comparison"]) + "\n")
        artifacts.write_checksums(tmp)  # last
    log.info(f"multitask: wrote {paths.dir}")
    for path in (paths.metrics, paths.comparison_md, paths.comparison_json, paths.config):
        if path.exists():
            outbox.log_artifact(path, "multitask")
