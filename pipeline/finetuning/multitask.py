"""Multi-task fine-tuning: one shared encoder, a head per task, batches mixed across tasks by
ratio, each task also trained alone as a baseline; the comparison table.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
import warnings

import keras
import mlflow
import numpy as np

from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.config import Config
from pipeline.finetuning import data as fd
from pipeline.finetuning import outputs, readers, records, runtime
from pipeline.finetuning import tasks as task_registry
from models import preprocessor
from pipeline.text import vocab as vocab_lib

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


def task_batches(split, batch_size: int, seed: int):
    """An endless, reshuffled stream of full (x, y, sample_weight) batches of one task: its
    TFRecords streamed (records.RecordSplit), or a Split in memory."""
    import tensorflow as tf

    if hasattr(split, "dataset"):
        return split.dataset(batch_size, records.SHUFFLE_BUFFER, seed)

    n = len(next(iter(split.x.values())))
    parts = (split.x, split.y) + ((split.sample_weight,) if split.sample_weight else ())
    ds = tf.data.Dataset.from_tensor_slices(parts)
    ds = ds.shuffle(n, seed=seed, reshuffle_each_iteration=True).repeat()
    return ds.batch(batch_size, drop_remainder=True).prefetch(2)


def train_mixed(tasks: list[Task], steps: int, batch_size: int, seed: int,
                label: str = "multitask", progress_every: int = 50) -> dict:
    """`steps` optimizer steps, each on one batch of the task the schedule draws.

    Returns {"batches": {task: count}, "train_loss": {task: mean loss of its last batches}}.
    """
    streams = {t.name: iter(task_batches(t.splits["train"], batch_size, seed + i))
               for i, t in enumerate(tasks)}
    schedule = iter(task_schedule([t.spec.sampling_ratio for t in tasks], seed))
    counts = {t.name: 0 for t in tasks}
    recent = {t.name: [] for t in tasks}
    started = time.time()
    for step in range(1, steps + 1):
        task = tasks[int(next(schedule))]
        batch = next(streams[task.name])
        x, y = batch[0], batch[1]
        weights = batch[2] if len(batch) == 3 else None
        with warnings.catch_warnings():  # a token task's step leaves the shared pooler alone
            warnings.filterwarnings("ignore", message=".*Gradients do not exist for variables.*")
            logs = task.model.train_on_batch(x, y, sample_weight=weights, return_dict=True)
        counts[task.name] += 1
        recent[task.name] = (recent[task.name] + [float(logs["loss"])])[-20:]
        if step % progress_every == 0 or step == steps:
            rate = step * batch_size / max(time.time() - started, 1e-9)
            losses = {n: float(np.mean(v)) for n, v in recent.items() if v}
            log.info(f"{label}: step {step}/{steps}  " +
                     "  ".join(f"{n} loss {v:.4f}" for n, v in losses.items()) +
                     f"  {rate:,.0f} examples/s")
            if mlflow.active_run():
                mlflow.log_metrics({f"{n}.train_loss": v for n, v in losses.items()}, step=step)
    return {"batches": counts,
            "train_loss": {n: float(np.mean(v)) if v else float("nan") for n, v in recent.items()}}


# ---------------------------------------------------------------------------
# Building the models
# ---------------------------------------------------------------------------
def load_tasks(config: Config, vocab: list, vocab_path, lowercase: bool) -> list[Task]:
    """Data and features of every task: the finetune stage's readers, and its features written
    once by the Beam job and streamed (pipeline/finetuning/records.py)."""
    out = []
    for spec in config_lib.multitask_tasks(config):
        fc = spec.finetune
        data = fd.load_task(fc)
        splits = records.write_or_reuse(dataclasses.replace(config, finetune=fc),
                                        task_registry.get(fc.task, fc), data, vocab, vocab_path,
                                        lowercase)
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


def _log_task_metrics(results: dict) -> None:
    flat = {}
    for name, result in results.items():
        for split in ("validation", "test"):
            flat.update({f"{name}.{split}_{k}": v for k, v in _floats(result[split]).items()})
    mlflow.log_metrics(flat)


def single_task_baseline(config: Config, task: Task, fresh_backbone, steps: int, strategy) -> dict:
    """`task` alone, from a fresh copy of the same encoder, for the same steps, as a nested run."""
    fc = config.finetune
    keras.utils.set_random_seed(fc.seed)
    backbone = fresh_backbone()
    alone = Task(dataclasses.replace(task.spec, weight=1.0, sampling_ratio=1.0), task.data,
                 task.splits)
    with strategy.scope():
        build_models([alone], backbone, fc, steps)
    parent = mlflow.active_run()
    context = (mlflow.start_run(run_name=f"single-task: {task.name}", nested=True,
                                experiment_id=parent.info.experiment_id,
                                tags={"pipeline.stage": "multitask-single-task",
                                      "multitask.task": task.name})
               if parent else _null())
    with context as child:
        if child is not None:
            mlflow.log_params({"multitask.task": task.name, "multitask.total_steps": steps,
                               "finetune.learning_rate": fc.learning_rate,
                               "finetune.batch_size": fc.batch_size, "finetune.seed": fc.seed})
        log.info(f"multitask: single-task baseline {task.name}: {steps} steps")
        train_mixed([alone], steps, fc.batch_size, fc.seed, label=f"single {task.name}")
        result = evaluate_tasks([alone])[task.name]
        if child is not None:
            _log_task_metrics({task.name: result})
            result["mlflow_run_id"] = child.info.run_id
    return result


def _null():
    import contextlib

    return contextlib.nullcontext()


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


def write_and_log(config, paths, tasks, results, vocab_path, lowercase, model_path) -> None:
    """<run_dir>/multitask/<name>/ written whole, then its files logged to MLflow."""
    with artifacts.atomic_dir(paths.dir) as tmp:
        out = artifacts.MultitaskArtifacts(tmp)
        for task in tasks:
            fc = task.spec.finetune
            folder = out.task(task.name)
            folder.dir.mkdir(parents=True)
            task.model.save(str(folder.model_keras))
            vocab_lib.write_beside_model(vocab_path, lowercase, folder.dir)
            task_config = dataclasses.replace(config, finetune=fc)
            info = outputs.task_info(task_config, task.data, lowercase, model_path)
            info["multitask"] = config.multitask.name
            folder.task_json.write_text(json.dumps(info, indent=2))
            folder.splits.write_text(json.dumps(task.data.splits, indent=2))
            folder.metrics.write_text(json.dumps(results["multitask"][task.name], indent=2,
                                                 default=float))
            if task.task.serving:  # `make predict` serves it as a finetune folder
                pre = preprocessor.TextPreprocessor(vocab_lib.read_vocab(vocab_path), lowercase,
                                                    fc.max_seq_length)
                task.task.export(task.model, pre, folder.saved_model, task.data.labels,
                                 info["pair"], info)
        out.metrics.write_text(json.dumps(results, indent=2, default=float))
        out.config.write_text(config_lib.dump_yaml(config))
        if "comparison" in results:
            out.comparison_json.write_text(json.dumps(results["comparison"], indent=2))
            out.comparison_md.write_text(comparison_markdown(results["comparison"]) + "\n")
        artifacts.write_checksums(tmp)  # last
    log.info(f"multitask: wrote {paths.dir}")
    if not mlflow.active_run():
        return
    for path in (paths.metrics, paths.comparison_md, paths.comparison_json, paths.config):
        if path.exists():
            mlflow.log_artifact(str(path), "multitask")
