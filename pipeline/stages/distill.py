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
  3. training: the `Distiller` (pipeline/finetuning/distillation.py) trained by fine-tuning's
     `fit` path: per batch the teacher's logits (inference mode), the loss
     alpha · KL(teacher_T ‖ student_T) · T² + (1 − alpha) · CE(labels), plus optionally
     `hidden_weight` · MSE/cosine between hidden states ([CLS] of the last layer, or each
     student layer against its teacher layer), through a learned projection when the widths
     differ; AdamW with warmup and linear decay (runtime.build_optimizer); checkpoints (a
     killed run resumes), progress lines, the student's validation metric after every epoch
     and the best epoch kept;
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
import time

import keras

from models import preprocessor
from pipeline import artifacts
from pipeline.artifacts import Artifacts
from pipeline.config import Config
from pipeline.finetuning import data as fd
from pipeline.finetuning import distillation as distill_lib
from pipeline.finetuning import outputs, records, runtime, tasks
from pipeline.text import vocab as vocab_lib
from pipeline.tracking import outbox, runs

log = logging.getLogger(__name__)


def run(config: Config, write_outputs: bool = True) -> dict:
    dc = config.distill
    started = time.time()
    # 1. The teacher (an altered file: exit 2, named), its task, data and features.
    teacher = distill_lib.load_teacher(config)
    name = distill_lib.output_name(config, teacher.dir)
    fc = distill_lib.student_finetune_config(config, teacher.config.finetune, teacher.dir, name)
    student_config = dataclasses.replace(config, finetune=fc)
    keras.utils.set_random_seed(dc.seed)
    data = fd.load_task(fc)
    distill_lib.check_data(teacher, data)
    vocab_path, lowercase = teacher.paths.vocab_file, bool(teacher.info["lowercase"])
    vocab = vocab_lib.read_vocab(vocab_path)
    task = tasks.get("classification", fc)
    splits = records.write_or_reuse(student_config, task, data, vocab, vocab_path, lowercase)

    # 2. The student.
    keras.utils.set_random_seed(dc.seed)
    student, sizes, copied = distill_lib.build_student(teacher.model, dc, len(data.labels),
                                                       fc.dropout)
    per_epoch = runtime.updates_per_epoch(len(splits["train"]), fc)
    total_steps = min(per_epoch * fc.epochs, fc.max_steps or per_epoch * fc.epochs)
    tb = teacher.model.backbone
    log.info(f"distill: teacher {teacher.dir} ({tb.num_layers} layers, hidden {tb.hidden_dim}, "
             f"{teacher.model.count_params():,} parameters) -> student ({sizes['num_layers']} "
             f"layers, hidden {sizes['hidden_dim']}, {student.count_params():,} parameters, "
             + (f"initialised from teacher layers {copied}" if copied is not None
                else "random init")
             + f"); T={dc.temperature} alpha={dc.alpha} hidden={dc.hidden_loss}"
             f"{'/' + dc.hidden_match if dc.hidden_loss != 'none' else ''}; {total_steps} steps")
    runs.log_params({
        "distill.teacher_dir": str(teacher.dir),
        **{f"distill.student.{k}": v for k, v in sizes.items()},
        "distill.initialised_from_layers": str(copied), "distill.total_steps": total_steps})

    # 3. Train: the Distiller through fine-tuning's fit path, resuming from its checkpoints.
    distiller = distill_lib.Distiller(teacher.model, student, dc)
    distiller.compile(optimizer=runtime.build_optimizer(fc, total_steps, knobs=False),
                      **runtime.compile_options(fc))
    saved = (distill_lib.checkpoints(config, student_config, data, teacher, name)
             if write_outputs else None)
    history, best_epoch = distill_lib.train_student(distiller, student, splits, data, fc,
                                                    total_steps, saved)
    train_seconds = time.time() - started

    # 4. Teacher vs student on the same splits and inputs.
    results = {"task": "classification", "dataset": fc.dataset, "metric": data.metric,
               "best_epoch": best_epoch, "history": history}
    predictions = {}
    for split in ("validation", *data.tests):
        results[split], predictions[split] = task.evaluate(student, splits[split], data)
    summary = distill_lib.compare(teacher, student, splits, data, results, sizes, copied, dc,
                                  fc, total_steps)
    results["distillation"] = summary
    results["seconds"] = round(time.time() - started, 1)
    results["train_seconds"] = round(train_seconds, 1)

    # 5. Outputs: the finetune layout (atomic), distill.json beside metrics.json.
    if write_outputs:
        paths = Artifacts(config.run_dir).distill(name)
        pre = preprocessor.TextPreprocessor(vocab, lowercase, teacher.info["max_seq_length"])
        outputs.write_and_log(student_config, paths, student, pre, data, results, predictions,
                              splits, vocab_path, lowercase)
        artifacts.write_text_atomic(paths.distill_json, json.dumps(summary, indent=2,
                                                                   default=float))
        outbox.log_artifact(paths.distill_json, "distill")
        results["output_dir"] = str(paths.dir)
        saved.remove()  # the output folder is complete
    return results
