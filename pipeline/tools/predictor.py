"""`Predictor`: a fine-tuned model folder (or an MLflow model) answering raw text, the way
`python -m pipeline predict` uses it.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd  # noqa: F401 - the pyfunc's type hints

from pipeline.finetuning.features import python_answer, python_tag
from pipeline.serving.export import load_saved_model, run_qa_model, run_saved_model, run_token_model


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
            import models
            from models.preprocessor import TextPreprocessor
            from pipeline.text.vocab import read_vocab

            self._model = models.load_keras(self.paths.model_keras, compile=False)
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
        from pipeline.text.windows import WINDOW_FEATURES, text_windows

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
            from pipeline.serving.search import search_rows

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
