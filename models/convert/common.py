"""What the Google and Hugging Face converters share: the variable paths of our model, the
head-splitting layouts, building a `BertPretrainer` from a weights dict, vocab files, errors."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import numpy as np

# Activation names of the checkpoint configs → our `BertEncoder(activation=...)`.
# Google's modeling.py: "gelu" is the tanh approximation.
GOOGLE_ACTIVATIONS = {"gelu": "gelu_approximate", "relu": "relu"}
# transformers' ACT2FN: "gelu" is exact (erf); "gelu_new", "gelu_pytorch_tanh" and
# "gelu_fast" are the tanh approximation (same formula, different kernels).
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_approximate",
    "gelu_pytorch_tanh": "gelu_approximate",
    "gelu_fast": "gelu_approximate",
    "relu": "relu",
}
# Ours → the `hidden_act` written by `export_huggingface`.
HF_ACTIVATION_NAMES = {"gelu": "gelu", "gelu_approximate": "gelu_new", "relu": "relu"}

# The fields that must agree for weights to move between two models.
ARCHITECTURE_KEYS = (
    "vocabulary_size", "num_layers", "hidden_dim", "num_heads", "intermediate_dim",
    "max_sequence_length", "num_segments", "activation", "layer_norm_epsilon",
    "embedding_dim", "share_layers",
)
# BertEncoder's ALBERT options; checkpoints (Hugging Face / Google BERT) have neither.
ALBERT_DEFAULTS = {"embedding_dim": None, "share_layers": False}

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class ConversionError(ValueError):
    """A checkpoint cannot be read or does not fit the model."""


@dataclasses.dataclass
class Imported:
    """An imported checkpoint.

    model: `BertPretrainer` with the checkpoint's weights.
    vocab: the tokens of its vocab.txt, in id order (empty if it had none).
    lowercase: True for an uncased vocabulary (tokenize with lowercase + strip accents).
    architecture: the `BertEncoder` arguments read from the checkpoint's config.
    source: the path imported from.
    missing: our variables the checkpoint did not hold (left at their random init).
    """

    model: object
    vocab: list
    lowercase: bool
    architecture: dict
    source: str
    missing: list = dataclasses.field(default_factory=list)


# ---------------------------------------------------------------------------
# Layout helpers (numpy only).
# ---------------------------------------------------------------------------
def split_heads_kernel(kernel: np.ndarray, num_heads: int) -> np.ndarray:
    """(H, H) dense kernel (in, out) → (H, N, D) for keras' MultiHeadAttention q/k/v."""
    hidden = kernel.shape[0]
    return kernel.reshape(hidden, num_heads, kernel.shape[1] // num_heads)


def split_heads_bias(bias: np.ndarray, num_heads: int) -> np.ndarray:
    """(H,) → (N, D)."""
    return bias.reshape(num_heads, bias.shape[0] // num_heads)


def split_heads_output_kernel(kernel: np.ndarray, num_heads: int) -> np.ndarray:
    """(H, H) dense kernel (in = N·D, out) → (N, D, H) for the attention output projection."""
    return kernel.reshape(num_heads, kernel.shape[0] // num_heads, kernel.shape[1])


def layer_paths(i: int) -> dict:
    """Our variable paths inside Transformer layer `i`, by role."""
    p = f"transformer_layer_{i}"
    attention = f"{p}/self_attention_layer"
    return {
        "query/kernel": f"{attention}/query/kernel",
        "query/bias": f"{attention}/query/bias",
        "key/kernel": f"{attention}/key/kernel",
        "key/bias": f"{attention}/key/bias",
        "value/kernel": f"{attention}/value/kernel",
        "value/bias": f"{attention}/value/bias",
        "attention_output/kernel": f"{attention}/attention_output/kernel",
        "attention_output/bias": f"{attention}/attention_output/bias",
        "attention_norm/gamma": f"{p}/self_attention_layer_norm/gamma",
        "attention_norm/beta": f"{p}/self_attention_layer_norm/beta",
        "intermediate/kernel": f"{p}/feedforward_intermediate_dense/kernel",
        "intermediate/bias": f"{p}/feedforward_intermediate_dense/bias",
        "output/kernel": f"{p}/feedforward_output_dense/kernel",
        "output/bias": f"{p}/feedforward_output_dense/bias",
        "output_norm/gamma": f"{p}/feedforward_layer_norm/gamma",
        "output_norm/beta": f"{p}/feedforward_layer_norm/beta",
    }


# Our variable paths outside the Transformer layers.
EMBEDDING_PATHS = {
    "word": "token_embedding/embeddings",
    "position": "position_embedding/embeddings",
    "segment": "segment_embedding/embeddings",
    "norm/gamma": "embeddings_layer_norm/gamma",
    "norm/beta": "embeddings_layer_norm/beta",
}
POOLER_PATHS = {"kernel": "pooled_dense/kernel", "bias": "pooled_dense/bias"}
MLM_PATHS = {
    "kernel": "mlm_head/intermediate_dense/kernel",
    "bias": "mlm_head/intermediate_dense/bias",
    "norm/gamma": "mlm_head/intermediate_layer_norm/gamma",
    "norm/beta": "mlm_head/intermediate_layer_norm/beta",
    "output_bias": "mlm_head/output_bias",
}
NSP_PATHS = {"kernel": "nsp_head/kernel", "bias": "nsp_head/bias"}
# Variables a checkpoint without pretraining heads (e.g. a bare `BertModel`) lacks.
HEAD_PREFIXES = ("mlm_head/", "nsp_head/", "pooled_dense/")


# ---------------------------------------------------------------------------
# Model building.
# ---------------------------------------------------------------------------
def build_pretrainer(architecture: dict, weights: dict, source: str = "checkpoint"):
    """A `BertPretrainer` for `architecture` with `weights` ({our variable path: array}).

    Every encoder variable must be in `weights` with the right shape; missing
    pooler / MLM / NSP head variables are allowed (a bare encoder checkpoint)
    and keep their random initialisation, with a warning. Returns (model, missing).
    """
    from models.bert import BertEncoder
    from models.pretraining import BertPretrainer

    encoder = BertEncoder(**architecture)
    model = BertPretrainer(encoder, compile=False)
    missing = assign_weights(model, weights, source)
    return model, missing


def assign_weights(model, weights: dict, source: str = "checkpoint") -> list:
    """Assigns `weights` ({variable path: array}) to `model`'s variables; returns missing paths."""
    variables = {v.path: v for v in model.weights}
    unknown = sorted(set(weights) - set(variables))
    if unknown:
        raise ConversionError(f"{source}: converted weights name variables the model does not "
                              f"have: {unknown[:5]}")
    missing = []
    for path, variable in variables.items():
        if path not in weights:
            missing.append(path)
            continue
        value = np.asarray(weights[path], dtype="float32")
        if tuple(value.shape) != tuple(variable.shape):
            raise ConversionError(f"{source}: {path} has shape {tuple(value.shape)} in the "
                                  f"checkpoint but {tuple(variable.shape)} in the model built "
                                  f"from its config")
        variable.assign(value)
    not_heads = [p for p in missing if not p.startswith(HEAD_PREFIXES)]
    if not_heads:
        raise ConversionError(f"{source}: the checkpoint has no value for encoder variable(s) "
                              f"{not_heads[:5]}")
    if missing:
        warnings.warn(f"{source}: no weights for {', '.join(missing)}; these keep their random "
                      f"initialisation (the checkpoint has no pretraining heads)", stacklevel=3)
    return missing


def architecture_of(model) -> dict:
    """The `ARCHITECTURE_KEYS` of a `BertPretrainer` (or `BertEncoder`)."""
    encoder = getattr(model, "backbone", model)
    return {key: getattr(encoder, key, ALBERT_DEFAULTS.get(key)) for key in ARCHITECTURE_KEYS}


def albert_options(architecture) -> dict:
    """The ALBERT options of an architecture dict or encoder that differ from plain BERT
    ({"embedding_dim": E} when E != hidden, {"share_layers": True}); {} for BERT."""
    get = architecture.get if isinstance(architecture, dict) else (
        lambda key, default=None: getattr(getattr(architecture, "backbone", architecture), key,
                                          default))
    out = {}
    embedding_dim = get("embedding_dim", None)
    if embedding_dim is not None and embedding_dim != get("hidden_dim", None):
        out["embedding_dim"] = embedding_dim
    if get("share_layers", False):
        out["share_layers"] = True
    return out


def require_bert(model, what: str) -> None:
    """ConversionError when `model` uses ALBERT options the BERT checkpoint formats cannot hold."""
    options = albert_options(model)
    if options:
        described = ", ".join(f"{k}={v!r}" for k, v in options.items())
        raise ConversionError(
            f"{what} writes BERT checkpoints, but this model uses ALBERT options ({described}: "
            f"model.embedding_size / model.share_layers); a BERT checkpoint has no embedding "
            f"projection and one set of weights per layer. Keep the .keras file for this model")


def architecture_mismatches(ours: dict, theirs: dict) -> list:
    """[(key, ours, theirs)] for every `ARCHITECTURE_KEYS` entry that differs."""
    out = []
    for key in ARCHITECTURE_KEYS:
        a, b = ours.get(key, ALBERT_DEFAULTS.get(key)), theirs.get(key, ALBERT_DEFAULTS.get(key))
        if key == "embedding_dim":  # None means "= hidden_dim"
            a = ours.get("hidden_dim") if a is None else a
            b = theirs.get("hidden_dim") if b is None else b
        if key == "share_layers":
            a, b = bool(a), bool(b)
        if isinstance(a, float) or isinstance(b, float):
            same = a is not None and b is not None and np.isclose(a, b, rtol=1e-6, atol=0)
        else:
            same = a == b
        if not same:
            out.append((key, a, b))
    return out


def keras_weights(model) -> dict:
    """{variable path: numpy array} of a model."""
    import keras

    return {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}


# ---------------------------------------------------------------------------
# Vocabulary and tokenizer.
# ---------------------------------------------------------------------------
def guess_lowercase(tokens) -> bool:
    """True if no ordinary token has an uppercase letter (an uncased vocabulary)."""
    for token in tokens:
        if token.startswith("[") and token.endswith("]"):
            continue
        if token != token.lower():
            return False
    return True


def tokenizer_from_vocab(vocab_path, lowercase: bool, special_tokens_in_strings: bool = True,
                         sequence_length=None):
    """The project's tokenizer layer (`models.preprocessor.TokenizerLayer`) over a vocab.txt.

    It follows Google's `tokenization.py` exactly (`models.tokenizer` has the rules, and the
    cases where Hugging Face's tokenizers differ from it). Uncased (`lowercase=True`):
    lowercase AND strip accents, as BERT's uncased tokenizers do.
    `special_tokens_in_strings=True` makes literal "[MASK]", "[SEP]" … in the text map to
    their ids, as the Hugging Face tokenizer does.

        >>> tokenizer = tokenizer_from_vocab("vocab.txt", lowercase=True)  # doctest: +SKIP
        >>> tokenizer(["Héllo world"])  # doctest: +SKIP
    """
    from models.preprocessor import TokenizerLayer
    from models.tokenizer import read_vocab

    return TokenizerLayer(read_vocab(vocab_path), lowercase=lowercase, sequence_length=sequence_length,
                          special_tokens_in_strings=special_tokens_in_strings)


def write_vocab(tokens, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(token + "\n" for token in tokens), encoding="utf-8")
    return path


def check_vocab_tokens(tokens, source: str) -> None:
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise ConversionError(f"{source}: vocab has no {', '.join(missing)} token(s)")


# ---------------------------------------------------------------------------
# Weight files.
# ---------------------------------------------------------------------------
def safetensors_header(file: Path) -> dict:
    """The header ({tensor name: {"dtype", "shape", "data_offsets"}}) of a safetensors file,
    checked to be readable and not truncated; else ConversionError naming the file."""
    import json
    import struct

    fix = "download it again"
    if not file.is_file():
        raise ConversionError(f"{file}: missing (named by the checkpoint's index); {fix}")
    size = file.stat().st_size
    try:
        with open(file, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > size - 8:
                raise ValueError(f"header of {length:,} bytes in a file of {size:,}")
            header = json.loads(handle.read(length))
        ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
    except (struct.error, ValueError, KeyError, TypeError, OSError) as err:
        raise ConversionError(f"{file}: not a readable safetensors file ({err}); {fix}") from err
    if ends and 8 + length + max(ends) > size:
        raise ConversionError(f"{file}: truncated ({size:,} bytes, its header needs "
                              f"{8 + length + max(ends):,}); {fix}")
    return {name: entry for name, entry in header.items() if name != "__metadata__"}
