"""Exports that serve raw text: the fine-tuned models' SavedModels, and the pretrained model.

A fine-tuning task's `export` (pipeline/finetuning/tasks/) writes, with `build_serving_module`
or pipeline/serving/word_serving.py and `save_serving_module`, a SavedModel whose
`serving_default` signature takes RAW STRINGS:
the keras-hub WordPiece tokenizer and the `[CLS] A [SEP] (B [SEP])` packing run inside the
graph (the `TextPreprocessor` the training features were made with), then the Keras model:

    classification:   text (, text_pair) -> {"label": string (batch,), "scores": (batch, classes)}
    regression:       text (, text_pair) -> {"score": (batch,)}
    semantic_search:  text               -> {"embedding": (batch, hidden)}, L2-normalised
    token_classification: text -> {"words", "labels", "scores": (batch, max_words), "word_count"}
    question_answering:   question, context -> {"answer", "score", "null_score", "start", "end"}
    (the last two: whitespace word split / basic tokens, windows, n-best search in the graph;
    see pipeline/serving/word_serving.py)

Every raw-text SavedModel also has a `tokenize` signature: text (batch,) -> {"token_ids":
(batch, longest) int32 padded with -1, "lengths": (batch,)}, the WordPiece ids its graph gives
(the tokenizer contract of models/tokenizer.py; `saved_model_token_ids` reads them as lists).

Load it anywhere TensorFlow and tensorflow-text are installed (`import tensorflow_text` first
registers the tokenizer ops): `tf.saved_model.load(dir).signatures["serving_default"](text=...)`.
`RawTextModel` (pipeline/serving/mlflow_model.py) wraps it as an MLflow pyfunc.

Long documents: `export_window_model` serves the sliding-window classifier (the windows made
in the graph, pipeline/text/windows.py). `export` writes the pretrain stage's model.keras and
SavedModel, each beside its final path and renamed into place.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd  # noqa: F401 - the pyfunc's type hints

from pipeline import artifacts
from pipeline.artifacts import Artifacts
from pipeline.text.windows import WINDOW_FEATURES, text_windows, tf_text_windows


def export(model, paths: Artifacts, lowercase: bool) -> None:
    """model.keras and a SavedModel, both written beside and renamed into place only when both
    are complete (a full disk half-way leaves the previous pair as it was); the run's vocab.txt
    and vocab.json (its casing, `lowercase`) go beside model.keras first, so that the model can
    be started from in any run directory (`finetune.init_from`, `model.init_from`)."""
    from pipeline.text.vocab import write_beside_model

    paths.pretrain_dir.mkdir(parents=True, exist_ok=True)
    artifacts.remove_strays(paths.pretrain_dir, f".tmp-*-{paths.model_keras.name}",
                            ".tmp-*-vocab")
    tmp = paths.pretrain_dir / f".tmp-{os.getpid()}-{paths.model_keras.name}"
    vocab_tmp = paths.pretrain_dir / f".tmp-{os.getpid()}-vocab"
    try:
        vocab_tmp.mkdir()
        write_beside_model(paths.vocab_file, lowercase, vocab_tmp)
        for name in ("vocab.txt", "vocab.json"):
            os.replace(vocab_tmp / name, paths.model_keras.with_name(name))
        model.save(str(tmp))
        with artifacts.atomic_dir(paths.saved_model) as tmp_dir:
            model.export(str(tmp_dir / "export"), format="tf_saved_model", verbose=False)
            for item in (tmp_dir / "export").iterdir():
                item.rename(tmp_dir / item.name)
            (tmp_dir / "export").rmdir()
        os.replace(tmp, paths.model_keras)
    finally:
        tmp.unlink(missing_ok=True)
        artifacts.remove_strays(paths.pretrain_dir, vocab_tmp.name)


SIGNATURE = "serving_default"


TOKENIZE_SIGNATURE = "tokenize"


def tokenize_function(tokenizer):
    """The `tokenize` signature's function: text -> {"token_ids" (padded with -1), "lengths"}."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def tokenize(text):
        ids = tf.cast(tokenizer(text), tf.int32)
        return {"token_ids": ids.to_tensor(default_value=-1),
                "lengths": tf.cast(ids.row_lengths(), tf.int32)}

    return tokenize


def saved_model_token_ids(folder, texts, batch_size: int = 1024) -> list[list[int]]:
    """The WordPiece ids a raw-text SavedModel's graph gives each text (its `tokenize`)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 - registers the tokenizer ops

    tokenize = tf.saved_model.load(str(folder)).signatures[TOKENIZE_SIGNATURE]
    out: list[list[int]] = []
    for start in range(0, len(texts), batch_size):
        result = tokenize(text=tf.constant(list(texts[start:start + batch_size])))
        ids, lengths = result["token_ids"].numpy(), result["lengths"].numpy()
        out.extend(row[:n].tolist() for row, n in zip(ids, lengths))
    return out


# ---------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------
def label_outputs(outputs, labels):
    """Classification: {"label": the most probable class name, "scores": class probabilities}."""
    import tensorflow as tf

    scores = tf.nn.softmax(tf.cast(outputs["logits"], tf.float32), axis=-1)
    return {"label": tf.gather(labels, tf.argmax(scores, axis=-1)), "scores": scores}


def score_outputs(outputs, labels):
    """Regression: {"score": the predicted number}."""
    import tensorflow as tf

    return {"score": tf.cast(outputs["score"], tf.float32)}


def embedding_outputs(outputs, labels):
    """Sentence encoders: {"embedding": the unit vector}."""
    import tensorflow as tf

    return {"embedding": tf.cast(outputs["embedding"], tf.float32)}


def build_serving_module(model, preprocessor, outputs_fn, labels=None, pair: bool = False):
    """A tf.Module whose `serve` takes raw strings (see the module docstring): the text (pair)
    packed in the graph, the model, then `outputs_fn(model outputs, labels tensor)`."""
    import tensorflow as tf

    class TextServing(tf.Module):
        def __init__(self):
            super().__init__(name="text_serving")
            self.model = model
            self.tokenizer = preprocessor.tokenizer  # tracked: the vocabulary table travels
            self.packer = preprocessor.packer
            self.labels = tf.constant(list(labels or [""]))

        def _outputs(self, inputs):
            return outputs_fn(self.model(inputs, training=False), self.labels)

    module = TextServing()
    packed = preprocessor.functions()  # traced already if the features were made in the graph
    if pair:
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text"),
                                      tf.TensorSpec([None], tf.string, name="text_pair")])
        def serve(text, text_pair):
            return module._outputs(packed["pair"](text, text_pair))
    else:
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serve(text):
            return module._outputs(packed["single"](text))
    module.serve = serve
    return module


def save_serving_module(module, folder, tokenize=None) -> None:
    """Writes the module as a SavedModel to `folder` (which must not exist yet): its `serve` as
    the serving signature, beside the `tokenize` signature of its tokenizer (`tokenize`: the
    same as a traced function, `TextPreprocessor.functions()["tokenize"]`, not traced again)."""
    import tensorflow as tf

    # Traced here and kept traced: inside the save a tf.function's cache key holds the save's
    # options, so it (and all it calls: the preprocessor's functions) would be traced again.
    module.serve = module.serve.get_concrete_function()
    tokenize = tokenize_function(tokenize or module.tokenizer).get_concrete_function()
    tf.saved_model.save(module, str(folder),
                        signatures={SIGNATURE: module.serve, TOKENIZE_SIGNATURE: tokenize})


def load_saved_model(folder):
    """The SavedModel's serving function (tensorflow_text registered first)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 - registers the ops the WordPiece tokenizer uses

    return tf.saved_model.load(str(folder)).signatures[SIGNATURE]


def signature_inputs(serve) -> list[str]:
    """The names of the raw-string inputs of a serving function, in order: ["text"],
    ["text", "text_pair"] or ["question", "context"]."""
    _, kwargs = serve.structured_input_signature
    order = ("question", "context", "text", "text_pair")
    return sorted(kwargs, key=lambda name: order.index(name) if name in order else len(order))


def run_saved_model(serve, texts, pairs=None, batch_size: int = 256) -> dict:
    """Numpy outputs of the serving function on lists of strings (in batches)."""
    import tensorflow as tf

    parts = []
    for start in range(0, len(texts), batch_size):
        kwargs = {"text": tf.constant(list(texts[start:start + batch_size]))}
        if pairs is not None:
            kwargs["text_pair"] = tf.constant(list(pairs[start:start + batch_size]))
        parts.append({k: v.numpy() for k, v in serve(**kwargs).items()})
    if not parts:
        return {}
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    if "label" in out:
        out["label"] = np.array([x.decode("utf-8") for x in out["label"]], dtype=object)
    return out


def run_token_model(serve, texts, batch_size: int = 256) -> list[dict]:
    """Token classification SavedModel on raw texts: per text {"words", "labels", "scores"}
    (lists, one entry per whitespace-separated word)."""
    import tensorflow as tf

    rows = []
    for start in range(0, len(texts), batch_size):
        out = {k: v.numpy() for k, v in
               serve(text=tf.constant(list(texts[start:start + batch_size]))).items()}
        for i, n in enumerate(out["word_count"]):
            rows.append({"words": [w.decode("utf-8") for w in out["words"][i, :n]],
                         "labels": [t.decode("utf-8") for t in out["labels"][i, :n]],
                         "scores": [float(x) for x in out["scores"][i, :n]]})
    return rows


def run_qa_model(serve, questions, contexts, batch_size: int = 64) -> list[dict]:
    """QA SavedModel on raw (question, context) strings: per question {"answer", "score",
    "null_score", "start", "end"} (character offsets into the context; -1 for no answer)."""
    import tensorflow as tf

    if len(questions) != len(contexts):
        raise ValueError(f"{len(questions)} questions but {len(contexts)} contexts")
    rows = []
    for start in range(0, len(questions), batch_size):
        out = {k: v.numpy() for k, v in
               serve(question=tf.constant(list(questions[start:start + batch_size])),
                     context=tf.constant(list(contexts[start:start + batch_size]))).items()}
        for i in range(len(out["answer"])):
            rows.append({"answer": out["answer"][i].decode("utf-8"),
                         "score": float(out["score"][i]),
                         "null_score": float(out["null_score"][i]),
                         "start": int(out["start"][i]), "end": int(out["end"][i])})
    return rows


def export_window_model(model, pre, folder, labels, stride: int, max_windows: int) -> None:
    """The raw-text SavedModel of a windowed classifier: text -> {"label", "scores"}, as
    the classification task writes, windows made in the graph."""
    import tensorflow as tf

    if not 1 <= stride <= pre.seq_length - 2:
        raise ValueError(f"window stride {stride}: must be 1..{pre.seq_length - 2} (a window)")

    class WindowServing(tf.Module):
        def __init__(self):
            super().__init__(name="window_serving")
            self.model = model
            self.tokenizer = pre.tokenizer  # tracked: the vocabulary table travels
            self.labels = tf.constant(list(labels))

    module = WindowServing()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def serve(text):
        outputs = module.model(tf_text_windows(pre, text, stride, max_windows), training=False)
        scores = tf.nn.softmax(tf.cast(outputs["logits"], tf.float32), axis=-1)
        return {"label": tf.gather(module.labels, tf.argmax(scores, axis=-1)), "scores": scores}

    module.serve = serve
    save_serving_module(module, folder)


def check_window_export(folder, model, pre, texts: list[str], stride: int,
                        max_windows: int) -> float:
    """Max |exported − in-memory| class probability on `texts` (raw strings into the SavedModel
    vs. `text_windows` + the Keras model)."""
    from pipeline.serving import export

    exported = export.run_saved_model(export.load_saved_model(folder), list(texts))
    f = text_windows(texts, pre, stride, max_windows)
    logits = np.asarray(model.predict({k: f[k] for k in WINDOW_FEATURES}, verbose=0)["logits"],
                        np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return float(np.abs(probs - exported["scores"]).max())
