"""What a checkpoint is, read from its small files only (no weights loaded, no Keras).

`describe(path)` reads a `.keras` file's config.json, a Hugging Face directory's config.json
(+ tokenizer_config.json, the safetensors headers) or a Google directory's bert_config.json,
and returns the architecture (the `ARCHITECTURE_KEYS` of `BertEncoder`), the vocab file
and its casing, and whether the weights hold the MLM head. It also checks what can be
checked without loading a tensor: the weight files are there and not truncated, the model
type is BERT, the vocab has as many rows as the embedding matrix. Every problem is a
`ConversionError` whose message names the file and what to do.

The config layer calls it for `model.init_from` (the checkpoint decides the model's sizes,
its vocab and casing), so it must stay cheap: json, zipfile, struct.

    >>> from models.convert.describe import describe
    >>> d = describe("uncased_L-12_H-768_A-12/")  # doctest: +SKIP
    >>> d.architecture["num_layers"], d.lowercase, d.vocab_file.name  # doctest: +SKIP
    (12, True, 'vocab.txt')
"""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path

from models.convert.common import (
    ALBERT_DEFAULTS,
    ARCHITECTURE_KEYS,
    ConversionError,
    guess_lowercase,
    safetensors_header,
)

# model_type values of architectures people try that are not BERT, and what they are.
NOT_BERT = {
    "roberta": "RoBERTa", "xlm-roberta": "XLM-RoBERTa", "deberta": "DeBERTa",
    "deberta-v2": "DeBERTa-v2/v3", "modernbert": "ModernBERT", "distilbert": "DistilBERT",
    "albert": "ALBERT (Google's release)", "electra": "ELECTRA", "camembert": "CamemBERT",
    "mpnet": "MPNet", "xlnet": "XLNet", "gpt2": "GPT-2", "t5": "T5", "llama": "Llama",
}
HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
# Tensor-name fragments of the pretraining heads in a Hugging Face state dict.
HF_MLM_HEAD = "cls.predictions."


@dataclasses.dataclass
class Described:
    """A checkpoint, without its weights.

    format: "keras" | "huggingface" | "google".
    architecture: {ARCHITECTURE_KEYS: value} read from its config.
    vocab_file: its vocab.txt (None when it has none beside it).
    lowercase: its casing (True = uncased); `casing_from` says where that came from.
    mlm_head: whether its weights hold the MLM head (None: not known without loading them).
    """

    path: Path
    format: str
    architecture: dict
    vocab_file: Path | None
    lowercase: bool
    casing_from: str
    mlm_head: bool | None
    vocab_size: int = 0


def describe(path) -> Described:
    """The checkpoint at `path` (a .keras file, a Hugging Face or a Google directory)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".keras":
        return _describe_keras(path)
    if path.is_dir() and (path / "config.json").is_file():
        return _describe_huggingface(path)
    if path.is_dir() and (path / "bert_config.json").is_file():
        return _describe_google(path)
    if not path.exists():
        raise ConversionError(f"{path}: does not exist; give a .keras file, a Hugging Face "
                              f"directory (config.json) or a Google directory (bert_config.json)")
    raise ConversionError(f"{path}: not a checkpoint this project reads; give a .keras file, a "
                          f"Hugging Face directory (config.json + model.safetensors) or a Google "
                          f"directory (bert_config.json + bert_model.ckpt.*)")


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ConversionError(f"{path}: not readable JSON ({err}); download the file again") from err
    if not isinstance(value, dict):
        raise ConversionError(f"{path}: holds a {type(value).__name__}, not a JSON object; "
                              f"download the file again")
    return value


def _full(architecture: dict) -> dict:
    return {key: architecture.get(key, ALBERT_DEFAULTS.get(key)) for key in ARCHITECTURE_KEYS}


def _vocab_rows(vocab_file: Path) -> list:
    from models.tokenizer import read_vocab

    try:
        return read_vocab(vocab_file)
    except (OSError, ValueError) as err:
        raise ConversionError(f"{vocab_file}: not a readable vocab file ({err}); download it "
                              f"again") from err


def _check_vocab(vocab_file: Path, tokens: list, rows: int, what: str) -> None:
    if len(tokens) != rows:
        raise ConversionError(
            f"{vocab_file} has {len(tokens):,} tokens but {what} has {rows:,} rows; the vocab "
            f"and the weights come from different checkpoints: use the vocab.txt released "
            f"with these weights")


def _casing(path: Path, tokens: list, declared: bool | None, declared_in: str) -> tuple:
    if declared is not None:
        return declared, declared_in
    return guess_lowercase(tokens), "guessed from the vocab (no uppercase token: uncased)"


# ---------------------------------------------------------------------------
# The three formats.
# ---------------------------------------------------------------------------
def _describe_keras(path: Path) -> Described:
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            config = json.loads(archive.read("config.json"))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as err:
        raise ConversionError(f"{path}: not a readable .keras file ({err}); write it again "
                              f"(a pretrain run's model.keras or `python -m models.convert "
                              f"import-hf`)") from err
    if "model.weights.h5" not in names:
        raise ConversionError(f"{path}: has no model.weights.h5 inside; write it again")
    inner = config.get("config", {})
    backbone = inner.get("backbone", {}) if isinstance(inner, dict) else {}
    if config.get("class_name") != "BertPretrainer" or "config" not in backbone:
        raise ConversionError(f"{path}: holds a {config.get('class_name')}, not a BertPretrainer; "
                              f"continue pretraining from a pretrain run's model.keras or an "
                              f"imported checkpoint (`python -m models.convert import-hf`)")
    architecture = _full(backbone["config"])
    vocab_file = path.parent / "vocab.txt"
    if not vocab_file.is_file():
        return Described(path, "keras", architecture, None, True, "unknown (no vocab.txt)", True)
    tokens = _vocab_rows(vocab_file)
    _check_vocab(vocab_file, tokens, architecture["vocabulary_size"], f"the embedding of {path}")
    declared, where = None, ""
    meta = vocab_file.with_name("vocab.json")
    if meta.is_file() and "lowercase" in _read_json(meta):
        declared, where = bool(_read_json(meta)["lowercase"]), str(meta)
    lowercase, where = _casing(path, tokens, declared, where)
    return Described(path, "keras", architecture, vocab_file, lowercase, where, True, len(tokens))


def _describe_huggingface(path: Path) -> Described:
    from models.convert import huggingface

    config = _read_json(path / "config.json")
    model_type = str(config.get("model_type", "bert"))
    if model_type != "bert":
        name = NOT_BERT.get(model_type, f"model_type {model_type!r}")
        raise ConversionError(
            f"{path / 'config.json'}: a {name} checkpoint (model_type {model_type!r}); this "
            f"project imports BERT only (model_type 'bert': Google's BERT and its Hugging Face "
            f"ports, e.g. bert-base-uncased, BioBERT, SciBERT, all-MiniLM); start from one")
    architecture = _full(huggingface.read_config(path))
    headers = _hf_weight_headers(path)
    names = {name for header in headers for name in header}
    rows = _hf_embedding_rows(headers)
    if rows is not None and rows != architecture["vocabulary_size"]:
        raise ConversionError(f"{path / 'config.json'} says vocab_size "
                              f"{architecture['vocabulary_size']:,} but the word embeddings in "
                              f"the weights have {rows:,} rows; download the checkpoint again")
    mlm = any(HF_MLM_HEAD in name for name in names) if headers else None
    vocab_file = path / "vocab.txt"
    if not vocab_file.is_file():
        return Described(path, "huggingface", architecture, None, True, "unknown (no vocab.txt)",
                         mlm)
    tokens = _vocab_rows(vocab_file)
    _check_vocab(vocab_file, tokens, architecture["vocabulary_size"],
                 f"the word embedding ({path / 'config.json'} vocab_size)")
    declared, where = None, ""
    tokenizer_config = path / "tokenizer_config.json"
    if tokenizer_config.is_file() and "do_lower_case" in _read_json(tokenizer_config):
        declared = bool(_read_json(tokenizer_config)["do_lower_case"])
        where = f"{tokenizer_config} do_lower_case"
    lowercase, where = _casing(path, tokens, declared, where)
    return Described(path, "huggingface", architecture, vocab_file, lowercase, where, mlm,
                     len(tokens))


def _describe_google(path: Path) -> Described:
    from models.convert import google

    architecture = _full(google.read_config(path))
    prefix = Path(google.checkpoint_prefix(path))
    data_files = sorted(prefix.parent.glob(prefix.name + ".data-*"))
    if not data_files:
        raise ConversionError(f"{prefix}.index: its data file ({prefix.name}.data-00000-of-00001) "
                              f"is missing; download the whole checkpoint directory again")
    vocab_file = path / "vocab.txt"
    if not vocab_file.is_file():
        return Described(path, "google", architecture, None, True, "unknown (no vocab.txt)", None)
    tokens = _vocab_rows(vocab_file)
    _check_vocab(vocab_file, tokens, architecture["vocabulary_size"],
                 f"the word embedding ({path / 'bert_config.json'} vocab_size)")
    name = path.resolve().name.lower()
    declared = True if "uncased" in name else (False if "cased" in name else None)
    lowercase, where = _casing(path, tokens, declared, f"the directory name {path.name!r}")
    return Described(path, "google", architecture, vocab_file, lowercase, where, None, len(tokens))


# ---------------------------------------------------------------------------
# Hugging Face weight files: present, complete, and what they hold (headers only).
# ---------------------------------------------------------------------------
def _hf_weight_headers(path: Path) -> list:
    """The safetensors headers ({tensor name: {"shape": ...}}) of the checkpoint's weight
    files; [] for pytorch_model.bin (read only when imported). Missing, truncated or
    unreadable files raise ConversionError naming the file."""
    if (path / "model.safetensors").exists():
        return [safetensors_header(path / "model.safetensors")]
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = _read_json(index).get("weight_map", {})
        shards = sorted(set(weight_map.values()))
        if not shards:
            raise ConversionError(f"{index}: has no weight_map; download the checkpoint again")
        return [safetensors_header(path / shard) for shard in shards]
    if (path / "pytorch_model.bin").exists():
        if (path / "pytorch_model.bin").stat().st_size == 0:
            raise ConversionError(f"{path / 'pytorch_model.bin'}: is empty; download it again")
        return []
    raise ConversionError(f"{path}: has config.json but no weights ({', '.join(HF_WEIGHT_FILES)}); "
                          f"download the weight file into the directory")


def _hf_embedding_rows(headers: list) -> int | None:
    for header in headers:
        for name, entry in header.items():
            if name.endswith("embeddings.word_embeddings.weight"):
                return int(entry["shape"][0])
    return None
