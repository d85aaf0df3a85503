"""LAMB: Adam with a layer-wise trust ratio, for large-batch BERT pretraining (You et al. 2019).

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
"""

from __future__ import annotations

import keras
from keras import ops

from models import keras_compat
from models.bert import SERIALIZATION_PACKAGE


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class Lamb(keras.optimizers.Optimizer):
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
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        step = ops.cast(self.iterations + 1, variable.dtype)
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
