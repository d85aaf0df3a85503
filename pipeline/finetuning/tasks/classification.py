"""Sequence classification: one label per text or text pair, a softmax head on the pooled
[CLS] (models/heads.py BertClassifier). Long documents (`finetune.long_doc_aggregation`):
every window of a text, the window logits aggregated (models/window_heads.py).
"""

from __future__ import annotations

import numpy as np

from pipeline.finetuning.tasks.base import (
    INPUTS,
    FinetuneTask,
    Split,
    gather,
    predict_outputs,
    register,
    softmax,
)


@register
class Classification(FinetuneTask):
    name = "classification"
    datasets = ("brown_genre", "csv", "tsv", "jsonl", "glue")
    metric = "accuracy"
    label_set = True
    stratify = True
    multitask = True
    distillable = True
    windows = True

    @classmethod
    def check_config(cls, fc) -> str:
        if fc.dataset == "glue" and fc.glue_task == "sts-b":
            return (f"finetune.task = {fc.task!r} does not fit GLUE task 'sts-b'; "
                    f"use task regression")
        return ""

    @property
    def windowed(self) -> bool:
        """Long-document classification: every window of a text, predictions aggregated
        (a task built without settings, e.g. to read a model folder's task.json: no)."""
        return self.fc is not None and self.fc.long_doc_aggregation != "none"

    def selection_metric(self, dataset: str) -> str:
        return "macro_f1" if dataset == "brown_genre" else self.metric

    # ---- inputs ----------------------------------------------------------------------
    def make_split(self, examples, pre, labels, pair) -> Split:
        index = {name: i for i, name in enumerate(labels)}
        y = {"logits": np.array([index[e.label] for e in examples], np.int32)}
        if self.windowed:  # one example = all windows of a document
            from pipeline.text.windows import text_windows

            f = text_windows([e.text for e in examples], pre, self.fc.window_stride,
                             self.fc.max_windows)
            return Split(examples, {k: f[k] for k in (*INPUTS, "window_mask")}, y, None,
                         {"n_windows": f["n_windows"],
                          "truncated_documents": f["truncated_documents"]})
        x = pre.features([e.text for e in examples],
                         [e.text_pair for e in examples] if pair else None)
        return Split(examples, x, y)

    def notes(self, sample) -> list[str]:
        if not self.windowed:
            return []
        meta, fc = sample().meta, self.fc
        return [f"long documents: {meta['n_windows'].mean():.1f} windows per training text on "
                f"average (max_windows {fc.max_windows}, stride {fc.window_stride}); "
                f"{meta['truncated_documents']} text(s) cut after max_windows; aggregation "
                f"{fc.long_doc_aggregation}"]

    # ---- model -----------------------------------------------------------------------
    def build_model(self, backbone, num_labels):
        from models import heads

        self.freeze(backbone)
        if self.windowed:
            from models.window_heads import BertWindowClassifier

            return BertWindowClassifier(backbone, num_labels, self.fc.long_doc_aggregation,
                                        dropout=self.fc.dropout)
        return heads.BertClassifier(backbone, num_labels, dropout=self.fc.dropout)

    def losses(self) -> dict:
        import keras

        return {"loss": {"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
                "metrics": {"logits": [keras.metrics.SparseCategoricalAccuracy("accuracy")]}}

    # ---- evaluation ------------------------------------------------------------------
    def evaluate(self, model, split, data, encoder=None):
        from pipeline.finetuning import metrics

        out = gather(self, model, split, ("logits",), ("label",))
        logits, y_true = out["logits"], out["label"].reshape(-1)
        y_pred = logits.argmax(-1)
        result = metrics.classification_report(y_true, y_pred)
        if len(data.labels) == 2:
            result["f1"] = metrics.binary_f1(y_true, y_pred, positive=1)
        return result, {"y_true": y_true, "y_pred": y_pred, "logits": logits}

    def baselines(self, data, seed):
        """Majority class, counts + logistic regression, and TF-IDF linear models tuned on
        the validation split (pipeline/finetuning/baselines.py)."""
        from pipeline.finetuning import baselines, metrics

        def metric_of(y_true, y_pred):
            out = metrics.classification_report(y_true, y_pred)
            if len(data.labels) == 2:
                out["f1"] = metrics.binary_f1(y_true, y_pred, positive=1)
            return out

        return baselines.text_classifiers(data, metric_of, seed, self.fc.baseline_max_train)

    def test_artifacts(self, results, predictions, data, out, title) -> None:
        from pipeline.finetuning import metrics

        matrix = metrics.confusion_matrix(predictions["test"]["y_true"],
                                          predictions["test"]["y_pred"], len(data.labels))
        results["test"]["confusion_matrix"] = matrix.tolist()
        confusion_matrix_png(matrix, data.labels, out.confusion_matrix,
                             f"{title}: test confusion matrix "
                             f"(accuracy {results['test']['accuracy']:.3f})")

    def prediction_row(self, example, prediction, i, data) -> dict:
        row = {"text": example.text, "gold": example.label,
               "predicted": data.labels[int(prediction["y_pred"][i])]}
        if example.text_pair is not None:
            row["text_pair"] = example.text_pair
        return row

    # ---- outputs ---------------------------------------------------------------------
    def serving_module(self, model, pre, labels, pair, info):
        from pipeline.serving import export

        return export.build_serving_module(model, pre, export.label_outputs, labels, pair)

    def export(self, model, pre, folder, info) -> None:
        from pipeline.serving import export

        if self.windowed:  # windows made in the graph
            export.export_window_model(model, pre, folder, info.get("labels"),
                                       self.fc.window_stride, self.fc.max_windows)
        else:
            super().export(model, pre, folder, info)

    def check_export(self, folder, model, pre, data, info) -> dict:
        from pipeline.serving import export

        texts = [e.text for e in data.test[:32]]
        if self.windowed:
            return {"export_max_abs_diff": export.check_window_export(
                folder, model, pre, texts, self.fc.window_stride, self.fc.max_windows)}
        pairs = [e.text_pair for e in data.test[:32]] if info["pair"] else None
        exported = export.run_saved_model(export.load_saved_model(folder), texts, pairs)
        memory = predict_outputs(model, pre.features(texts, pairs), 32)
        return {"export_max_abs_diff":
                float(np.abs(softmax(memory["logits"]) - exported["scores"]).max())}

    def predict_rows(self, predictor, texts, pairs) -> list[dict]:
        labels = predictor.info["labels"]
        if predictor.info.get("long_doc_aggregation", "none") != "none" and \
                not predictor.paths.saved_model.exists():  # a windowed model without its export
            return self.classify_windows(predictor, texts)
        from pipeline.serving.export import run_saved_model

        out = run_saved_model(predictor.serve, texts, pairs)
        rows = []
        for i, text in enumerate(texts):
            row = {"text": text, **({"text_pair": pairs[i]} if pairs is not None else {})}
            row["label"] = str(out["label"][i])
            row["scores"] = {name: round(float(s), 6) for name, s in zip(labels, out["scores"][i])}
            rows.append(row)
        return rows

    @staticmethod
    def classify_windows(predictor, texts) -> list[dict]:
        """Long-document classification (.keras model): every window, aggregated in the head."""
        from pipeline.text.windows import WINDOW_FEATURES, text_windows

        model, pre = predictor.keras_parts()
        info, labels = predictor.info, predictor.info["labels"]
        f = text_windows(texts, pre, info["window_stride"], info["max_windows"])
        scores = softmax(model.predict({k: f[k] for k in WINDOW_FEATURES}, verbose=0)["logits"])
        return [{"text": t, "label": labels[int(s.argmax())], "windows": int(n),
                 "scores": {name: round(float(x), 6) for name, x in zip(labels, s)}}
                for t, s, n in zip(texts, scores, f["n_windows"])]


def confusion_matrix_png(matrix: np.ndarray, labels: list, path, title: str) -> None:
    """scikit-learn's ConfusionMatrixDisplay of the counts, coloured by the fraction of each
    gold class (so rare classes are as visible as frequent ones)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import ConfusionMatrixDisplay

    size = max(4.0, 0.55 * len(labels) + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    rows = matrix.sum(axis=1, keepdims=True)
    normalised = np.divide(matrix, rows, out=np.zeros(matrix.shape, float), where=rows > 0)
    display = ConfusionMatrixDisplay(normalised, display_labels=labels)
    display.plot(ax=ax, cmap="Blues", xticks_rotation=60, include_values=False, colorbar=False)
    display.im_.set_clim(0, 1)
    fig.colorbar(display.im_, ax=ax, fraction=0.046, pad=0.04, label="fraction of the gold class")
    for i, j in zip(*np.nonzero(matrix)):  # the counts, as text on the cells
        ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=7,
                color="white" if normalised[i, j] > 0.5 else "black")
    ax.tick_params(labelsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
