"""Google BERT checkpoints (google-research/bert, TF1) → `BertPretrainer`.

A Google checkpoint directory (e.g. `uncased_L-12_H-768_A-12/`) holds
`bert_config.json`, `bert_model.ckpt.{index,data-*}` and `vocab.txt`. Its
variable names (modeling.py and run_pretraining.py of google-research/bert):

    bert/embeddings/word_embeddings                 (V, H)
    bert/embeddings/position_embeddings             (P, H)
    bert/embeddings/token_type_embeddings           (T, H)
    bert/embeddings/LayerNorm/{gamma,beta}          (H,)
    bert/encoder/layer_{i}/attention/self/{query,key,value}/{kernel,bias}
    bert/encoder/layer_{i}/attention/output/dense/{kernel,bias}
    bert/encoder/layer_{i}/attention/output/LayerNorm/{gamma,beta}
    bert/encoder/layer_{i}/intermediate/dense/{kernel,bias}
    bert/encoder/layer_{i}/output/dense/{kernel,bias}
    bert/encoder/layer_{i}/output/LayerNorm/{gamma,beta}
    bert/pooler/dense/{kernel,bias}
    cls/predictions/transform/dense/{kernel,bias}
    cls/predictions/transform/LayerNorm/{gamma,beta}
    cls/predictions/output_bias                     (V,)   (decoder tied to word_embeddings)
    cls/seq_relationship/output_weights             (2, H)  transposed vs a Dense kernel
    cls/seq_relationship/output_bias                (2,)

Dense kernels are (in, out) as in Keras. The config's "gelu" is the tanh
approximation (modeling.gelu) and LayerNorm epsilon is 1e-12
(tf.contrib.layers.layer_norm). Optimizer slots (`…/adam_m`, `…/adam_v`) and
`global_step` are skipped. Casing is not in the config: it is read from the
directory name ("uncased_…" / "cased_…") or guessed from the vocab.

    >>> from models.convert import google
    >>> imported = google.import_checkpoint("uncased_L-2_H-128_A-2/")  # doctest: +SKIP
    >>> imported.model.save("model.keras")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np

from models.convert.common import (
    EMBEDDING_PATHS,
    GOOGLE_ACTIVATIONS,
    MLM_PATHS,
    NSP_PATHS,
    POOLER_PATHS,
    ConversionError,
    Imported,
    build_pretrainer,
    check_vocab_tokens,
    guess_lowercase,
    layer_paths,
    split_heads_bias,
    split_heads_kernel,
    split_heads_output_kernel,
)
from models.tokenizer import read_vocab

CONFIG_FILE = "bert_config.json"
CHECKPOINT_PREFIX = "bert_model.ckpt"
# Google's layer_norm (tf.contrib.layers.layer_norm) uses this epsilon.
GOOGLE_LAYER_NORM_EPSILON = 1e-12
SKIPPED = re.compile(r"(/adam_[mv]$|^global_step$|/Momentum$|/Adam(_1)?$|^good_steps$|"
                     r"^loss_scale$)")


def read_config(directory) -> dict:
    """`bert_config.json` → `BertEncoder` keyword arguments."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise ConversionError(f"{directory}: no {CONFIG_FILE}; a Google BERT directory holds "
                              f"bert_config.json, bert_model.ckpt.* and vocab.txt")
    config = json.loads(path.read_text(encoding="utf-8"))
    act = str(config.get("hidden_act", "gelu")).lower()
    if act not in GOOGLE_ACTIVATIONS:
        raise ConversionError(f"{path}: hidden_act {act!r} is not supported; expected one of "
                              f"{sorted(GOOGLE_ACTIVATIONS)}")
    try:
        return {
            "vocabulary_size": int(config["vocab_size"]),
            "num_layers": int(config["num_hidden_layers"]),
            "num_heads": int(config["num_attention_heads"]),
            "hidden_dim": int(config["hidden_size"]),
            "intermediate_dim": int(config["intermediate_size"]),
            "dropout": float(config.get("hidden_dropout_prob", 0.1)),
            "max_sequence_length": int(config.get("max_position_embeddings", 512)),
            "num_segments": int(config.get("type_vocab_size", 2)),
            "activation": GOOGLE_ACTIVATIONS[act],
            "layer_norm_epsilon": GOOGLE_LAYER_NORM_EPSILON,
        }
    except KeyError as err:
        raise ConversionError(f"{path}: missing key {err.args[0]!r}") from err


def checkpoint_prefix(directory) -> str:
    """The checkpoint prefix in a directory: bert_model.ckpt, else the latest / only one."""
    directory = Path(directory)
    if (directory / f"{CHECKPOINT_PREFIX}.index").is_file():
        return str(directory / CHECKPOINT_PREFIX)
    indexes = sorted(directory.glob("*.index"))
    if len(indexes) == 1:
        return str(indexes[0].with_suffix(""))
    if indexes:  # run_pretraining.py output: model.ckpt-<step>.index; take the highest step
        def step(p):
            match = re.search(r"-(\d+)$", p.with_suffix("").name)
            return int(match.group(1)) if match else -1
        return str(max(indexes, key=step).with_suffix(""))
    raise ConversionError(f"{directory}: no TensorFlow checkpoint ({CHECKPOINT_PREFIX}.index and "
                          f"{CHECKPOINT_PREFIX}.data-*) found")


def read_checkpoint(prefix: str) -> dict:
    """{variable name: numpy array} of a TF checkpoint, optimizer slots skipped.

    Uses TensorFlow (`tf.train.load_checkpoint`); the import is local to this
    function so the rest of models/ stays backend-agnostic.
    """
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(prefix)
        names = reader.get_variable_to_shape_map()
        return {name: np.asarray(reader.get_tensor(name), dtype="float32")
                for name in sorted(names) if not SKIPPED.search(name)}
    except (tf.errors.OpError, ValueError, IndexError, RuntimeError) as err:  # truncated or corrupt
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConversionError(f"{prefix}.index / .data-*: not a readable TensorFlow checkpoint "
                              f"({first}); download the checkpoint directory again") from err


def to_keras_weights(variables: dict, architecture: dict, source: str = "checkpoint") -> dict:
    """Google variable names → {our variable path: array in our layout}.

    Warns about checkpoint variables that were not used (other than optimizer slots).
    """
    heads = architecture["num_heads"]
    used = set()
    out = {}

    def take(name, path, fn=None, required=True):
        if name not in variables:
            if required:
                raise ConversionError(f"{source}: no variable {name!r} in the checkpoint")
            return
        used.add(name)
        value = variables[name]
        out[path] = fn(value) if fn else value

    emb = "bert/embeddings"
    take(f"{emb}/word_embeddings", EMBEDDING_PATHS["word"])
    take(f"{emb}/position_embeddings", EMBEDDING_PATHS["position"])
    take(f"{emb}/token_type_embeddings", EMBEDDING_PATHS["segment"])
    take(f"{emb}/LayerNorm/gamma", EMBEDDING_PATHS["norm/gamma"])
    take(f"{emb}/LayerNorm/beta", EMBEDDING_PATHS["norm/beta"])
    for i in range(architecture["num_layers"]):
        ours = layer_paths(i)
        g = f"bert/encoder/layer_{i}"
        for qkv in ("query", "key", "value"):
            take(f"{g}/attention/self/{qkv}/kernel", ours[f"{qkv}/kernel"],
                 lambda x: split_heads_kernel(x, heads))
            take(f"{g}/attention/self/{qkv}/bias", ours[f"{qkv}/bias"],
                 lambda x: split_heads_bias(x, heads))
        take(f"{g}/attention/output/dense/kernel", ours["attention_output/kernel"],
             lambda x: split_heads_output_kernel(x, heads))
        take(f"{g}/attention/output/dense/bias", ours["attention_output/bias"])
        take(f"{g}/attention/output/LayerNorm/gamma", ours["attention_norm/gamma"])
        take(f"{g}/attention/output/LayerNorm/beta", ours["attention_norm/beta"])
        take(f"{g}/intermediate/dense/kernel", ours["intermediate/kernel"])
        take(f"{g}/intermediate/dense/bias", ours["intermediate/bias"])
        take(f"{g}/output/dense/kernel", ours["output/kernel"])
        take(f"{g}/output/dense/bias", ours["output/bias"])
        take(f"{g}/output/LayerNorm/gamma", ours["output_norm/gamma"])
        take(f"{g}/output/LayerNorm/beta", ours["output_norm/beta"])
    # Heads: a fine-tuned or encoder-only checkpoint may lack them.
    take("bert/pooler/dense/kernel", POOLER_PATHS["kernel"], required=False)
    take("bert/pooler/dense/bias", POOLER_PATHS["bias"], required=False)
    mlm = "cls/predictions"
    take(f"{mlm}/transform/dense/kernel", MLM_PATHS["kernel"], required=False)
    take(f"{mlm}/transform/dense/bias", MLM_PATHS["bias"], required=False)
    take(f"{mlm}/transform/LayerNorm/gamma", MLM_PATHS["norm/gamma"], required=False)
    take(f"{mlm}/transform/LayerNorm/beta", MLM_PATHS["norm/beta"], required=False)
    take(f"{mlm}/output_bias", MLM_PATHS["output_bias"], required=False)
    take("cls/seq_relationship/output_weights", NSP_PATHS["kernel"], np.transpose, required=False)
    take("cls/seq_relationship/output_bias", NSP_PATHS["bias"], required=False)

    unused = sorted(set(variables) - used)
    if unused:
        warnings.warn(f"{source}: {len(unused)} checkpoint variable(s) not used: "
                      f"{', '.join(unused[:8])}", stacklevel=2)
    return out


def lowercase_of(directory, tokens) -> bool:
    """Uncased? From the directory name (Google's are uncased_… / cased_…), else the vocab."""
    name = Path(directory).resolve().name.lower()
    if "uncased" in name:
        return True
    if re.search(r"(^|[_-])cased", name):
        return False
    return guess_lowercase(tokens)


def import_checkpoint(directory, lowercase: bool | None = None) -> Imported:
    """Reads a Google BERT directory into a `BertPretrainer` (see the module docstring).

    `lowercase`: the casing of its vocabulary; None reads it from the
    directory name or guesses it from the vocab.
    """
    directory = Path(directory)
    architecture = read_config(directory)
    prefix = checkpoint_prefix(directory)
    variables = read_checkpoint(prefix)
    weights = to_keras_weights(variables, architecture, source=prefix)
    model, missing = build_pretrainer(architecture, weights, source=prefix)
    vocab_file = directory / "vocab.txt"
    vocab = read_vocab(vocab_file) if vocab_file.is_file() else []
    if vocab:
        check_vocab_tokens(vocab, str(vocab_file))
        if len(vocab) != architecture["vocabulary_size"]:
            raise ConversionError(f"{vocab_file} has {len(vocab)} tokens but {CONFIG_FILE} says "
                                  f"vocab_size {architecture['vocabulary_size']}")
    if lowercase is None:
        lowercase = lowercase_of(directory, vocab)
    return Imported(model=model, vocab=vocab, lowercase=lowercase, architecture=architecture,
                    source=str(directory), missing=missing)
