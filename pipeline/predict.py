"""Serving fine-tuned models: raw-text SavedModel, MLflow wrapper, `python -m pipeline predict`.

`export_text_model` writes a SavedModel whose `serving_default` signature takes RAW STRINGS:
the keras-hub WordPiece tokenizer and the `[CLS] A [SEP] (B [SEP])` packing run inside the
graph (the `TextPreprocessor` the training features were made with), then the Keras model:

    classification:   text (, text_pair) -> {"label": string (batch,), "scores": (batch, classes)}
    regression:       text (, text_pair) -> {"score": (batch,)}
    semantic_search:  text               -> {"embedding": (batch, hidden)}, L2-normalised
    token_classification: text -> {"words", "labels", "scores": (batch, max_words), "word_count"}
    question_answering:   question, context -> {"answer", "score", "null_score", "start", "end"}
    (the last two: whitespace word split / basic tokens, windows, n-best search in the graph;
    see pipeline/word_serving.py)

Load it anywhere TensorFlow and tensorflow-text are installed (`import tensorflow_text` first
registers the tokenizer ops): `tf.saved_model.load(dir).signatures["serving_default"](text=...)`.
`RawTextModel` wraps it as an MLflow pyfunc (logged and registered by the finetune stage).

Command line (every task through its SavedModel; a model folder written before token
classification and QA had one falls back to the `.keras` model and the Python tokenization):

    python -m pipeline predict --model runs/default/finetune/brown_genre --text "The jury said ..."
    python -m pipeline predict --model runs/default/finetune/brown_genre --file texts.txt
    python -m pipeline predict --model models:/bert-brown_genre/1 --text "..."   # MLflow registry
    python -m pipeline predict --model DIR --text "A" --text-pair "B"              # sentence pairs
    python -m pipeline predict --model DIR --question "Who?" --context "..."      # QA
    python -m pipeline predict --model DIR --documents docs.txt --query "..." --top-k 5  # search
    python -m pipeline predict --model DIR --documents long.txt --query "..." --passages  # long docs

`--file`: one example per line (sentence pairs: text TAB text_pair; QA: JSON lines with
"question" and "context"); `-` reads standard input. Output: one JSON object per example.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd  # noqa: F401 - the pyfunc's type hints

SERVING_TASKS = ("classification", "regression", "semantic_search", "token_classification",
                 "question_answering")
WORD_TASKS = ("token_classification", "question_answering")  # pipeline/word_serving.py
SIGNATURE = "serving_default"


# ---------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------
def build_serving_module(model, preprocessor, task: str, labels=None, pair: bool = False):
    """A tf.Module whose `serve` takes raw strings (see the module docstring)."""
    import tensorflow as tf

    class TextServing(tf.Module):
        def __init__(self):
            super().__init__(name="text_serving")
            self.model = model
            self.tokenizer = preprocessor.tokenizer  # tracked: the vocabulary table travels
            self.packer = preprocessor.packer
            self.labels = tf.constant(list(labels or [""]))

        def _outputs(self, inputs):
            outputs = self.model(inputs, training=False)
            if task == "classification":
                scores = tf.nn.softmax(tf.cast(outputs["logits"], tf.float32), axis=-1)
                return {"label": tf.gather(self.labels, tf.argmax(scores, axis=-1)),
                        "scores": scores}
            if task == "regression":
                return {"score": tf.cast(outputs["score"], tf.float32)}
            return {"embedding": tf.cast(outputs["embedding"], tf.float32)}

    module = TextServing()
    if pair:
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text"),
                                      tf.TensorSpec([None], tf.string, name="text_pair")])
        def serve(text, text_pair):
            return module._outputs(preprocessor(text, text_pair))
    else:
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serve(text):
            return module._outputs(preprocessor(text))
    module.serve = serve
    return module


def export_text_model(model, preprocessor, folder, task: str, labels=None,
                      pair: bool = False, options: dict | None = None) -> None:
    """Writes the raw-string SavedModel to `folder` (which must not exist yet). `options`: for
    question answering, max_query_length, doc_stride, n_best, max_answer_length, version_2 and
    null_score_threshold (the task.json keys; a missing one takes finetune.*'s default)."""
    import dataclasses

    import tensorflow as tf

    from pipeline import word_serving
    from pipeline.config import FinetuneConfig

    if task not in SERVING_TASKS:
        raise ValueError(f"no raw-text SavedModel for task {task!r}; {SERVING_TASKS} have one")
    if task == "token_classification":
        module = word_serving.build_token_module(model, preprocessor, labels)
    elif task == "question_answering":
        keys = ("max_query_length", "doc_stride", "n_best", "max_answer_length", "version_2",
                "null_score_threshold")
        settings = {**{k: v for k, v in dataclasses.asdict(FinetuneConfig()).items()
                       if k in keys}, **{k: v for k, v in (options or {}).items() if k in keys}}
        module = word_serving.build_qa_module(model, preprocessor, **settings)
    else:
        module = build_serving_module(model, preprocessor, task, labels, pair)
    tf.saved_model.save(module, str(folder), signatures={SIGNATURE: module.serve})


def load_saved_model(folder):
    """The SavedModel's serving function (tensorflow_text registered first)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 - registers the ops the WordPiece tokenizer uses

    return tf.saved_model.load(str(folder)).signatures[SIGNATURE]


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


# ---------------------------------------------------------------------------
# MLflow pyfunc wrapper
# ---------------------------------------------------------------------------
class RawTextModel(mlflow.pyfunc.PythonModel):
    """MLflow pyfunc over the raw-text SavedModel: a DataFrame with a "text" column (and
    "text_pair" for pair models) in; a DataFrame out (classification: "label" and one
    "score_<label>" column per class; regression: "score"; semantic search: "embedding";
    token classification: "words", "labels", "scores" (a list per text); question answering:
    "question" and "context" columns in, "answer", "score", "null_score", "start", "end" out)."""

    def load_context(self, context):
        self.task = json.loads(Path(context.artifacts["task"]).read_text())
        self.serve = load_saved_model(context.artifacts["saved_model"])

    def predict(self, context, model_input: "pd.DataFrame",
                params: dict | None = None) -> "pd.DataFrame":
        import pandas as pd

        if self.task["task"] == "question_answering":
            return pd.DataFrame(run_qa_model(self.serve,
                                             model_input["question"].astype(str).tolist(),
                                             model_input["context"].astype(str).tolist()),
                                columns=["answer", "score", "null_score", "start", "end"])
        texts = model_input["text"].astype(str).tolist()
        if self.task["task"] == "token_classification":
            return pd.DataFrame(run_token_model(self.serve, texts),
                                columns=["words", "labels", "scores"])
        pairs = model_input["text_pair"].astype(str).tolist() if self.task.get("pair") else None
        out = run_saved_model(self.serve, texts, pairs)
        if self.task["task"] == "classification":
            frame = pd.DataFrame({"label": out["label"]})
            for i, name in enumerate(self.task["labels"]):
                frame[f"score_{name}"] = out["scores"][:, i]
            return frame
        if self.task["task"] == "regression":
            return pd.DataFrame({"score": out["score"]})
        return pd.DataFrame({"embedding": list(out["embedding"])})


def log_to_mlflow(folder, task_info: dict, registered_model: str = "") -> tuple[str, str]:
    """Logs the SavedModel as an MLflow pyfunc model and registers it under `registered_model`
    (if given); returns (model URI, registered version or "")."""
    import importlib.metadata as md

    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    folder = Path(folder)
    columns = [ColSpec("string", "text")] + ([ColSpec("string", "text_pair")]
                                             if task_info.get("pair") else [])
    if task_info.get("task") == "question_answering":
        columns = [ColSpec("string", "question"), ColSpec("string", "context")]
    requirements = [f"{p}=={md.version(p)}" for p in
                    ("tensorflow", "tensorflow-text", "keras", "keras-hub", "mlflow", "pandas")]
    pyfunc_logger = logging.getLogger("mlflow.pyfunc")
    level = pyfunc_logger.level
    pyfunc_logger.setLevel(logging.ERROR)  # the CloudPickle note: RawTextModel is plain code
    try:
        with warnings.catch_warnings():  # "add type hints", "no input example": by design
            warnings.filterwarnings("ignore", category=UserWarning, module="mlflow")
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=RawTextModel(),
                artifacts={"saved_model": str(folder / "saved_model"),
                           "task": str(folder / "task.json")},
                signature=ModelSignature(inputs=Schema(columns)),
                pip_requirements=requirements,
                registered_model_name=registered_model or None,
            )
    finally:
        pyfunc_logger.setLevel(level)
    version = getattr(info, "registered_model_version", None)
    return info.model_uri, str(version) if version else ""


# ---------------------------------------------------------------------------
# Prediction for every task (used by the CLI)
# ---------------------------------------------------------------------------
class Predictor:
    """A fine-tuned model folder (<run_dir>/finetune/<name>) ready to predict."""

    def __init__(self, folder):
        from pipeline.artifacts import FinetuneArtifacts

        paths = FinetuneArtifacts(folder)
        if not paths.task_json.is_file():
            raise FileNotFoundError(
                f"{folder} is not a fine-tuned model folder (no task.json); pass "
                f"<run_dir>/finetune/<name> as written by `make finetune`, or models:/NAME/VERSION")
        self.paths = paths
        self.info = json.loads(paths.task_json.read_text())
        self.task = self.info["task"]
        self._serve = self._model = self._pre = None

    # Lazy loading: the SavedModel for the serving tasks, the .keras model for the others.
    @property
    def serve(self):
        if self._serve is None:
            self._serve = load_saved_model(self.paths.saved_model)
        return self._serve

    def keras_parts(self):
        if self._model is None:
            import keras

            import models.heads  # noqa: F401 - registers the task models
            import models.window_heads  # noqa: F401 - and the long-document classifier
            from pipeline.finetune_data import TextPreprocessor, read_vocab

            self._model = keras.models.load_model(self.paths.model_keras, compile=False)
            self._pre = TextPreprocessor(read_vocab(self.paths.vocab_file),
                                         self.info["lowercase"], self.info["max_seq_length"])
        return self._model, self._pre

    def texts(self, texts, pairs=None) -> list[dict]:
        if self.task == "token_classification":
            return self.tag(texts)
        if self.info.get("long_doc_aggregation", "none") != "none" and \
                not self.paths.saved_model.exists():  # a windowed model without its export
            return self.classify_windows(texts)
        if self.task == "question_answering":
            raise ValueError(f"a {self.task} model takes --question/--context, not --text")
        out = run_saved_model(self.serve, texts, pairs)
        rows = []
        for i, text in enumerate(texts):
            row = {"text": text}
            if pairs is not None:
                row["text_pair"] = pairs[i]
            if self.task == "classification":
                row["label"] = str(out["label"][i])
                row["scores"] = {name: round(float(s), 6)
                                 for name, s in zip(self.info["labels"], out["scores"][i])}
            elif self.task == "regression":
                row["score"] = float(out["score"][i])
            else:
                row["embedding"] = [round(float(x), 6) for x in out["embedding"][i]]
            rows.append(row)
        return rows

    def classify_windows(self, texts) -> list[dict]:
        """Long-document classification (.keras model): every window, aggregated in the head."""
        from pipeline.windows import WINDOW_FEATURES, text_windows

        model, pre = self.keras_parts()
        f = text_windows(texts, pre, self.info["window_stride"], self.info["max_windows"])
        logits = np.asarray(model.predict({k: f[k] for k in WINDOW_FEATURES},
                                          verbose=0)["logits"], np.float64)
        scores = np.exp(logits - logits.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        labels = self.info["labels"]
        return [{"text": t, "label": labels[int(s.argmax())], "windows": int(n),
                 "scores": {name: round(float(x), 6) for name, x in zip(labels, s)}}
                for t, s, n in zip(texts, scores, f["n_windows"])]

    def tag(self, texts) -> list[dict]:
        """Per text: its whitespace-separated words with a label and its probability each
        (the SavedModel; a folder without one: the .keras model, Python tokenization)."""
        if self.paths.saved_model.is_dir():
            out = run_token_model(self.serve, texts)
        else:
            model, pre = self.keras_parts()
            out = python_tag(model, pre, texts, self.info["labels"])
        return [{"text": t, "tags": [[w, g] for w, g in zip(o["words"], o["labels"])],
                 "scores": [round(x, 6) for x in o["scores"]]} for t, o in zip(texts, out)]

    def answer(self, questions, contexts) -> list[dict]:
        """Per question: the answer span of its context ("" for none), its start + end logit
        and character offsets (the SavedModel; a folder without one: the .keras model)."""
        if self.task != "question_answering":
            raise ValueError(f"--question/--context need a question_answering model, this one is "
                             f"{self.task}")
        if self.paths.saved_model.is_dir():
            out = run_qa_model(self.serve, questions, contexts)
        else:
            model, pre = self.keras_parts()
            out = python_answer(model, pre, questions, contexts, self.info)
        return [{"question": q, **o} for q, o in zip(questions, out)]

    def search(self, documents, queries, top_k: int = 5, passages: bool = False,
               passage_length: int = 0, passage_stride: int = 0) -> list[dict]:
        if self.task != "semantic_search":
            raise ValueError(f"--documents/--query need a semantic_search model, this one is "
                             f"{self.task}")
        if passages:  # long documents: passage vectors, document score = best passage
            from pipeline.retrieval import search_rows

            model, pre = self.keras_parts()
            return search_rows(model, pre, documents, queries, top_k, passage_length or None,
                               passage_stride or None)
        index = run_saved_model(self.serve, documents)["embedding"]  # (docs, hidden), unit norm
        query = run_saved_model(self.serve, queries)["embedding"]  # (queries, hidden)
        scores = query @ index.T  # cosine similarities
        rows = []
        for q, row in zip(queries, scores):
            order = np.argsort(-row)[:top_k]
            rows.append({"query": q, "results": [
                {"rank": r + 1, "score": round(float(row[i]), 6), "document": documents[i]}
                for r, i in enumerate(order)]})
        return rows


def python_tag(model, pre, texts, labels) -> list[dict]:
    """`run_token_model`'s output from a Keras model and the Python-side tokenization
    (finetune_data.token_features / token_predictions): the reference the export is checked
    against, and the fallback for model folders without a token-classification SavedModel."""
    from pipeline.finetune_data import TokenExample, token_features, token_predictions

    examples = [TokenExample(t.split(), []) for t in texts]
    features = token_features(examples, pre, None)
    logits = np.asarray(model.predict({k: features[k] for k in
                                       ("token_ids", "segment_ids", "padding_mask")},
                                      verbose=0)["logits"], np.float64)
    fallback = "O" if "O" in labels else labels[0]
    tags = token_predictions(logits, features, examples, labels, fallback)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    rows = []
    for i, (example, positions) in enumerate(zip(examples, features["word_positions"])):
        scores = [float(probs[i, p].max()) for p in positions]
        rows.append({"words": example.words, "labels": tags[i],
                     "scores": scores + [0.0] * (len(example.words) - len(scores))})
    return rows


def python_answer(model, pre, questions, contexts, info: dict) -> list[dict]:
    """`run_qa_model`'s output from a Keras model and the Python-side tokenization
    (finetune_data.qa_features / qa_predictions; no character offsets: start = end = -1
    unless the answer text is found in the context)."""
    from pipeline.finetune_data import QAExample, qa_features, qa_predictions

    examples = [QAExample(str(i), q, c, []) for i, (q, c) in enumerate(zip(questions, contexts))]
    features = qa_features(examples, pre, info["max_query_length"], info["doc_stride"])
    out = model.predict({k: features[k] for k in ("token_ids", "segment_ids", "padding_mask")},
                        verbose=0)
    scores: dict = {}
    answers = qa_predictions(examples, features, np.asarray(out["start_logits"], np.float32),
                             np.asarray(out["end_logits"], np.float32), info["n_best"],
                             info["max_answer_length"], info["version_2"],
                             info["null_score_threshold"], scores=scores)
    rows = []
    for e in examples:
        text = answers[e.qid]
        start = e.context.find(text) if text else -1
        rows.append({"answer": text, "score": scores[e.qid][0], "null_score": scores[e.qid][1],
                     "start": start, "end": start + len(text) if start >= 0 else -1})
    return rows


def _read_lines(path: str) -> list[str]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "predict":
        argv = argv[1:]
    parser = argparse.ArgumentParser(
        prog="python -m pipeline predict", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[3:]))
    parser.add_argument("--model", required=True,
                        help="<run_dir>/finetune/<name>, or models:/NAME/VERSION (MLflow registry)")
    parser.add_argument("--text", action="append", default=[], help="a text (repeatable)")
    parser.add_argument("--text-pair", action="append", default=[],
                        help="the second text of a pair, one per --text")
    parser.add_argument("--file", help="one example per line (pairs: text TAB text_pair; QA: "
                                       "JSON lines with question and context); - for stdin")
    parser.add_argument("--question", action="append", default=[])
    parser.add_argument("--context", action="append", default=[])
    parser.add_argument("--documents", help="semantic search: a file with one document per line")
    parser.add_argument("--query", action="append", default=[], help="semantic search query")
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--passages", action="store_true",
                        help="search: index long documents as passages (document score = best "
                             "passage; pipeline/retrieval.py)")
    parser.add_argument("--passage-length", type=int, default=0,
                        help="--passages: word pieces per passage (default max_seq_length - 2)")
    parser.add_argument("--passage-stride", type=int, default=0,
                        help="--passages: pieces between passage starts (default half a passage)")
    parser.add_argument("--tracking-uri", default="",
                        help="for models:/ URIs (default: $MLFLOW_TRACKING_URI or ./mlflow.db)")
    args = parser.parse_args(argv)
    try:
        rows = _predict(args)
    except (FileNotFoundError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for row in rows:
        print(json.dumps(row, ensure_ascii=False))
    return 0


def _predict(args) -> list[dict]:
    texts, pairs = list(args.text), list(args.text_pair) or None
    if args.model.startswith("models:/") or args.model.startswith("runs:/"):
        return _predict_mlflow(args, texts, pairs)
    predictor = Predictor(args.model)
    if args.documents or args.query:
        if not (args.documents and args.query):
            raise ValueError("semantic search needs both --documents FILE and --query TEXT")
        return predictor.search(_read_lines(args.documents), args.query, args.top_k,
                                args.passages, args.passage_length, args.passage_stride)
    if args.question or (args.file and predictor.task == "question_answering"):
        questions, contexts = list(args.question), list(args.context)
        if args.file:
            for line in _read_lines(args.file):
                item = json.loads(line)
                questions.append(item["question"])
                contexts.append(item["context"])
        if len(questions) != len(contexts):
            raise ValueError(f"{len(questions)} --question but {len(contexts)} --context")
        return predictor.answer(questions, contexts)
    if args.file:
        for line in _read_lines(args.file):
            if predictor.info.get("pair"):
                if "\t" not in line:
                    raise ValueError(f"{args.file}: this model takes text pairs; write each line "
                                     f"as text TAB text_pair (got {line[:60]!r})")
                a, b = line.split("\t", 1)
                texts.append(a)
                pairs = (pairs or []) + [b]
            else:
                texts.append(line)
    if not texts:
        raise ValueError("nothing to predict: give --text, --file, --question/--context or "
                         "--documents/--query")
    if predictor.info.get("pair") and (pairs is None or len(pairs) != len(texts)):
        raise ValueError("this model takes text pairs: give one --text-pair per --text")
    return predictor.texts(texts, pairs if predictor.info.get("pair") else None)


def _predict_mlflow(args, texts, pairs) -> list[dict]:
    import pandas as pd

    from pipeline import artifacts

    uri = args.tracking_uri or __import__("os").environ.get("MLFLOW_TRACKING_URI") or \
        f"sqlite:///{artifacts.MLFLOW_DB}"
    mlflow.set_tracking_uri(uri)
    if args.question or args.context:  # a question_answering model
        if len(args.question) != len(args.context):
            raise ValueError(f"{len(args.question)} --question but {len(args.context)} --context")
        frame = pd.DataFrame({"question": args.question, "context": args.context})
        out = mlflow.pyfunc.load_model(args.model).predict(frame)
        return [{"question": q, **{k: (v.item() if hasattr(v, "item") else v)
                                   for k, v in row.items()}}
                for q, (_, row) in zip(args.question, out.iterrows())]
    if args.file:
        texts += _read_lines(args.file)
    frame = pd.DataFrame({"text": texts})
    if pairs:
        frame["text_pair"] = pairs
    out = mlflow.pyfunc.load_model(args.model).predict(frame)
    return [{"text": t, **{k: (v.tolist() if hasattr(v, "tolist") else v)
                           for k, v in row.items()}}
            for t, (_, row) in zip(texts, out.iterrows())]
