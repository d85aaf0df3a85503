"""`Predictor`: a fine-tuned model folder (or an MLflow model) answering raw text, the way
`python -m pipeline predict` uses it.
"""

from __future__ import annotations

import json

import pandas as pd  # noqa: F401 - the pyfunc's type hints

from pipeline.finetuning import tasks
from pipeline.serving.export import load_saved_model


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
        self.task = tasks.get(self.info["task"])
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
        """`--text` (and `--text-pair`): one row per text, as the model's task answers."""
        return self.task.predict_rows(self, texts, pairs)

    def answer(self, questions, contexts) -> list[dict]:
        """`--question` / `--context`: one answer row per question (question answering)."""
        if not hasattr(self.task, "answer_rows"):
            raise ValueError(f"--question/--context need a question_answering model, this one is "
                             f"{self.task.name}")
        return self.task.answer_rows(self, questions, contexts)

    def search(self, documents, queries, top_k: int = 5, passages: bool = False,
               passage_length: int = 0, passage_stride: int = 0) -> list[dict]:
        """`--documents` / `--query`: the top documents per query (semantic search)."""
        if not hasattr(self.task, "search_rows"):
            raise ValueError(f"--documents/--query need a semantic_search model, this one is "
                             f"{self.task.name}")
        return self.task.search_rows(self, documents, queries, top_k,
                                     (passage_length, passage_stride) if passages else None)


