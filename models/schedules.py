"""Learning-rate schedule of BERT pretraining: linear warmup, then linear (or polynomial) decay.

    >>> from models.schedules import WarmupPolynomialDecay
    >>> lr = WarmupPolynomialDecay(1e-3, warmup_steps=10, decay_steps=100)
    >>> [round(float(lr(s)), 6) for s in (0, 5, 10, 55, 100, 200)]
    [0.0, 0.0005, 0.001, 0.0005, 0.0, 0.0]

With gradient accumulation Keras calls the schedule with the count of micro-batches
(`optimizer._iterations`), not of updates; `micro_steps_per_update=k` turns it back
into updates, so warmup and decay are counted in optimizer updates either way:

    >>> lr = WarmupPolynomialDecay(1e-3, 10, 100, micro_steps_per_update=4)
    >>> [round(float(lr(s)), 6) for s in (0, 3, 20, 23, 40)]
    [0.0, 0.0, 0.0005, 0.0005, 0.001]

Pretraining for a wall-clock budget: with `decay_seconds = T` the decay also follows the
training seconds, whichever of steps and seconds is further along, so the rate reaches its end
value when the budget is spent on any machine. The trainer sets the seconds with
`set_seconds` (a variable read inside the compiled step):

    >>> lr = WarmupPolynomialDecay(1e-3, 10, 1000, decay_seconds=60.0)
    >>> lr.set_seconds(30.0); round(float(lr(20)), 6)
    0.0005
    >>> lr.set_seconds(60.0); round(float(lr(20)), 6)
    0.0

A head warm-up first (`hold_steps` updates at `hold_learning_rate`, the encoder frozen; see
pipeline/training/head_warmup.py): the schedule then starts, warmup and decay counted from
the end of the hold, the decay still ending at `decay_steps`:

    >>> lr = WarmupPolynomialDecay(1e-3, 10, 110, hold_steps=10, hold_learning_rate=5e-3)
    >>> [round(float(lr(s)), 6) for s in (0, 9, 10, 15, 20, 65, 110)]
    [0.005, 0.005, 0.0, 0.0005, 0.001, 0.0005, 0.0]

With a time budget, the decay spends the seconds left after the hold (`hold_seconds`, the
training seconds when it ended):

    >>> lr = WarmupPolynomialDecay(1e-3, 0, 1000, decay_seconds=60.0, hold_steps=10,
    ...                            hold_seconds=20.0)
    >>> lr.set_seconds(40.0); round(float(lr(15)), 6)
    0.0005
"""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="bert_pipeline")
class WarmupPolynomialDecay(keras.optimizers.schedules.LearningRateSchedule):
    """`peak * step / warmup` for the first `warmup_steps`, then decays from `peak` to
    `end_learning_rate` at `decay_steps` as `(1 - progress) ** power` (power 1 = linear).

    Steps are optimizer updates; with `micro_steps_per_update = k` (gradient accumulation
    over k micro-batches) the step Keras passes in is divided by k (rounded down).
    Backend-agnostic (`keras.ops` only)."""

    def __init__(self, peak_learning_rate, warmup_steps, decay_steps,
                 end_learning_rate=0.0, power=1.0, name="warmup_polynomial_decay",
                 micro_steps_per_update=1, decay_seconds=0.0, hold_steps=0,
                 hold_learning_rate=0.0, hold_seconds=0.0):
        self.peak_learning_rate = float(peak_learning_rate)
        self.warmup_steps = int(warmup_steps)
        self.decay_steps = int(decay_steps)
        self.end_learning_rate = float(end_learning_rate)
        self.power = float(power)
        self.name = name
        self.micro_steps_per_update = int(micro_steps_per_update)
        if self.micro_steps_per_update < 1:
            raise ValueError(f"micro_steps_per_update must be >= 1, got {micro_steps_per_update}")
        self.decay_seconds = float(decay_seconds)
        # The head warm-up: a constant rate for the first hold_steps updates. Read when the
        # step is traced; the trainer may move it (a warm-up that ended early) and retrace.
        self.hold_steps = int(hold_steps)
        self.hold_learning_rate = float(hold_learning_rate)
        self.hold_seconds = float(hold_seconds)
        self.seconds = None
        if self.decay_seconds > 0:
            self.seconds = keras.Variable(0.0, trainable=False, dtype="float32",
                                          name="train_seconds")

    def set_seconds(self, seconds: float):
        """The training seconds so far (a budgeted schedule only; a no-op otherwise)."""
        if self.seconds is not None:
            self.seconds.assign(float(seconds))

    def __call__(self, step):
        if self.micro_steps_per_update > 1:
            step = ops.floor_divide(step, self.micro_steps_per_update)
        step = held = ops.cast(step, "float32")
        if self.hold_steps:
            step = ops.maximum(held - float(self.hold_steps), 0.0)
        peak = self.peak_learning_rate
        warmup = ops.maximum(float(self.warmup_steps), 1.0)
        warm = peak * step / warmup
        span = ops.maximum(float(self.decay_steps - self.hold_steps - self.warmup_steps), 1.0)
        progress = ops.clip((step - float(self.warmup_steps)) / span, 0.0, 1.0)
        if self.seconds is not None:
            budget = max(self.decay_seconds - self.hold_seconds, 1e-6)
            spent = ops.clip((ops.cast(self.seconds, "float32") - self.hold_seconds) / budget,
                             0.0, 1.0)
            progress = ops.maximum(progress, spent)
        decayed = (peak - self.end_learning_rate) * (1.0 - progress) ** self.power \
            + self.end_learning_rate
        rate = ops.where(step < float(self.warmup_steps), warm, decayed)
        if self.hold_steps:
            rate = ops.where(held < float(self.hold_steps), self.hold_learning_rate, rate)
        return rate

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps,
            "end_learning_rate": self.end_learning_rate,
            "power": self.power,
            "name": self.name,
            "micro_steps_per_update": self.micro_steps_per_update,
            "decay_seconds": self.decay_seconds,
            "hold_steps": self.hold_steps,
            "hold_learning_rate": self.hold_learning_rate,
            "hold_seconds": self.hold_seconds,
        }
