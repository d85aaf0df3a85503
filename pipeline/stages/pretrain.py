"""Stage `pretrain`: TFRecords → a BERT trained on MLM + NSP, evaluated on held-out data, exported.

Reads top to bottom:
  1. check inputs (vocab, data stats agree with the config, no incompatible checkpoint);
  2. the strategy (`train.strategy`), the peak FLOP/s of this machine (for MFU), tf.data
     pipelines for training (repeated, shuffled, sharded per worker; on resume the batches
     already consumed are skipped) and held-out evaluation;
  3. inside the tf.distribute strategy: build the pretrainer (in `train.precision`), AdamW or
     LAMB with warmup + linear/polynomial decay, gradient accumulation and clipping, compile
     with MLM (weighted) + NSP losses and the model's own train step (`BertPretrainer.train_step`);
  4. resume from the latest checkpoint in <run_dir>/pretrain/checkpoints if there is one,
     else copy the weights of `model.init_from` (an imported checkpoint) if it is set;
  5. `model.fit` in chunks of `checkpoint_every` steps (a Keras epoch = one checkpoint interval),
     logging per-step metrics to MLflow and writing a checkpoint at the end of each chunk;
     a non-finite loss stops training without writing a checkpoint; running out of memory
     ends with a message naming the knobs;
  6. held-out evaluation (MLM loss/accuracy, NSP accuracy) → eval.json;
  7. export `model.keras` (with the run's vocab.txt and vocab.json, its casing, beside it) and
     a SavedModel (both atomic), log them to MLflow.

Two-phase pretraining (`data.phases`, `train.phases`; see `plan_phases`): steps 2-6 run once per
phase, phase i reading data/phase<i>/ and checkpointing to pretrain/checkpoints/phase<i>/; each
phase after the first starts from the previous phase's final weights with a fresh optimizer and
schedule, each is its own MLflow run under the pipeline run, and a phase whose checkpoints
already reach its steps is skipped. The model exported in step 7 is the last phase's.

MLflow on resume: the id of the stage run (and of each phase run) is kept beside the
checkpoints (mlflow_run.json); the CLI reopens the stage run (`resumable_run_id`) and
`phase_run` the phase's, so an interrupted training's metrics continue in the same run.

Steps are optimizer updates everywhere (`train.steps`, checkpoints, logs, the LR schedule):
with `train.grad_accum_steps = k` one step is k forward/backward passes of `train.batch_size`.
"""

from __future__ import annotations

import contextlib
import gc
import json

import keras
import logging

from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.artifacts import Artifacts
from pipeline.config import Config
from pipeline.serving.export import export
from pipeline.text import vocab as vocab_lib
from pipeline.tracking import outbox
from pipeline.tracking import runs as tracking
from pipeline.training import strategy as strategy_lib
from pipeline.training.checkpoints import latest_checkpoint
from pipeline.training.loop import train_phase
from pipeline.training.mfu import PEAK_DTYPES, measure_peak_flops, onednn_enabled
from pipeline.training.phases import phase_run, plan_phases
from pipeline.training.pretrainer import PretrainError
from pipeline.training.records import check_inputs
from pipeline.training.review import review_plots

log = logging.getLogger(__name__)


def run(config: Config) -> dict:
    """Trains every phase in turn (one without data.phases), then evaluates the final model on
    held-out data and exports it. With data.phases, each phase starts from the previous one's
    final weights with a fresh optimizer and schedule, and is its own MLflow run under the
    pipeline run; a phase whose checkpoints already reach its steps is skipped."""
    paths = Artifacts(config.run_dir)
    tc = config.train
    phases = plan_phases(config, paths)
    vocabulary_size, stats = check_inputs(config, paths)
    keras.utils.set_random_seed(tc.seed)
    strategy = strategy_lib.make_strategy(tc.strategy, tc.tpu, tc.allow_cpu)
    for phase in phases:
        try:
            strategy_lib.per_replica_batch(phase.config.train.batch_size, strategy)
        except strategy_lib.StrategyError as err:
            where = f" (train.phases[{phase.index - 1}])" if phase.index else ""
            raise PretrainError(f"{err}{where}") from err
    chief = strategy_lib.is_chief()
    config_yaml = config_lib.dump_yaml(config)
    stage_run = outbox.active_run_id() if chief else None
    if stage_run is not None:  # a re-run after an interruption continues this run
        tracking.write_run_file(paths.pretrain_run_file, stage_run)

    peak = 0.0
    if tc.peak_flops_seconds:
        peak = measure_peak_flops(tc.peak_flops_seconds, PEAK_DTYPES[tc.precision])
        log.info(f"pretrain: peak {peak / 1e9:,.0f} GFLOP/s per replica "
                 f"({tc.precision.replace('mixed_', '')} matmul, {tc.peak_flops_seconds:g} s, "
                 f"oneDNN {'on' if onednn_enabled() else 'off'})")
        peak *= strategy.num_replicas_in_sync

    previous = None  # where the next phase starts from: weights (a list), or a checkpoint path
    for phase in phases:
        final = phase is phases[-1]
        found = latest_checkpoint(phase.checkpoint_dir)
        steps = phase.config.train.steps
        if not final and found and found[0] >= steps:
            log.info(f"{phase.prefix}: already trained ({found[1].name}, step {found[0]} of "
                     f"{steps}); going on to phase{phase.index + 1}")
            previous = found[1]
            continue
        trains = not found or found[0] < steps
        tracked = bool(phase.index) and trains and stage_run is not None
        with (phase_run(phase, stage_run, resume=found is not None) if tracked
              else contextlib.nullcontext()) as run_of_phase:
            if run_of_phase is not None:
                tracking.write_run_file(Artifacts.run_file(phase.checkpoint_dir),
                                        run_of_phase.info.run_id)
                tracking.log_params({"phase": phase.index, "phase.data_dir": str(phase.data_dir),
                                     **{k: v for k, v in
                                        config_lib.to_flat_dict(phase.config).items()
                                        if k.startswith(("train.", "data.", "model."))}})
                outbox.set_tags({f"pretrain.{phase.name}.run_id": run_of_phase.info.run_id},
                                stage_run)
            if phase.index:
                keras.utils.set_random_seed(tc.seed + phase.index - 1)
                log.info(f"{phase.prefix}: {phase.shape} (max_seq_length/max_predictions_per_seq) "
                         f"from {phase.data_dir}, {steps} steps")
            outcome = train_phase(phase, paths, strategy, vocabulary_size, peak, chief,
                                  config_yaml, found, previous)
        if not final:  # keep only the weights: the model and its optimizer state are freed
            previous = outcome.pop("model").get_weights()
            outcome = None
            gc.collect()

    model, results, history = outcome["model"], outcome["results"], outcome["history"]
    digest = outcome["weights_sha256"]
    if chief:
        # First: if it fails (a full disk), the previous outputs stand. The vocab and its
        # casing go beside model.keras: any run directory can start from it.
        export(model, paths, vocab_lib.vocab_lowercase(paths.vocab_file, config.vocab.lowercase))
        artifacts.write_text_atomic(paths.pretrain_eval, json.dumps(results, indent=2))
        artifacts.write_text_atomic(paths.pretrain_config, config_yaml)
        if outcome["heldout"]:  # time to accuracy: (step, training seconds, accuracy) probes
            artifacts.write_text_atomic(paths.heldout_curve,
                                        json.dumps(outcome["heldout"], indent=1))
        # Through the outbox: a tracking store that went away is not the end of a run.
        outbox.set_tags({"pretrain.weights_sha256": digest})
        outbox.log_metrics({k: v for k, v in results.items() if k != "step"},
                           step=results["step"])
        outbox.log_artifact(paths.pretrain_eval, "pretrain")
        outbox.log_artifact(paths.pretrain_config, "pretrain")
        if outcome["heldout"]:
            outbox.log_artifact(paths.heldout_curve, "pretrain")
        outbox.log_artifact(paths.model_keras, "model")
        outbox.log_artifact(paths.model_vocab, "model")  # the model's vocab and casing
        outbox.log_artifact(paths.model_vocab_meta, "model")
        outbox.log_artifact(paths.saved_model, "model/saved_model")
        if config.tracking.register_encoder:
            name = config.tracking.encoder_name or f"bert-encoder-{paths.root.name}"
            outbox.deferred("pipeline.serving.mlflow_model:register_encoder",
                            [str(paths.model_keras), str(paths.vocab_file), name])
        if stage_run is not None:  # images for the MLflow UI: none drawn without a run
            review_plots(model, config, paths, history)
    return {"parameters": outcome["parameters"], "start_step": outcome["start_step"],
            "weights_sha256": digest, "history": history,
            "phases": len(phases) if config.data.phases else 0, **results}
