"""Regression: a number per text or text pair (STS-B style), a linear head on the pooled [CLS]
(models/heads.py BertRegressor), mean squared error, Pearson / Spearman.
"""

from __future__ import annotations

import numpy as np

from pipeline.finetuning.tasks.base import (
    FinetuneTask,
    Split,
    gather,
    predict_outputs,
    register,
)


@register
class Regression(FinetuneTask):
    name = "regression"
    datasets = ("csv", "tsv", "jsonl", "glue")
    metric = "pearson"
    multitask = True
    output = "score"
    targets = {"score": "target"}

    @classmethod
    def check_config(cls, fc) -> str:
        if fc.dataset == "glue" and fc.glue_task != "sts-b":
            return (f"finetune.task = {fc.task!r} does not fit GLUE task {fc.glue_task!r}; "
                    f"use task classification")
        return ""

    def read_file(self, path, fc) -> list:
        from pipeline.finetuning.readers import read_table

        return read_table(path, (fc.text_column, fc.text_pair_column, fc.label_column),
                          fmt=fc.dataset, regression=True)

    def make_split(self, examples, pre, labels, pair) -> Split:
        x = pre.features([e.text for e in examples],
                         [e.text_pair for e in examples] if pair else None)
        return Split(examples, x, {"score": np.array([e.label for e in examples], np.float32)})

    def build_model(self, backbone, num_labels):
        from models import heads

        self.freeze(backbone)
        return heads.BertRegressor(backbone, dropout=self.fc.dropout)

    def losses(self) -> dict:
        import keras

        return {"loss": {"score": keras.losses.MeanSquaredError()}}

    def evaluate(self, model, split, data, encoder=None):
        from pipeline.finetuning import metrics

        out = gather(self, model, split, ("score",), ("target",))
        score = out["score"].reshape(-1)
        return metrics.regression_report(out["target"].reshape(-1), score), {"y_pred": score}

    def baselines(self, data, seed):
        """The training mean, counts + ridge, and TF-IDF + ridge with alpha tuned on the
        validation split (pipeline/finetuning/baselines.py)."""
        from pipeline.finetuning import baselines, metrics

        return baselines.text_regressors(data, metrics.regression_report, seed,
                                         self.fc.baseline_max_train)

    def prediction_row(self, example, prediction, i, data) -> dict:
        return {"text": example.text, "text_pair": example.text_pair, "gold": example.label,
                "predicted": float(prediction["y_pred"][i])}

    def serving_module(self, model, pre, labels, pair, info):
        from pipeline.serving import export

        return export.build_serving_module(model, pre, export.score_outputs, labels, pair)

    def check_export(self, folder, model, pre, data, info) -> dict:
        from pipeline.serving import export

        texts = [e.text for e in data.test[:32]]
        pairs = [e.text_pair for e in data.test[:32]] if info["pair"] else None
        exported = export.run_saved_model(export.load_saved_model(folder), texts, pairs)
        memory = predict_outputs(model, pre.features(texts, pairs), 32)
        return {"export_max_abs_diff": float(np.abs(memory["score"] - exported["score"]).max())}

    def predict_rows(self, predictor, texts, pairs) -> list[dict]:
        from pipeline.serving.export import run_saved_model

        out = run_saved_model(predictor.serve, texts, pairs)
        return [{"text": t, **({"text_pair": pairs[i]} if pairs is not None else {}),
                 "score": float(out["score"][i])} for i, t in enumerate(texts)]
