"""Evaluation metrics of the fine-tuning tasks: scikit-learn and scipy where they have them,
ports of the official scripts where they do not (CoNLL `conlleval`, SQuAD's evaluate-v2.0).

Each function follows the definition people compare against:

- classification: `accuracy`, `confusion_matrix`, `f1_per_class`, `macro_f1` (mean over the
  classes present in the gold or predicted labels, as scikit-learn's default), `binary_f1`
  (F1 of the positive class: MRPC, QQP), `matthews_corrcoef` (multi-class form, as
  scikit-learn and GLUE's CoLA);
- regression: `pearson`, `spearman` (Pearson of average ranks, ties share a rank; both 0
  where undefined, i.e. a constant side, instead of scipy's NaN);
- token classification: `conll_chunks` / `conll_f1` (entity-level precision, recall, F1 as the
  CoNLL `conlleval` script: a chunk counts only if its type and both boundaries match; IOB1,
  IOB2/BIO and IOBES tags), `token_accuracy`;
- extractive QA: `normalize_answer`, `squad_exact_match`, `squad_f1`, `squad_evaluate` (the
  official SQuAD v1.1/v2.0 evaluation: lower case, no punctuation, no articles a/an/the,
  whitespace collapsed; best score over the gold answers; v2: an empty gold means "no answer");
- retrieval: `recall_at_k`, `mean_reciprocal_rank`.

    >>> accuracy([0, 1, 1, 2], [0, 1, 2, 2])
    0.75
    >>> round(macro_f1([0, 1, 1, 2], [0, 1, 2, 2]), 4)
    0.7778
    >>> squad_exact_match("The Eiffel Tower!", "eiffel tower")
    1.0
"""

from __future__ import annotations

import collections
import re
import string
import warnings

import numpy as np
from scipy import stats
from sklearn import metrics as sk_metrics


# ---------------------------------------------------------------------------
# Classification
# ---------------------------------------------------------------------------
def _labels(y_true, y_pred):
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true and y_pred differ in shape: {y_true.shape} vs {y_pred.shape}")
    if y_true.size == 0:
        raise ValueError("no examples to score")
    return y_true, y_pred


def accuracy(y_true, y_pred) -> float:
    """Fraction of predictions equal to the gold label."""
    return float(sk_metrics.accuracy_score(*_labels(y_true, y_pred)))


def confusion_matrix(y_true, y_pred, num_classes: int | None = None) -> np.ndarray:
    """`m[i, j]` = number of examples of gold class i predicted as j (integer class ids).

    >>> confusion_matrix([0, 1, 1], [0, 0, 1]).tolist()
    [[1, 0], [1, 1]]
    """
    y_true, y_pred = _labels(y_true, y_pred)
    n = int(num_classes if num_classes is not None else max(y_true.max(), y_pred.max()) + 1)
    return sk_metrics.confusion_matrix(y_true, y_pred, labels=np.arange(n)).astype(np.int64)


def f1_per_class(y_true, y_pred, num_classes: int | None = None) -> np.ndarray:
    """F1 of each class id 0..n-1 (0 where a class has neither gold nor predicted examples)."""
    y_true, y_pred = _labels(y_true, y_pred)
    n = int(num_classes if num_classes is not None else max(y_true.max(), y_pred.max()) + 1)
    return sk_metrics.f1_score(y_true, y_pred, labels=np.arange(n), average=None,
                               zero_division=0.0)


def macro_f1(y_true, y_pred) -> float:
    """Unweighted mean F1 over the classes that occur in the gold or the predicted labels."""
    y_true, y_pred = _labels(y_true, y_pred)
    return float(sk_metrics.f1_score(y_true, y_pred, average="macro", zero_division=0.0))


def binary_f1(y_true, y_pred, positive=1) -> float:
    """F1 of the positive class (GLUE's MRPC and QQP); 0 when there are no true positives."""
    y_true, y_pred = _labels(y_true, y_pred)
    return float(sk_metrics.f1_score(y_true == positive, y_pred == positive, zero_division=0.0))


def matthews_corrcoef(y_true, y_pred) -> float:
    """Matthews correlation, multi-class form (Gorodkin 2004); 0 if undefined.

    >>> round(matthews_corrcoef([1, 1, 0, 0], [1, 0, 0, 0]), 6)
    0.57735
    """
    with warnings.catch_warnings():  # one label on both sides: undefined, 0 (sklearn warns)
        warnings.simplefilter("ignore", UserWarning)
        return float(sk_metrics.matthews_corrcoef(*_labels(y_true, y_pred)))


def classification_report(y_true, y_pred) -> dict:
    """{"accuracy", "macro_f1", "mcc"} for integer labels."""
    return {"accuracy": accuracy(y_true, y_pred), "macro_f1": macro_f1(y_true, y_pred),
            "mcc": matthews_corrcoef(y_true, y_pred)}


# ---------------------------------------------------------------------------
# Regression
# ---------------------------------------------------------------------------
def pearson(x, y) -> float:
    """Pearson correlation; 0 when either side is constant (where it is undefined)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.shape != y.shape or x.size < 2:
        raise ValueError(f"pearson needs two equal-length series of >= 2 values, got {x.shape}, "
                         f"{y.shape}")
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(stats.pearsonr(x, y).statistic)


def average_ranks(x) -> np.ndarray:
    """Ranks 1..n; tied values share the mean of their ranks.

    >>> average_ranks([10, 20, 20, 5]).tolist()
    [2.0, 3.5, 3.5, 1.0]
    """
    return stats.rankdata(np.asarray(x, np.float64), method="average")


def spearman(x, y) -> float:
    """Spearman rank correlation (Pearson of average ranks); 0 when either side is constant."""
    return pearson(average_ranks(x), average_ranks(y))


def regression_report(y_true, y_pred) -> dict:
    y_true, y_pred = np.asarray(y_true, np.float64), np.asarray(y_pred, np.float64)
    return {"pearson": pearson(y_true, y_pred), "spearman": spearman(y_true, y_pred),
            "mse": float(sk_metrics.mean_squared_error(y_true, y_pred))}


# ---------------------------------------------------------------------------
# Token classification (CoNLL conlleval semantics)
# ---------------------------------------------------------------------------
def _split_tag(tag: str) -> tuple[str, str]:
    """"B-PER" -> ("B", "PER"); "O" -> ("O", ""); a tag without a prefix is its own type ("I")."""
    if tag in ("O", ""):
        return "O", ""
    if len(tag) > 2 and tag[1] == "-" and tag[0] in "BIES":
        return tag[0], tag[2:]
    return "I", tag


def _chunk_end(prev_tag, tag, prev_type, type_) -> bool:
    """conlleval's endOfChunk: does a chunk end between the previous token and this one?"""
    return ((prev_tag in ("E", "S")) or
            (prev_tag in ("B", "I") and tag in ("B", "S", "O")) or
            (prev_tag != "O" and prev_type != type_))


def _chunk_start(prev_tag, tag, prev_type, type_) -> bool:
    """conlleval's startOfChunk: does a chunk start at this token?"""
    return ((tag in ("B", "S")) or
            (prev_tag in ("E", "S", "O") and tag in ("I", "E")) or
            (tag != "O" and prev_type != type_))


def conll_chunks(tags: list[str]) -> set[tuple[str, int, int]]:
    """The chunks of one tag sequence as {(type, first token, last token)}.

    Works for IOB2 (B- starts every chunk), IOB1 (B- only between two chunks of one type)
    and IOBES.

    >>> sorted(conll_chunks(["B-PER", "I-PER", "O", "I-LOC", "B-LOC", "S-ORG"]))
    [('LOC', 3, 3), ('LOC', 4, 4), ('ORG', 5, 5), ('PER', 0, 1)]
    """
    chunks = set()
    prev_tag, prev_type, start = "O", "", None
    for i, tag in enumerate(list(tags) + ["O"]):
        t, type_ = _split_tag(tag)
        if start is not None and _chunk_end(prev_tag, t, prev_type, type_):
            chunks.add((prev_type, start, i - 1))
            start = None
        if _chunk_start(prev_tag, t, prev_type, type_):
            start = i
        prev_tag, prev_type = t, type_
    return chunks


def conll_f1(gold: list[list[str]], predicted: list[list[str]]) -> dict:
    """Entity-level micro precision / recall / F1 over sentences (conlleval), plus token accuracy.

    >>> r = conll_f1([["B-PER", "I-PER", "O"]], [["B-PER", "O", "O"]])
    >>> r["precision"], r["recall"], r["f1"], round(r["token_accuracy"], 4)
    (0.0, 0.0, 0.0, 0.6667)
    """
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted ones")
    correct = found_gold = found_predicted = 0
    for g, p in zip(gold, predicted):
        if len(g) != len(p):
            raise ValueError(f"a sentence has {len(g)} gold tags but {len(p)} predicted ones")
        gc, pc = conll_chunks(g), conll_chunks(p)
        correct += len(gc & pc)
        found_gold += len(gc)
        found_predicted += len(pc)
    precision = correct / found_predicted if found_predicted else 0.0
    recall = correct / found_gold if found_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1,
            "token_accuracy": token_accuracy(gold, predicted)}


def token_accuracy(gold: list[list], predicted: list[list]) -> float:
    """Fraction of tokens (over all sentences) whose predicted tag equals the gold one."""
    flat_g = [t for s in gold for t in s]
    flat_p = [t for s in predicted for t in s]
    if len(flat_g) != len(flat_p):
        raise ValueError(f"{len(flat_g)} gold tokens but {len(flat_p)} predicted ones")
    if not flat_g:
        raise ValueError("no tokens to score")
    return sum(a == b for a, b in zip(flat_g, flat_p)) / len(flat_g)


def is_chunk_tagset(labels) -> bool:
    """True when every label is "O" or has a B-/I-/E-/S- prefix (entity metrics make sense)."""
    return all(l == "O" or (len(l) > 2 and l[1] == "-" and l[0] in "BIES") for l in labels)


# ---------------------------------------------------------------------------
# Extractive QA (the official SQuAD v1.1 / v2.0 evaluation scripts)
# ---------------------------------------------------------------------------
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, remove punctuation, articles (a, an, the) and extra whitespace.

    >>> normalize_answer("The  Denver Broncos!")
    'denver broncos'
    """
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def squad_exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def squad_f1(prediction: str, gold: str) -> float:
    """Token-overlap F1 of the normalised answers; v2 rule: an empty side scores 1 only if both are.

    >>> round(squad_f1("the Denver Broncos won", "Denver Broncos"), 4)
    0.8
    """
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not p or not g:
        return float(p == g)
    common = collections.Counter(p) & collections.Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def squad_evaluate(gold_answers: dict[str, list[str]], predictions: dict[str, str]) -> dict:
    """EM and F1 in percent (as the official script prints them), best over each question's answers.

    `gold_answers`: question id -> answer texts; an empty list means "no answer" (v2), which
    is matched by the empty prediction "". Questions without a prediction score 0. Also
    reports `HasAns_*` / `NoAns_*` splits when both kinds occur.
    """
    if not gold_answers:
        raise ValueError("no questions to score")
    exact, f1 = {}, {}
    for qid, answers in gold_answers.items():
        answers = [a for a in answers if normalize_answer(a)] or [""]
        prediction = predictions.get(qid)
        if prediction is None:
            exact[qid] = f1[qid] = 0.0
            continue
        exact[qid] = max(squad_exact_match(prediction, a) for a in answers)
        f1[qid] = max(squad_f1(prediction, a) for a in answers)
    result = {"exact_match": 100.0 * np.mean(list(exact.values())),
              "f1": 100.0 * np.mean(list(f1.values())), "total": len(gold_answers)}
    has = [q for q, a in gold_answers.items() if any(normalize_answer(x) for x in a)]
    no = [q for q in gold_answers if q not in set(has)]
    if has and no:
        for name, ids in (("HasAns", has), ("NoAns", no)):
            result[f"{name}_exact_match"] = 100.0 * np.mean([exact[q] for q in ids])
            result[f"{name}_f1"] = 100.0 * np.mean([f1[q] for q in ids])
    return {k: float(v) if k != "total" else v for k, v in result.items()}


# ---------------------------------------------------------------------------
# Retrieval
# ---------------------------------------------------------------------------
def recall_at_k(ranked: list[list], relevant: list[set], k: int) -> float:
    """Mean over queries of |relevant ∩ top k| / |relevant| (queries without relevant items
    are skipped).

    >>> recall_at_k([["a", "b", "c"], ["x", "y", "z"]], [{"b"}, {"z", "q"}], 2)
    0.5
    """
    scores = [len(set(r[:k]) & set(rel)) / len(rel) for r, rel in zip(ranked, relevant) if rel]
    if not scores:
        raise ValueError("no query has a relevant item")
    return float(np.mean(scores))


def mean_reciprocal_rank(ranked: list[list], relevant: list[set]) -> float:
    """Mean over queries of 1 / rank of the first relevant item (0 when none is ranked).

    >>> mean_reciprocal_rank([["a", "b"], ["x", "y"], ["p"]], [{"b"}, {"x"}, {"q"}])
    0.5
    """
    scores = []
    for r, rel in zip(ranked, relevant):
        if not rel:
            continue
        scores.append(next((1.0 / (i + 1) for i, item in enumerate(r) if item in rel), 0.0))
    if not scores:
        raise ValueError("no query has a relevant item")
    return float(np.mean(scores))
