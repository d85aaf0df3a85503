"""Evaluating a fine-tuned model on a split (per task, with the metrics of
pipeline/finetuning/metrics.py), the baselines on the same test split, the confusion matrix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.finetuning import features, metrics, readers
from pipeline.finetuning.task_model import Split, predict_outputs


def evaluate(task: str, model, split: Split, data: readers.TaskData, fc, encoder=None) -> tuple:
    """(metrics dict, per-example predictions) of `model` on one split."""
    if task == "classification":
        logits = predict_outputs(model, split.x, 2 * fc.batch_size)["logits"]
        y_pred = logits.argmax(-1)
        y_true = split.y["logits"]
        result = metrics.classification_report(y_true, y_pred)
        if len(data.labels) == 2:
            result["f1"] = metrics.binary_f1(y_true, y_pred, positive=1)
        return result, {"y_true": y_true, "y_pred": y_pred, "logits": logits}
    if task == "regression":
        score = predict_outputs(model, split.x, 2 * fc.batch_size)["score"]
        return metrics.regression_report(split.y["score"], score), {"y_pred": score}
    if task == "token_classification":
        logits = predict_outputs(model, split.x, 2 * fc.batch_size)["logits"]
        fallback = "O" if "O" in data.labels else data.labels[0]
        tags = features.token_predictions(logits, split.meta, split.examples, data.labels, fallback)
        gold = [e.tags for e in split.examples]
        if metrics.is_chunk_tagset(data.labels):
            result = metrics.conll_f1(gold, tags)
        else:  # POS-style tags: every token is its own "chunk"; F1 = token accuracy
            result = {"token_accuracy": metrics.token_accuracy(gold, tags)}
            result["f1"] = result["token_accuracy"]
        return result, {"tags": tags}
    if task == "question_answering":
        out = predict_outputs(model, split.x, 2 * fc.batch_size)
        answers = features.qa_predictions(split.examples, split.meta, out["start_logits"],
                                          out["end_logits"], fc.n_best, fc.max_answer_length,
                                          fc.version_2, fc.null_score_threshold)
        gold = {e.qid: [a for a, _ in e.answers] for e in split.examples}
        result = metrics.squad_evaluate(gold, answers)
        return result, {"answers": answers}
    # semantic search: each text's own text_pair is the relevant document among all of them
    encoder = encoder or model
    queries = {k[2:]: v for k, v in split.x.items() if k.startswith("a_")}
    documents = {k[2:]: v for k, v in split.x.items() if k.startswith("b_")}
    q = predict_outputs(encoder, queries, 2 * fc.batch_size)["embedding"]
    d = predict_outputs(encoder, documents, 2 * fc.batch_size)["embedding"]
    return retrieval_metrics(q @ d.T, [e.text_pair for e in split.examples])


def retrieval_metrics(scores: np.ndarray, documents: list[str]) -> tuple[dict, dict]:
    """Query i's relevant documents: every document whose text equals document i's."""
    ranked = [list(np.argsort(-row)) for row in scores]
    relevant = []
    by_text: dict[str, set] = {}
    for i, text in enumerate(documents):
        by_text.setdefault(text, set()).add(i)
    relevant = [by_text[text] for text in documents]
    result = {f"recall_at_{k}": metrics.recall_at_k(ranked, relevant, k) for k in (1, 5, 10)}
    result["mrr"] = metrics.mean_reciprocal_rank(ranked, relevant)
    return result, {"top1": [r[0] for r in ranked]}


# ---------------------------------------------------------------------------
# Baselines on the same test split
# ---------------------------------------------------------------------------
def baselines(task: str, data: readers.TaskData, seed: int) -> dict:
    """{"majority": metrics, "bow_lr": metrics} (per task; empty for QA)."""
    train, test = data.train, data.test
    if task == "classification":
        from scipy.sparse import hstack
        from sklearn.feature_extraction.text import CountVectorizer
        from sklearn.linear_model import LogisticRegression

        index = {name: i for i, name in enumerate(data.labels)}
        y_train = np.array([index[e.label] for e in train])
        y_test = np.array([index[e.label] for e in test])
        majority = np.bincount(y_train, minlength=len(index)).argmax()
        out = {"majority": metrics.classification_report(y_test, np.full_like(y_test, majority))}
        vectorizers = [CountVectorizer(lowercase=True, min_df=2)]
        sides = [lambda e: e.text]
        if data.pair:
            vectorizers.append(CountVectorizer(lowercase=True, min_df=2))
            sides.append(lambda e: e.text_pair or "")
        x_train = hstack([v.fit_transform([s(e) for e in train])
                          for v, s in zip(vectorizers, sides)])
        x_test = hstack([v.transform([s(e) for e in test]) for v, s in zip(vectorizers, sides)])
        lr = LogisticRegression(max_iter=2000, random_state=seed).fit(x_train, y_train)
        out["bow_lr"] = metrics.classification_report(y_test, lr.predict(x_test))
        if len(index) == 2:
            out["majority"]["f1"] = metrics.binary_f1(y_test, np.full_like(y_test, majority))
            out["bow_lr"]["f1"] = metrics.binary_f1(y_test, lr.predict(x_test))
        return out
    if task == "regression":
        from sklearn.feature_extraction.text import CountVectorizer
        from sklearn.linear_model import Ridge

        y_train = np.array([e.label for e in train])
        y_test = np.array([e.label for e in test])
        out = {"mean": metrics.regression_report(y_test, np.full_like(y_test, y_train.mean()))}
        vec = CountVectorizer(min_df=1)
        joined = lambda e: f"{e.text} {e.text_pair or ''}"  # noqa: E731
        ridge = Ridge().fit(vec.fit_transform([joined(e) for e in train]), y_train)
        out["bow_ridge"] = metrics.regression_report(
            y_test, ridge.predict(vec.transform([joined(e) for e in test])))
        return out
    if task == "token_classification":
        from collections import Counter

        overall = Counter(t for e in train for t in e.tags).most_common(1)[0][0]
        per_word: dict = {}
        for e in train:
            for w, t in zip(e.words, e.tags):
                per_word.setdefault(w.lower(), Counter())[t] += 1
        best = {w: c.most_common(1)[0][0] for w, c in per_word.items()}
        gold = [e.tags for e in test]
        pred = [[best.get(w.lower(), overall) for w in e.words] for e in test]
        majority = [[overall] * len(e.words) for e in test]
        if metrics.is_chunk_tagset(data.labels):
            return {"majority": metrics.conll_f1(gold, majority),
                    "most_frequent_tag": metrics.conll_f1(gold, pred)}
        return {"majority": {"token_accuracy": metrics.token_accuracy(gold, majority)},
                "most_frequent_tag": {"token_accuracy": metrics.token_accuracy(gold, pred)}}
    if task == "semantic_search":
        from sklearn.feature_extraction.text import TfidfVectorizer

        vec = TfidfVectorizer().fit([e.text for e in train] + [e.text_pair for e in train])
        q = vec.transform([e.text for e in test])
        d = vec.transform([e.text_pair for e in test])
        return {"tfidf": retrieval_metrics((q @ d.T).toarray(), [e.text_pair for e in test])[0]}
    return {}


def confusion_matrix_png(matrix: np.ndarray, labels: list, path: Path, title: str) -> None:
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
