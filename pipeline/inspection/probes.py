"""Loading a model for inspection, and the probes: fill-mask, NSP, attention, embeddings.

See the package docstring (pipeline/inspection/__init__.py) for examples.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from beam_jobs.schema import NSP_IS_NEXT
from pipeline.text.tokenizer import Tokenizer
from pipeline.text.vocab import TextError

POOLINGS = ("cls", "mean", "tokens")


# Probe inputs for `log_attention_probes`: (sentence A, sentence B or None).
PROBES = (
    ("The man went to the store.", "He bought a gallon of milk."),
    ("The cat sat on the mat because it was tired.", None),
    ("She gave him the book, and he read it to the children.", None),
)


class InspectError(TextError):
    """Bad input (text, path, option): the CLI prints the message and exits with status 2."""


# ---------------------------------------------------------------------------
# Models: a .keras BertPretrainer or a SavedModel's `serve` endpoint, behind one interface.
# ---------------------------------------------------------------------------
@dataclass
class LoadedModel:
    """A pretrainer from `.keras` (`keras_model`) or a SavedModel (`serve`), with its limits."""

    path: Path | None
    keras_model: Any | None
    serve: Callable | None
    max_sequence_length: int
    vocabulary_size: int
    saved_model: Any = None  # the loaded SavedModel: `serve` needs it alive (it owns the variables)

    @property
    def kind(self) -> str:
        return "keras" if self.keras_model is not None else "saved_model"

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{"token_ids", "segment_ids", "padding_mask", "mask_positions"} -> {"mlm", "nsp"} logits."""
        if self.keras_model is not None:
            import keras

            heads = getattr(self.keras_model, "output", None)
            if not (isinstance(heads, dict) and {"mlm", "nsp"} <= heads.keys()):
                raise InspectError(
                    f"fill-mask and nsp need a pretrainer with MLM and NSP heads; "
                    f"{self.path or type(self.keras_model).__name__} has outputs "
                    f"{sorted(heads) if isinstance(heads, dict) else heads}")
            outputs = self.keras_model(inputs, training=False)
            return {k: keras.ops.convert_to_numpy(v) for k, v in outputs.items()}
        import tensorflow as tf

        outputs = self.serve({k: tf.constant(v, tf.int32) for k, v in inputs.items()})
        return {k: v.numpy() for k, v in outputs.items()}

    def encoder(self, command: str):
        """The encoder (BertEncoder / BertBackbone), or InspectError for a SavedModel."""
        if self.keras_model is None:
            raise InspectError(
                f"{command} needs the .keras model: the SavedModel {self.path} only returns the MLM "
                f"and NSP logits; pass --model <run_dir>/pretrain/model.keras (or --run-dir)")
        return _encoder_of(self.keras_model)


def _encoder_of(model):
    if hasattr(model, "transformer_layers"):
        return model
    if hasattr(getattr(model, "backbone", None), "transformer_layers"):
        return model.backbone
    raise InspectError(f"{type(model).__name__} is not a BERT encoder or pretrainer (no transformer "
                       f"layers found)")


def as_model(model) -> LoadedModel:
    """A `LoadedModel` as is; a Keras pretrainer or encoder wrapped in one."""
    if isinstance(model, LoadedModel):
        return model
    encoder = _encoder_of(model)
    max_length = getattr(encoder, "max_sequence_length", None) or \
        encoder.position_embedding.sequence_length
    return LoadedModel(None, model, None, int(max_length), int(encoder.vocabulary_size))


def _require_model(path: Path) -> Path:
    if not path.exists():
        raise InspectError(f"model {path} not found; pass --model PATH to a .keras file or a "
                           f"SavedModel directory, or --run-dir of a trained run")
    return path


def load_model(path: str | Path) -> LoadedModel:
    """Loads a `.keras` pretrainer or a SavedModel directory with a `serve` endpoint."""
    path = _require_model(Path(path))
    if path.is_file() and path.suffix == ".keras":
        import models

        try:
            with warnings.catch_warnings():  # "Skipping variable loading for optimizer"
                warnings.simplefilter("ignore", UserWarning)
                model = models.load_keras(path, compile=False)
        except Exception as err:  # noqa: BLE001 - reported as bad input
            raise InspectError(f"could not load {path} as a Keras model: {err}") from err
        loaded = as_model(model)
        loaded.path = path
        return loaded
    if path.is_dir() and (path / "saved_model.pb").is_file():
        import tensorflow as tf

        try:
            saved = tf.saved_model.load(str(path))
        except Exception as err:  # noqa: BLE001 - reported as bad input
            raise InspectError(f"could not load the SavedModel {path}: {err}") from err
        if not hasattr(saved, "serve"):
            raise InspectError(f"the SavedModel {path} has no `serve` endpoint; export it with "
                               f"model.export(path, format='tf_saved_model')")
        shapes = {v.name.split(":")[0]: v.shape for v in getattr(saved, "variables", [])}
        positions = shapes.get("position_embedding/embeddings")
        tokens = shapes.get("token_embedding/embeddings")
        if positions is None or tokens is None:
            raise InspectError(f"the SavedModel {path} has no position/token embedding variables; "
                               f"is it a BERT pretrainer exported by this project?")
        return LoadedModel(path, None, saved.serve, int(positions[0]), int(tokens[0]), saved)
    raise InspectError(f"{path} is neither a .keras file nor a SavedModel directory "
                       f"(a folder with saved_model.pb)")


def load(run_dir: str | Path | None = None, model: str | Path | None = None,
         vocab: str | Path | None = None, lowercase: bool | None = None
         ) -> tuple[LoadedModel, Tokenizer]:
    """The model and its tokenizer, from a run directory and/or explicit paths.

    `model` defaults to `<run_dir>/pretrain/model.keras`; `vocab` to
    `<run_dir>/vocab/vocab.txt`, else a vocab.txt beside the model or in
    `<model's grandparent>/vocab/`; `lowercase=None` reads `vocab.json` beside
    the vocab. `run_dir` defaults to `runs/default` when `model` is not given.
    """
    from pipeline.artifacts import Artifacts

    if run_dir is None and model is None:
        run_dir = "runs/default"
    paths = Artifacts(run_dir) if run_dir is not None else None
    if model is None:
        model = paths.model_keras
        if not Path(model).exists():
            raise InspectError(f"no trained model at {model}; train one with `make pretrain` (or "
                               f"`python -m pipeline all`), or pass --model PATH")
    model = _require_model(Path(model))  # before the vocab, so the message names what is wrong
    if vocab is None:
        candidates = ([paths.vocab_file] if paths is not None else []) + [
            model.parent / "vocab.txt", model.parent.parent / "vocab" / "vocab.txt"]
        vocab = next((c for c in candidates if c.is_file()), None)
        if vocab is None:
            raise InspectError(f"no vocab found for {model} (looked at "
                               f"{', '.join(str(c) for c in candidates)}); pass --vocab PATH")
    tokenizer = Tokenizer.from_vocab(vocab, lowercase)
    loaded = load_model(model)
    if loaded.vocabulary_size != len(tokenizer):
        raise InspectError(f"the vocab {vocab} has {len(tokenizer)} tokens but the model {model} has "
                           f"{loaded.vocabulary_size}; pass the vocab the model was trained with")
    return loaded, tokenizer


# ---------------------------------------------------------------------------
# fill-mask and next-sentence prediction.
# ---------------------------------------------------------------------------
def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, "float64")
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def fill_mask(model, tokenizer: Tokenizer, text: str, top_k: int = 5,
              text_b: str | None = None) -> list[list[dict]]:
    """Per [MASK] (left to right, in `text` then `text_b`), the `top_k` tokens, most likely first:
    `[[{"token", "id", "probability"}, ...], ...]`.

    Probabilities are the softmax over the whole vocab of the MLM logits at the mask.
    """
    model = as_model(model)
    if top_k < 1:
        raise InspectError(f"--top-k must be at least 1, got {top_k}")
    inputs = tokenizer.encode([(text, text_b)], model.max_sequence_length)
    positions = np.flatnonzero(inputs["token_ids"][0] == tokenizer.mask_id)
    if positions.size == 0:
        raise InspectError(f"no [MASK] in {text!r}; write [MASK] (capitals, in square brackets) "
                           f"where the model should fill in a word")
    inputs["mask_positions"] = positions[None, :].astype("int32")  # (1, masks)
    probabilities = _softmax(model.predict(inputs)["mlm"][0])  # (masks, vocab)
    top = np.argsort(-probabilities, axis=-1, kind="stable")[:, :top_k]
    return [[{"token": tokenizer.vocab[i], "id": int(i), "probability": float(row[i])} for i in ids]
            for ids, row in zip(top, probabilities)]


def nsp_probability(model, tokenizer: Tokenizer, text_a: str | Sequence[str],
                    text_b: str | Sequence[str]) -> float | np.ndarray:
    """P(B is the sentence that follows A): softmax of the NSP logits, class `NSP_IS_NEXT`.

    Two strings give a float; two equal-length lists of strings score the pairs in
    one batch and give an array.
    """
    model = as_model(model)
    single = isinstance(text_a, str)
    pairs = [(text_a, text_b)] if single else list(zip(text_a, text_b, strict=True))
    inputs = tokenizer.encode(pairs, model.max_sequence_length)
    inputs["mask_positions"] = np.zeros((len(pairs), 1), "int32")  # the MLM output is not used
    probabilities = _softmax(model.predict(inputs)["nsp"])[:, NSP_IS_NEXT]  # (pairs,)
    return float(probabilities[0]) if single else probabilities


# ---------------------------------------------------------------------------
# Attention.
# ---------------------------------------------------------------------------
def encoder_trace(model, inputs: dict[str, np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """Runs the encoder layer by layer (inference mode).

    Returns the hidden states `[(batch, seq, hidden)] * (1 + layers)` (embeddings,
    then each layer's output; the last is `sequence_output`) and the attention
    weights `(batch, layers, heads, seq, seq)`: row q of a head is the softmax over
    keys of QK^T/sqrt(head_dim), padded keys masked (weight 0).
    """
    import keras

    encoder = model.encoder("attention") if isinstance(model, LoadedModel) else _encoder_of(model)
    token_ids = keras.ops.convert_to_tensor(inputs["token_ids"], "int32")
    segment_ids = keras.ops.convert_to_tensor(inputs["segment_ids"], "int32")
    padding_mask = keras.ops.convert_to_tensor(inputs["padding_mask"], "int32")
    # The embedding block of BertEncoder (dropout is the identity at inference).
    tokens = encoder.token_embedding(token_ids)  # (batch, seq, hidden)
    positions = encoder.position_embedding(tokens)  # (batch, seq, hidden)
    segments = encoder.segment_embedding(segment_ids)  # (batch, seq, hidden)
    x = encoder.embeddings_layer_norm(encoder.embeddings_add((tokens, positions, segments)))
    if getattr(encoder, "embeddings_projection", None) is not None:  # ALBERT: E -> hidden
        x = encoder.embeddings_projection(x)
    hidden, attention = [x], []
    for layer in encoder.transformer_layers:
        x, scores = layer(x, padding_mask=padding_mask, training=False,
                          return_attention_scores=True)  # scores: (batch, heads, seq, seq)
        hidden.append(x)
        attention.append(scores)
    hidden = [keras.ops.convert_to_numpy(keras.ops.cast(h, "float32")) for h in hidden]
    attention = np.stack([keras.ops.convert_to_numpy(keras.ops.cast(a, "float32"))
                          for a in attention], axis=1)  # (batch, layers, heads, seq, seq)
    return hidden, attention


def attention_maps(model, tokenizer: Tokenizer, text: str, text_b: str | None = None,
                   check: bool = True) -> np.ndarray:
    """Attention weights for one input: `(layers, heads, seq, seq)`, rows = queries, columns = keys.

    With `check`, the layer-by-layer recomputation must reproduce the model's
    `sequence_output` (RuntimeError otherwise).
    """
    import keras

    model = as_model(model)
    encoder = model.encoder("attention")
    inputs = tokenizer.encode([(text, text_b)], model.max_sequence_length)
    hidden, attention = encoder_trace(encoder, inputs)
    if check:
        expected = keras.ops.convert_to_numpy(keras.ops.cast(
            encoder(inputs, training=False)["sequence_output"], "float32"))
        scale = max(1.0, float(np.abs(expected).max()))
        difference = float(np.abs(hidden[-1] - expected).max())
        if difference > 1e-3 * scale:
            raise RuntimeError(f"recomputing the encoder layer by layer differs from the model's "
                               f"sequence_output by {difference:.3g}; its structure is not the "
                               f"BertEncoder this module expects")
    return attention[0]


def token_labels(tokenizer: Tokenizer, text: str, text_b: str | None = None,
                 max_length: int = 10**9) -> list[str]:
    """The tokens of `[CLS] A [SEP] (B [SEP])`, e.g. the axis labels of an attention map."""
    return tokenizer.tokens(tokenizer.encode([(text, text_b)], max_length)["token_ids"][0])


# ---------------------------------------------------------------------------
# Embeddings.
# ---------------------------------------------------------------------------
def embed(model, tokenizer: Tokenizer, texts: Sequence[str], pooling: str = "cls",
          batch_size: int = 32, truncate: bool = False) -> np.ndarray | list[np.ndarray]:
    """Vectors from the encoder's `sequence_output`, for feature extraction.

    pooling "cls": the [CLS] vector, `(texts, hidden)`; "mean": the mean over the
    text's real tokens ([CLS] and [SEP] included, padding excluded), `(texts, hidden)`;
    "tokens": one `(tokens, hidden)` array per text, `[CLS] ... [SEP]`.
    """
    import keras

    if pooling not in POOLINGS:
        raise InspectError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    if not texts:
        raise InspectError("no texts to embed")
    model = as_model(model)
    encoder = model.encoder("embed")
    results: list = []
    for start in range(0, len(texts), batch_size):
        batch = [(t, None) for t in texts[start:start + batch_size]]
        try:
            inputs = tokenizer.encode(batch, model.max_sequence_length, truncate, first=start)
        except TextError as err:
            raise InspectError(f"{err} or pass --truncate") from None
        sequence = keras.ops.convert_to_numpy(keras.ops.cast(
            encoder(inputs, training=False)["sequence_output"], "float32"))  # (batch, seq, hidden)
        mask = inputs["padding_mask"].astype("float32")[..., None]  # (batch, seq, 1)
        if pooling == "cls":
            results.append(sequence[:, 0])
        elif pooling == "mean":
            results.append((sequence * mask).sum(axis=1) / mask.sum(axis=1))
        else:
            lengths = inputs["padding_mask"].sum(axis=1)
            results.extend(sequence[i, :n] for i, n in enumerate(lengths))
    return results if pooling == "tokens" else np.concatenate(results)


def save_embeddings(vectors, out: str | Path, texts: Sequence[str] | None = None,
                    tokens: Sequence[list[str]] | None = None) -> Path:
    """Writes `embed`'s result to `.npy` or `.parquet`.

    .npy: `(texts, hidden)`, or for per-token vectors `(texts, longest, hidden)`
    zero-padded. .parquet: one row per text with columns `text` (if given),
    `embedding` (list<float>, or list<list<float>> per token) and `tokens` (if given).
    """
    out = Path(out)
    if out.suffix not in (".npy", ".parquet"):
        raise InspectError(f"--out {out} must end in .npy or .parquet")
    out.parent.mkdir(parents=True, exist_ok=True)
    per_token = isinstance(vectors, list)
    if out.suffix == ".npy":
        if per_token:
            longest = max(v.shape[0] for v in vectors)
            padded = np.zeros((len(vectors), longest, vectors[0].shape[1]), "float32")
            for i, v in enumerate(vectors):
                padded[i, :len(v)] = v
            vectors = padded
        np.save(out, np.asarray(vectors, "float32"))
        return out
    import pyarrow as pa
    import pyarrow.parquet as pq

    if per_token:
        hidden = vectors[0].shape[1]
        rows = pa.FixedSizeListArray.from_arrays(
            pa.array(np.concatenate(vectors).astype("float32").ravel()), hidden)
        offsets = np.concatenate([[0], np.cumsum([len(v) for v in vectors])]).astype("int32")
        column = pa.ListArray.from_arrays(pa.array(offsets), rows)
    else:
        vectors = np.asarray(vectors, "float32")
        column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), vectors.shape[1])
    table = {}
    if texts is not None:
        table["text"] = pa.array(list(texts), pa.string())
    table["embedding"] = column
    if tokens is not None:
        table["tokens"] = pa.array([list(t) for t in tokens], pa.list_(pa.string()))
    pq.write_table(pa.table(table), out)
    return out
