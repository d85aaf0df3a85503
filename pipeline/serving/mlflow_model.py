"""The raw-text SavedModel as an MLflow pyfunc model: logged with its signature and registered."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import mlflow
import pandas as pd  # noqa: F401 - the pyfunc's type hints

from pipeline.serving.export import load_saved_model, run_qa_model, run_saved_model, run_token_model


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
