"""The pretraining task: the BERT pretrainer built from the config, its optimizer, how its
step is compiled (the step itself is `models.BertPretrainer.train_step`) and its cost.

    build_model        models.BertPretrainer (MLM head tied to the embeddings + NSP/SOP) in
                       train.precision, from model.* (or a converted checkpoint: init_from_checkpoint)
    build_optimizer    AdamW or LAMB with warmup + linear/polynomial decay (models/), with
                       rate groups and a hold for the head warm-up (head_warmup.py)
    compile_model      MLM (weighted) + NSP losses, metrics, the step's fused kernels and XLA
                       per `resolve_jit_compile` / `xla_optimizer`
    flops_per_token    the model FLOPs of one training token (for MFU)

`PretrainError` is the stage's user error: the message says which key to change.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import keras
import tensorflow as tf

import models
from models import fused, keras_compat
from models.flops import training_flops_per_token
from models.optimizers import AdamW, Lamb
from models.schedules import WarmupPolynomialDecay
from pipeline import config as config_lib
from pipeline.config import Config

log = logging.getLogger(__name__)


class PretrainError(ValueError):
    pass


# ---------------------------------------------------------------------------
# Building blocks (also used by tests, benchmarks and the other stages).
# ---------------------------------------------------------------------------
def build_model(config: Config, vocabulary_size: int) -> models.BertPretrainer:
    """The pretrainer of `config.model`, computing in `config.train.precision`."""
    arch = config_lib.model_architecture(config)
    precision = config.train.precision
    backbone = models.BertEncoder(
        vocabulary_size=vocabulary_size,
        num_layers=arch["num_layers"],
        num_heads=arch["num_heads"],
        hidden_dim=arch["hidden_dim"],
        intermediate_dim=arch["intermediate_dim"],
        dropout=config.model.dropout,
        max_sequence_length=config.model.max_sequence_length,
        num_segments=config.model.num_segments,
        activation=config.model.activation,
        layer_norm_epsilon=config.model.layer_norm_epsilon,
        embedding_dim=config.model.embedding_size,  # ALBERT options (default: BERT)
        share_layers=config.model.share_layers,
        initializer_range=config.model.initializer_range,
        dtype=None if precision == "float32" else precision,
    )
    model = models.BertPretrainer(backbone)
    model.fused_kernels = bool(config.train.fused_kernels)  # compile_model passes it on
    return model


def build_optimizer(tc: config_lib.TrainConfig) -> keras.optimizers.Optimizer:
    """AdamW or LAMB on BERT's schedule; accumulation, clipping and loss scaling from `tc`.

    The schedule counts optimizer updates (`micro_steps_per_update` undoes Keras' counting
    of micro-batches under gradient accumulation). Clipping is by the global norm of the
    averaged gradient of one update: over all replicas (see `BertPretrainer.train_step`) and all
    accumulated micro-batches (Keras clips after accumulating).
    """
    accum = tc.grad_accum_steps
    schedule = WarmupPolynomialDecay(tc.learning_rate, tc.warmup_steps, tc.steps,
                                     end_learning_rate=tc.end_learning_rate,
                                     power=tc.decay_power, micro_steps_per_update=accum,
                                     decay_seconds=(tc.max_seconds if tc.decay_over == "max_seconds"
                                                    else 0.0),
                                     hold_learning_rate=tc.head_learning_rate)  # hold: head_warmup
    kwargs = {"learning_rate": schedule, "weight_decay": tc.weight_decay, "beta_1": tc.beta_1,
              "beta_2": tc.beta_2, "epsilon": tc.epsilon,
              "global_clipnorm": tc.clipnorm or None,
              "gradient_accumulation_steps": accum if accum > 1 else None}
    optimizer = Lamb(**kwargs) if tc.optimizer == "lamb" else AdamW(**kwargs)
    # BERT does not decay LayerNorm parameters or biases (LAMB: nor adapt their step).
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    if tc.precision == "mixed_float16":
        # float16 gradients under/overflow without it; steps with inf/NaN gradients are
        # skipped and the scale lowered.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def learning_rate_schedule(optimizer) -> WarmupPolynomialDecay | None:
    """The optimizer's schedule (under a loss-scale wrapper too), or None."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    schedule = getattr(inner, "_learning_rate", None)
    return schedule if isinstance(schedule, WarmupPolynomialDecay) else None


def resolve_jit_compile(setting: str, strategy, precision: str = "float32",
                        fused_kernels: bool = False) -> bool | str:
    """`train.jit_compile` for this strategy: "true" / "false" as said; "auto" is XLA on for
    a single replica (one CPU or one GPU) and Keras' own choice ("auto") otherwise, except on
    a machine without GPUs for "mixed_bfloat16" or with the fused kernels
    (`fused_kernels`: train.fused_kernels, models/fused.py), where it is off and only the
    update is compiled (`xla_optimizer`).

    Keras' "auto" turns XLA off on every CPU-only machine and under any tf.distribute
    strategy, one-device included. Without the fused kernels the XLA-compiled float32 step is
    the faster one on a CPU for the small models of the demo (BERT-tiny, 2 cores: 25.5k vs
    18.5k tokens/s) and on one GPU. With them, TensorFlow's own kernels (oneDNN's matmuls)
    plus the fused GELU and LayerNorm are level with XLA on BERT-tiny and faster from
    BERT-mini up (2 cores with AVX-512: mini 4,637 vs 3,866 tokens/s, small ~1,600 vs
    ~1,430), because XLA:CPU's matmuls are slower than oneDNN's. XLA does not reach a CPU's
    bfloat16 units (AVX512_BF16, AMX): its bfloat16 step ran at 0.87x its float32 one on
    BERT-small, while oneDNN runs it at ~1.7x (`make bench-train`). Several replicas and
    TPUs keep Keras' choice: TPUs compile anyway, and Keras does not XLA-compile a step that
    all-reduces across replicas. Also off when op determinism is enabled (not every op has a
    deterministic XLA kernel; Keras does the same).
    """
    if setting != "auto":
        return {"true": True, "false": False}[str(setting)]
    if keras_compat.op_determinism_enabled():
        return False
    if ((precision == "mixed_bfloat16" or fused_kernels)
            and not tf.config.list_logical_devices("GPU")):
        return False
    if strategy.num_replicas_in_sync == 1 and not isinstance(
            strategy, (tf.distribute.TPUStrategy, tf.distribute.MultiWorkerMirroredStrategy)):
        return True
    return "auto"


def xla_optimizer(setting: str, strategy, precision: str, fused_kernels: bool = False) -> bool:
    """Whether the optimizer's update (and the gradient norm) alone is XLA-compiled: where
    "auto" leaves the step outside XLA on one replica (`resolve_jit_compile`). The update is
    a chain of elementwise passes over every weight and its two moments: outside XLA each is
    its own TensorFlow op (BERT-small: ~0.1 s a step on 2 cores), compiled they fuse (~0.05 s).
    """
    return (setting == "auto" and strategy.num_replicas_in_sync == 1
            and resolve_jit_compile(setting, strategy, precision, fused_kernels) is False
            and not keras_compat.op_determinism_enabled())


def nsp_weight(config) -> float:
    """The sentence-level loss's weight: train.nsp_weight, 0 for data.objective: mlm (its
    records have no sentence-level labels)."""
    return 0.0 if config.data.objective == "mlm" else float(config.train.nsp_weight)


def compile_model(model, optimizer, jit_compile: str = "auto", steps_per_execution: int = 1,
                  nsp_weight: float = 1.0):
    """MLM + NSP losses, the NSP loss weighted `nsp_weight` (train.nsp_weight: 0 = MLM only,
    and then no NSP accuracy), weighted accuracies; the model's own train step with its fused
    kernels (`model.fused_kernels`, set by `build_model`) and XLA as `resolve_jit_compile`
    and `xla_optimizer` decide for this strategy.

    The MLM loss is the weighted mean over the real predictions of the whole global batch,
    on any number of replicas: the input batches carry weights already divided by their
    global sum (`normalize_mlm_weights`), and the loss sums loss × weight over the
    replica's slots / their count. (models.pretraining's own MLM loss divides by each
    replica's sum of weights instead, which is the same on one device only.)
    """
    strategy, precision = tf.distribute.get_strategy(), model.dtype_policy.name
    fused_kernels = bool(model.fused_kernels)
    mlm_loss = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="sum_over_batch_size", name="mlm_loss")
    mlm_loss.fn = fused.sparse_categorical_crossentropy  # fused in the train step only
    losses = {models.pretraining.MLM_OUTPUT: mlm_loss,
              models.pretraining.NSP_OUTPUT: models.pretraining.nsp_loss()}
    metrics = models.pretraining.pretraining_metrics()
    if not nsp_weight:
        metrics[models.pretraining.NSP_OUTPUT] = []
    model.compile(optimizer=optimizer, loss=losses, weighted_metrics=metrics,
                  loss_weights={models.pretraining.MLM_OUTPUT: 1.0,
                                models.pretraining.NSP_OUTPUT: float(nsp_weight)},
                  jit_compile=resolve_jit_compile(jit_compile, strategy, precision,
                                                  fused_kernels),
                  steps_per_execution=steps_per_execution, fused_kernels=fused_kernels,
                  xla_update=xla_optimizer(jit_compile, strategy, precision, fused_kernels))


def normalize_mlm_weights(x, y, sample_weight):
    """A global batch's MLM weights × (slots / sum of weights), before it is split.

    With the "sum_over_batch_size" MLM loss of `compile_model`, each of n replicas then
    computes n × (its sum of loss × weight) / (the global sum of weights), Keras divides by
    n, and the replicas' gradients add up to those of the global weighted mean.
    """
    weights = sample_weight[models.pretraining.MLM_OUTPUT]
    scale = tf.cast(tf.size(weights), weights.dtype) / tf.maximum(tf.reduce_sum(weights), 1e-6)
    return x, y, {**sample_weight, models.pretraining.MLM_OUTPUT: weights * scale}


def flops_per_token(config: Config, vocabulary_size: int) -> float:
    arch = config_lib.model_architecture(config)
    return training_flops_per_token(
        num_layers=arch["num_layers"], hidden_dim=arch["hidden_dim"],
        intermediate_dim=arch["intermediate_dim"], vocabulary_size=vocabulary_size,
        seq_length=config.data.max_seq_length,
        num_predictions=config_lib.training_masks(config)[1],
        embedding_dim=config.model.embedding_size)


def oom_message(config: Config, strategy) -> str:
    tc, dc = config.train, config.data
    replicas = strategy.num_replicas_in_sync
    half = max(1, tc.batch_size // 2)
    arch = config_lib.model_architecture(config)
    lines = [(f"out of memory training a BERT of {arch['num_layers']} layers × "
              f"{arch['hidden_dim']} with train.batch_size = "
              f"{tc.batch_size} ({tc.batch_size // replicas} per replica), data.max_seq_length = "
              f"{dc.max_seq_length}, train.precision = {tc.precision}. Turn one of these knobs:"),
             (f"  - train.batch_size={half} train.grad_accum_steps={tc.grad_accum_steps * 2} "
              f"(same effective batch of {tc.batch_size * tc.grad_accum_steps}, half the memory "
              f"for activations)")]
    if tc.precision == "float32":
        lines.append("  - train.precision=mixed_bfloat16 (or mixed_float16 on GPUs older than "
                     "Ampere): activations take half the memory")
    lines.append(f"  - a shorter data.max_seq_length (now {dc.max_seq_length}; attention memory "
                 f"grows with its square), which means re-running `make data`")
    lines.append("  - more replicas (train.strategy=mirrored or multi_worker) to split the batch")
    return "\n".join(lines)


# What the config calls each architecture field, for the init_from messages.
CONFIG_KEY_OF = {
    "vocabulary_size": "the run's vocab size", "num_layers": "model.num_layers",
    "hidden_dim": "model.hidden_dim", "num_heads": "model.num_heads",
    "intermediate_dim": "model.intermediate_dim",
    "max_sequence_length": "model.max_sequence_length", "num_segments": "model.num_segments",
    "activation": "model.activation", "layer_norm_epsilon": "model.layer_norm_epsilon",
    "embedding_dim": "model.embedding_size", "share_layers": "model.share_layers",
}


def init_from_checkpoint(model, config: Config, vocab_file: Path) -> list:
    """Copies the weights of `config.model.init_from` into `model` (built from the config).

    The checkpoint (a .keras file, a Hugging Face or a Google directory; see
    models.convert) must have the architecture this config builds and the run's
    vocab: a different vocabulary size, size, activation, epsilon, position or
    segment count, or a vocab.txt with other tokens, raises PretrainError naming
    both values. Returns the paths of the variables the checkpoint did not hold (the
    pretraining heads of an encoder-only checkpoint), which keep their initialisation.
    """
    from models import convert

    source = config.model.init_from
    try:
        with warnings.catch_warnings():  # the missing heads are reported below, once
            warnings.filterwarnings("ignore", message=".*keep their random initialisation.*")
            imported = convert.load_pretrainer(source)
    except (convert.ConversionError, OSError) as err:
        raise PretrainError(f"model.init_from = {source}: {err}") from err
    ours, theirs = convert.architecture_of(model), imported.architecture
    if ours["vocabulary_size"] != theirs["vocabulary_size"]:
        raise PretrainError(
            f"model.init_from = {source} has a vocabulary of {theirs['vocabulary_size']} tokens "
            f"but the run's vocab {vocab_file} has {ours['vocabulary_size']}; tokenize the data "
            f"with the checkpoint's own vocab.txt (and its casing)")
    mismatches = convert.architecture_mismatches(ours, theirs)
    if mismatches:
        details = "; ".join(f"{CONFIG_KEY_OF[key]}: config {a!r}, checkpoint {b!r}"
                            for key, a, b in mismatches)
        fix = " ".join(f"{CONFIG_KEY_OF[key]}={b}" for key, _, b in mismatches)
        raise PretrainError(
            f"model.init_from = {source} does not match the model this config builds ({details}); "
            f"set {fix} or start from another checkpoint")
    if imported.vocab:
        run_vocab = convert.read_vocab(vocab_file)
        for i, (a, b) in enumerate(zip(run_vocab, imported.vocab)):
            if a != b:
                raise PretrainError(
                    f"model.init_from = {source}: its vocab differs from the run's vocab "
                    f"{vocab_file} (id {i}: {b!r} in the checkpoint, {a!r} in the run); the data "
                    f"must be tokenized with the checkpoint's vocab.txt")
    convert.assign_weights(model, convert.keras_weights(imported.model), source=source)
    new = list(imported.missing)
    log.info(f"pretrain: initialised from {source} ({len(model.weights) - len(new)} of "
             f"{len(model.weights)} variables)")
    if new:
        log.info(f"pretrain: {source} has no pretraining heads; new, randomly initialised: "
                 f"{', '.join(new)} (the MLM decoder is tied to the imported token embeddings)")
    return new
