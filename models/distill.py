"""Knowledge distillation (DistilBERT style): losses, the student encoder, weight transfer.

- `soft_target_loss`: KL(softmax(t/T) ‖ softmax(s/T)) · T², averaged over the batch (Hinton et
  al. 2015: the T² keeps the gradient scale independent of T);
- `distillation_loss`: alpha · soft + (1 − alpha) · cross-entropy on the hard labels;
- `hidden_state_loss`: MSE or cosine distance between student and teacher hidden states
  ([CLS] vectors or whole sequences over real tokens);
- `build_student`: a smaller `BertEncoder` (a preset size, or the teacher's sizes with
  overrides) with the teacher's vocabulary, positions, segments, activation and epsilon;
- `init_from_teacher`: copies the embeddings, the pooler and every other Transformer layer of
  the teacher (DistilBERT's initialisation) into a student of the same widths;
- `with_hidden_states`: a model returning every Transformer layer's output beside the logits.

>>> import numpy as np
>>> t = np.array([[2.0, 0.0]], "float32")
>>> round(float(soft_target_loss(t, t, 2.0)), 6)
0.0
"""

from __future__ import annotations

import keras
from keras import ops

from models import presets
from models.bert import BertEncoder


# ---------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------
def soft_target_loss(teacher_logits, student_logits, temperature: float):
    """T² · mean over the batch of KL(p_teacher,T ‖ p_student,T)."""
    t = ops.cast(teacher_logits, "float32") / temperature
    s = ops.cast(student_logits, "float32") / temperature
    log_p_t = ops.log_softmax(t, axis=-1)
    log_p_s = ops.log_softmax(s, axis=-1)
    kl = ops.sum(ops.exp(log_p_t) * (log_p_t - log_p_s), axis=-1)  # (batch,)
    return temperature * temperature * ops.mean(kl)


def hard_label_loss(labels, student_logits):
    """Mean sparse softmax cross-entropy of the student's logits on the gold labels."""
    return ops.mean(keras.losses.sparse_categorical_crossentropy(
        labels, ops.cast(student_logits, "float32"), from_logits=True))


def distillation_loss(labels, teacher_logits, student_logits, temperature: float, alpha: float):
    """(alpha · soft + (1 − alpha) · hard, soft, hard)."""
    soft = soft_target_loss(teacher_logits, student_logits, temperature)
    hard = hard_label_loss(labels, student_logits)
    return alpha * soft + (1.0 - alpha) * hard, soft, hard


def hidden_state_loss(student, teacher, kind: str, padding_mask=None):
    """MSE (mean over features) or cosine distance 1 − cos between hidden states.

    (batch, d) vectors, or (batch, seq, d) sequences averaged over the real tokens of
    `padding_mask`.
    """
    student = ops.cast(student, "float32")
    teacher = ops.cast(teacher, "float32")
    if kind == "mse":
        per = ops.mean(ops.square(student - teacher), axis=-1)
    elif kind == "cosine":
        norm = ops.sqrt(ops.sum(ops.square(student), -1) * ops.sum(ops.square(teacher), -1))
        per = 1.0 - ops.sum(student * teacher, -1) / ops.maximum(norm, 1e-12)
    else:
        raise ValueError(f"hidden_loss {kind!r} is not mse or cosine")
    if padding_mask is None or len(per.shape) == 1:
        return ops.mean(per)
    mask = ops.cast(padding_mask, "float32")
    return ops.sum(per * mask) / ops.maximum(ops.sum(mask), 1.0)


# ---------------------------------------------------------------------------
# The student
# ---------------------------------------------------------------------------
def student_sizes(teacher: BertEncoder, preset: str = "", **overrides) -> dict:
    """num_layers / hidden_dim / num_heads / intermediate_dim of the student: the preset's (or
    the teacher's) with the non-zero `overrides`; with neither, half the teacher's layers."""
    keys = ("num_layers", "hidden_dim", "num_heads", "intermediate_dim")
    sizes = dict(presets.PRESETS[preset]) if preset else {k: getattr(teacher, k) for k in keys}
    given = {k: v for k, v in overrides.items() if k in keys and v}
    sizes.update(given)
    if not preset and "num_layers" not in given:
        sizes["num_layers"] = max(1, teacher.num_layers // 2)
    if "hidden_dim" in given and "intermediate_dim" not in given and not preset:
        sizes["intermediate_dim"] = 4 * sizes["hidden_dim"]
    if "hidden_dim" in given and "num_heads" not in given and not preset:
        sizes["num_heads"] = max(1, sizes["hidden_dim"] // 64)
    return sizes


def build_student(teacher: BertEncoder, sizes: dict, dropout: float | None = None) -> BertEncoder:
    """A `BertEncoder` of `sizes` sharing the teacher's input conventions."""
    return BertEncoder(vocabulary_size=teacher.vocabulary_size,
                       max_sequence_length=teacher.max_sequence_length,
                       num_segments=teacher.num_segments, activation=teacher.activation,
                       layer_norm_epsilon=teacher.layer_norm_epsilon,
                       dropout=teacher.dropout if dropout is None else dropout, **sizes)


def same_widths(student: BertEncoder, teacher: BertEncoder) -> bool:
    return all(getattr(student, k) == getattr(teacher, k)
               for k in ("hidden_dim", "num_heads", "intermediate_dim"))


def teacher_layer_for_init(i: int, student_layers: int, teacher_layers: int) -> int:
    """Student layer i starts from teacher layer ⌊i · m / n⌋: every other one for m = 2n."""
    return (i * teacher_layers) // student_layers


def teacher_layer_for_match(i: int, student_layers: int, teacher_layers: int) -> int:
    """Student layer i's output is matched to the output of teacher layer ⌊(i+1) · m / n⌋ − 1
    (the last layer of its block: the students' last layer matches the teacher's last)."""
    return ((i + 1) * teacher_layers) // student_layers - 1


def init_from_teacher(student: BertEncoder, teacher: BertEncoder) -> list[int]:
    """Copies embeddings, pooler and teacher layers ⌊i · m / n⌋ into the student; returns
    the teacher layer indices used."""
    if not same_widths(student, teacher):
        raise ValueError(
            f"the student (hidden {student.hidden_dim}, heads {student.num_heads}, intermediate "
            f"{student.intermediate_dim}) and the teacher (hidden {teacher.hidden_dim}, heads "
            f"{teacher.num_heads}, intermediate {teacher.intermediate_dim}) differ in width; "
            f"layers can only be copied between equal widths")
    if student.num_layers > teacher.num_layers:
        raise ValueError(f"the student has more layers ({student.num_layers}) than the teacher "
                         f"({teacher.num_layers})")
    for name in ("token_embedding", "position_embedding", "segment_embedding",
                 "embeddings_layer_norm", "pooled_dense"):
        student.get_layer(name).set_weights(teacher.get_layer(name).get_weights())
    chosen = [teacher_layer_for_init(i, student.num_layers, teacher.num_layers)
              for i in range(student.num_layers)]
    for layer, j in zip(student.transformer_layers, chosen):
        layer.set_weights(teacher.transformer_layers[j].get_weights())
    return chosen


def with_hidden_states(classifier) -> keras.Model:
    """A model on the classifier's inputs returning {"logits", "layers": [each Transformer
    layer's (batch, seq, hidden) output]} with the classifier's own layers (shared weights)."""
    backbone = classifier.backbone
    inner = keras.Model(backbone.input,
                        {"pooled": backbone.output["pooled_output"],
                         "layers": [layer.output for layer in backbone.transformer_layers]})
    inputs = {name: keras.Input(shape=(None,), dtype="int32", name=name)
              for name in ("token_ids", "segment_ids", "padding_mask")}
    hidden = inner(inputs)
    logits = classifier.output_dense(classifier.output_dropout(hidden["pooled"]))
    return keras.Model(inputs, {"logits": logits, "layers": hidden["layers"]})
