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
     SavedModel, task.json, metrics.json, ...; outputs.write_and_log) plus distill.json, and
     the teacher-vs-student figures logged to MLflow.
"""

from __future__ import annotations

import json
import time

import keras

from pipeline import artifacts
from pipeline.config import Config
from pipeline.finetuning import distillation, outputs, runtime
from pipeline.tracking import outbox


def run(config: Config, write_outputs: bool = True) -> dict:
    dc = config.distill
    started = time.time()
    # 1. The teacher (an altered file: exit 2, named), its task, data and features.
    teacher, ctx = distillation.prepare(config)
    fc, data = ctx.fc, ctx.data

    # 2. The student.
    keras.utils.set_random_seed(dc.seed)
    student = distillation.build_student(teacher.model, ctx)
    per_epoch = runtime.updates_per_epoch(len(ctx.splits["train"]), fc)
    total_steps = min(per_epoch * fc.epochs, fc.max_steps or per_epoch * fc.epochs)
    distillation.describe(teacher, student, dc, total_steps)

    # 3. Train: the Distiller through fine-tuning's fit path, resuming from its checkpoints.
    distiller = distillation.Distiller(teacher.model, student.model, dc)
    distiller.compile(optimizer=runtime.build_optimizer(fc, total_steps, knobs=False),
                      **runtime.compile_options(fc))
    saved = distillation.checkpoints(ctx) if write_outputs else None
    history, best_epoch = distillation.train_student(ctx, distiller, student.model, total_steps,
                                                     saved)
    train_seconds = time.time() - started

    # 4. Teacher vs student on the same splits and inputs.
    results = {"task": "classification", "dataset": fc.dataset, "metric": data.metric,
               "best_epoch": best_epoch, "history": history}
    predictions = {}
    for split in ("validation", *data.tests):
        results[split], predictions[split] = ctx.task.evaluate(student.model, ctx.splits[split],
                                                               data)
    summary = distillation.compare(ctx, teacher, student, results, total_steps)
    results["distillation"] = summary
    results["seconds"] = round(time.time() - started, 1)
    results["train_seconds"] = round(train_seconds, 1)

    # 5. Outputs: the finetune layout (atomic), distill.json beside metrics.json.
    if write_outputs:
        outputs.write_and_log(ctx, student.model, results, predictions)
        artifacts.write_text_atomic(ctx.paths.distill_json, json.dumps(summary, indent=2,
                                                                       default=float))
        outbox.log_artifact(ctx.paths.distill_json, "distill")
        results["output_dir"] = str(ctx.paths.dir)
        saved.remove()  # the output folder is complete
    return results
