"""Stage `distill`: a smaller student BERT trained on a fine-tuned classifier's soft targets.

Reads top to bottom:
  1. the teacher: a folder written by the finetune stage (`distill.teacher`, default
     <run_dir>/finetune/brown_genre): model.keras, vocab.txt, task.json, config.yaml; its
     task must be classification. The data and splits are the teacher's own (its config's
     finetune section through pipeline/finetuning/data.py), so the test split is the same;
  2. the student encoder (models/distill.py): a preset size or the teacher's sizes with
     overrides (default: half the layers); with equal widths it starts from the teacher's
     embeddings, pooler and every other Transformer layer (`distill.init_from_teacher`);
     a BertClassifier head on it (models/heads.py);
  3. training: per batch the teacher's logits (inference mode), the loss
     alpha · KL(teacher_T ‖ student_T) · T² + (1 − alpha) · CE(labels), plus optionally
     `hidden_weight` · MSE/cosine between hidden states ([CLS] of the last layer, or each
     student layer against its teacher layer), through a learned projection when the widths
     differ; AdamW with warmup and linear decay (runtime.build_optimizer);
  4. teacher and student on the same validation/test split (finetune.evaluate), their parameter
     counts and inference speed (examples/s, `predict` on the same test inputs, this process);
  5. <run_dir>/distill/<name>/ written whole like a finetune folder (model.keras, raw-text
     SavedModel, task.json, metrics.json, ...; finetune.write_and_log) plus distill.json, and
     the teacher-vs-student figures logged to MLflow.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time

import keras
import mlflow

import models
from models import distill as distill_lib
from models import heads
from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.artifacts import Artifacts, FinetuneArtifacts
from pipeline.config import Config
from pipeline.finetuning import data as fd
from pipeline.finetuning import outputs, records, runtime, tasks
from pipeline.finetuning.distillation import (
    SPEED_EXAMPLES,
    Distiller,
    DistillError,
    examples_per_second,
    output_name,
    student_finetune_config,
    teacher_folder,
    train_student,
)
from models import preprocessor
from pipeline.text import vocab as vocab_lib

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------
def run(config: Config, write_outputs: bool = True) -> dict:
    dc = config.distill
    started = time.time()
    teacher_dir = teacher_folder(config)
    # The teacher as the finetune stage wrote it (an altered file: exit 2, named).
    artifacts.verify_checksums(teacher_dir, f"make finetune ARGS=--force  (the teacher "
                                            f"{teacher_dir.name})")
    tpaths = FinetuneArtifacts(teacher_dir)
    info = json.loads(tpaths.task_json.read_text())
    if not tasks.get(info.get("task")).distillable:
        raise DistillError(f"distill.teacher = {teacher_dir} is a {info.get('task')!r} model; "
                           f"distillation here needs a classification teacher (finetune.task = "
                           f"classification)")
    teacher_config = config_lib.load(tpaths.config)
    name = output_name(config, teacher_dir)
    fc = student_finetune_config(config, teacher_config.finetune, teacher_dir, name)
    student_config = dataclasses.replace(config, finetune=fc)
    keras.utils.set_random_seed(dc.seed)

    # 1. Data: the teacher's task, splits and features.
    data = fd.load_task(fc)
    if data.labels != info["labels"]:
        raise DistillError(f"the labels of the teacher's data ({data.labels}) differ from its "
                           f"task.json ({info['labels']}); was the data changed since "
                           f"{teacher_dir} was trained?")
    vocab_path = tpaths.vocab_file
    lowercase = bool(info["lowercase"])
    pre = preprocessor.TextPreprocessor(vocab_lib.read_vocab(vocab_path), lowercase, info["max_seq_length"])
    task = tasks.get("classification", fc)  # the teacher's task
    # The teacher's features (the same key: its folder is reused), streamed.
    splits = records.write_or_reuse(student_config, task, data, vocab_lib.read_vocab(vocab_path),
                                    vocab_path, lowercase)

    # 2. Teacher and student.
    teacher = models.load_keras(tpaths.model_keras, compile=False)
    if not isinstance(teacher, heads.BertClassifier):
        raise DistillError(f"{tpaths.model_keras} holds a {type(teacher).__name__}, not a "
                           f"BertClassifier")
    tb = teacher.backbone
    sizes = distill_lib.student_sizes(tb, dc.student_preset, num_layers=dc.num_layers,
                                      hidden_dim=dc.hidden_dim, num_heads=dc.num_heads,
                                      intermediate_dim=dc.intermediate_dim)
    if sizes["hidden_dim"] % sizes["num_heads"]:
        raise DistillError(f"student hidden size {sizes['hidden_dim']} is not divisible by "
                           f"{sizes['num_heads']} heads; set distill.num_heads")
    student_backbone = distill_lib.build_student(tb, sizes)
    copied = None
    can_copy = (distill_lib.same_widths(student_backbone, tb)
                and student_backbone.num_layers <= tb.num_layers)
    if dc.init_from_teacher == "true" and not can_copy:
        raise DistillError(f"distill.init_from_teacher = true needs the student's widths "
                           f"(hidden/heads/intermediate {sizes['hidden_dim']}/{sizes['num_heads']}/"
                           f"{sizes['intermediate_dim']}) equal to the teacher's ({tb.hidden_dim}/"
                           f"{tb.num_heads}/{tb.intermediate_dim}) and no more layers; use auto "
                           f"or false")
    if dc.init_from_teacher != "false" and can_copy:
        copied = distill_lib.init_from_teacher(student_backbone, tb)
    student = heads.BertClassifier(student_backbone, len(data.labels), dropout=fc.dropout)
    if copied is not None:  # the teacher's classifier too, when the student starts from it
        student.output_dense.set_weights(teacher.output_dense.get_weights())
    n_train = len(data.train)
    steps_per_epoch = math.ceil(n_train / fc.batch_size)
    total_steps = steps_per_epoch * fc.epochs
    if fc.max_steps:
        total_steps = min(total_steps, fc.max_steps)
    params = {"teacher": teacher.count_params(), "student": student.count_params()}
    log.info(f"distill: teacher {teacher_dir} ({tb.num_layers} layers, hidden {tb.hidden_dim}, "
             f"{params['teacher']:,} parameters) -> student ({sizes['num_layers']} layers, hidden "
             f"{sizes['hidden_dim']}, {params['student']:,} parameters, "
             + (f"initialised from teacher layers {copied}" if copied is not None
                else "random init")
             + f"); T={dc.temperature} alpha={dc.alpha} hidden={dc.hidden_loss}"
             f"{'/' + dc.hidden_match if dc.hidden_loss != 'none' else ''}; {total_steps} steps")
    if mlflow.active_run():
        mlflow.log_params({"distill.teacher_dir": str(teacher_dir),
                           **{f"distill.student.{k}": v for k, v in sizes.items()},
                           "distill.initialised_from_layers": str(copied),
                           "distill.total_steps": total_steps})

    # 3. Train.
    optimizer = runtime.build_optimizer(fc, total_steps, knobs=False)  # a batch = an update
    distiller = Distiller(teacher, student, dc, optimizer)
    history = train_student(distiller, splits["train"], fc.batch_size, total_steps, dc.seed)
    train_seconds = time.time() - started

    # 4. Teacher vs student on the same splits and inputs.
    results = {"task": "classification", "dataset": fc.dataset, "metric": data.metric,
               "best_epoch": None, "history": history}
    predictions, teacher_results = {}, {}
    for split in ("validation", *data.tests):
        results[split], predictions[split] = task.evaluate(student, splits[split], data)
        teacher_results[split] = task.evaluate(teacher, splits[split], data)[0]
    speed_batch = 2 * fc.batch_size
    speed_x = next(splits["test"].batches(SPEED_EXAMPLES))[1]
    speed = {"teacher": examples_per_second(teacher, speed_x, speed_batch),
             "student": examples_per_second(student, speed_x, speed_batch)}
    metric = data.metric
    summary = {
        "metric": f"test_{metric}",
        "teacher": {"dir": str(teacher_dir), f"test_{metric}": teacher_results["test"][metric],
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
    results["teacher"] = teacher_results
    results["distillation"] = summary
    results["seconds"] = round(time.time() - started, 1)
    results["train_seconds"] = round(train_seconds, 1)
    log.info(f"distill: test {metric}: teacher {summary['teacher'][f'test_{metric}']:.4f}, student "
             f"{summary['student'][f'test_{metric}']:.4f}; parameters {params['teacher']:,} -> "
             f"{params['student']:,} ({summary['parameter_ratio']:.2f}x); "
             f"{speed['teacher']:,.0f} -> {speed['student']:,.0f} examples/s "
             f"({summary['speedup']:.2f}x)")
    if mlflow.active_run():
        mlflow.log_metrics({
            f"teacher_test_{metric}": summary["teacher"][f"test_{metric}"],
            f"student_test_{metric}": summary["student"][f"test_{metric}"],
            "teacher_parameters": params["teacher"], "student_parameters": params["student"],
            "teacher_examples_per_second": speed["teacher"],
            "student_examples_per_second": speed["student"],
            "parameter_ratio": summary["parameter_ratio"], "speedup": summary["speedup"],
            **{f"teacher_{split}_{k}": v for split, r in teacher_results.items()
               for k, v in r.items() if isinstance(v, float)}})

    # 5. Outputs: the finetune layout (atomic), distill.json beside metrics.json.
    if write_outputs:
        paths = Artifacts(config.run_dir).distill(name)
        outputs.write_and_log(student_config, paths, student, pre, data, results, predictions,
                              splits, vocab_path, lowercase)
        artifacts.write_text_atomic(paths.distill_json, json.dumps(summary, indent=2,
                                                                   default=float))
        if mlflow.active_run():
            mlflow.log_artifact(str(paths.distill_json), "distill")
        results["output_dir"] = str(paths.dir)
    return results
