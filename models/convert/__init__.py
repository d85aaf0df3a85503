"""Import Google and Hugging Face BERT checkpoints into `BertPretrainer`; export to Hugging Face.

Three formats, one model:

| format | files | module |
|---|---|---|
| Google (google-research/bert, TF1) | `bert_config.json`, `bert_model.ckpt.*`, `vocab.txt` | `google.py` |
| Hugging Face (`transformers`) | `config.json`, `model.safetensors` or `pytorch_model.bin`, `vocab.txt` | `huggingface.py` |
| ours | a `.keras` file of `models.pretraining.BertPretrainer` | `models/` |

The architecture (sizes, vocabulary size, positions, segment types, layer-norm
epsilon and the GELU form) always comes from the checkpoint's own config, never
from a preset: Google's "gelu" is the tanh approximation, Hugging Face's
`hidden_act: "gelu"` is the exact erf form, and the wrong one costs ~4.5e-3 max
abs difference on a real checkpoint.

Both importers first translate the checkpoint into a dict keyed by our variable
paths (`weight.path`, e.g. `"transformer_layer_0/self_attention_layer/query/kernel"`)
holding arrays in our layout, then `build_pretrainer` builds the model and
assigns every variable, checking each shape.

Layouts (H = hidden, N = heads, D = H / N):

| what | Google (TF1) | Hugging Face (torch) | ours (keras-hub) |
|---|---|---|---|
| dense kernel | (in, out) | weight (out, in) | (in, out) |
| q/k/v kernel | (H, H) | (H, H) transposed | (H, N, D) |
| q/k/v bias | (H,) | (H,) | (N, D) |
| attention output kernel | (H, H) | (H, H) transposed | (N, D, H) |
| NSP weights | output_weights (2, H) | weight (2, H) | kernel (H, 2) |
| MLM output bias | cls/predictions/output_bias | cls.predictions.bias | mlm_head/output_bias |

The MLM decoder is tied to the token embedding in all three.

Usage:

```python
from models import convert

imported = convert.import_huggingface("bert-base-uncased/")   # or convert.import_google(dir)
imported.model                 # a BertPretrainer with the checkpoint's weights
imported.vocab, imported.lowercase, imported.architecture
imported.model.save("model.keras")
convert.export_huggingface(imported.model, "vocab.txt", "hf_dir/", lowercase=True)
tokenizer = convert.tokenizer_from_vocab("vocab.txt", lowercase=True)
source = convert.load_pretrainer("model.keras")  # or an HF / Google directory
```

Command line: `python -m models.convert --help`.

Reading a Google TF1 checkpoint needs TensorFlow (`tf.train.load_checkpoint`);
that import stays inside `google.read_checkpoint`. Reading `pytorch_model.bin`
needs torch, imported inside `huggingface.read_state_dict` only when such a
file is read. Everything else here is numpy, Keras and keras-hub.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from models.convert.common import (  # re-exported: the package's API
    ALBERT_DEFAULTS,
    ARCHITECTURE_KEYS,
    EMBEDDING_PATHS,
    GOOGLE_ACTIVATIONS,
    HEAD_PREFIXES,
    HF_ACTIVATION_NAMES,
    HF_ACTIVATIONS,
    MLM_PATHS,
    NSP_PATHS,
    POOLER_PATHS,
    SPECIAL_TOKENS,
    ConversionError,
    Imported,
    albert_options,
    architecture_mismatches,
    architecture_of,
    assign_weights,
    build_pretrainer,
    check_vocab_tokens,
    guess_lowercase,
    keras_weights,
    layer_paths,
    require_bert,
    split_heads_bias,
    split_heads_kernel,
    split_heads_output_kernel,
    tokenizer_from_vocab,
    write_vocab,
)
from models.tokenizer import read_vocab  # the one vocab reader (also convert.read_vocab)


def import_google(path, **kwargs) -> Imported:
    """See `models.convert.google.import_checkpoint`."""
    from models.convert import google

    return google.import_checkpoint(path, **kwargs)


def import_huggingface(path, **kwargs) -> Imported:
    """See `models.convert.huggingface.import_checkpoint`."""
    from models.convert import huggingface

    return huggingface.import_checkpoint(path, **kwargs)


def export_huggingface(model, vocab, out_dir, lowercase=None) -> Path:
    """See `models.convert.huggingface.export`."""
    from models.convert import huggingface

    return huggingface.export(model, vocab, out_dir, lowercase=lowercase)


def detect_format(path) -> str:
    """"keras" (a .keras file), "huggingface" (a dir with config.json) or "google" (bert_config.json)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".keras":
        return "keras"
    if path.is_dir():
        if (path / "config.json").is_file():
            return "huggingface"
        if (path / "bert_config.json").is_file():
            return "google"
    raise ConversionError(
        f"{path}: not a BERT checkpoint this project reads; expected a .keras file (from "
        f"`python -m models.convert import-hf/import-google` or a pretrain run), a Hugging Face "
        f"directory (config.json + model.safetensors or pytorch_model.bin) or a Google directory "
        f"(bert_config.json + bert_model.ckpt.*)")


def load_pretrainer(path) -> Imported:
    """A `BertPretrainer` from a .keras file, a Hugging Face directory or a Google directory.

    For a .keras file the vocab is read from a `vocab.txt` beside it if there is
    one (the importers' CLI writes it there); `vocab` is empty otherwise.
    """
    kind = detect_format(path)
    if kind == "huggingface":
        return import_huggingface(path)
    if kind == "google":
        return import_google(path)
    from models import load_keras  # registers every class of the package first

    with warnings.catch_warnings():
        # A Task compiles itself on construction; the file holds no optimizer state to load.
        warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
        model = load_keras(path, compile=False)
    if not hasattr(model, "backbone"):
        raise ConversionError(f"{path}: holds a {type(model).__name__}, not a BertPretrainer")
    vocab_file = Path(path).parent / "vocab.txt"
    vocab = read_vocab(vocab_file) if vocab_file.is_file() else []
    return Imported(model=model, vocab=vocab, lowercase=guess_lowercase(vocab) if vocab else True,
                    architecture=architecture_of(model), source=str(path))
