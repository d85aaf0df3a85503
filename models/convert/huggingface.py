"""Hugging Face BERT directories ↔ `BertPretrainer`.

Import: a local directory with `config.json` (`model_type: "bert"`),
`model.safetensors` (or a sharded `model.safetensors.index.json`) or
`pytorch_model.bin`, and `vocab.txt`. Offline: nothing is fetched. The names
are those of `transformers`' `BertForPreTraining` (a bare `BertModel` has no
`bert.` prefix and no `cls.*` heads; both are accepted):

    bert.embeddings.{word,position,token_type}_embeddings.weight
    bert.embeddings.LayerNorm.{weight,bias}     (older files: gamma, beta)
    bert.encoder.layer.{i}.attention.self.{query,key,value}.{weight,bias}
    bert.encoder.layer.{i}.attention.output.dense.{weight,bias}
    bert.encoder.layer.{i}.attention.output.LayerNorm.{weight,bias}
    bert.encoder.layer.{i}.intermediate.dense.{weight,bias}
    bert.encoder.layer.{i}.output.dense.{weight,bias}
    bert.encoder.layer.{i}.output.LayerNorm.{weight,bias}
    bert.pooler.dense.{weight,bias}
    cls.predictions.transform.dense.{weight,bias}
    cls.predictions.transform.LayerNorm.{weight,bias}
    cls.predictions.bias                        (decoder.weight is tied to word_embeddings)
    cls.seq_relationship.{weight,bias}

torch `Linear.weight` is (out, in): every dense weight is transposed. The
activation follows `hidden_act` ("gelu" = exact erf; "gelu_new",
"gelu_pytorch_tanh", "gelu_fast" = tanh approximation), the epsilon
`layer_norm_eps`. safetensors files are read with the `safetensors` package's
numpy API (bfloat16 tensors are widened to float32 by hand, numpy has no
bfloat16); `pytorch_model.bin` needs torch, imported only then.

Export: `export(model, vocab, out_dir)` writes `config.json` (with the
`hidden_act` of the model's activation), `model.safetensors`, `vocab.txt`,
`tokenizer_config.json` and `special_tokens_map.json`, which
`transformers.BertForPreTraining.from_pretrained(out_dir)` and
`BertTokenizerFast.from_pretrained(out_dir)` load.

    >>> from models.convert import huggingface
    >>> imported = huggingface.import_checkpoint("bert-base-uncased/")  # doctest: +SKIP
    >>> huggingface.export(imported.model, imported.vocab, "out/")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path

import numpy as np

from models.convert.common import (
    EMBEDDING_PATHS,
    HF_ACTIVATION_NAMES,
    HF_ACTIVATIONS,
    MLM_PATHS,
    NSP_PATHS,
    POOLER_PATHS,
    SPECIAL_TOKENS,
    ConversionError,
    Imported,
    build_pretrainer,
    check_vocab_tokens,
    guess_lowercase,
    keras_weights,
    layer_paths,
    require_bert,
    safetensors_header,
    split_heads_bias,
    split_heads_kernel,
    split_heads_output_kernel,
    write_vocab,
)
from models.tokenizer import read_vocab

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
# Buffers and duplicates that carry no weights of their own.
IGNORED = ("embeddings.position_ids", "cls.predictions.decoder.weight",
           "cls.predictions.decoder.bias")


# ---------------------------------------------------------------------------
# Reading.
# ---------------------------------------------------------------------------
def read_config(directory) -> dict:
    """`config.json` → `BertEncoder` keyword arguments."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise ConversionError(f"{directory}: no config.json; a Hugging Face BERT directory holds "
                              f"config.json, model.safetensors (or pytorch_model.bin), vocab.txt")
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("model_type", "bert") != "bert":
        raise ConversionError(f"{path}: model_type {config.get('model_type')!r} is not 'bert'; "
                              f"only BERT checkpoints are supported")
    position_type = config.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ConversionError(f"{path}: position_embedding_type {position_type!r} is not "
                              f"supported (only 'absolute', as in BERT)")
    act = config.get("hidden_act", "gelu")
    if act not in HF_ACTIVATIONS:
        raise ConversionError(f"{path}: hidden_act {act!r} is not supported; expected one of "
                              f"{sorted(HF_ACTIVATIONS)}")
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
            "activation": HF_ACTIVATIONS[act],
            "layer_norm_epsilon": float(config.get("layer_norm_eps", 1e-12)),
        }
    except KeyError as err:
        raise ConversionError(f"{path}: missing key {err.args[0]!r}") from err


def _read_safetensors_file(path: Path) -> dict:
    """{name: float32 array}; bfloat16 tensors are widened by hand (numpy has no bfloat16)."""
    from safetensors.numpy import load_file

    safetensors_header(path)  # present, readable, not truncated: else one line naming it
    try:
        return {k: np.asarray(v, dtype="float32") for k, v in load_file(str(path)).items()}
    except (TypeError, ValueError) as err:  # e.g. "data type 'bfloat16' not understood"
        first_error = err
    # The format: 8-byte little-endian header size, a JSON header, then the raw bytes.
    with open(path, "rb") as handle:
        (header_size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_size))
        data = handle.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = data[start:end]
        dtype = info["dtype"]
        if dtype == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype("<u4") << 16
            value = bits.view("<f4")
        elif dtype in ("F16", "F32", "F64"):
            value = np.frombuffer(raw, dtype={"F16": "<f2", "F32": "<f4", "F64": "<f8"}[dtype])
        else:
            raise ConversionError(f"{path}: cannot read tensor {name} of dtype {dtype} "
                                  f"({first_error})")
        out[name] = value.reshape(info["shape"]).astype("float32")
    return out


def _read_pytorch_bin(path: Path) -> dict:
    try:
        import torch
    except ImportError as err:
        raise ConversionError(
            f"{path}: reading pytorch_model.bin needs torch (pip install torch, the CPU build is "
            f"enough), or convert the directory to model.safetensors first") from err
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    return {k: v.detach().float().numpy() for k, v in state.items() if hasattr(v, "detach")}


def read_state_dict(directory) -> dict:
    """{name: float32 array} from model.safetensors (single or sharded) or pytorch_model.bin."""
    directory = Path(directory)
    if (directory / SAFETENSORS).is_file():
        return _read_safetensors_file(directory / SAFETENSORS)
    if (directory / SAFETENSORS_INDEX).is_file():
        index = json.loads((directory / SAFETENSORS_INDEX).read_text(encoding="utf-8"))
        state = {}
        for shard in sorted(set(index["weight_map"].values())):
            state.update(_read_safetensors_file(directory / shard))
        return state
    if (directory / PYTORCH_BIN).is_file():
        try:
            return _read_pytorch_bin(directory / PYTORCH_BIN)
        except (RuntimeError, EOFError, ValueError, OSError) as err:  # torch: truncated / not a zip
            raise ConversionError(f"{directory / PYTORCH_BIN}: not a readable PyTorch checkpoint "
                                  f"({str(err).splitlines()[0] if str(err) else type(err).__name__})"
                                  f"; download it again") from err
    raise ConversionError(f"{directory}: no {SAFETENSORS}, {SAFETENSORS_INDEX} or {PYTORCH_BIN}")


def normalize_names(state: dict) -> dict:
    """Drops the `bert.` prefix; old LayerNorm names gamma/beta → weight/bias."""
    out = {}
    for name, value in state.items():
        if name.startswith("bert."):
            name = name[len("bert."):]
        if ".LayerNorm." in name:
            name = name.replace(".LayerNorm.gamma", ".LayerNorm.weight")
            name = name.replace(".LayerNorm.beta", ".LayerNorm.bias")
        out[name] = value
    return out


def to_keras_weights(state: dict, architecture: dict, source: str = "checkpoint") -> dict:
    """HF state dict → {our variable path: array in our layout}. Warns about unused names."""
    state = normalize_names(state)
    heads = architecture["num_heads"]
    used = set()
    out = {}

    def take(name, path, fn=None, required=True):
        if name not in state:
            if required:
                raise ConversionError(f"{source}: no tensor {name!r} (nor 'bert.{name}')")
            return
        used.add(name)
        out[path] = fn(state[name]) if fn else state[name]

    t = np.transpose
    take("embeddings.word_embeddings.weight", EMBEDDING_PATHS["word"])
    take("embeddings.position_embeddings.weight", EMBEDDING_PATHS["position"])
    take("embeddings.token_type_embeddings.weight", EMBEDDING_PATHS["segment"])
    take("embeddings.LayerNorm.weight", EMBEDDING_PATHS["norm/gamma"])
    take("embeddings.LayerNorm.bias", EMBEDDING_PATHS["norm/beta"])
    for i in range(architecture["num_layers"]):
        ours = layer_paths(i)
        h = f"encoder.layer.{i}"
        for qkv in ("query", "key", "value"):
            take(f"{h}.attention.self.{qkv}.weight", ours[f"{qkv}/kernel"],
                 lambda x: split_heads_kernel(t(x), heads))
            take(f"{h}.attention.self.{qkv}.bias", ours[f"{qkv}/bias"],
                 lambda x: split_heads_bias(x, heads))
        take(f"{h}.attention.output.dense.weight", ours["attention_output/kernel"],
             lambda x: split_heads_output_kernel(t(x), heads))
        take(f"{h}.attention.output.dense.bias", ours["attention_output/bias"])
        take(f"{h}.attention.output.LayerNorm.weight", ours["attention_norm/gamma"])
        take(f"{h}.attention.output.LayerNorm.bias", ours["attention_norm/beta"])
        take(f"{h}.intermediate.dense.weight", ours["intermediate/kernel"], t)
        take(f"{h}.intermediate.dense.bias", ours["intermediate/bias"])
        take(f"{h}.output.dense.weight", ours["output/kernel"], t)
        take(f"{h}.output.dense.bias", ours["output/bias"])
        take(f"{h}.output.LayerNorm.weight", ours["output_norm/gamma"])
        take(f"{h}.output.LayerNorm.bias", ours["output_norm/beta"])
    take("pooler.dense.weight", POOLER_PATHS["kernel"], t, required=False)
    take("pooler.dense.bias", POOLER_PATHS["bias"], required=False)
    take("cls.predictions.transform.dense.weight", MLM_PATHS["kernel"], t, required=False)
    take("cls.predictions.transform.dense.bias", MLM_PATHS["bias"], required=False)
    take("cls.predictions.transform.LayerNorm.weight", MLM_PATHS["norm/gamma"], required=False)
    take("cls.predictions.transform.LayerNorm.bias", MLM_PATHS["norm/beta"], required=False)
    if "cls.predictions.bias" in state:
        take("cls.predictions.bias", MLM_PATHS["output_bias"])
    else:
        take("cls.predictions.decoder.bias", MLM_PATHS["output_bias"], required=False)
    take("cls.seq_relationship.weight", NSP_PATHS["kernel"], t, required=False)
    take("cls.seq_relationship.bias", NSP_PATHS["bias"], required=False)

    decoder = state.get("cls.predictions.decoder.weight")
    word = state.get("embeddings.word_embeddings.weight")
    if decoder is not None and word is not None and not np.array_equal(decoder, word):
        warnings.warn(f"{source}: cls.predictions.decoder.weight differs from the word "
                      f"embeddings (an untied decoder); our MLM head is tied, so the word "
                      f"embeddings are used", stacklevel=2)
    unused = sorted(n for n in set(state) - used if n not in IGNORED)
    if unused:
        warnings.warn(f"{source}: {len(unused)} tensor(s) not used: {', '.join(unused[:8])}",
                      stacklevel=2)
    return out


def lowercase_of(directory, tokens) -> bool:
    """do_lower_case from tokenizer_config.json, else guessed from the vocab."""
    path = Path(directory) / "tokenizer_config.json"
    if path.is_file():
        config = json.loads(path.read_text(encoding="utf-8"))
        if "do_lower_case" in config:
            return bool(config["do_lower_case"])
    return guess_lowercase(tokens)


def _vocab_from_tokenizer_json(path: Path) -> list:
    model = json.loads(path.read_text(encoding="utf-8")).get("model", {})
    if model.get("type") != "WordPiece":
        raise ConversionError(f"{path}: tokenizer model {model.get('type')!r} is not WordPiece")
    ids = model["vocab"]
    tokens = [None] * len(ids)
    for token, i in ids.items():
        tokens[i] = token
    return tokens


def import_checkpoint(directory, lowercase: bool | None = None) -> Imported:
    """Reads a Hugging Face BERT directory into a `BertPretrainer` (see the module docstring).

    The vocab comes from vocab.txt (or tokenizer.json's WordPiece vocab);
    `lowercase` None reads do_lower_case from tokenizer_config.json, else guesses.
    """
    directory = Path(directory)
    architecture = read_config(directory)
    state = read_state_dict(directory)
    weights = to_keras_weights(state, architecture, source=str(directory))
    model, missing = build_pretrainer(architecture, weights, source=str(directory))
    vocab = []
    if (directory / "vocab.txt").is_file():
        vocab = read_vocab(directory / "vocab.txt")
    elif (directory / "tokenizer.json").is_file():
        vocab = _vocab_from_tokenizer_json(directory / "tokenizer.json")
    if vocab:
        check_vocab_tokens(vocab, str(directory))
        if len(vocab) != architecture["vocabulary_size"]:
            raise ConversionError(f"{directory}: the vocab has {len(vocab)} tokens but config.json "
                                  f"says vocab_size {architecture['vocabulary_size']}")
    if lowercase is None:
        lowercase = lowercase_of(directory, vocab)
    return Imported(model=model, vocab=vocab, lowercase=lowercase, architecture=architecture,
                    source=str(directory), missing=missing)


# ---------------------------------------------------------------------------
# Writing.
# ---------------------------------------------------------------------------
def to_state_dict(model) -> dict:
    """A `BertPretrainer`'s weights under `BertForPreTraining` names, torch layout (float32)."""
    encoder = model.backbone
    hidden = encoder.hidden_dim
    w = keras_weights(model)

    def t(x):
        return np.ascontiguousarray(np.transpose(x))

    state = {
        "bert.embeddings.word_embeddings.weight": w[EMBEDDING_PATHS["word"]],
        "bert.embeddings.position_embeddings.weight": w[EMBEDDING_PATHS["position"]],
        "bert.embeddings.token_type_embeddings.weight": w[EMBEDDING_PATHS["segment"]],
        "bert.embeddings.LayerNorm.weight": w[EMBEDDING_PATHS["norm/gamma"]],
        "bert.embeddings.LayerNorm.bias": w[EMBEDDING_PATHS["norm/beta"]],
    }
    for i in range(encoder.num_layers):
        ours = layer_paths(i)
        h = f"bert.encoder.layer.{i}"
        for qkv in ("query", "key", "value"):
            kernel = w[ours[f"{qkv}/kernel"]].reshape(hidden, hidden)  # (H, N, D) → (H, H)
            state[f"{h}.attention.self.{qkv}.weight"] = t(kernel)
            state[f"{h}.attention.self.{qkv}.bias"] = w[ours[f"{qkv}/bias"]].reshape(hidden)
        state[f"{h}.attention.output.dense.weight"] = t(
            w[ours["attention_output/kernel"]].reshape(hidden, hidden))
        state[f"{h}.attention.output.dense.bias"] = w[ours["attention_output/bias"]]
        state[f"{h}.attention.output.LayerNorm.weight"] = w[ours["attention_norm/gamma"]]
        state[f"{h}.attention.output.LayerNorm.bias"] = w[ours["attention_norm/beta"]]
        state[f"{h}.intermediate.dense.weight"] = t(w[ours["intermediate/kernel"]])
        state[f"{h}.intermediate.dense.bias"] = w[ours["intermediate/bias"]]
        state[f"{h}.output.dense.weight"] = t(w[ours["output/kernel"]])
        state[f"{h}.output.dense.bias"] = w[ours["output/bias"]]
        state[f"{h}.output.LayerNorm.weight"] = w[ours["output_norm/gamma"]]
        state[f"{h}.output.LayerNorm.bias"] = w[ours["output_norm/beta"]]
    state.update({
        "bert.pooler.dense.weight": t(w[POOLER_PATHS["kernel"]]),
        "bert.pooler.dense.bias": w[POOLER_PATHS["bias"]],
        "cls.predictions.transform.dense.weight": t(w[MLM_PATHS["kernel"]]),
        "cls.predictions.transform.dense.bias": w[MLM_PATHS["bias"]],
        "cls.predictions.transform.LayerNorm.weight": w[MLM_PATHS["norm/gamma"]],
        "cls.predictions.transform.LayerNorm.bias": w[MLM_PATHS["norm/beta"]],
        "cls.predictions.bias": w[MLM_PATHS["output_bias"]],
        "cls.seq_relationship.weight": t(w[NSP_PATHS["kernel"]]),
        "cls.seq_relationship.bias": w[NSP_PATHS["bias"]],
    })
    return {k: np.ascontiguousarray(v, dtype="float32") for k, v in state.items()}


def hf_config(model) -> dict:
    encoder = model.backbone
    return {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "vocab_size": encoder.vocabulary_size,
        "hidden_size": encoder.hidden_dim,
        "num_hidden_layers": encoder.num_layers,
        "num_attention_heads": encoder.num_heads,
        "intermediate_size": encoder.intermediate_dim,
        "hidden_act": HF_ACTIVATION_NAMES[encoder.activation],
        "hidden_dropout_prob": encoder.dropout,
        "attention_probs_dropout_prob": encoder.dropout,
        "max_position_embeddings": encoder.max_sequence_length,
        "type_vocab_size": encoder.num_segments,
        "initializer_range": 0.02,
        "layer_norm_eps": encoder.layer_norm_epsilon,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        "dtype": "float32",
    }


def export(model, vocab, out_dir, lowercase: bool | None = None) -> Path:
    """Writes a Hugging Face BERT directory for a `BertPretrainer`.

    vocab: a vocab.txt path or a list of tokens (its length must equal the
    model's vocabulary size). lowercase: the tokenizer's casing; None guesses
    it from the vocab (no uppercase letters → uncased).
    """
    from safetensors.numpy import save_file

    require_bert(model, "export to Hugging Face (BertForPreTraining)")
    tokens = read_vocab(vocab) if isinstance(vocab, (str, Path)) else list(vocab)
    size = model.backbone.vocabulary_size
    if len(tokens) != size:
        raise ConversionError(f"the vocab has {len(tokens)} tokens but the model's vocabulary "
                              f"size is {size}; export needs the vocab the model was trained with")
    check_vocab_tokens(tokens, "vocab")
    if lowercase is None:
        lowercase = guess_lowercase(tokens)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(to_state_dict(model), str(out / SAFETENSORS), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(model), indent=2) + "\n",
                                     encoding="utf-8")
    write_vocab(tokens, out / "vocab.txt")
    special = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
               "cls_token": "[CLS]", "mask_token": "[MASK]"}
    assert set(special.values()) == set(SPECIAL_TOKENS)
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": bool(lowercase),
        "strip_accents": None,  # None: follows do_lower_case, as in BERT
        "tokenize_chinese_chars": True,
        "model_max_length": model.backbone.max_sequence_length,
        **special,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n",
                                               encoding="utf-8")
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n",
                                                 encoding="utf-8")
    return out
