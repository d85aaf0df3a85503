"""Look inside a trained BERT: fill-mask, next-sentence probability, attention maps, embeddings.

    python -m pipeline fill-mask "The man went to the [MASK]." [--top_k 5] [--json]
    python -m pipeline nsp "The man went to the store." "He bought a gallon of milk." [--json]
    python -m pipeline attention "The cat sat on the mat because it was tired." \
        [--layers 0,1|all] [--heads all|0,1] [--out attention/]
    python -m pipeline embed "first text" "second text" | --input texts.txt \
        --pooling cls|mean|tokens --out vectors.npy|vectors.parquet

Every command takes the model from a run directory (`--run_dir runs/default`, the
default: `<run_dir>/pretrain/model.keras` + `<run_dir>/vocab/vocab.txt`, casing from
`vocab.json`) or from `--model PATH` (a `.keras` file, e.g. an imported checkpoint,
or a SavedModel directory) with `--vocab PATH` (found beside the model when omitted;
add `--cased` for a cased vocab without a `vocab.json`). fill-mask and nsp run on
either format; attention and embed need the `.keras` model, because the SavedModel's
`serve` endpoint returns only the MLM and NSP logits.

Exit codes: 0 success; 2 bad input (no [MASK], text longer than the model takes,
unknown model path, missing vocab), with a message saying what to change.

The functions under the CLI take a model (a `.keras` `BertPretrainer`, a
`LoadedModel`, or, for attention and embed, a bare `BertEncoder`) and a `Tokenizer`:

    model, tokenizer = load(run_dir="runs/default")
    fill_mask(model, tokenizer, "The man went to the [MASK].")[0][0]  # {"token", "id", "probability"}
    nsp_probability(model, tokenizer, "The man went to the store.", "He bought milk.")  # P(IsNext)
    attention_maps(model, tokenizer, "The cat sat on the mat.")  # (layers, heads, seq, seq)
    embed(model, tokenizer, ["a text", "another"], pooling="mean")  # (2, hidden)

Attention weights come from each Transformer layer's own attention computation
(`TransformerEncoder(..., return_attention_scores=True)`), run layer by layer on
the embeddings; `attention_maps` checks that the last recomputed layer output equals
the model's `sequence_output`, so the maps are the ones the model used.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from beam_jobs.schema import NSP_IS_NEXT

REQUIRED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
POOLINGS = ("cls", "mean", "tokens")
TRACE_ABOVE = 256  # texts per tokenizer call above which the tokenizer runs as a tf.function

# Probe inputs for `log_attention_probes`: (sentence A, sentence B or None).
PROBES = (
    ("The man went to the store.", "He bought a gallon of milk."),
    ("The cat sat on the mat because it was tired.", None),
    ("She gave him the book, and he read it to the children.", None),
)


class InspectError(ValueError):
    """Bad input (text, path, option): the CLI prints the message and exits with status 2."""


# ---------------------------------------------------------------------------
# Tokenizer: keras-hub WordPiece, [CLS] A [SEP] (B [SEP]) inputs.
# ---------------------------------------------------------------------------
class Tokenizer:
    """keras-hub's `WordPieceTokenizer` over a vocab.txt; a literal "[MASK]" in text is the [MASK] id.

    (So are "[CLS]", "[SEP]", "[PAD]" and "[UNK]"; anything else in brackets is split
    into pieces as usual, e.g. "[mask]" is "[", "mask", "]".)

    The special tokens are looked up by string, so any vocab layout works
    (Google's puts [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103).
    Uncased (`lowercase=True`) also strips accents, as the data stage does.

    ```python
    tokenizer = Tokenizer.from_vocab("runs/default/vocab/vocab.txt")
    inputs = tokenizer.encode([("Hello [MASK].", None)], max_length=512)
    tokenizer.tokens(inputs["token_ids"][0])  # ['[CLS]', 'hello', '[MASK]', '.', '[SEP]']
    ```
    """

    def __init__(self, vocab_file: str | Path, lowercase: bool = True):
        import keras_hub
        import tensorflow as tf

        path = Path(vocab_file)
        if not path.is_file():
            raise InspectError(f"vocab file {path} not found; pass --vocab PATH (the vocab.txt the "
                               f"model was trained with)")
        text = path.read_text(encoding="utf-8")
        # Lines split as keras-hub splits a vocab file, so ids agree with the data stage's.
        self.vocab = [line.rstrip() for line in io.StringIO(text, newline=None)]
        self.vocab_file = path
        self.lowercase = lowercase
        index: dict[str, int] = {}
        for i, token in enumerate(self.vocab):
            index.setdefault(token, i)
        missing = [t for t in REQUIRED_TOKENS if t not in index]
        if missing:
            raise InspectError(f"vocab file {path} has no {', '.join(missing)} token(s); a BERT vocab "
                               f"needs all of {', '.join(REQUIRED_TOKENS)}")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            index[t] for t in REQUIRED_TOKENS)
        self._layer = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=self.vocab, lowercase=lowercase, strip_accents=lowercase, oov_token="[UNK]",
            special_tokens=list(REQUIRED_TOKENS), special_tokens_in_strings=True)
        self._traced = None  # tf.function of the layer, made for the first large batch
        self._tf = tf

    @classmethod
    def from_vocab(cls, vocab_file: str | Path, lowercase: bool | None = None) -> "Tokenizer":
        """`lowercase=None` reads it from the `vocab.json` beside the vocab (uncased if there is none)."""
        if lowercase is None:
            meta = Path(vocab_file).parent / "vocab.json"
            lowercase = True
            if meta.is_file():
                lowercase = bool(json.loads(meta.read_text(encoding="utf-8")).get("lowercase", True))
        return cls(vocab_file, lowercase)

    def __len__(self) -> int:
        return len(self.vocab)

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        """[text] -> [[wordpiece id, ...]] (no [CLS]/[SEP])."""
        if not texts:
            return []
        # Eager calls cost ~1 ms for a few texts; tracing costs seconds but then runs ~10x
        # faster, which pays off for large batches (embed over a file).
        tokenize = self._layer
        if len(texts) > TRACE_ABOVE:
            if self._traced is None:
                self._traced = self._tf.function(
                    self._layer, input_signature=[self._tf.TensorSpec([None], self._tf.string)])
            tokenize = self._traced
        ragged = tokenize(self._tf.constant(list(texts)))  # (texts, (tokens))
        if isinstance(ragged, list):  # keras-hub returns Python lists from eager calls
            return [[int(i) for i in ids] for ids in ragged]
        flat = ragged.flat_values.numpy().tolist()
        splits = ragged.row_splits.numpy().tolist()
        return [flat[start:end] for start, end in zip(splits[:-1], splits[1:])]

    def tokens(self, ids) -> list[str]:
        return [self.vocab[int(i)] for i in ids]

    def encode(self, pairs: Sequence[tuple[str, str | None]], max_length: int,
               truncate: bool = False, first: int = 0) -> dict[str, np.ndarray]:
        """[(A, B or None)] -> `[CLS] A [SEP] (B [SEP])` inputs padded to the longest, (batch, seq) int32.

        Returns {"token_ids", "segment_ids" (0 for [CLS] A [SEP], 1 for B [SEP]),
        "padding_mask" (1 = real token)}. A sequence longer than `max_length`
        raises InspectError, or with `truncate` loses tokens from the end of the
        longer sentence. `first` numbers the texts in that message (first + 1, ...).
        """
        a_ids = self.ids([a for a, _ in pairs])
        b_texts = [(i, b) for i, (_, b) in enumerate(pairs) if b is not None]
        b_ids: list[list[int] | None] = [None] * len(pairs)
        for (i, _), ids in zip(b_texts, self.ids([b for _, b in b_texts])):
            b_ids[i] = ids
        rows = []
        for n, (a, b) in enumerate(zip(a_ids, b_ids)):
            specials = 2 if b is None else 3
            length = len(a) + len(b or []) + specials
            if length > max_length:
                if not truncate:
                    which = f"text {first + n + 1}" if len(pairs) > 1 or first else "the text"
                    raise InspectError(
                        f"{which} is {length} tokens with [CLS]/[SEP], but the model takes at most "
                        f"{max_length}; shorten it")
                a, b = list(a), (list(b) if b is not None else None)
                while len(a) + len(b or []) + specials > max_length:
                    (b if b is not None and len(b) > len(a) else a).pop()
            ids = [self.cls_id, *a, self.sep_id]
            segments = [0] * len(ids)
            if b is not None:
                ids += [*b, self.sep_id]
                segments += [1] * (len(b) + 1)
            rows.append((ids, segments))
        seq = max(len(ids) for ids, _ in rows)
        token_ids = np.full((len(rows), seq), self.pad_id, "int32")
        segment_ids = np.zeros((len(rows), seq), "int32")
        padding_mask = np.zeros((len(rows), seq), "int32")
        for i, (ids, segments) in enumerate(rows):
            token_ids[i, :len(ids)] = ids
            segment_ids[i, :len(ids)] = segments
            padding_mask[i, :len(ids)] = 1
        return {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}


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
                f"and NSP logits; pass --model <run_dir>/pretrain/model.keras (or --run_dir)")
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
                           f"SavedModel directory, or --run_dir of a trained run")
    return path


def load_model(path: str | Path) -> LoadedModel:
    """Loads a `.keras` pretrainer or a SavedModel directory with a `serve` endpoint."""
    path = _require_model(Path(path))
    if path.is_file() and path.suffix == ".keras":
        import keras

        import models  # noqa: F401 - registers BertEncoder / BertPretrainer for deserialization

        try:
            with warnings.catch_warnings():  # "Skipping variable loading for optimizer"
                warnings.simplefilter("ignore", UserWarning)
                model = keras.saving.load_model(str(path), compile=False)
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
        raise InspectError(f"--top_k must be at least 1, got {top_k}")
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


def _figure(width: float, height: float):
    # Object-oriented Matplotlib with the Agg canvas: no pyplot, no global backend state.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def _heat_map(figure, box, weights: np.ndarray, tokens: list[str], title: str, fontsize: float):
    """One head's map in `box` = (left, bottom, side, side) inches; rows = queries, columns = keys."""
    width, height = figure.get_size_inches()
    left, bottom, side_w, side_h = box
    ax = figure.add_axes((left / width, bottom / height, side_w / width, side_h / height))
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, interpolation="nearest", aspect="auto")
    ticks = np.arange(len(tokens))
    ax.set_xticks(ticks, tokens, rotation=90, fontsize=fontsize)
    ax.set_yticks(ticks, tokens, fontsize=fontsize)
    ax.set_xlabel("key (attended to)", fontsize=8)
    ax.set_ylabel("query", fontsize=8)
    ax.set_title(title, fontsize=9)
    return ax, image


def plot_attention(maps: np.ndarray, tokens: list[str], out_dir: str | Path,
                   layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                   per_head: bool = True, prefix: str = "") -> list[Path]:
    """Writes heat maps of `maps` `(layers, heads, seq, seq)` as PNGs; returns their paths.

    Per chosen layer: `{prefix}layer{L:02d}_head{H:02d}.png` for each chosen head
    (if `per_head`) and `{prefix}layer{L:02d}_heads.png`, a grid of all its heads.
    """
    num_layers, num_heads, seq, _ = maps.shape
    layers = list(range(num_layers)) if layers is None else list(layers)
    heads = list(range(num_heads)) if heads is None else list(heads)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Fixed geometry in inches instead of a layout engine: text layout is most of the
    # cost of a figure, and tight/constrained layout would draw every figure twice.
    side = min(max(2.2, 0.2 * seq), 12.0)  # the square map
    fontsize = max(3.0, min(9.0, 0.75 * 72 * side / seq))
    margin = 0.35 + max(len(t) for t in tokens) * fontsize * 0.62 / 72  # tick labels + axis label
    written = []
    for layer in layers:
        if per_head:
            for head in heads:
                figure = _figure(margin + side + 1.0, margin + side + 0.45)
                _, image = _heat_map(figure, (margin, margin, side, side), maps[layer, head],
                                     tokens, f"layer {layer}, head {head}", fontsize)
                width, height = figure.get_size_inches()
                colorbar = figure.add_axes(((margin + side + 0.15) / width, margin / height,
                                            0.15 / width, side / height))
                figure.colorbar(image, cax=colorbar)
                path = out_dir / f"{prefix}layer{layer:02d}_head{head:02d}.png"
                figure.savefig(path)
                written.append(path)
        grid_side = min(side, 6.0)
        grid_font = max(3.0, min(9.0, 0.75 * 72 * grid_side / seq))
        grid_margin = 0.35 + max(len(t) for t in tokens) * grid_font * 0.62 / 72
        columns = min(num_heads, 4)
        rows = math.ceil(num_heads / columns)
        cell_w, cell_h = grid_margin + grid_side + 0.2, grid_margin + grid_side + 0.4
        figure = _figure(columns * cell_w, rows * cell_h + 0.4)
        for head in range(num_heads):
            row, column = divmod(head, columns)
            box = (column * cell_w + grid_margin, (rows - 1 - row) * cell_h + grid_margin,
                   grid_side, grid_side)
            _heat_map(figure, box, maps[layer, head], tokens, f"head {head}", grid_font)
        figure.suptitle(f"layer {layer}: attention of every head (rows: queries, columns: keys)",
                        y=1 - 0.15 / (rows * cell_h + 0.4), va="top", fontsize=10)
        path = out_dir / f"{prefix}layer{layer:02d}_heads.png"
        figure.savefig(path)
        written.append(path)
    return written


def log_attention_probes(model, vocab: Tokenizer | str | Path, out_dir: str | Path,
                         sentences: Sequence = PROBES, *, lowercase: bool | None = None,
                         layers: Sequence[int] | None = None) -> list[Path]:
    """Attention grids (one PNG per layer, all heads) for a few fixed probe sentences.

    `vocab` is a `Tokenizer` or a vocab.txt path (`lowercase=None`: from the
    vocab.json beside it). Each of `sentences` is a text or an (A, B) pair; ones
    longer than the model takes are skipped. Files: `probe{i}_layer{L:02d}_heads.png`.
    Returns the paths written (for `mlflow.log_artifact`).
    """
    tokenizer = vocab if isinstance(vocab, Tokenizer) else Tokenizer.from_vocab(vocab, lowercase)
    model = as_model(model)
    written = []
    for i, probe in enumerate(sentences):
        text, text_b = (probe, None) if isinstance(probe, str) else probe
        try:
            maps = attention_maps(model, tokenizer, text, text_b)
        except InspectError:
            continue
        tokens = token_labels(tokenizer, text, text_b)
        written += plot_attention(maps, tokens, out_dir, layers=layers, per_head=False,
                                  prefix=f"probe{i}_")
    return written


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
        except InspectError as err:
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


# ---------------------------------------------------------------------------
# Command line (a thin layer over the functions above).
# ---------------------------------------------------------------------------
def _parse_indices(text: str, count: int, what: str) -> list[int]:
    if text.strip().lower() == "all":
        return list(range(count))
    try:
        indices = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InspectError(f"--{what} takes 'all' or comma-separated numbers, got {text!r}") from None
    bad = [i for i in indices if not 0 <= i < count]
    if bad or not indices:
        raise InspectError(f"--{what} {text!r}: the model has {count} {what} (0..{count - 1})")
    return indices


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    source = common.add_argument_group("model and vocab")
    source.add_argument("--run_dir", help="a run directory (default runs/default when --model is "
                        "not given): <run_dir>/pretrain/model.keras and <run_dir>/vocab/vocab.txt")
    source.add_argument("--model", help="a .keras file or a SavedModel directory")
    source.add_argument("--vocab", help="vocab.txt (default: the run's, or beside the model)")
    source.add_argument("--cased", action="store_true",
                        help="the vocab is cased (default: vocab.json beside it, else uncased)")
    parser = argparse.ArgumentParser(prog="python -m pipeline",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("fill-mask", parents=[common], help="top-k tokens for each [MASK]")
    p.add_argument("text", help='text with one or more [MASK], e.g. "The man went to the [MASK]."')
    p.add_argument("--top_k", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p = commands.add_parser("nsp", parents=[common], help="probability that B follows A")
    p.add_argument("text_a")
    p.add_argument("text_b")
    p.add_argument("--json", action="store_true")
    p = commands.add_parser("attention", parents=[common], help="attention heat maps (PNG)")
    p.add_argument("text")
    p.add_argument("text_b", nargs="?", help="optional second sentence ([CLS] A [SEP] B [SEP])")
    p.add_argument("--layers", default="all", help="'all' or e.g. 0,1")
    p.add_argument("--heads", default="all", help="'all' or e.g. 0,3 (per-head PNGs)")
    p.add_argument("--out", default="attention", help="output folder (default ./attention)")
    p = commands.add_parser("embed", parents=[common], help="[CLS]/mean/per-token vectors")
    p.add_argument("texts", nargs="*", help="texts to embed (or --input)")
    p.add_argument("--input", help="a text file, one text per line (blank lines skipped)")
    p.add_argument("--pooling", choices=POOLINGS, default="cls")
    p.add_argument("--out", required=True, help="file.npy or file.parquet")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--truncate", action="store_true",
                   help="cut texts longer than the model takes instead of failing")
    return parser


def _load(args) -> tuple[LoadedModel, Tokenizer]:
    return load(run_dir=args.run_dir, model=args.model, vocab=args.vocab,
                lowercase=False if args.cased else None)


def _fill_mask(args) -> None:
    model, tokenizer = _load(args)
    results = fill_mask(model, tokenizer, args.text, args.top_k)
    tokens = token_labels(tokenizer, args.text)
    positions = [i for i, t in enumerate(tokens) if t == "[MASK]"]
    if args.json:
        print(json.dumps({"text": args.text, "tokens": tokens, "masks": [
            {"position": p, "predictions": r} for p, r in zip(positions, results)]}, indent=2))
        return
    print(" ".join(tokens))
    for n, (position, predictions) in enumerate(zip(positions, results), 1):
        print(f"\n[MASK] {n} (token {position})")
        print(f"  {'rank':>4}  {'token':<20} probability")
        for rank, p in enumerate(predictions, 1):
            print(f"  {rank:>4}  {p['token']:<20} {p['probability']:.4f}")


def _nsp(args) -> None:
    model, tokenizer = _load(args)
    probability = nsp_probability(model, tokenizer, args.text_a, args.text_b)
    if args.json:
        print(json.dumps({"text_a": args.text_a, "text_b": args.text_b,
                          "is_next_probability": probability}, indent=2))
    else:
        print(f"P(B follows A) = {probability:.4f}")


def _attention(args) -> None:
    model, tokenizer = _load(args)
    encoder = model.encoder("attention")
    layers = _parse_indices(args.layers, len(encoder.transformer_layers), "layers")
    heads = _parse_indices(args.heads, encoder.transformer_layers[0].num_heads, "heads")
    maps = attention_maps(model, tokenizer, args.text, args.text_b)
    tokens = token_labels(tokenizer, args.text, args.text_b)
    written = plot_attention(maps, tokens, args.out, layers=layers, heads=heads)
    arrays = Path(args.out) / "attention.npz"
    np.savez(arrays, weights=maps, tokens=np.array(tokens))
    print(f"{len(written)} PNGs in {args.out} ({len(layers)} layer(s) x {len(heads)} head(s) + "
          f"one grid per layer); all weights (layers, heads, seq, seq) in {arrays}")
    for path in written:
        print(f"  {path}")


def _embed(args) -> None:
    texts = list(args.texts)
    if args.input:
        path = Path(args.input)
        if not path.is_file():
            raise InspectError(f"--input {path} not found")
        texts += [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                  if line.strip()]
    if not texts:
        raise InspectError("no texts: give them as arguments or --input FILE (one per line)")
    if Path(args.out).suffix not in (".npy", ".parquet"):
        raise InspectError(f"--out {args.out} must end in .npy or .parquet")
    model, tokenizer = _load(args)
    vectors = embed(model, tokenizer, texts, args.pooling, args.batch_size, args.truncate)
    tokens = None
    if args.pooling == "tokens":
        inputs = tokenizer.encode([(t, None) for t in texts], model.max_sequence_length,
                                  truncate=args.truncate)
        tokens = [tokenizer.tokens(ids[mask == 1])
                  for ids, mask in zip(inputs["token_ids"], inputs["padding_mask"])]
    out = save_embeddings(vectors, args.out, texts, tokens)
    shape = (f"{len(vectors)} x (tokens) x {vectors[0].shape[1]}" if args.pooling == "tokens"
             else " x ".join(map(str, vectors.shape)))
    print(f"wrote {shape} {args.pooling} vectors to {out}")


COMMANDS = {"fill-mask": _fill_mask, "nsp": _nsp, "attention": _attention, "embed": _embed}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pipeline fill-mask|nsp|attention|embed ...`; argv[0] is the command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # argparse: --help (0) or a usage error (2), already printed
        return int(exit_.code or 0)
    try:
        COMMANDS[args.command](args)
    except InspectError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
