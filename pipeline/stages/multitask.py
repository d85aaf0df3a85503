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

from pipeline.artifacts import Artifacts
from pipeline.config import Config
from pipeline.finetuning import task_model
from pipeline.finetuning.multitask import (
    build_models,
    checkpoints,
    comparison,
    comparison_markdown,
    default_steps,
    evaluate_tasks,
    load_tasks,
    log_task_metrics,
    normalized_ratios,
    single_task_baseline,
    train_mixed,
    write_and_log,
)
from pipeline.finetuning.task_model import FinetuneError
from pipeline.text import vocab as vocab_lib
from pipeline.tracking import outbox, runs

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------
def run(config: Config, write_outputs: bool = True) -> dict:
    from pipeline.training import strategy as strategy_lib

    mc, fc = config.multitask, config.finetune
    started = time.time()
    if not mc.tasks:
        raise FinetuneError("multitask.tasks is empty; list the tasks, e.g. [{name: genre, "
                            "dataset: brown_genre}, {name: pos, task: token_classification, "
                            "dataset: brown_pos}] (see configs/multitask_brown.yaml)")
    keras.utils.set_random_seed(fc.seed)
    model_path, vocab_path = task_model.resolve_init(config)
    vocab = vocab_lib.read_vocab(vocab_path)
    lowercase = vocab_lib.vocab_lowercase(vocab_path, config.vocab.lowercase)
    tasks = load_tasks(config, vocab, vocab_path, lowercase)
    steps = mc.steps or default_steps(tasks, fc)
    strategy = strategy_lib.make_strategy(config.train.strategy, config.train.tpu,
                                         config.train.allow_cpu)

    def fresh_backbone():
        with strategy.scope():
            backbone = task_model.load_backbone(model_path)
        if backbone.vocabulary_size != len(vocab):
            raise FinetuneError(f"the encoder in {model_path} has {backbone.vocabulary_size} "
                                f"token embeddings but {vocab_path} has {len(vocab)} tokens; "
                                f"give the vocab it was trained with (finetune.vocab_file)")
        longest = max(t.spec.finetune.max_seq_length for t in tasks)
        if longest > backbone.max_sequence_length:
            raise FinetuneError(f"a task's max_seq_length ({longest}) exceeds the encoder's "
                                f"{backbone.max_sequence_length} positions ({model_path})")
        return backbone

    ratios = normalized_ratios([t.spec.sampling_ratio for t in tasks])
    log.info(f"multitask: {len(tasks)} tasks on {model_path}, {steps} steps of batch "
             f"{fc.batch_size}, lr {fc.learning_rate}; batch shares " +
             ", ".join(f"{t.name} {r:.2f}" for t, r in zip(tasks, ratios)))
    runs.log_params({
        "multitask.total_steps": steps, "multitask.init_model": str(model_path),
        **{f"multitask.{t.name}.weight": t.spec.weight for t in tasks},
        **{f"multitask.{t.name}.sampling_share": round(r, 6) for t, r in zip(tasks, ratios)},
        **{f"multitask.{t.name}.train_examples": len(t.data.train) for t in tasks}})

    def saved(name):  # checkpoints (the stage's run): a re-run resumes there
        return (checkpoints(config, tasks, model_path, vocab_path, name) if write_outputs
                else None)

    # Multi-task training.
    keras.utils.set_random_seed(fc.seed)
    backbone = fresh_backbone()
    with strategy.scope():
        build_models(tasks, backbone, fc, steps)
    trained = train_mixed(tasks, steps, fc.batch_size, fc.seed, saved=saved("mixed"))
    results = {"steps": steps, "batches": trained["batches"], "best_epoch": trained["best_epoch"],
               "history": trained["history"],
               "sampling_shares": {t.name: r for t, r in zip(tasks, ratios)},
               "weights": {t.name: t.spec.weight for t in tasks},
               "multitask": evaluate_tasks(tasks)}
    log.info("multitask: batches per task " + ", ".join(f"{n} {c}" for n, c in
                                                        trained["batches"].items()))
    log_task_metrics(results["multitask"])
    outbox.log_metrics({f"{n}.batches": c for n, c in trained["batches"].items()})

    # Single-task baselines: same encoder, steps and hyperparameters, one task each.
    if mc.compare_single_task:
        results["single_task"] = {}
        for task in tasks:
            results["single_task"][task.name] = single_task_baseline(
                config, task, fresh_backbone, steps, strategy, saved(f"single-{task.name}"))
        results["comparison"] = comparison(results, tasks)
        log.info("multitask: comparison (test)\n" + comparison_markdown(results["comparison"]))
        outbox.log_metrics({f"{row['task']}.delta_test_{row['metric']}": row["delta"]
                            for row in results["comparison"]})
    for name, result in results["multitask"].items():
        metric = result["metric"]
        log.info(f"multitask: {name} test {metric} {result['test'][metric]:.4f} (multi-task)")
    results["seconds"] = round(time.time() - started, 1)

    if write_outputs:
        paths = Artifacts(config.run_dir).multitask(mc.name)
        write_and_log(config, paths, tasks, results, vocab_path, lowercase, model_path)
        results["output_dir"] = str(paths.dir)
        for name in ("mixed", *(f"single-{t.name}" for t in tasks)):
            saved(name).remove()  # the output folder is complete
    return results
