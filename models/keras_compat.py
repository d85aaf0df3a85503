"""Every private API of Keras, keras-hub and TensorFlow the project still needs, in one place.

A Keras upgrade that moves or reshapes one of these breaks training silently (a step that no
longer clips by the global norm, a resume that restores the wrong optimizer state) rather than
loudly. So each private is reached only through a function or class here, with the reason it is
needed and the public API that does not do the job; tests/test_keras_compat.py checks each
one's signature (inspect) and behaviour on a tiny model, and fails naming it when it changes.

    Private (Keras 3.15, keras-hub 0.32, TF 2.21)     Here                      Used by
    Trainer._symbolic_build                           symbolic_build            BertPretrainer.prebuild
    TensorFlowTrainer._maybe_symbolic_build (hook)    PrebuiltModel             BertPretrainer
    keras.src.losses.loss.unscale_loss_for_distribution  unscale_loss_for_distribution  train step
    TFOptimizer._all_reduce_sum_gradients (replaced)  gradients_summed_by_step  BertPretrainer.compile
    BaseOptimizer._accumulated_gradients              accumulated_gradient      gradient norm
    BaseOptimizer._get_variable_index                 variable_index            Lamb, gradient norm
    BaseOptimizer._use_weight_decay                   uses_weight_decay         Lamb
    keras_hub MaskedLMHead._intermediate_dense/...    masked_lm_head_parts      TiedMaskedLMHead
    Layer._flatten_layers                             flatten_layers            (models/fused.py)
    tf.distribute ..._in_multi_worker_mode            in_multi_worker_mode      train/test step
    tensorflow.python.framework.config
        .is_op_determinism_enabled                    op_determinism_enabled    resolve_jit_compile
    tensorflow.python.util._pywrap_util_port
        .IsMklEnabled                                 onednn_enabled            (training/mfu.py)
    Model.load_weights(objects_to_skip=...)           load_weights_skipping     a phase's start
        (a legacy keyword, undocumented)

Former privates now reached through public APIs: `keras.utils.unpack_x_y_sample_weight`
(was keras.src.trainers.data_adapters), `Model.compute_loss` (was `_compute_loss`, which only
adds a fallback for overrides without `training`; BertPretrainer does not override it), the
loss tracker found in `Model.metrics` by name (was `_loss_tracker`), the MLM accuracy as a
`keras.metrics.MeanMetricWrapper` subclass (was a `_fn` swapped into Keras' metric), LAMB's
own weight-decay rate (was an override of `_apply_weight_decay`).

Everything TensorFlow is imported inside the functions: `models` stays importable, and the
model trainable, on JAX or torch without TensorFlow.
"""

from __future__ import annotations

import keras


class KerasCompatError(RuntimeError):
    """A private API this module relies on is missing or changed: says which, and where."""


def _require(owner, name: str):
    member = getattr(owner, name, None)
    if member is None:
        where = owner if isinstance(owner, type) else type(owner)
        raise KerasCompatError(
            f"{where.__module__}.{where.__qualname__}.{name} is gone in Keras "
            f"{keras.__version__}; models/keras_compat.py needs updating (see "
            f"tests/test_keras_compat.py)")
    return member


# ---------------------------------------------------------------------------
# Trainer: building before fit, the loss tracker, replica scaling of the loss.
# ---------------------------------------------------------------------------
def symbolic_build(model, data_batch) -> None:
    """Builds `model`'s layers, compiled losses, compiled metrics and optimizer from a batch
    of specs (`tf.data.Dataset.element_spec` works) without running it. Keras' `fit` does
    the same on its first batch; there is no public method that builds the compiled loss
    and metrics."""
    _require(model, "_symbolic_build")(data_batch=data_batch)


class PrebuiltModel:
    """A mixin for a `keras.Model` subclass: once `mark_prebuilt()` was called (after
    `symbolic_build`), `fit` / `evaluate` skip their own build from the first batch.

    On the TensorFlow backend under a strategy that build pulls a batch and
    `strategy.reduce`s it, which fails for dict batches under MultiWorkerMirroredStrategy
    (Keras 3.15); with everything built there is nothing left for it to do.
    """

    def mark_prebuilt(self) -> None:
        self._compat_prebuilt = True

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if getattr(self, "_compat_prebuilt", False):
            return None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)


def loss_tracker(model) -> keras.metrics.Metric:
    """The `Mean` metric named "loss" that a compiled model reports as `loss` (public:
    `Model.metrics`, where Keras lists it first once compiled)."""
    for metric in model.metrics:
        if metric.name == "loss" and isinstance(metric, keras.metrics.Mean):
            return metric
    raise KerasCompatError(
        f"a compiled {type(model).__name__} has no 'loss' Mean in model.metrics in Keras "
        f"{keras.__version__}; models/keras_compat.py loss_tracker needs updating")


def unscale_loss_for_distribution(loss):
    """The replica's loss times the replica count: Keras' compiled losses divide each
    replica's loss by it (so that summing gradients over replicas gives the global one), and
    Keras' own step undoes that for the `loss` it reports, with this function."""
    from keras.src.losses import loss as loss_module

    return loss_module.unscale_loss_for_distribution(loss)


# ---------------------------------------------------------------------------
# Optimizer internals.
# ---------------------------------------------------------------------------
def _identity_all_reduce(grads_and_vars):
    return list(grads_and_vars)


def gradients_summed_by_step(optimizer) -> None:
    """Tells a TensorFlow-backend optimizer (the inner one of a `LossScaleOptimizer`) that
    the gradients it gets are already summed over the replicas.

    Keras' optimizer clips each replica's own gradient and all-reduces afterwards (in
    `_all_reduce_sum_gradients`), which is not clipping by the global norm; BertPretrainer's
    step all-reduces first and the optimizer's own all-reduce becomes the identity. Keras 3
    has no public switch for it (Keras 2's `experimental_aggregate_gradients=False`)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    _require(inner, "_all_reduce_sum_gradients")
    inner._all_reduce_sum_gradients = _identity_all_reduce


def sums_gradients_itself(optimizer) -> bool:
    """Whether `gradients_summed_by_step` was applied to `optimizer`."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return inner.__dict__.get("_all_reduce_sum_gradients") is _identity_all_reduce


def variable_index(optimizer, variable) -> int:
    """The index of `variable` in the lists `add_optimizer_variables` returns (Keras' own
    optimizers find their moments this way; there is no public lookup)."""
    return _require(optimizer, "_get_variable_index")(variable)


def accumulated_gradient(optimizer, variable):
    """The gradient sum gradient accumulation holds for `variable` (micro-batches so far of
    the current update), or None without accumulation."""
    if not optimizer.gradient_accumulation_steps:
        return None
    return _require(optimizer, "_accumulated_gradients")[variable_index(optimizer, variable)]


def uses_weight_decay(optimizer, variable) -> bool:
    """False for a variable `exclude_from_weight_decay` excluded (by variable or by name)."""
    return bool(_require(optimizer, "_use_weight_decay")(variable))


# ---------------------------------------------------------------------------
# Layers.
# ---------------------------------------------------------------------------
def masked_lm_head_parts(head) -> tuple:
    """keras-hub `MaskedLMHead`'s dense layer, LayerNorm and output bias (built), which a
    subclass that replaces `call` needs; keras-hub keeps them private."""
    return (_require(head, "_intermediate_dense"), _require(head, "_intermediate_layer_norm"),
            _require(head, "_bias"))


def flatten_layers(layer) -> list:
    """Every sublayer of `layer`, recursively, without `layer` itself (Keras has no public
    recursive walk; `Model.layers` is one level)."""
    return list(_require(layer, "_flatten_layers")(include_self=False, recursive=True))


# ---------------------------------------------------------------------------
# TensorFlow.
# ---------------------------------------------------------------------------
def in_multi_worker_mode(strategy) -> bool:
    """Whether `strategy` is a MultiWorkerMirroredStrategy over more than one worker
    (TF_CONFIG names several); False for every other strategy."""
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    return bool(_require(strategy.extended, "_in_multi_worker_mode")())


def op_determinism_enabled() -> bool:
    """Whether `tf.config.experimental.enable_op_determinism()` was called (TensorFlow
    exports the setter only)."""
    from tensorflow.python.framework import config as tf_config

    return bool(tf_config.is_op_determinism_enabled())


def onednn_enabled() -> bool:
    """Whether TensorFlow runs its CPU kernels on oneDNN in this process (TensorFlow exports no
    getter; TF_ENABLE_ONEDNN_OPTS is read once, when it loads)."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


# ---------------------------------------------------------------------------
# Saving.
# ---------------------------------------------------------------------------
def load_weights_skipping(model, path, skip: list) -> None:
    """`model.load_weights(path)` of a `.weights.h5` file except the objects in `skip` (the
    optimizer, to start a phase with a fresh one): the public method's `objects_to_skip`
    keyword, which Keras reads but does not document."""
    try:
        model.load_weights(str(path), objects_to_skip=list(skip))
    except ValueError as err:
        if "objects_to_skip" not in str(err) and "keyword" not in str(err):
            raise
        raise KerasCompatError(
            f"Model.load_weights no longer takes objects_to_skip in Keras {keras.__version__} "
            f"({err}); models/keras_compat.py load_weights_skipping needs updating") from err


# ---------------------------------------------------------------------------
# Private hooks other modules override or call on themselves (a subclass cannot reach them
# through a function here): tests/test_keras_compat.py checks that each is still there.
# ---------------------------------------------------------------------------
SUBCLASS_HOOKS = {
    # models/preprocessor.py TokenizerLayer: overrides the first, calls the next two; the
    # attributes are set by keras-hub's set_vocabulary.
    "keras_hub.tokenizers.WordPieceTokenizer": (
        "_set_vocabulary_tf", "_maybe_initialized_tf", "_check_vocabulary", "_token_to_id_map",
        "_fast_word_piece"),
}
