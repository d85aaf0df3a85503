"""The head warm-up of continued pretraining: new heads learn before the encoder moves.

A checkpoint without pretraining heads (a sentence encoder, a bare BertModel) gets new,
random MLM/NSP heads (`pretrainer.init_from_checkpoint`). Trained together from the first
update, the random heads' gradients flow into the imported encoder while the heads know
nothing. So, first, only the new heads train (`BertPretrainer.train_heads_only`): the encoder
and its token embedding, which is the MLM decoder's weight (tied), stay exactly as imported;
the MLM head learns its transform, LayerNorm and output bias, at `train.head_learning_rate`
(the schedule's hold, models/schedules.py). The warm-up ends after `train.head_warmup_steps`
updates (-1: `AUTO_STEPS` when heads are new), or, with `train.head_warmup_until_plateau`, at
the first held-out probe whose MLM accuracy is not above the previous one's, or, with
`train.max_seconds`, once `TIME_SHARE` of the time budget is spent. Then everything
trains on the schedule, its warmup and decay counted from there (a decay over
train.max_seconds spends the seconds left); the weights that were frozen
start their Adam moments then (models/optimizers.py `RateGroups`) and the new weights take
`train.new_weights_lr_multiplier` × the schedule's rate.

All in the one `model.fit` of the phase: `HeadWarmupEnd`, a callback, unfreezes the encoder
between two updates (the model's step is traced again with the new trainable variables).

Resume: `head_warmup.json` beside the checkpoints records the new weights, the heads warmed,
the budget and, once it ended, the update the encoder unfroze at; a resumed run reads it, so
a checkpoint from inside the warm-up resumes the warm-up, and one from after it resumes with
the encoder training and the same rate groups.

MLflow: `heldout_mlm_accuracy` at step 0 (the probe before the first update) and after,
`heldout_mlm_accuracy_at_unfreeze` at the unfreeze step, the tags `pretrain.head_warmup.steps`,
`pretrain.head_warmup.heads` and `pretrain.head_warmup.unfreeze_step`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import keras

from pipeline import artifacts
from pipeline.tracking import outbox
from pipeline.training.checkpoints import global_step
from pipeline.training.pretrainer import learning_rate_schedule

log = logging.getLogger(__name__)

AUTO_STEPS = 300  # train.head_warmup_steps = -1 with new heads
# With train.max_seconds, the warm-up also ends once this share of it is spent: on a slow
# machine 300 updates can be the whole budget, and the encoder would never adapt.
TIME_SHARE = 0.25
RECORD = "head_warmup.json"
HEADS = ("mlm_head", "nsp_head")


@dataclasses.dataclass
class HeadWarmup:
    new_weights: list  # the variable paths model.init_from did not hold
    heads: list  # the heads trained alone during the warm-up
    steps: int  # its budget in updates (0: none)
    until_plateau: bool
    multiplier: float  # train.new_weights_lr_multiplier, after the warm-up
    unfrozen_at: int | None = None  # the update the encoder unfroze at (None: not yet)
    unfrozen_seconds: float = 0.0  # the training seconds then (a time-budgeted decay's start)
    max_seconds: float = 0.0  # TIME_SHARE of train.max_seconds: it ends by then (0: no limit)

    def warming(self, step: int) -> bool:
        return self.unfrozen_at is None and step < self.steps


def record_path(checkpoint_dir: Path) -> Path:
    return Path(checkpoint_dir) / RECORD


def read_record(checkpoint_dir: Path) -> HeadWarmup | None:
    try:
        return HeadWarmup(**json.loads(record_path(checkpoint_dir).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write_record(checkpoint_dir: Path, warmup: HeadWarmup) -> None:
    artifacts.write_text_atomic(record_path(checkpoint_dir),
                                json.dumps(dataclasses.asdict(warmup), indent=1))


def plan(train_config, new_weights: list | None, checkpoint_dir: Path, start_step: int,
         nsp_weight: float, resumed: bool) -> HeadWarmup | None:
    """The warm-up of this phase: a resumed run's as its checkpoints recorded it; else from
    the weights model.init_from did not hold (`new_weights`; None: not imported); None when
    no weight is new."""
    if resumed:
        warmup = read_record(checkpoint_dir)
        if warmup is not None and warmup.unfrozen_at is None and start_step >= warmup.steps:
            warmup.unfrozen_at = warmup.steps
        return warmup
    if not new_weights:
        return None
    heads = [h for h in HEADS if any(w.startswith(h + "/") for w in new_weights)
             and (h != "nsp_head" or nsp_weight)]  # an NSP head with no loss learns nothing
    steps = train_config.head_warmup_steps
    if steps < 0:
        steps = AUTO_STEPS if heads else 0
    steps = min(steps, train_config.steps) if heads else 0
    return HeadWarmup(list(new_weights), heads, steps, bool(train_config.head_warmup_until_plateau),
                      float(train_config.new_weights_lr_multiplier),
                      None if steps else start_step,
                      max_seconds=TIME_SHARE * float(train_config.max_seconds or 0.0))


def configure(model, warmup: HeadWarmup, step: int) -> None:
    """Sets the model's trainable layers, the schedule's hold and the optimizer's rate groups
    for `step`: inside the warm-up only its heads train; after it, everything, the new weights
    at the multiplier and the others with Adam moments from the unfreeze step."""
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    schedule = learning_rate_schedule(model.optimizer)
    if warmup.warming(step):
        schedule.hold_steps = warmup.steps
        optimizer.set_rate_groups()
        model.train_heads_only(warmup.heads)
        return
    unfrozen = warmup.unfrozen_at or 0
    schedule.hold_steps, schedule.hold_seconds = unfrozen, warmup.unfrozen_seconds
    new = set(warmup.new_weights)
    warmed = tuple(f"{h}/" for h in warmup.heads)
    model.train_everything()
    variables = model.trainable_variables
    optimizer.set_rate_groups(
        factors=[(v, warmup.multiplier) for v in variables if v.path in new],
        moments_from=[(v, unfrozen) for v in variables if not v.path.startswith(warmed)])


class HeadWarmupEnd(keras.callbacks.Callback):
    """Ends the head warm-up after its budget, or (until_plateau) at the first held-out probe
    of `probe` (a HeldOutProbe listed before this callback) not above the previous one; then
    unfreezes (`configure`), records the unfreeze step beside the checkpoints (`write`: the
    chief) and logs the held-out accuracy there."""

    def __init__(self, warmup: HeadWarmup, checkpoint_dir: Path, probe=None, write: bool = True,
                 prefix: str = "pretrain", to_mlflow: bool = True, clock=None):
        super().__init__()
        self.warmup, self.dir, self.probe, self.write = warmup, Path(checkpoint_dir), probe, write
        self.prefix, self.to_mlflow = prefix, to_mlflow
        self.clock = clock  # training seconds (a time-budgeted decay starts from them)

    def on_train_batch_end(self, batch, logs=None):
        step = global_step(self.model)
        if self.warmup.unfrozen_at is not None or step == 0:
            return
        reason = ""
        if step >= self.warmup.steps:
            reason = f"its {self.warmup.steps} updates done"
        elif self.warmup.max_seconds and self.clock is not None and (
                self.clock() >= self.warmup.max_seconds):
            reason = (f"{TIME_SHARE:.0%} of train.max_seconds spent: "
                      f"{self.warmup.max_seconds:,.0f} s")
        elif self.warmup.until_plateau and self.probe is not None and len(self.probe.curve) > 1:
            (before, _, was), (last, _, now) = self.probe.curve[-2:]
            if last == step and now <= was:
                reason = (f"the held-out MLM accuracy stopped rising ({was:.4f} at step {before}, "
                          f"{now:.4f} at step {step})")
        if reason:
            self.unfreeze(step, reason)

    def unfreeze(self, step: int, reason: str) -> None:
        self.warmup.unfrozen_at = step
        self.warmup.unfrozen_seconds = float(self.clock()) if self.clock is not None else 0.0
        if self.write:
            write_record(self.dir, self.warmup)
        configure(self.model, self.warmup, step)
        curve = self.probe.curve if self.probe is not None else []
        if curve and curve[-1][0] == step:
            accuracy = curve[-1][2]
        elif self.probe is not None:  # a point of the held-out curve too
            accuracy = self.probe.probe(step)
        else:
            accuracy = None
        start = next((a for s, _, a in curve if s == 0), None)
        said = (f"; held-out MLM accuracy {start:.4f} at step 0 -> {accuracy:.4f}"
                if start is not None and accuracy is not None else
                f"; held-out MLM accuracy {accuracy:.4f}" if accuracy is not None else "")
        log.info(f"{self.prefix}: head warm-up ended at step {step} ({reason}){said}; the "
                 f"encoder unfreezes and trains on the schedule from here")
        if self.to_mlflow:
            outbox.set_tags({"pretrain.head_warmup.unfreeze_step": str(step)})
            if accuracy is not None:
                outbox.log_metrics({"heldout_mlm_accuracy_at_unfreeze": accuracy}, step=step)
