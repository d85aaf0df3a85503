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

import logging
import math
import time

import keras
import numpy as np

from models import preprocessor
from pipeline import config as config_lib
from pipeline.artifacts import Artifacts
from pipeline.config import Config
from pipeline.finetuning import data as fd
from pipeline.finetuning import records, runtime, tasks
from pipeline.training.callbacks import EpochEvaluator
from pipeline.finetuning.outputs import _report, compare_with_baselines, write_and_log
from pipeline.finetuning.task_model import (
    FinetuneError,
    load_backbone,
    output_name,
    resolve_init,
)
from pipeline.text import vocab as vocab_lib
from pipeline.tracking import outbox

log = logging.getLogger(__name__)


NOTES_SAMPLE = 2000  # training examples whose features the log's notes describe


def fine_tune(config: Config, write_outputs: bool = True, evaluate_test: bool = True,
              recipe: dict | None = None) -> dict:
    """Fine-tunes, evaluates and (if `write_outputs`) writes + logs + registers the model.

    `evaluate_test` false (a point of recipe auto's search): the test split(s) are not
    evaluated, so nothing chosen from the results can have seen them. `recipe`: what recipe
    auto tried and chose (pipeline/finetuning/recipe.py), kept in the results (metrics.json)."""
    from pipeline.training import strategy as strategy_lib

    fc = config.finetune
    task = tasks.get(fc.task, fc)
    if write_outputs and task.serving and fc.register_model and not fc.export:
        raise FinetuneError("finetune.register_model = true registers the raw-text SavedModel, "
                            "which finetune.export = false does not write; set "
                            "finetune.export=true or finetune.register_model=false")
    started = time.time()
    for warning in config_lib.finetune_warnings(config):
        log.info(f"finetune: warning: {warning}")
    paths = Artifacts(config.run_dir).finetune(output_name(fc))
    keras.utils.set_random_seed(fc.seed)

    # 1. Data.
    data = fd.load_task(fc)
    counts = data.splits["counts"]
    glue_task = f" ({fc.glue_task})" if fc.glue_task else ""
    log.info(f"finetune: {task.name} on {fc.dataset}{glue_task}: {counts['train']:,} train / "
             f"{counts['validation']:,} validation / {counts['test']:,} test examples"
             + (f", {len(data.labels)} labels" if data.labels else ""))

    # 2. Encoder, vocab, features.
    model_path, vocab_path = resolve_init(config)
    vocab = vocab_lib.read_vocab(vocab_path)
    lowercase = vocab_lib.vocab_lowercase(vocab_path, config.vocab.lowercase)
    strategy = strategy_lib.make_strategy(config.train.strategy, config.train.tpu,
                                         config.train.allow_cpu)
    runtime.check_strategy(fc, strategy)
    with strategy.scope():
        backbone = runtime.with_precision(load_backbone(model_path), fc.precision)
    if backbone.vocabulary_size != len(vocab):
        raise FinetuneError(f"the encoder in {model_path} has {backbone.vocabulary_size} token "
                            f"embeddings but {vocab_path} has {len(vocab)} tokens; give the vocab "
                            f"it was trained with (finetune.vocab_file)")
    if fc.max_seq_length > backbone.max_sequence_length:
        raise FinetuneError(f"finetune.max_seq_length = {fc.max_seq_length} exceeds the encoder's "
                            f"{backbone.max_sequence_length} positions ({model_path}); lower it")
    pre = preprocessor.TextPreprocessor(vocab, lowercase, fc.max_seq_length)  # serving's
    # The features of every split: TFRecords written once by a Beam job (the same for the
    # same task settings, vocab and examples: reused), streamed by tf.data from here on.
    splits = records.write_or_reuse(config, task, data, vocab, vocab_path, lowercase)
    sample = data.train[:NOTES_SAMPLE]  # what the features cut, on a sample in memory
    for note in task.notes(task.make_split(sample, pre, data.labels, data.pair)):
        log.info(f"finetune: {note}" + (f" (in the first {len(sample):,} training examples)"
                                        if len(sample) < len(data.train) else ""))

    # 3. Model and optimizer. Seeded again: the Beam job that writes the features (when
    # they are not reused) draws from the global generators, by a varying amount.
    keras.utils.set_random_seed(fc.seed)
    n_train = len(splits["train"])
    steps_per_epoch = runtime.updates_per_epoch(n_train, fc)  # updates (× grad_accum_steps)
    total_steps = steps_per_epoch * fc.epochs
    if fc.max_steps:
        total_steps = min(total_steps, fc.max_steps)
    epochs = math.ceil(total_steps / steps_per_epoch)
    with strategy.scope():
        model, encoder = build_trainable(task, backbone, data, fc, total_steps)
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
    checkpoints = (runtime.Checkpoints.for_run(config, data, model_path, vocab_path,
                                               output_name(fc)) if write_outputs else None)
    evaluator = train_best_epoch(task, model, encoder, splits, data, fc, total_steps, epochs,
                                 to_mlflow=True, checkpoints=checkpoints,
                                 max_seconds=fc.max_seconds)
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
        results[name], predictions[name] = task.evaluate(model, splits[name], data, encoder)
    if fc.baselines and evaluate_test:
        results["baselines"] = task.baselines(data, fc.seed)
        if fc.random_init_baseline:  # what pretraining bought: the same model from scratch
            results["baselines"]["random_init"] = random_init_baseline(
                task, backbone, splits, data, fc, total_steps, epochs, strategy)
        compare_with_baselines(results, task, data.metric)
    results["seconds"] = round(time.time() - started, 1)
    results["train_seconds"] = round(train_seconds, 1)
    _report(results, data)

    if write_outputs:
        write_and_log(config, paths, encoder, pre, data, results, predictions, splits, vocab_path,
                      lowercase)
        results["output_dir"] = str(paths.dir)
        checkpoints.remove()  # the output folder is complete
    return results


def build_trainable(task, backbone, data, fc, total_steps: int):
    """(the model `fit` trains, the task model it contains), compiled; call in the strategy
    scope. They differ where the task trains a wrapper (semantic search: a bi-encoder trainer
    around the encoder)."""
    encoder = task.build_model(backbone, len(data.labels or []))
    model = task.trainer(encoder)
    task.compile(model, runtime.build_optimizer(fc, total_steps), **runtime.compile_options(fc))
    return model, encoder


def train_best_epoch(task, model, encoder, splits: dict, data, fc, total_steps: int,
                     epochs: int, to_mlflow: bool = True, checkpoints=None,
                     label: str = "finetune", max_seconds: float = 0.0) -> EpochEvaluator:
    """`model.fit` for `epochs` (at most `total_steps` updates), the validation metric after
    every epoch; the best epoch's weights are put back and its validation result given to
    `task.keep`. Returns the evaluator (history, best).
    With `checkpoints` (runtime.Checkpoints): resumes from the latest, writes them. `label`
    begins each progress line. `max_seconds` (0: none): training stops once that many seconds
    have passed since it began (the per-epoch validation included; a resumed run counts from
    its resumption), the interrupted epoch is evaluated and the best epoch so far kept
    (`evaluator.stopped_for_time` says so)."""
    def evaluate_validation():
        return task.evaluate(model, splits["validation"], data, encoder)[0]

    evaluator = EpochEvaluator(evaluate_validation, data.metric, to_mlflow=to_mlflow,
                               label=label)
    runtime.fit_best_epoch(model, splits["train"], fc, total_steps, epochs, evaluator,
                           checkpoints, max_seconds)
    if evaluator.best_result is not None:  # what validation chose for the kept weights
        task.keep(evaluator.best_result)
    return evaluator


def random_init_baseline(task, backbone, splits: dict, data, fc, total_steps: int,
                         epochs: int, strategy) -> dict:
    """Test metrics of the same architecture from random initialisation, fine-tuned with the
    same data, steps, schedule and epoch selection: the gain of pretraining is the difference."""
    keras.utils.set_random_seed(fc.seed + 1)
    with strategy.scope():
        fresh = type(backbone).from_config(backbone.get_config())
        model, encoder = build_trainable(task, fresh, data, fc, total_steps)
    train_best_epoch(task, model, encoder, splits, data, fc, total_steps, epochs,
                     to_mlflow=False, label="finetune (random init)",
                     max_seconds=fc.max_seconds)
    return task.evaluate(model, splits["test"], data, encoder)[0]

