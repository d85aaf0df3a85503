"""Classical baselines a reviewer accepts, each tuned on the validation split, never on test.

Every fine-tuning run reports them beside the model on the same test split (the tasks'
`baselines`), and the summary states the model's margin against the strongest one:

    text classification  TF-IDF (word 1-2-grams and char 3-5-grams, sublinear tf) with a
                         logistic regression and a linear SVM, C picked on validation; the
                         cheap rows too (majority class, counts + logistic regression)
    regression           the same features with Ridge, alpha picked on validation; the mean
    token classification a linear-chain CRF on word-shape and context features (CRFsuite;
                         averaged perceptron, its passes picked on validation, or L-BFGS
                         with c2 picked); most-frequent-tag and the commonest tag
    semantic search      BM25 (bm25s), k1/b picked on validation; TF-IDF
    question answering   the SQuAD paper's sliding-window baseline: the span whose window
                         overlaps the question most (idf-weighted), span length and window
                         picked on validation (and v2.0's no-answer cut)

A validation split too small to choose on (fewer than MIN_VALIDATION examples, or one class)
falls back to each family's default with a one-line warning naming the split. Training sets
larger than `finetune.baseline_max_train` are subsampled (seeded) for the baselines only.
Sparse features stay sparse.

Each row is {test metric: value, ..., "chosen": "C=1", "validation": {metric: value}}.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

log = logging.getLogger(__name__)

MIN_VALIDATION = 10  # fewer validation examples than this: defaults, not a choice


# ---------------------------------------------------------------------------
# Choosing on validation
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Candidate:
    """One grid point: its description ("C=1") and a function that fits it on the training
    split and returns a predictor (inputs -> predictions)."""
    label: str
    fit: Callable
    default: bool = False  # the family's setting when validation cannot choose


def too_small(validation: Sequence, labels: Sequence | None = None) -> str:
    """Why `validation` cannot choose a setting ("" if it can)."""
    if len(validation) < MIN_VALIDATION:
        return f"{len(validation)} example(s), fewer than {MIN_VALIDATION}"
    if labels is not None and len(set(labels)) < 2:
        return "one class only"
    return ""


def choose(candidates: list[Candidate], score: Callable, small: str):
    """(the chosen candidate's label, its predictor, its validation score or None): the
    candidate with the best `score(predictor)` on validation; with `small` (validation too
    small) the default candidate, unscored. Ties keep the earlier (simpler) candidate."""
    if small:
        default = next(c for c in candidates if c.default)
        return default.label, default.fit(), None
    best = None
    for candidate in candidates:
        predictor = candidate.fit()
        value = float(score(predictor))
        if best is None or value > best[2]:
            best = (candidate.label, predictor, value)
    return best


def warn_small(task: str, small: str, what: str) -> None:
    log.warning(f"finetune: the validation split has {small}: too small to choose the "
                f"baselines' settings on, so {what} use their defaults; give a larger "
                f"validation split (finetune.validation_file or finetune.validation_fraction)")


def subsample(examples: list, limit: int, seed: int) -> list:
    """At most `limit` examples (0: all), seeded, in their original order."""
    if not limit or len(examples) <= limit:
        return examples
    keep = np.sort(np.random.default_rng(seed).choice(len(examples), limit, replace=False))
    log.info(f"finetune: baselines train on {limit:,} of the {len(examples):,} training "
             f"examples (finetune.baseline_max_train)")
    return [examples[i] for i in keep]


def row(test: dict, chosen: str, validation: float | None, metric: str) -> dict:
    out = dict(test)
    out["chosen"] = chosen + ("" if validation is not None else " (default)")
    if validation is not None:
        out["validation"] = {metric: round(validation, 6)}
    return out


# ---------------------------------------------------------------------------
# Text features (classification, pair classification, regression)
# ---------------------------------------------------------------------------
def _sides(examples, pair: bool) -> list[list[str]]:
    first = [e.text for e in examples]
    return [first, [e.text_pair or "" for e in examples]] if pair else [first]


class TextFeatures:
    """TF-IDF of each side of the examples (`kind` "word": 1-2-grams; "char": 3-5-gram
    characters within words), sublinear tf, fitted on the training split. For pairs: both
    sides and their element-wise product (the terms they share), all sparse."""

    def __init__(self, kind: str, pair: bool):
        self.kind, self.pair = kind, pair
        self.vectorizers: list = []

    def _vectorizer(self, n_docs: int):
        from sklearn.feature_extraction.text import TfidfVectorizer

        min_df = 2 if n_docs >= 50 else 1
        if self.kind == "char":
            return TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), sublinear_tf=True,
                                   min_df=min_df, max_features=200_000, dtype=np.float32)
        return TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=min_df,
                               dtype=np.float32)

    def fit_transform(self, examples):
        sides = _sides(examples, self.pair)
        self.vectorizers = [self._vectorizer(len(examples)) for _ in sides]
        return self._stack([v.fit_transform(s) for v, s in zip(self.vectorizers, sides)])

    def transform(self, examples):
        sides = _sides(examples, self.pair)
        return self._stack([v.transform(s) for v, s in zip(self.vectorizers, sides)])

    def _stack(self, parts):
        from scipy.sparse import hstack

        if self.pair:  # and the terms both sides use
            parts = [*parts, _overlap(*parts, self.vectorizers)]
        return hstack(parts).tocsr()


def _overlap(a, b, vectorizers):
    """Per-term product of the two sides' TF-IDF on the terms both vocabularies have."""
    from scipy.sparse import csr_matrix

    va, vb = vectorizers[0].vocabulary_, vectorizers[1].vocabulary_
    common = sorted(set(va) & set(vb))
    if not common:
        return csr_matrix((a.shape[0], 1), dtype=np.float32)
    ia = np.array([va[t] for t in common])
    ib = np.array([vb[t] for t in common])
    return a[:, ia].multiply(b[:, ib]).tocsr()


def text_classifiers(data, metric_of: Callable, seed: int, max_train: int) -> dict:
    """Rows of the text-classification baselines (the tasks' `baselines`): majority, bow_lr,
    tfidf_lr, tfidf_svm, tfidf_char_svm. `metric_of(y_true, y_pred)` -> the metrics dict (the
    selection metric `data.metric` among them)."""
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.svm import LinearSVC

    started = time.time()
    index = {name: i for i, name in enumerate(data.labels)}
    train = subsample(data.train, max_train, seed)
    y = {name: np.array([index[e.label] for e in split]) for name, split in
         (("train", train), ("validation", data.validation), ("test", data.test))}
    small = too_small(data.validation, y["validation"])
    if small:
        warn_small("classification", small, "C")
    metric = data.metric
    out = {"majority": metric_of(y["test"], np.full_like(
        y["test"], np.bincount(y["train"], minlength=len(index)).argmax()))}

    # The cheap row: raw counts, one vocabulary per side, default C.
    from scipy.sparse import hstack

    counts = [CountVectorizer(lowercase=True, min_df=2 if len(train) >= 50 else 1)
              for _ in _sides(train[:1], data.pair)]
    x_counts = {name: hstack([v.fit_transform(s) if name == "train" else v.transform(s)
                              for v, s in zip(counts, _sides(split, data.pair))]).tocsr()
                for name, split in (("train", train), ("test", data.test))}
    bow = OneVsRestClassifier(LogisticRegression(solver="liblinear")).fit(x_counts["train"],
                                                                         y["train"])
    out["bow_lr"] = {**metric_of(y["test"], bow.predict(x_counts["test"])),
                     "chosen": "C=1, counts (fixed)"}

    # Each family's grid, and its default (used when validation is too small to choose).
    # Logistic regression one-vs-rest with liblinear: seconds where lbfgs' multinomial took
    # a minute on Brown genre, and as good there.
    families = {
        "tfidf_lr": ("word", [(c, lambda c: OneVsRestClassifier(
            LogisticRegression(C=c, solver="liblinear"))) for c in (1.0, 3.0, 10.0, 30.0)], 10.0),
        "tfidf_svm": ("word", [(c, lambda c: LinearSVC(C=c, random_state=seed))
                               for c in (0.1, 0.3, 1.0, 3.0)], 1.0),
        "tfidf_char_svm": ("char", [(c, lambda c: LinearSVC(C=c, random_state=seed))
                                    for c in (0.1, 0.3, 1.0)], 0.3),
    }
    features = {}
    for name, (kind, grid, default) in families.items():
        if kind not in features:
            f = TextFeatures(kind, data.pair)
            features[kind] = (f.fit_transform(train), f.transform(data.validation),
                              f.transform(data.test))
        x_train, x_val, x_test = features[kind]
        candidates = [Candidate(f"C={c:g}", (lambda c=c, make=make: make(c).fit(x_train,
                                                                              y["train"])),
                                default=c == default) for c, make in grid]
        chosen, model, value = choose(
            candidates, lambda m: metric_of(y["validation"], m.predict(x_val))[metric], small)
        out[name] = row(metric_of(y["test"], model.predict(x_test)), chosen, value, metric)
    log.info(f"finetune: baselines in {time.time() - started:.1f} s (settings chosen on the "
             f"validation split, {len(data.validation):,} examples)")
    return out


def text_regressors(data, metric_of: Callable, seed: int, max_train: int) -> dict:
    """Rows of the regression baselines: mean, bow_ridge (counts, alpha 1), tfidf_ridge
    (alpha picked on validation)."""
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import Ridge

    started = time.time()
    train = subsample(data.train, max_train, seed)
    y = {name: np.array([e.label for e in split], np.float64) for name, split in
         (("train", train), ("validation", data.validation), ("test", data.test))}
    small = too_small(data.validation)
    if small:
        warn_small("regression", small, "alpha")
    metric = data.metric
    out = {"mean": metric_of(y["test"], np.full_like(y["test"], y["train"].mean()))}
    joined = [f"{e.text} {e.text_pair or ''}" for e in train]
    vec = CountVectorizer(min_df=1)
    ridge = Ridge().fit(vec.fit_transform(joined), y["train"])
    test = vec.transform([f"{e.text} {e.text_pair or ''}" for e in data.test])
    out["bow_ridge"] = {**metric_of(y["test"], ridge.predict(test)),
                        "chosen": "alpha=1, counts (fixed)"}
    f = TextFeatures("word", data.pair)
    x_train, x_val, x_test = (f.fit_transform(train), f.transform(data.validation),
                              f.transform(data.test))
    candidates = [Candidate(f"alpha={a:g}", (lambda a=a: Ridge(alpha=a).fit(x_train, y["train"])),
                            default=a == 1.0) for a in (0.1, 0.3, 1.0, 3.0, 10.0)]
    chosen, model, value = choose(
        candidates, lambda m: metric_of(y["validation"], m.predict(x_val))[metric], small)
    out["tfidf_ridge"] = row(metric_of(y["test"], model.predict(x_test)), chosen, value, metric)
    log.info(f"finetune: baselines in {time.time() - started:.1f} s")
    return out


# ---------------------------------------------------------------------------
# Token classification: a CRF on word features
# ---------------------------------------------------------------------------
def _shape(word: str) -> str:
    shape = re.sub("[A-Z]", "X", re.sub("[a-z]", "x", re.sub("[0-9]", "d", word)))
    return re.sub(r"(.)\1+", r"\1\1", shape)  # runs shortened: Xxxxx -> Xxx


def word_features(words: list[str]) -> list[list[str]]:
    """CRFsuite attributes of each word: the word and its shape, affixes and case, and the
    neighbours' (the usual features of a CRF tagger for POS and NER)."""
    lower = [w.lower() for w in words]
    out = []
    for i, w in enumerate(words):
        f = ["bias", f"w={lower[i]}", f"shape={_shape(w)}", f"p3={lower[i][:3]}",
             f"s3={lower[i][-3:]}", f"s2={lower[i][-2:]}", f"s1={lower[i][-1:]}",
             f"upper={w.isupper()}", f"title={w.istitle()}", f"digit={w.isdigit()}",
             f"hyphen={'-' in w}"]
        for offset in (-2, -1, 1, 2):
            j = i + offset
            if 0 <= j < len(words):
                f += [f"{offset}:w={lower[j]}", f"{offset}:shape={_shape(words[j])}"]
                if abs(offset) == 1:
                    f.append(f"{offset}:s3={lower[j][-3:]}")
            elif abs(offset) == 1:
                f.append("BOS" if offset < 0 else "EOS")
        out.append(f)
    return out


def crf_tagger(data, score: Callable, seed: int, fc) -> tuple:
    """(what was chosen, the test split's tags, its validation score): CRFsuite's
    linear-chain model on `word_features`, trained on `data.train` (at most
    finetune.baseline_max_train examples), chosen on `data.validation`, tagging `data.test`.
    finetune.baseline_crf_algorithm "ap": trained by averaged perceptron (Collins 2002), the
    number of passes picked on validation from iterations/2 and iterations; "lbfgs": the
    probabilistic CRF, c2 (L2) picked from 0.01, 0.1, 1 at finetune.baseline_crf_iterations
    L-BFGS iterations. `score(gold, predicted)`: the task's selection metric."""
    import tempfile
    from pathlib import Path

    import pycrfsuite

    validation, test = data.validation, data.test
    algorithm, iterations = fc.baseline_crf_algorithm, fc.baseline_crf_iterations
    train = subsample(data.train, fc.baseline_max_train, seed)
    small = too_small(validation)
    if small:
        warn_small("token classification", small, "the CRF's settings")
    features = {id(split): [word_features(e.words) for e in split]
                for split in (train, validation, test)}
    with tempfile.TemporaryDirectory() as folder:
        def fit(params: dict):
            trainer = pycrfsuite.Trainer(algorithm=algorithm, verbose=False)
            for x, e in zip(features[id(train)], train):
                trainer.append(x, e.tags)
            trainer.set_params(params)
            path = str(Path(folder) / f"crf-{len(list(Path(folder).iterdir()))}.bin")
            trainer.train(path)
            tagger = pycrfsuite.Tagger()
            tagger.open(path)
            return lambda split: [tagger.tag(x) for x in features[id(split)]]

        if algorithm == "ap":
            grid = sorted({max(1, iterations // 2), iterations})
            candidates = [Candidate(f"averaged perceptron, {n} passes",
                                    (lambda n=n: fit({"max_iterations": n})),
                                    default=n == iterations) for n in grid]
        else:
            candidates = [Candidate(f"L-BFGS, c1=0.1, c2={c2:g}",
                                    (lambda c2=c2: fit({"c1": 0.1, "c2": c2,
                                                        "max_iterations": iterations})),
                                    default=c2 == 0.1) for c2 in (0.01, 0.1, 1.0)]
        chosen, tag, value = choose(candidates,
                                    lambda t: score([e.tags for e in validation], t(validation)),
                                    small)
        return chosen, tag(test), value


# ---------------------------------------------------------------------------
# Semantic search: BM25
# ---------------------------------------------------------------------------
def bm25_scores(queries: list[str], documents: list[str], k1: float, b: float) -> np.ndarray:
    """BM25 (bm25s, Lucene's variant, English stopwords) of every query against every
    document: a (queries, documents) matrix."""
    import bm25s

    retriever = bm25s.BM25(k1=k1, b=b)
    retriever.index(bm25s.tokenize(documents, stopwords="en", show_progress=False),
                    show_progress=False)
    tokens = bm25s.tokenize(queries, stopwords="en", show_progress=False, return_ids=False)
    known = [[t for t in q if t in retriever.vocab_dict] for q in tokens]
    return np.stack([retriever.get_scores(q) if q else np.zeros(len(documents), np.float32)
                     for q in known])


def bm25_search(validation, test, metric_of: Callable, metric: str) -> dict:
    """The BM25 row: (k1, b) picked on validation (each split's queries against its own
    documents, as the model is evaluated)."""
    small = too_small(validation)
    if small:
        warn_small("semantic search", small, "BM25's k1 and b")

    def fit(k1, b):
        return lambda split: bm25_scores([e.text for e in split], [e.text_pair for e in split],
                                         k1, b)

    candidates = [Candidate(f"k1={k1:g}, b={b:g}", (lambda k1=k1, b=b: fit(k1, b)),
                            default=(k1, b) == (1.5, 0.75))
                  for k1, b in ((0.9, 0.4), (1.2, 0.75), (1.5, 0.75), (2.0, 0.75))]
    chosen, scorer, value = choose(
        candidates, lambda s: metric_of(s(validation), validation)[metric], small)
    return row(metric_of(scorer(test), test), chosen, value, metric)


# ---------------------------------------------------------------------------
# Question answering: the sliding-window span baseline (SQuAD paper, after MCTest)
# ---------------------------------------------------------------------------
_WORD = re.compile(r"\S+")
_PUNCT = re.compile(r"^\W+|\W+$")


def _stopwords() -> frozenset:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return frozenset(ENGLISH_STOP_WORDS)


def _norm(word: str) -> str:
    return _PUNCT.sub("", word.lower())


def idf_of(contexts: list[str]) -> Callable[[str], float]:
    """idf of normalised words over `contexts` (one document each); unseen words get the
    largest."""
    df = Counter(w for c in contexts for w in {_norm(x) for x in _WORD.findall(c)})
    n = max(1, len(contexts))
    unseen = math.log(1 + n)
    return lambda w: math.log(1 + n / df[w]) if w in df else unseen


def window_span(example, idf: Callable, stop: frozenset, max_len: int,
                window: int) -> tuple[str, float]:
    """(answer text, score in [0, 1]) of a QAExample: among the context's spans of 1..max_len
    words that share no content word with the question, the one whose `window` words either
    side hold the most idf-weighted question words (ties: the one nearest a question word);
    the score is that sum over the question's total."""
    question, context = example.question, example.context
    q_words = {_norm(w) for w in _WORD.findall(question)} - stop - {""}
    total = sum(idf(w) for w in q_words)
    matches = list(_WORD.finditer(context))
    if not matches or not total:
        return "", 0.0
    words = [_norm(m.group()) for m in matches]
    weight = np.array([idf(w) if w in q_words else 0.0 for w in words])
    prefix = np.concatenate([[0.0], np.cumsum(weight)])
    n = len(words)
    found = np.flatnonzero(weight)
    best, best_key = None, (-1.0, 0)
    for start in range(n):
        for end in range(start, min(n, start + max_len)):
            if words[end] in q_words or not words[end]:
                break  # spans never contain a question word
            if all(w in stop for w in words[start:end + 1]):
                continue
            lo, hi = max(0, start - window), min(n, end + 1 + window)
            # ties: the span nearer a question word (the paper's distance feature)
            near = int(np.min(np.minimum(np.abs(found - start), np.abs(found - end)))) \
                if len(found) else n
            key = (prefix[hi] - prefix[lo], -near)
            if key > best_key:
                best, best_key = (start, end), key
    if best is None:
        return "", 0.0
    text = context[matches[best[0]].start():matches[best[1]].end()]
    return _PUNCT.sub("", text) or text, float(best_key[0] / total)


def qa_window(train, validation, test, evaluate: Callable, version_2: bool) -> dict:
    """The sliding-window row: span length and window picked on validation by `evaluate(
    examples, answers, no-answer probabilities)["f1"]`; for v2.0 also the score under which
    it answers "" (from the validation scores' quantiles)."""
    small = too_small(validation)
    if small:
        warn_small("question answering", small, "the sliding window's span length and window")
    stop = _stopwords()
    idf = idf_of(sorted({e.context for e in train}))

    def predict(examples, max_len, window):
        return {e.qid: window_span(e, idf, stop, max_len, window)
                for e in examples}

    def answers(found, cut):
        return ({q: ("" if s < cut else text) for q, (text, s) in found.items()},
                {q: 1.0 - s for q, (_, s) in found.items()})

    cuts = {}  # (span length, window) -> v2.0's no-answer cut, chosen on validation

    def fit(max_len, window):
        cut = 0.0
        if version_2 and not small:
            found = predict(validation, max_len, window)
            levels = np.quantile([s for _, s in found.values()], np.linspace(0.1, 0.9, 9))
            cut = max([0.0, *levels],
                      key=lambda c: evaluate(validation, *answers(found, c))["f1"])
        cuts[max_len, window] = float(cut)
        return lambda examples: answers(predict(examples, max_len, window), cut)

    settings = [(m, w) for m in (1, 3, 5) for w in (3, 5, 10)]
    candidates = [Candidate(f"span<={m}, window={w}", (lambda m=m, w=w: fit(m, w)),
                            default=(m, w) == (3, 5)) for m, w in settings]
    chosen, run, value = choose(candidates,
                                lambda r: evaluate(validation, *r(validation))["f1"], small)
    if version_2:
        m, w = settings[[c.label for c in candidates].index(chosen.replace(" (default)", ""))]
        chosen += f", no answer under {cuts[m, w]:.3f}"
    return row(evaluate(test, *run(test)), chosen, value, "f1")


# ---------------------------------------------------------------------------
# The margin against the strongest baseline
# ---------------------------------------------------------------------------
def strongest(baselines: dict, metric: str) -> tuple[str, float] | None:
    """(name, test value) of the baseline with the highest test `metric` (every row counts,
    random_init too: the margin is the conservative one); None without any."""
    scored = [(name, float(r[metric])) for name, r in baselines.items()
              if isinstance(r.get(metric), (int, float)) and not math.isnan(float(r[metric]))]
    return max(scored, key=lambda t: t[1]) if scored else None


def margin_line(model_value: float, baselines: dict, metric: str, points: float) -> tuple:
    """(one summary line, margin in points, the strongest baseline's name) or (None, None,
    None) without baselines. `points`: points per unit of the metric (100 for a metric in
    [0, 1], 1 for one already in percent)."""
    best = strongest(baselines, metric)
    if best is None:
        return None, None, None
    name, value = best
    margin = (model_value - value) * points
    digits = 3 if points == 100 else 2
    if margin < 0:
        return (f"the model LOSES to the baseline {name}: {metric} {model_value:.{digits}f} vs "
                f"{value:.{digits}f} ({margin:+.1f} points)", margin, name)
    return (f"model {model_value:.{digits}f} vs best baseline {name} {value:.{digits}f} "
            f"({margin:+.1f})", margin, name)
