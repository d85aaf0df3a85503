"""One fine-tuning run: the steps of the finetune stage, shared with the sweep (one per point).

Reads top to bottom:
  1. the task's examples, label set and fixed seeded splits (pipeline/finetuning/data.py);
  2. the pretrained encoder: `finetune.init_from`, else <run_dir>/pretrain/model.keras, and
     its vocab; the features of every split as TFRecords, written once by a Beam job with
     the tokenizer contract's pure-Python tokenizer (the ids the exported in-graph tokenizer
     gives) and reused while nothing they depend on changes (pipeline/finetuning/records.py);
     training and evaluation stream them;
  3. inside the tf.distribute strategy: the task model (models/heads.py) on that encoder, the
     freeze strategy, AdamW with linear warmup and decay;
  4. `model.fit` for `epochs` (or `max_steps`, or until `max_seconds` of training), the
     validation metric after every epoch, the best epoch's weights kept;
  5. validation and test metrics (pipeline/finetuning/metrics.py), the baselines on the same
     test split (majority class, bag-of-words logistic regression; per task), a
     confusion-matrix PNG;
  6. with `write_outputs`: <run_dir>/finetune/<name>/ written whole (model.keras, raw-text
     SavedModel unless `finetune.export` is false, metrics, splits, ...), logged to MLflow;
     the SavedModel logged as a pyfunc model and registered (pipeline/finetuning/outputs.py).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

import keras
import numpy as np

from pipeline import config as config_lib
from pipeline.config import Config
from pipeline.finetuning import runtime, tasks
from pipeline.finetuning.context import RunContext
from pipeline.finetuning.outputs import _report, compare_with_baselines, write_and_log
from pipeline.finetuning.task_model import FinetuneError
from pipeline.tracking import outbox
from pipeline.training.callbacks import EpochEvaluator

log = logging.getLogger(__name__)


NOTES_SAMPLE = 2000  # training examples whose features the log's notes describe


def fine_tune(config: Config, write_outputs: bool = True, evaluate_test: bool = True,
              recipe: dict | None = None) -> dict:
    """Fine-tunes, evaluates and (if `write_outputs`) writes + logs + registers the model.

    `evaluate_test` false (a point of recipe auto's search): the test split(s) are not
    evaluated, so nothing chosen from the results can have seen them. `recipe`: what recipe
    auto tried and chose (pipeline/finetuning/recipe.py), kept in the results (metrics.json)."""
    fc = config.finetune
    task = tasks.get(fc.task, fc)
    if write_outputs and task.serving and fc.register_model and not fc.export:
        raise FinetuneError("finetune.register_model = true registers the raw-text SavedModel, "
                            "which finetune.export = false does not write; set "
                            "finetune.export=true or finetune.register_model=false")
    started = time.time()
    for warning in config_lib.finetune_warnings(config):
        log.info(f"finetune: warning: {warning}")
    keras.utils.set_random_seed(fc.seed)

    # 1. Data; 2. encoder, vocab, features.
    ctx = RunContext.build(config)
    task, data, model_path = ctx.task, ctx.data, ctx.model_path  # one task: what `keep` told
    counts = data.splits["counts"]
    glue_task = f" ({fc.glue_task})" if fc.glue_task else ""
    log.info(f"finetune: {task.name} on {fc.dataset}{glue_task}: {counts['train']:,} train / "
             f"{counts['validation']:,} validation / {counts['test']:,} test examples"
             + (f", {len(data.labels)} labels" if data.labels else ""))
    backbone = ctx.load_encoder(fc.max_seq_length, fc.precision)
    # The features of every split: TFRecords written once by a Beam job (the same for the
    # same task settings, vocab and examples: reused), streamed by tf.data from here on.
    ctx = ctx.with_features()
    sample = data.train[:NOTES_SAMPLE]  # what the features cut, on a sample in memory
    for note in task.notes(lambda: task.make_split(sample, ctx.tokenizer.preprocessor,
                                                   data.labels, data.pair)):
        log.info(f"finetune: {note}" + (f" (in the first {len(sample):,} training examples)"
                                        if len(sample) < len(data.train) else ""))

    # 3. Model and optimizer. Seeded again: the Beam job that writes the features (when
    # they are not reused) draws from the global generators, by a varying amount.
    keras.utils.set_random_seed(fc.seed)
    steps_per_epoch = runtime.updates_per_epoch(len(ctx.splits["train"]), fc)  # × grad_accum
    total_steps = steps_per_epoch * fc.epochs
    if fc.max_steps:
        total_steps = min(total_steps, fc.max_steps)
    epochs = math.ceil(total_steps / steps_per_epoch)
    with ctx.strategy.scope():
        model, encoder = build_trainable(ctx, backbone, total_steps)
    trainable = int(sum(np.prod(v.shape) for v in model.trainable_weights))
    log.info(f"finetune: {model_path} → {type(encoder).__name__}, {encoder.count_params():,} "
             f"parameters ({trainable:,} trainable, freeze={fc.freeze}); {total_steps} steps "
             f"({epochs} epoch(s) of {steps_per_epoch}), {runtime.describe(fc, model)}, "
             f"lr {fc.learning_rate}")
    outbox.log_params({"finetune.parameters": encoder.count_params(),
                       "finetune.trainable_parameters": trainable,
                       "finetune.total_steps": total_steps,
                       "finetune.init_model": str(model_path),
                       **{f"finetune.examples.{k}": v for k, v in counts.items()}})

    # 4. Train, keeping the best epoch by the validation metric; checkpoints (the stage's run,
    # not a sweep's points) in finetune/.checkpoints/<name>/: a re-run resumes there.
    checkpoints = runtime.Checkpoints.for_run(ctx) if write_outputs else None
    plan = runtime.FitPlan(fc, total_steps, epochs, fc.max_seconds, checkpoints)
    evaluator = train_best_epoch(ctx, (model, encoder), plan)
    train_seconds = time.time() - started

    # 5. Evaluate: validation, test(s), baselines.
    results = {"task": task.name, "dataset": fc.dataset, "metric": data.metric,
               "best_epoch": evaluator.best_epoch, "history": evaluator.history,
               "learning_rate": fc.learning_rate, "planned_steps": total_steps,
               "trained_steps": int(evaluator.history[-1]["step"]) if evaluator.history else 0,
               "max_seconds": fc.max_seconds, "stopped_for_time": evaluator.stopped_for_time}
    if recipe is not None:
        results["recipe"] = recipe
    predictions = {}
    results["validation"] = evaluator.best_result  # the kept epoch's validation metrics
    for name in (data.tests if evaluate_test else ()):
        results[name], predictions[name] = task.evaluate(model, ctx.splits[name], data, encoder)
    if fc.baselines and evaluate_test:
        results["baselines"] = task.baselines(data, fc.seed)
        if fc.random_init_baseline:  # what pretraining bought: the same model from scratch
            results["baselines"]["random_init"] = random_init_baseline(
                ctx, (model, encoder), backbone, plan)
        compare_with_baselines(results, task, data.metric)
    results["seconds"] = round(time.time() - started, 1)
    results["train_seconds"] = round(train_seconds, 1)
    _report(results, data)

    if write_outputs:
        write_and_log(ctx, encoder, results, predictions)
        results["output_dir"] = str(ctx.paths.dir)
        checkpoints.remove()  # the output folder is complete
    return results


def build_trainable(ctx: RunContext, backbone, total_steps: int):
    """(the model `fit` trains, the task model it contains), compiled; call in the strategy
    scope. They differ where the task trains a wrapper (semantic search: a bi-encoder trainer
    around the encoder)."""
    task, fc = ctx.task, ctx.fc
    encoder = task.build_model(backbone, len(ctx.data.labels or []))
    model = task.trainer(encoder)
    task.compile(model, runtime.build_optimizer(fc, total_steps), **runtime.compile_options(fc))
    return model, encoder


def train_best_epoch(ctx: RunContext, trainable: tuple, plan: runtime.FitPlan,
                     label: str = "finetune", to_mlflow: bool = True) -> EpochEvaluator:
    """`model.fit` of `trainable` (`build_trainable`'s pair) for `plan.epochs` (at most
    `plan.total_steps` updates), the validation metric after every epoch; the best epoch's
    weights are put back and its validation result given to `task.keep`. Returns the
    evaluator (history, best).
    With `plan.checkpoints` (runtime.Checkpoints): resumes from the latest, writes them.
    `label` begins each progress line. `plan.max_seconds` (0: none): training stops once that
    many seconds have passed since it began (the per-epoch validation included; a resumed
    run counts from its resumption), the interrupted epoch is evaluated and the best epoch so
    far kept (`evaluator.stopped_for_time` says so)."""
    model, encoder = trainable

    def evaluate_validation():
        return ctx.task.evaluate(model, ctx.splits["validation"], ctx.data, encoder)[0]

    evaluator = EpochEvaluator(evaluate_validation, ctx.data.metric, to_mlflow=to_mlflow,
                               label=label)
    runtime.fit_best_epoch(model, ctx.splits["train"], plan, evaluator)
    if evaluator.best_result is not None:  # what validation chose for the kept weights
        ctx.task.keep(evaluator.best_result)
    return evaluator


def random_init_baseline(ctx: RunContext, trainable: tuple, backbone,
                         plan: runtime.FitPlan) -> dict:
    """Test metrics of the same architecture from random initialisation, fine-tuned with the
    same data, steps, schedule and epoch selection: the gain of pretraining is the difference.
    Trained in `trainable` (the fine-tuned pair, whose train and predict steps are traced
    already): its weights and optimizer state are set to a fresh model's, and put back after."""
    keras.utils.set_random_seed(ctx.fc.seed + 1)
    with ctx.strategy.scope():
        fresh, _ = build_trainable(ctx, type(backbone).from_config(backbone.get_config()),
                                   plan.total_steps)
        fresh.optimizer.build(fresh.trainable_variables)
    model, encoder = trainable
    state = [*model.variables, *model.optimizer.variables]  # weights, seed states, optimizer
    kept = [keras.ops.convert_to_numpy(v) for v in state]
    for variable, value in zip(state, [*fresh.variables, *fresh.optimizer.variables], strict=True):
        variable.assign(value)
    try:
        train_best_epoch(ctx, trainable, dataclasses.replace(plan, checkpoints=None),
                         label="finetune (random init)", to_mlflow=False)
        return ctx.task.evaluate(model, ctx.splits["test"], ctx.data, encoder)[0]
    finally:
        for variable, value in zip(state, kept):
            variable.assign(value)
