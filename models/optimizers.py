"""BERT's optimizers: LAMB (Adam with a layer-wise trust ratio, for large-batch pretraining,
You et al. 2019) and AdamW, both with learning-rate groups (`RateGroups`: a factor per variable,
and moments that began at a later update for variables frozen until then).

For every variable, with Adam's bias-corrected moments m̂ and v̂:

    update = m̂ / (√v̂ + ε) + weight_decay · w          (decay only where it applies)
    ratio  = ‖w‖ / ‖update‖   (1 when either norm is 0, or the variable is excluded)
    w     ← w − learning_rate · ratio · update

As in Google's and NVIDIA's BERT LAMB, the variables excluded from weight decay
(`exclude_from_weight_decay`, e.g. LayerNorm parameters and biases) are also excluded
from the layer adaptation (their ratio is 1). Gradient clipping, accumulation
(`gradient_accumulation_steps`) and learning-rate schedules work as for any Keras
optimizer. Only `keras.ops` is used, so it runs on every Keras backend.

Why not `keras.optimizers.Lamb` (Keras 3.15): it is the same update without weight decay
and exclusions, but it differs on the two points BERT's recipe relies on
(tests/test_optimizers.py shows both): its weight decay is the base optimizer's decoupled
`w -= lr · wd · w`, applied outside the trust ratio, and its trust ratio applies to every
variable, LayerNorm parameters and biases included.

The decay rate is kept here (`weight_decay_rate`), not in the base optimizer's
`weight_decay`, so that Keras does not apply its own decoupled decay as well; the saved
config still calls it `weight_decay`.

    >>> import keras, numpy as np
    >>> from models.optimizers import Lamb
    >>> w = keras.Variable(np.ones((2, 2), "float32"), name="kernel")
    >>> opt = Lamb(learning_rate=0.1, weight_decay=0.0)
    >>> opt.apply([np.full((2, 2), 0.5, "float32")], [w])
    >>> # First step: m̂/√v̂ = 1 everywhere, ‖w‖ = ‖update‖, so w moves by exactly lr.
    >>> bool(np.allclose(keras.ops.convert_to_numpy(w), 0.9))
    True

Rate groups (`set_rate_groups`): continuing the pretraining of a checkpoint whose heads are
new, the new weights may take a multiple of the schedule's rate, and the weights frozen while
the heads warmed up start their Adam moments at the update they unfroze. Keras' Adam corrects
the moments' bias by the global update count t, which for moments that began k updates ago
makes the first steps up to ~5x too large ((1 - beta_1^k) / sqrt(1 - beta_2^k) against
(1 - beta_1^t) / sqrt(1 - beta_2^t)); the group's rate carries the ratio, so each variable
steps as a fresh Adam would. Weight decay follows the group's factor (AdamW: lr·wd·w).

    >>> from models.optimizers import AdamW
    >>> w, u = (keras.Variable(np.ones(2, "float32"), name=n) for n in ("w", "u"))
    >>> opt = AdamW(learning_rate=0.1, weight_decay=0.0)
    >>> opt.build([w, u])
    >>> opt.set_rate_groups(factors=[(u, 3.0)])
    >>> opt.apply([np.ones(2, "float32")] * 2, [w, u])
    >>> [round(float(keras.ops.convert_to_numpy(x)[0]), 4) for x in (w, u)]
    [0.9, 0.7]
"""

from __future__ import annotations

import keras
from keras import ops

from models import keras_compat
from models.bert import SERIALIZATION_PACKAGE


class RateGroups:
    """A learning-rate factor per variable (1 by default), and for variables frozen until a
    later update, the update their moments began at (see the module docstring).

    Read when the step is traced: call `set_rate_groups` before `fit` (a model whose
    trainable variables changed retraces its step anyway)."""

    _factors: dict = {}
    _moments_from: dict = {}

    def set_rate_groups(self, factors=(), moments_from=()):
        """`factors`: (variable, learning-rate factor) pairs; `moments_from`: (variable, the
        update, in optimizer iterations, at which it started to train) pairs. Both replace
        earlier groups."""
        self._factors = {keras_compat.variable_index(self, v): float(f)
                         for v, f in factors if float(f) != 1.0}
        self._moments_from = {keras_compat.variable_index(self, v): int(step)
                              for v, step in moments_from if int(step) > 0}

    def rate_factor(self, variable) -> float:
        return self._factors.get(keras_compat.variable_index(self, variable), 1.0)

    def moment_steps(self, variable):
        """(this update's count for the moments of `variable`, the global count), 1-based."""
        step = ops.cast(self.iterations + 1, variable.dtype)
        began = self._moments_from.get(keras_compat.variable_index(self, variable), 0)
        return (ops.maximum(step - float(began), 1.0) if began else step), step


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class AdamW(RateGroups, keras.optimizers.AdamW):
    """Keras' AdamW with rate groups (`RateGroups`); without groups, the same updates."""

    def update_step(self, gradient, variable, learning_rate):
        factor = self.rate_factor(variable)
        lr = ops.cast(learning_rate, variable.dtype)
        if factor != 1.0 and self.weight_decay and keras_compat.uses_weight_decay(self, variable):
            # The base optimizer decayed w by lr·wd·w before this step; the group's rate
            # wants factor × that.
            self.assign_sub(variable, ops.multiply(
                variable, lr * ops.cast(self.weight_decay, variable.dtype) * (factor - 1.0)))
        own, step = self.moment_steps(variable)
        b1, b2 = (ops.cast(b, variable.dtype) for b in (self.beta_1, self.beta_2))
        # Keras' Adam scales by sqrt(1 - b2^t) / (1 - b1^t); moments k updates old want k.
        bias = (ops.sqrt(1 - ops.power(b2, own)) / (1 - ops.power(b1, own))
                * (1 - ops.power(b1, step)) / ops.sqrt(1 - ops.power(b2, step)))
        super().update_step(gradient, variable, lr * factor * bias)


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class Lamb(RateGroups, keras.optimizers.Optimizer):
    """Layer-wise Adaptive Moments optimizer for Batch training.

    Args:
        learning_rate: float or a `LearningRateSchedule`.
        beta_1, beta_2, epsilon: as in Adam (BERT: 0.9, 0.999, 1e-6).
        weight_decay: float. Decoupled weight decay added to the update before the trust
            ratio (not applied to variables excluded with `exclude_from_weight_decay`).
        **kwargs: the base optimizer's arguments (`global_clipnorm`,
            `gradient_accumulation_steps`, `name`, ...).
    """

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                 weight_decay=0.01, name="lamb", **kwargs):
        super().__init__(learning_rate=learning_rate, weight_decay=None, name=name, **kwargs)
        self.weight_decay_rate = weight_decay  # applied inside update_step, before the ratio
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._momentums, self._velocities = self.add_optimizer_variables(
            var_list, ["momentum", "velocity"])

    def update_step(self, gradient, variable, learning_rate):
        lr = ops.cast(learning_rate, variable.dtype) * self.rate_factor(variable)
        gradient = ops.cast(gradient, variable.dtype)
        step, _ = self.moment_steps(variable)  # moments that began later: their own count
        index = keras_compat.variable_index(self, variable)
        m, v = self._momentums[index], self._velocities[index]
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2))
        m_hat = ops.divide(m, 1 - ops.power(ops.cast(self.beta_1, variable.dtype), step))
        v_hat = ops.divide(v, 1 - ops.power(ops.cast(self.beta_2, variable.dtype), step))
        update = ops.divide(m_hat, ops.add(ops.sqrt(v_hat), self.epsilon))
        adapt = keras_compat.uses_weight_decay(self, variable)  # LayerNorm, biases: neither
        if adapt and self.weight_decay_rate:
            update = ops.add(update, ops.multiply(
                ops.cast(self.weight_decay_rate, variable.dtype), variable))
        if adapt:
            w_norm = ops.sqrt(ops.sum(ops.square(variable)))
            u_norm = ops.sqrt(ops.sum(ops.square(update)))
            ratio = ops.where(ops.logical_and(w_norm > 0, u_norm > 0),
                              ops.divide(w_norm, ops.maximum(u_norm, 1e-30)),
                              ops.ones_like(w_norm))
            lr = ops.multiply(lr, ratio)
        self.assign_sub(variable, ops.multiply(lr, update))

    def get_config(self):
        config = super().get_config()
        config.update({"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
                       "weight_decay": self.weight_decay_rate})
        return config
