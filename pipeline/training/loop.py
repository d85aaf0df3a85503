"""One pretraining phase, from its data to its held-out evaluation: build (or resume) the
model inside the strategy, `model.fit` in checkpoint-sized chunks with the logging, guard and
checkpoint callbacks, then evaluate.
"""

from __future__ import annotations

import logging
import math
import time
import warnings

import tensorflow as tf

from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.artifacts import Artifacts
from pipeline.tracking import outbox
from pipeline.tracking import runs as tracking
from pipeline.training import general_text
from pipeline.training import strategy as strategy_lib
from pipeline.training.callbacks import (Checkpointer, HeldOutProbe, NonFiniteGuard,
                                         ScheduleClock, StepLogger, StopAt, scalar_logs)
from pipeline.training.checkpoints import (
    checkpoint_seconds,
    global_step,
    latest_checkpoint,
    restore_seed_states,
    start_from_previous_phase,
    weights_digest,
)
from pipeline.training.head_warmup import HeadWarmupEnd, configure, write_record
from pipeline.training.head_warmup import plan as plan_head_warmup
from pipeline.training.mfu import onednn_enabled
from pipeline.training.phases import Phase
from pipeline.training.pretrainer import (
    PretrainError,
    build_model,
    build_optimizer,
    compile_model,
    flops_per_token,
    init_from_checkpoint,
    learning_rate_schedule,
    normalize_mlm_weights,
    nsp_weight,
    oom_message,
)
from pipeline.training.records import heldout_data, training_data

log = logging.getLogger(__name__)


def train_phase(phase: Phase, paths: Artifacts, strategy, vocabulary_size: int, peak: float,
                chief: bool, config_yaml: str, found, previous) -> dict:
    """Trains one phase to its train.steps (resuming from `found`, its latest checkpoint;
    else starting from `previous`, the previous phase's model or checkpoint; else from
    model.init_from or random weights), then evaluates it on its held-out records."""
    config, prefix = phase.config, phase.prefix
    tc, dc = config.train, config.data
    new_weights = None  # the variables model.init_from did not hold (None: not imported)
    train_data = training_data(config, paths, found[0] if found else 0,
                               data_dir=phase.data_dir, prefix=prefix)
    eval_data = heldout_data(config, paths, phase.data_dir).map(
        normalize_mlm_weights).with_options(strategy_lib.shard_options("data"))

    with strategy.scope():
        model = build_model(config, vocabulary_size)
        optimizer = build_optimizer(tc)
        compile_model(model, optimizer, tc.jit_compile, tc.steps_per_execution,
                      nsp_weight=nsp_weight(config))
        optimizer.build(model.trainable_variables)
        model.prebuild(train_data.element_spec)
        if found:
            model.load_weights(str(found[1]))
            restore_seed_states(model, found[1])  # dropout goes on with the masks it would draw
            log.info(f"{prefix}: resuming from {found[1].name} (step {global_step(model)})")
        elif previous is not None:
            start_from_previous_phase(model, previous, prefix)
        elif config.model.init_from:
            new_weights = init_from_checkpoint(model, config, paths.vocab_file)
    start_step = global_step(model)
    # New heads learn before the encoder moves (head_warmup.py); a resume reads the phase
    # (inside the warm-up or after it) recorded beside the checkpoints.
    warmup = plan_head_warmup(tc, new_weights, phase.checkpoint_dir, start_step,
                              nsp_weight(config), resumed=bool(found))
    if warmup is not None:
        with strategy.scope():
            configure(model, warmup, start_step)
    params = model.count_params()
    per_token = flops_per_token(config, vocabulary_size)
    arch = config_lib.model_architecture(config)
    log.info(f"{prefix}: BERT {arch['num_layers']} layers × {arch['hidden_dim']} "
             f"({arch['num_heads']} heads), {params:,} parameters, "
             f"{strategy.num_replicas_in_sync} replica(s) under {type(strategy).__name__} "
             f"({strategy_lib.worker_name()}), batch {tc.batch_size}"
             + (f" × {tc.grad_accum_steps} accumulated" if tc.grad_accum_steps > 1 else "")
             + f", {tc.precision}, XLA {'on' if model.jit_compile else 'off'}, "
             f"{per_token / 1e6:,.1f} MFLOP per token")
    if chief:
        # tracking.log_params: a resumed run keeps its params (a change is recorded as a tag).
        tracking.log_params({"model.parameters": params,
                             "train.replicas": strategy.num_replicas_in_sync,
                             "train.effective_batch": tc.batch_size * tc.grad_accum_steps,
                             "train.flops_per_token": per_token, "train.peak_flops": peak,
                             "train.onednn": onednn_enabled()})
        outbox.set_tags({"train.resumed_from_step": str(start_step)})
        if start_step:
            outbox.log_metrics({"resumed_from_step": start_step}, step=start_step)
        tracking.log_parameter_breakdown(model)  # params/params.{json,txt}, params_* metrics
        if new_weights is not None:  # which weights the run starts without (encoder-only)
            outbox.set_tags({"pretrain.init_from": config.model.init_from,
                             "pretrain.init_from.new_weights":
                                 ", ".join(new_weights)[:4000] or "none"})
        if warmup is not None and warmup.steps:
            outbox.set_tags({"pretrain.head_warmup.steps": str(warmup.steps),
                             "pretrain.head_warmup.heads": ", ".join(warmup.heads)})
    if warmup is not None and not found and chief:  # what a resumed run continues with
        write_record(phase.checkpoint_dir, warmup)
    if warmup is not None and warmup.warming(start_step):
        log.info(f"{prefix}: head warm-up: only {', '.join(warmup.heads)} train"
                 f"{' (new: the checkpoint has none)' if not found else ''}, the encoder and "
                 f"its token embedding (the MLM decoder) frozen, at learning rate "
                 f"{tc.head_learning_rate:g} until step {warmup.steps}"
                 + (f" (at most {warmup.max_seconds:,.0f} s of training)"
                    if warmup.max_seconds else "")
                 + (" or until the held-out MLM accuracy stops rising"
                    if warmup.until_plateau and tc.heldout_every else "")
                 + f"; then the encoder trains at train.learning_rate {tc.learning_rate:g}"
                 + (f", the new weights at {warmup.multiplier:g}x"
                    if warmup.multiplier != 1 else ""))
    elif warmup is not None and found and warmup.steps:
        log.info(f"{prefix}: resuming after the head warm-up (the encoder unfroze at step "
                 f"{warmup.unfrozen_at}): everything trains")

    # Time to accuracy: held-out MLM accuracy every train.heldout_every steps on a fixed sample
    # of the held-out batches; the training seconds continue those of the checkpoint resumed.
    probe = None
    seconds_before = checkpoint_seconds(found[1]) if found else 0.0
    if tc.heldout_every:
        sample = eval_data.take(tc.heldout_batches) if tc.heldout_batches else eval_data
        probe = HeldOutProbe(list(sample), tc.heldout_every, tc.steps, to_mlflow=chief,
                             seconds_before=seconds_before, prefix=prefix,
                             at_start=new_weights is not None,
                             general=general_text.for_run(config, paths))
    started = time.time()
    clock = probe.train_seconds if probe else (lambda: seconds_before + time.time() - started)
    stop = StopAt(tc.steps, tc.max_seconds, clock)
    out_of_time = bool(tc.max_seconds) and seconds_before >= tc.max_seconds
    logger = StepLogger(tc.log_every, tc.steps, tc.batch_size, dc.max_seq_length,
                        to_mlflow=chief, examples_per_update=tc.batch_size * tc.grad_accum_steps,
                        flops_per_token=per_token, peak_flops=peak,
                        max_seconds=tc.max_seconds, clock=clock)
    guard = NonFiniteGuard(check_grad_norm=tc.precision != "mixed_float16")
    warmup_end = ([HeadWarmupEnd(warmup, phase.checkpoint_dir, probe, write=chief, prefix=prefix,
                                 to_mlflow=chief, clock=clock)]
                  if warmup is not None and warmup.warming(start_step) else [])
    schedule = learning_rate_schedule(optimizer)
    budget = ([ScheduleClock(schedule, clock)]
              if schedule is not None and schedule.seconds is not None else [])
    if out_of_time:
        log.info(f"{prefix}: already trained {seconds_before:,.0f} s, train.max_seconds = "
                 f"{tc.max_seconds:g}: not training further")
    if start_step < tc.steps and not out_of_time:
        if chief:  # the settings the checkpoints will belong to (records.check_inputs)
            artifacts.write_text_atomic(paths.checkpoint_dir / "config.yaml", config_yaml)
        chunk = tc.checkpoint_every
        try:
            model.fit(
                train_data,
                steps_per_epoch=chunk * tc.grad_accum_steps,  # micro-batches per chunk
                initial_epoch=start_step // chunk,
                epochs=math.ceil(tc.steps / chunk),
                callbacks=[*budget, logger, guard, stop,
                           *([probe] if probe else []), *warmup_end,  # after the probe
                           Checkpointer(phase.checkpoint_dir, tc.keep_checkpoints, config_yaml,
                                        chief, guard,
                                        clock=clock)],
                shuffle=False,  # tf.data shuffles
                verbose=0,
            )
        except tf.errors.ResourceExhaustedError as err:
            raise PretrainError(oom_message(config, strategy)) from err
        finally:
            if warmup is not None:  # saved (and passed on) with every layer trainable
                model.train_everything()
        if guard.bad_step is not None:
            key = f"train.phases[{phase.index - 1}]." if phase.index else "train."
            raise PretrainError(f"{'' if not phase.index else phase.name + ': '}" + guard.error(
                latest_checkpoint(phase.checkpoint_dir),
                f"Lower {key}learning_rate (now {tc.learning_rate:g}) or lengthen "
                f"{key}warmup_steps (now {tc.warmup_steps}), clip harder with train.clipnorm "
                f"(now {tc.clipnorm:g}; 1.0 is BERT's), or change train.precision (now "
                f"{tc.precision}; mixed_float16 overflows most easily, float32 least)"))
        if stop.stopped_early:
            log.info(f"{prefix}: stopped at step {global_step(model)} after {clock():,.0f} s of "
                     f"training (train.max_seconds = {tc.max_seconds:g}); evaluating and exporting")
    elif not out_of_time:
        log.info(f"{prefix}: already trained to step {start_step} (train.steps = {tc.steps}); "
                 f"evaluating and exporting")

    # Held-out evaluation.
    with warnings.catch_warnings():  # a finite held-out set ends with an "out of data" warning
        warnings.filterwarnings("ignore", message=".*ran out of data")
        try:
            results = model.evaluate(eval_data, steps=tc.eval_batches or None, return_dict=True,
                                     verbose=0)
        except tf.errors.ResourceExhaustedError as err:
            raise PretrainError(oom_message(config, strategy)) from err
    results = {f"eval_{k}": v for k, v in scalar_logs(results).items()}
    results["step"] = global_step(model)
    nsp = (f"{results['eval_nsp_accuracy']:.4f}" if "eval_nsp_accuracy" in results
           else "n/a (no NSP loss)")
    log.info(f"{prefix}: held-out MLM accuracy "
             f"{results.get('eval_mlm_accuracy', float('nan')):.4f}, NSP accuracy {nsp}, "
             f"MLM loss {results.get('eval_mlm_loss', float('nan')):.4f}")
    digest = weights_digest(model)
    log.info(f"{prefix}: final weights sha256 {digest[:16]}… ({strategy_lib.worker_name()})")
    if chief and phase.index:
        outbox.set_tags({"pretrain.weights_sha256": digest})
        outbox.log_metrics({k: v for k, v in results.items() if k != "step"},
                           step=results["step"])
    heldout = ({"curve": probe.curve, "reached": {f"{k:g}": v for k, v in probe.reached.items()},
                "every": tc.heldout_every, "batches": tc.heldout_batches} if probe else None)
    if probe is not None and probe.general_curve:
        heldout["general"] = general_text.report(tc.general_heldout, probe.general_curve,
                                                 warmup, chief, prefix)
    return {"model": model, "parameters": params, "start_step": start_step,
            "weights_sha256": digest, "history": logger.history, "results": results,
            "heldout": heldout}
