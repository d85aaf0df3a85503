"""The raw-text SavedModel as an MLflow pyfunc model: logged with its signature and registered."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import mlflow
import pandas as pd  # noqa: F401 - the pyfunc's type hints

from pipeline.serving.export import (
    load_saved_model,
    run_qa_model,
    run_saved_model,
    run_token_model,
    signature_inputs,
)


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
        """The SavedModel's signature decides: (question, context) in -> answers; a
        "word_count" out -> words and tags; else "label" / "score" / "embedding" per text."""
        import pandas as pd

        columns = signature_inputs(self.serve)
        if "question" in columns:
            return pd.DataFrame(run_qa_model(self.serve,
                                             model_input["question"].astype(str).tolist(),
                                             model_input["context"].astype(str).tolist()),
                                columns=["answer", "score", "null_score", "start", "end"])
        texts = model_input["text"].astype(str).tolist()
        if "word_count" in self.serve.structured_outputs:
            return pd.DataFrame(run_token_model(self.serve, texts),
                                columns=["words", "labels", "scores"])
        pairs = model_input["text_pair"].astype(str).tolist() if "text_pair" in columns else None
        out = run_saved_model(self.serve, texts, pairs)
        if "label" in out:
            frame = pd.DataFrame({"label": out["label"]})
            for i, name in enumerate(self.task["labels"]):
                frame[f"score_{name}"] = out["scores"][:, i]
            return frame
        if "score" in out:
            return pd.DataFrame({"score": out["score"]})
        return pd.DataFrame({"embedding": list(out["embedding"])})


def log_to_mlflow(folder, task_info: dict, registered_model: str = "") -> tuple[str, str]:
    """Logs the SavedModel as an MLflow pyfunc model and registers it under `registered_model`
    (if given); returns (model URI, registered version or "")."""
    import importlib.metadata as md

    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    folder = Path(folder)
    names = task_info.get("inputs") or signature_inputs(load_saved_model(folder / "saved_model"))
    columns = [ColSpec("string", name) for name in names]
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
# The pretrained encoder as an MLflow model
# ---------------------------------------------------------------------------
class EncoderModel(mlflow.pyfunc.PythonModel):
    """MLflow pyfunc over the pretrain stage's model: a DataFrame with a "text" column in, an
    "embedding" column out (the encoder's pooled [CLS] output). Its artifacts, `model.keras` and
    `vocab.txt` (+ `vocab.json`), are what `finetune.init_from = models:/<name>@<alias>` starts
    from."""

    def load_context(self, context):
        import json as json_lib

        import models
        from models.preprocessor import TextPreprocessor
        from models.tokenizer import read_vocab

        vocab_file = Path(context.artifacts["vocab"])
        meta = context.artifacts.get("vocab_meta")
        lowercase = (json_lib.loads(Path(meta).read_text()).get("lowercase", True)
                     if meta else True)
        with warnings.catch_warnings():  # the pretrainer's optimizer state is not needed here
            warnings.filterwarnings("ignore", message=".*Skipping variable loading.*")
            model = models.load_keras(context.artifacts["model_keras"], compile=False)
        self.backbone = getattr(model, "backbone", model)
        self.pre = TextPreprocessor(read_vocab(vocab_file),
                                    lowercase, int(self.backbone.max_sequence_length))

    def predict(self, context, model_input: "pd.DataFrame",
                params: dict | None = None) -> "pd.DataFrame":
        import numpy as np
        import pandas as pd

        features = self.pre.features(model_input["text"].astype(str).tolist())
        out = self.backbone.predict(features, verbose=0)
        return pd.DataFrame({"embedding": list(np.asarray(out["pooled_output"], np.float32))})


def log_encoder(model_keras, vocab_file, registered_model: str = "") -> tuple[str, str]:
    """Logs the pretrained model as an MLflow pyfunc (EncoderModel, with a signature and an
    input example) and registers it; returns (model URI, registered version or "")."""
    import importlib.metadata as md

    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema, TensorSpec

    vocab_file = Path(vocab_file)
    artifacts = {"model_keras": str(model_keras), "vocab": str(vocab_file)}
    if vocab_file.with_name("vocab.json").is_file():
        artifacts["vocab_meta"] = str(vocab_file.with_name("vocab.json"))
    requirements = [f"{p}=={md.version(p)}" for p in
                    ("tensorflow", "tensorflow-text", "keras", "keras-hub", "mlflow", "pandas")]
    import numpy as np

    signature = ModelSignature(inputs=Schema([ColSpec("string", "text")]),
                               outputs=Schema([TensorSpec(np.dtype("float32"), (-1, -1),
                                                          "embedding")]))
    pyfunc_logger = logging.getLogger("mlflow.pyfunc")
    level = pyfunc_logger.level
    pyfunc_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning, module="mlflow")
            info = mlflow.pyfunc.log_model(
                name="encoder", python_model=EncoderModel(), artifacts=artifacts,
                signature=signature, pip_requirements=requirements,
                input_example=pd.DataFrame({"text": ["The jury said the election was fair."]}),
                registered_model_name=registered_model or None)
    finally:
        pyfunc_logger.setLevel(level)
    version = getattr(info, "registered_model_version", None)
    return info.model_uri, str(version) if version else ""


def register_encoder(model_keras, vocab_file, name: str) -> tuple[str, str]:
    """`log_encoder` under the active run, saying so on the pipeline's log: what the pretrain
    stage does last (through the tracking outbox, so a store that is down defers it)."""
    uri, version = log_encoder(model_keras, vocab_file, name)
    logging.getLogger("pipeline").info(
        f"pretrain: the encoder is MLflow model {uri}, registered as {name!r} version "
        f"{version} (fine-tune from it: finetune.init_from=models:/{name}/{version})")
    return uri, version


def download_model_files(uri: str, dest: Path) -> tuple[Path, Path | None]:
    """(model.keras, vocab.txt or None) of an MLflow model or run artifact URI (models:/…,
    runs:/…), downloaded under `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dest)))
    if local.is_file() and local.suffix == ".keras":
        vocab = local.parent / "vocab.txt"
        return local, vocab if vocab.is_file() else None
    kerases = sorted(local.rglob("model.keras")) or sorted(local.rglob("*.keras"))
    if not kerases:
        raise FileNotFoundError(f"{uri} holds no .keras model (downloaded to {local})")
    vocabs = sorted(local.rglob("vocab.txt"))
    return kerases[0], vocabs[0] if vocabs else None
