"""Stage `multitask`: one shared pretrained encoder, one head per task, batches mixed by ratio.

Reads top to bottom:
  1. the tasks of `multitask.tasks`, each a `finetune` section with its own data keys
     (pipeline/config/load.py `multitask_tasks`): examples, labels and seeded splits through the
     finetune stage's readers and features (pipeline/finetuning/data.py, the task class's
     `make_split`: pipeline/finetuning/tasks/);
  2. one encoder (`finetune.init_from`, else <run_dir>/pretrain/model.keras) shared by one task
     model per task (the task class's `build_model`), each compiled with its task's loss
     scaled by the task's `weight` (the task class's `compile`), all updated by one
     AdamW optimizer with one warmup/decay schedule (`runtime.build_optimizer`);
  3. the batch schedule: `tf.data.Dataset.choose_from_datasets` over the tasks' batches, the
     task ids drawn by `sample_from_datasets`, weighted by the normalised `sampling_ratio`s and
     seeded per epoch (multitask.TaskMix); `fit` trains the MultitaskModel, whose train step
     routes each batch to its task's model: fine-tuning's `fit` path, with checkpoints (a
     killed run resumes), progress lines and the best epoch (the tasks' mean validation
     metric) kept;
  4. validation and test metrics per task (the task class's `evaluate`), logged to MLflow prefixed by the
     task name (`genre.test_macro_f1`);
  5. with `multitask.compare_single_task`: each task trained alone from the same encoder with the
     same steps and hyperparameters, as a nested MLflow run; a comparison table (comparison.md,
     comparison.json) and the per-task deltas (`genre.delta_test_macro_f1`, multi − single);
  6. <run_dir>/multitask/<name>/ written whole (pipeline/artifacts.py MultitaskArtifacts).
"""

from __future__ import annotations

import logging
import time

import keras

from pipeline.config import Config
from pipeline.finetuning import multitask as mt
from pipeline.tracking import outbox, runs

log = logging.getLogger(__name__)


def run(config: Config, write_outputs: bool = True) -> dict:
    mc, fc = config.multitask, config.finetune
    started = time.time()
    keras.utils.set_random_seed(fc.seed)
    ctx = mt.context(config)  # the shared encoder and vocab, the strategy, the output folder
    tasks = mt.load_tasks(config, ctx.tokenizer)
    steps = mc.steps or mt.default_steps(tasks, fc)
    ratios = mt.normalized_ratios([t.spec.sampling_ratio for t in tasks])
    log.info(f"multitask: {len(tasks)} tasks on {ctx.model_path}, {steps} steps of batch "
             f"{fc.batch_size}, lr {fc.learning_rate}; batch shares " +
             ", ".join(f"{t.name} {r:.2f}" for t, r in zip(tasks, ratios)))
    runs.log_params({
        "multitask.total_steps": steps, "multitask.init_model": str(ctx.model_path),
        **{f"multitask.{t.name}.weight": t.spec.weight for t in tasks},
        **{f"multitask.{t.name}.sampling_share": round(r, 6) for t, r in zip(tasks, ratios)},
        **{f"multitask.{t.name}.train_examples": len(t.data.train) for t in tasks}})

    def saved(name):  # checkpoints (the stage's run): a re-run resumes there
        return mt.checkpoints(ctx, tasks, name) if write_outputs else None

    # Multi-task training.
    keras.utils.set_random_seed(fc.seed)
    backbone = ctx.load_encoder(max(t.spec.finetune.max_seq_length for t in tasks))
    with ctx.strategy.scope():
        mt.build_models(tasks, backbone, fc, steps)
    trained = mt.train_mixed(tasks, steps, fc, saved=saved("mixed"))
    results = {"steps": steps, "batches": trained["batches"], "best_epoch": trained["best_epoch"],
               "history": trained["history"],
               "sampling_shares": {t.name: r for t, r in zip(tasks, ratios)},
               "weights": {t.name: t.spec.weight for t in tasks},
               "multitask": mt.evaluate_tasks(tasks)}
    log.info("multitask: batches per task " + ", ".join(f"{n} {c}" for n, c in
                                                        trained["batches"].items()))
    mt.log_task_metrics(results["multitask"])
    outbox.log_metrics({f"{n}.batches": c for n, c in trained["batches"].items()})

    # Single-task baselines: same encoder, steps and hyperparameters, one task each.
    if mc.compare_single_task:
        results["single_task"] = {t.name: mt.single_task_baseline(ctx, tasks, t, steps,
                                                                  saved(f"single-{t.name}"))
                                  for t in tasks}
        results["comparison"] = mt.comparison(results, tasks)
        log.info("multitask: comparison (test)\n" + mt.comparison_markdown(results["comparison"]))
        outbox.log_metrics({f"{row['task']}.delta_test_{row['metric']}": row["delta"]
                            for row in results["comparison"]})
    for name, result in results["multitask"].items():
        metric = result["metric"]
        log.info(f"multitask: {name} test {metric} {result['test'][metric]:.4f} (multi-task)")
    results["seconds"] = round(time.time() - started, 1)

    if write_outputs:
        mt.write_and_log(ctx, tasks, results)
        results["output_dir"] = str(ctx.paths.dir)
        for name in ("mixed", *(f"single-{t.name}" for t in tasks)):
            saved(name).remove()  # the output folder is complete
    return results
