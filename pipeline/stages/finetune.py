"""Stage `finetune`: pretrained encoder + task head, trained on labelled data, evaluated, exported.

Reads top to bottom:
  1. the task's examples, label set and fixed seeded splits (pipeline/finetune_data.py);
  2. the pretrained encoder: `finetune.init_from`, else <run_dir>/pretrain/model.keras, and
     its vocab; features made with the same in-graph tokenizer the export serves with;
  3. inside the tf.distribute strategy: the task model (models/heads.py) on that encoder, the
     freeze strategy, AdamW with linear warmup and decay;
  4. `model.fit` for `epochs` (or `max_steps`), the validation metric after every epoch, the
     best epoch's weights kept;
  5. validation and test metrics (pipeline/metrics.py), the baselines on the same test split
     (majority class, bag-of-words logistic regression; per task), a confusion-matrix PNG;
  6. <run_dir>/finetune/<name>/ written whole (model.keras, raw-text SavedModel, metrics,
     splits, ...), logged to MLflow; the SavedModel logged as a pyfunc model and registered.

`sweep(config)` runs a small grid (`finetune.sweep`) as nested MLflow runs and reports the
best point by the validation metric.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import shutil
import time
import warnings
from pathlib import Path

import keras
import mlflow
import numpy as np
import yaml

from models import heads
from models.schedules import WarmupPolynomialDecay
from pipeline import artifacts, metrics
from pipeline import config as config_lib
from pipeline import finetune_data as fd
from pipeline.artifacts import Artifacts
from pipeline.config import Config

INPUTS = ("token_ids", "segment_ids", "padding_mask")


class FinetuneError(ValueError):
    """The fine-tuning inputs do not fit together; the message says how to fix it."""


def output_name(fc) -> str:
    """`finetune.name`, else brown_genre / brown_pos / the GLUE task / the task name."""
    if fc.name:
        return fc.name
    if fc.dataset == "glue":
        return fc.glue_task
    return fc.dataset if fc.dataset.startswith("brown_") else fc.task


# ---------------------------------------------------------------------------
# The pretrained encoder and its vocab
# ---------------------------------------------------------------------------
def resolve_init(config: Config) -> tuple[Path, Path]:
    """(the .keras file to start from, the vocab.txt that goes with it)."""
    paths = Artifacts(config.run_dir)
    fc = config.finetune
    if fc.init_from:
        model_path = Path(fc.init_from)
        if not model_path.is_file() or model_path.suffix != ".keras":
            raise FinetuneError(f"finetune.init_from = {fc.init_from!r} is not a .keras file; give "
                                f"a model saved by the pretrain or finetune stage (model.keras)")
    else:
        model_path = artifacts.require(paths.model_keras, "the pretrained model", "train")
    if fc.vocab_file:
        vocab = Path(fc.vocab_file)
    elif fc.init_from and (model_path.parent / "vocab.txt").is_file():
        vocab = model_path.parent / "vocab.txt"
    else:
        vocab = artifacts.require(paths.vocab_file, "the vocab", "vocab")
    return model_path, vocab


def load_backbone(model_path: Path):
    """The BERT encoder inside a saved model (a pretrainer, a task model or an encoder)."""
    with warnings.catch_warnings():  # the pretrainer's optimizer state is not needed here
        warnings.filterwarnings("ignore", message=".*Skipping variable loading for optimizer.*")
        model = keras.models.load_model(str(model_path), compile=False)
    if hasattr(model, "backbone"):
        return model.backbone
    if all(name in getattr(model, "input", {}) for name in INPUTS):
        return model
    raise FinetuneError(f"{model_path} holds a {type(model).__name__} without a BERT encoder "
                        f"(no .backbone); give a model written by the pretrain/finetune stage")


def build_task_model(task: str, backbone, num_labels: int, fc):
    """The task model of models/heads.py on `backbone`, with the freeze strategy applied."""
    heads.freeze_backbone(backbone, fc.freeze, fc.trainable_last_n)
    if task in ("token_classification", "question_answering", "semantic_search"):
        backbone.pooled_dense.trainable = False  # these heads do not use the [CLS] pooler
    if task == "classification" and windowed(fc):
        from models.window_heads import BertWindowClassifier

        return BertWindowClassifier(backbone, num_labels, fc.long_doc_aggregation,
                                    dropout=fc.dropout)
    if task == "classification":
        return heads.BertClassifier(backbone, num_labels, dropout=fc.dropout)
    if task == "regression":
        return heads.BertRegressor(backbone, dropout=fc.dropout)
    if task == "token_classification":
        return heads.BertTokenClassifier(backbone, num_labels, dropout=fc.dropout)
    if task == "question_answering":
        return heads.BertSpanExtractor(backbone)
    return heads.BertSentenceEncoder(backbone)


def build_optimizer(fc, total_steps: int) -> keras.optimizers.Optimizer:
    """AdamW, linear warmup over `warmup_fraction` of the steps then linear decay to 0."""
    warmup = int(round(fc.warmup_fraction * total_steps))
    schedule = WarmupPolynomialDecay(fc.learning_rate, warmup, total_steps)
    optimizer = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=fc.weight_decay,
                                       beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                                       global_clipnorm=fc.clipnorm or None)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return optimizer


# ---------------------------------------------------------------------------
# Features per task: (x, y, sample_weight) numpy dicts, plus what evaluation needs
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Split:
    examples: list
    x: dict
    y: dict | None = None
    sample_weight: dict | None = None
    meta: dict | None = None


def windowed(fc) -> bool:
    """Long-document classification: every window of a text, predictions aggregated."""
    return getattr(fc, "long_doc_aggregation", "none") != "none"


def make_split(task: str, examples: list, pre: fd.TextPreprocessor, labels, fc,
               pair: bool) -> Split:
    if task == "classification" and windowed(fc):  # one example = all windows of a document
        from pipeline.windows import text_windows

        f = text_windows([e.text for e in examples], pre, fc.window_stride, fc.max_windows)
        index = {name: i for i, name in enumerate(labels)}
        y = {"logits": np.array([index[e.label] for e in examples], np.int32)}
        return Split(examples, {k: f[k] for k in (*INPUTS, "window_mask")}, y, None,
                     {"n_windows": f["n_windows"], "truncated_documents": f["truncated_documents"]})
    if task in ("classification", "regression"):
        x = pre.features([e.text for e in examples],
                         [e.text_pair for e in examples] if pair else None)
        if task == "classification":
            index = {name: i for i, name in enumerate(labels)}
            y = {"logits": np.array([index[e.label] for e in examples], np.int32)}
        else:
            y = {"score": np.array([e.label for e in examples], np.float32)}
        return Split(examples, x, y)
    if task == "token_classification":
        f = fd.token_features(examples, pre, labels)
        return Split(examples, {k: f[k] for k in INPUTS}, {"logits": f["labels"]},
                     {"logits": f["weights"]}, f)
    if task == "question_answering":
        f = fd.qa_features(examples, pre, fc.max_query_length, fc.doc_stride)
        return Split(examples, {k: f[k] for k in INPUTS},
                     {"start_logits": f["start_positions"], "end_logits": f["end_positions"]},
                     None, f)
    # semantic search: both sides packed as single texts
    a = pre.features([e.text for e in examples])
    b = pre.features([e.text_pair for e in examples])
    x = {**{"a_" + k: v for k, v in a.items()}, **{"b_" + k: v for k, v in b.items()}}
    return Split(examples, x, {"similarity": np.zeros(len(examples), np.float32)})


def compile_task(model, task: str, optimizer, jit_compile=False, loss_weight: float = 1.0):
    """Loss (and metrics) per task. XLA is off by default: on CPU it made no reliable
    difference to the step time and costs seconds of compilation per run."""
    ce = keras.losses.SparseCategoricalCrossentropy
    accuracy = keras.metrics.SparseCategoricalAccuracy
    kwargs = {"optimizer": optimizer, "jit_compile": jit_compile}
    if loss_weight != 1.0 and task != "question_answering":  # multi-task: this task's share
        output = {"regression": "score", "semantic_search": "similarity"}.get(task, "logits")
        kwargs["loss_weights"] = {output: float(loss_weight)}
    if task == "classification":
        model.compile(loss={"logits": ce(from_logits=True)},
                      metrics={"logits": [accuracy("accuracy")]}, **kwargs)
    elif task == "regression":
        model.compile(loss={"score": keras.losses.MeanSquaredError()}, **kwargs)
    elif task == "token_classification":
        # Only first word pieces carry a label (weight 1): the mean is over those.
        model.compile(loss={"logits": ce(from_logits=True, reduction="mean_with_sample_weight")},
                      weighted_metrics={"logits": [accuracy("accuracy")]}, **kwargs)
    elif task == "question_answering":
        model.compile(loss={"start_logits": ce(from_logits=True),
                            "end_logits": ce(from_logits=True)},
                      loss_weights={"start_logits": 0.5, "end_logits": 0.5}, **kwargs)
    else:
        model.compile(loss={"similarity": heads.InBatchNegativesLoss()}, **kwargs)


# ---------------------------------------------------------------------------
# Evaluation per task
# ---------------------------------------------------------------------------
def predict_outputs(model, x: dict, batch_size: int) -> dict:
    return {k: np.asarray(v) for k, v in model.predict(x, batch_size=batch_size, verbose=0).items()}


def evaluate(task: str, model, split: Split, data: fd.TaskData, fc, encoder=None) -> tuple:
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
        tags = fd.token_predictions(logits, split.meta, split.examples, data.labels, fallback)
        gold = [e.tags for e in split.examples]
        if metrics.is_chunk_tagset(data.labels):
            result = metrics.conll_f1(gold, tags)
        else:  # POS-style tags: every token is its own "chunk"; F1 = token accuracy
            result = {"token_accuracy": metrics.token_accuracy(gold, tags)}
            result["f1"] = result["token_accuracy"]
        return result, {"tags": tags}
    if task == "question_answering":
        out = predict_outputs(model, split.x, 2 * fc.batch_size)
        answers = fd.qa_predictions(split.examples, split.meta, out["start_logits"],
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
def baselines(task: str, data: fd.TaskData, seed: int) -> dict:
    """{"majority": metrics, "bow_lr": metrics} (per task; empty for QA)."""
    train, test = data.train, data.test
    if task == "classification":
        from sklearn.feature_extraction.text import CountVectorizer
        from sklearn.linear_model import LogisticRegression
        from scipy.sparse import hstack

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(labels)
    size = max(4.0, 0.55 * n + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    rows = matrix.sum(axis=1, keepdims=True)
    normalised = np.divide(matrix, rows, out=np.zeros(matrix.shape, float), where=rows > 0)
    image = ax.imshow(normalised, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="fraction of the gold class")
    ax.set_xticks(range(n), labels, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(n), labels, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(title, fontsize=10)
    for i in range(n):
        for j in range(n):
            if matrix[i, j]:
                ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=7,
                        color="white" if normalised[i, j] > 0.5 else "black")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------
class EpochEvaluator(keras.callbacks.Callback):
    """After every epoch: the validation metrics, logged; the best epoch's weights kept."""

    def __init__(self, evaluate_fn, metric: str, log, to_mlflow: bool):
        super().__init__()
        self.evaluate_fn, self.metric, self.log = evaluate_fn, metric, log
        self.to_mlflow = to_mlflow
        self.best, self.best_epoch, self.best_weights, self.history = -np.inf, -1, None, []
        self.best_result = None
        self.start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        result = self.evaluate_fn()
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        entry = {"epoch": epoch + 1, "step": step,
                 "train_loss": float((logs or {}).get("loss", np.nan)),
                 **{f"val_{k}": v for k, v in result.items() if isinstance(v, float)}}
        self.history.append(entry)
        if self.to_mlflow and mlflow.active_run():
            mlflow.log_metrics({k: v for k, v in entry.items() if k not in ("epoch", "step")},
                               step=step)
        value = result[self.metric]
        self.log(f"finetune: epoch {epoch + 1}  step {step}  loss {entry['train_loss']:.4f}  "
                 f"validation {self.metric} {value:.4f}  ({time.time() - self.start:.0f} s)")
        if value > self.best:
            self.best, self.best_epoch, self.best_result = value, epoch + 1, result
            self.best_weights = self.model.get_weights()


class Progress(keras.callbacks.Callback):
    """Every `every` steps: loss and throughput (to the log and MLflow)."""

    def __init__(self, every: int, total: int, batch_size: int, log):
        super().__init__()
        self.every, self.total, self.batch_size, self.log = every, total, batch_size, log
        self.last = None

    def on_train_begin(self, logs=None):
        self.last = (time.time(), 0)

    def on_train_batch_end(self, batch, logs=None):
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        if step % self.every:
            return
        now = time.time()
        rate = (step - self.last[1]) * self.batch_size / max(now - self.last[0], 1e-9)
        self.last = (now, step)
        loss = float((logs or {}).get("loss", np.nan))
        if mlflow.active_run():
            mlflow.log_metrics({"train_loss": loss, "examples_per_second": rate}, step=step)
        self.log(f"finetune: step {step}/{self.total}  loss {loss:.4f}  {rate:,.0f} examples/s")


class StopAt(keras.callbacks.Callback):
    def __init__(self, total_steps: int):
        super().__init__()
        self.total = total_steps

    def on_train_batch_end(self, batch, logs=None):
        if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) >= self.total:
            self.model.stop_training = True


# ---------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------
def run(config: Config, log=print, write_outputs: bool = True) -> dict:
    """Fine-tunes, evaluates and (if `write_outputs`) writes + logs + registers the model."""
    from pipeline import strategy as strategy_lib

    fc = config.finetune
    task = fc.task
    started = time.time()
    for warning in config_lib.finetune_warnings(config):
        log(f"finetune: warning: {warning}")
    paths = Artifacts(config.run_dir).finetune(output_name(fc))
    keras.utils.set_random_seed(fc.seed)

    # 1. Data.
    data = fd.load_task(fc)
    counts = data.splits["counts"]
    log(f"finetune: {task} on {fc.dataset}{' (' + fc.glue_task + ')' if fc.glue_task else ''}: "
        f"{counts['train']:,} train / {counts['validation']:,} validation / {counts['test']:,} "
        f"test examples" + (f", {len(data.labels)} labels" if data.labels else ""))

    # 2. Encoder, vocab, features.
    model_path, vocab_path = resolve_init(config)
    vocab = fd.read_vocab(vocab_path)
    lowercase = fd.vocab_lowercase(vocab_path, config.vocab.lowercase)
    strategy = strategy_lib.make_strategy(config.train.strategy, config.train.tpu)
    with strategy.scope():
        backbone = load_backbone(model_path)
    if backbone.vocabulary_size != len(vocab):
        raise FinetuneError(f"the encoder in {model_path} has {backbone.vocabulary_size} token "
                            f"embeddings but {vocab_path} has {len(vocab)} tokens; give the vocab "
                            f"it was trained with (finetune.vocab_file)")
    if fc.max_seq_length > backbone.max_sequence_length:
        raise FinetuneError(f"finetune.max_seq_length = {fc.max_seq_length} exceeds the encoder's "
                            f"{backbone.max_sequence_length} positions ({model_path}); lower it")
    pre = fd.TextPreprocessor(vocab, lowercase, fc.max_seq_length)
    splits = {name: make_split(task, examples, pre, data.labels, fc, data.pair)
              for name, examples in (("train", data.train), ("validation", data.validation),
                                     *data.tests.items())}
    if task == "classification" and windowed(fc):
        meta = splits["train"].meta
        log(f"finetune: long documents: {meta['n_windows'].mean():.1f} windows per training "
            f"text on average (max_windows {fc.max_windows}, stride {fc.window_stride}); "
            f"{meta['truncated_documents']} text(s) cut after max_windows; aggregation "
            f"{fc.long_doc_aggregation}")
    if task == "token_classification" and splits["train"].meta["truncated_words"]:
        log(f"finetune: {splits['train'].meta['truncated_words']} training words beyond "
            f"max_seq_length were cut")

    # 3. Model and optimizer.
    n_train = len(next(iter(splits["train"].x.values())))
    steps_per_epoch = math.ceil(n_train / fc.batch_size)
    total_steps = steps_per_epoch * fc.epochs
    if fc.max_steps:
        total_steps = min(total_steps, fc.max_steps)
    epochs = math.ceil(total_steps / steps_per_epoch)
    with strategy.scope():
        encoder = build_task_model(task, backbone, len(data.labels or []), fc)
        model = (heads.BertBiEncoderTrainer(encoder, fc.similarity_scale)
                 if task == "semantic_search" else encoder)
        compile_task(model, task, build_optimizer(fc, total_steps))
    trainable = int(sum(np.prod(v.shape) for v in model.trainable_weights))
    log(f"finetune: {model_path} → {type(encoder).__name__}, {encoder.count_params():,} "
        f"parameters ({trainable:,} trainable, freeze={fc.freeze}); {total_steps} steps "
        f"({epochs} epoch(s) of {steps_per_epoch}), batch {fc.batch_size}, lr {fc.learning_rate}")
    if mlflow.active_run():
        mlflow.log_params({"finetune.parameters": encoder.count_params(),
                           "finetune.trainable_parameters": trainable,
                           "finetune.total_steps": total_steps,
                           "finetune.init_model": str(model_path),
                           **{f"finetune.examples.{k}": v for k, v in counts.items()}})

    # 4. Train, keeping the best epoch by the validation metric.
    def evaluate_validation():
        return evaluate(task, model, splits["validation"], data, fc, encoder)[0]

    evaluator = EpochEvaluator(evaluate_validation, data.metric, log, to_mlflow=True)
    train = splits["train"]
    fit_kwargs = {"sample_weight": train.sample_weight} if train.sample_weight else {}
    model.fit(train.x, train.y, batch_size=fc.batch_size, epochs=epochs, shuffle=True,
              callbacks=[StopAt(total_steps), evaluator,
                         Progress(max(10, steps_per_epoch // 4), total_steps, fc.batch_size, log)],
              verbose=0, **fit_kwargs)
    if evaluator.best_weights is not None and evaluator.best_epoch != len(evaluator.history):
        model.set_weights(evaluator.best_weights)
        log(f"finetune: keeping epoch {evaluator.best_epoch} (best validation {data.metric} "
            f"{evaluator.best:.4f})")
    train_seconds = time.time() - started

    # 5. Evaluate: validation, test(s), baselines.
    results = {"task": task, "dataset": fc.dataset, "metric": data.metric,
               "best_epoch": evaluator.best_epoch, "history": evaluator.history}
    predictions = {}
    results["validation"] = evaluator.best_result  # the kept epoch's validation metrics
    for name in data.tests:
        results[name], predictions[name] = evaluate(task, model, splits[name], data, fc, encoder)
    if fc.baselines:
        results["baselines"] = baselines(task, data, fc.seed)
    results["seconds"] = round(time.time() - started, 1)
    results["train_seconds"] = round(train_seconds, 1)
    _report(results, data, log)

    if write_outputs:
        write_and_log(config, paths, encoder, pre, data, results, predictions, splits, vocab_path,
                      lowercase, log)
        results["output_dir"] = str(paths.dir)
    return results


def _report(results: dict, data: fd.TaskData, log) -> None:
    keys = [k for k, v in results["test"].items() if isinstance(v, float)]
    keys = sorted(keys, key=lambda k: (k != data.metric, k))[:4]
    log(f"finetune: test ({len(data.test):,} examples)   " +
        "   ".join(f"{k} {results['test'][k]:.4f}" for k in keys))
    for name, result in results.get("baselines", {}).items():
        log(f"finetune: baseline {name:<18}" +
            "   ".join(f"{k} {result[k]:.4f}" for k in keys if k in result))


def task_info(config: Config, data: fd.TaskData, lowercase: bool, model_path="") -> dict:
    fc = config.finetune
    return {"task": fc.task, "labels": data.labels,
            "pair": data.pair and fc.task != "semantic_search",
            "max_seq_length": fc.max_seq_length, "lowercase": lowercase, "dataset": fc.dataset,
            "glue_task": fc.glue_task, "metric": data.metric,
            "max_query_length": fc.max_query_length, "doc_stride": fc.doc_stride,
            "n_best": fc.n_best, "max_answer_length": fc.max_answer_length,
            "version_2": fc.version_2, "null_score_threshold": fc.null_score_threshold,
            "init_from": str(model_path),
            "long_doc_aggregation": getattr(fc, "long_doc_aggregation", "none"),
            "window_stride": getattr(fc, "window_stride", 0),
            "max_windows": getattr(fc, "max_windows", 0)}


def write_and_log(config, paths, encoder, pre, data, results, predictions, splits, vocab_path,
                  lowercase, log) -> None:
    """Writes <run_dir>/finetune/<name>/ whole, then logs it to MLflow and registers the model."""
    from pipeline import predict

    fc = config.finetune
    task = fc.task
    info = task_info(config, data, lowercase, resolve_init(config)[0])
    with artifacts.atomic_dir(paths.dir) as tmp:
        out = artifacts.FinetuneArtifacts(tmp)
        encoder.save(str(out.model_keras))
        shutil.copyfile(vocab_path, out.vocab_file)
        out.task_json.write_text(json.dumps(info, indent=2))
        out.splits.write_text(json.dumps(data.splits, indent=2))
        out.config.write_text(config_lib.dump_yaml(config))
        if task in predict.SERVING_TASKS and not windowed(fc):  # windowed: just below
            predict.export_text_model(encoder, pre, out.saved_model, task, data.labels,
                                      info["pair"], options=info)
            if task in predict.WORD_TASKS:  # in-graph word split / windows / span search
                results["export_max_abs_diff"], results["export_mismatches"] = \
                    check_word_export(out.saved_model, encoder, pre, data, info)
            else:
                results["export_max_abs_diff"] = check_export(out.saved_model, encoder, pre,
                                                              data, info["pair"])
        if task == "classification" and windowed(fc):  # windows made in the graph
            from pipeline import windows as windows_lib

            windows_lib.export_window_model(encoder, pre, out.saved_model, data.labels,
                                            fc.window_stride, fc.max_windows)
            results["export_max_abs_diff"] = windows_lib.check_window_export(
                out.saved_model, encoder, pre, [e.text for e in data.test[:32]],
                fc.window_stride, fc.max_windows)
        if task == "classification":
            matrix = metrics.confusion_matrix(predictions["test"]["y_true"],
                                              predictions["test"]["y_pred"], len(data.labels))
            results["test"]["confusion_matrix"] = matrix.tolist()
            confusion_matrix_png(matrix, data.labels, out.confusion_matrix,
                                 f"{output_name(fc)}: test confusion matrix "
                                 f"(accuracy {results['test']['accuracy']:.3f})")
        out.metrics.write_text(json.dumps(results, indent=2, default=float))
        _write_predictions(out.test_predictions, task, data, predictions["test"])
    log(f"finetune: wrote {paths.dir}")

    if not mlflow.active_run():
        return
    flat = {}
    for split in ("validation", *data.tests):
        flat.update({f"{split}_{k}": v for k, v in results[split].items() if isinstance(v, float)})
    for name, result in results.get("baselines", {}).items():
        flat.update({f"baseline_{name}_test_{k}": v for k, v in result.items()
                     if isinstance(v, float)})
    for key in ("export_max_abs_diff", "export_mismatches"):
        if key in results:
            flat[key] = float(results[key])
    flat["finetune_seconds"] = results["seconds"]
    mlflow.log_metrics(flat)
    for path in (paths.metrics, paths.splits, paths.task_json, paths.config,
                 paths.test_predictions, paths.confusion_matrix):
        if path.exists():
            mlflow.log_artifact(str(path), "finetune")
    mlflow.log_artifact(str(paths.model_keras), "finetune")
    if task in predict.SERVING_TASKS and fc.register_model:
        name = fc.registered_model or f"bert-{output_name(fc)}"
        uri, version = predict.log_to_mlflow(paths.dir, info, name)
        mlflow.set_tags({"finetune.model_uri": uri, "finetune.registered_model": name})
        log(f"finetune: logged the raw-text model to MLflow ({uri}), registered as {name!r} "
            f"version {version}")
        if version:
            from pipeline import tracking

            # The champion alias moves only to a model that beats it on the same test split.
            split_id = hashlib.sha256(json.dumps(data.splits, sort_keys=True).encode()).hexdigest()
            tracking.promote_if_better(name, version, f"test_{data.metric}",
                                       results["test"][data.metric], split_id[:16], log=log)


def check_export(folder, encoder, pre, data, pair: bool, n: int = 32) -> float:
    """Max |exported − in-memory| output on the first test texts (raw strings both ways)."""
    from pipeline import predict

    examples = data.test[:n]
    texts = [e.text for e in examples]
    pairs = [e.text_pair for e in examples] if pair else None
    exported = predict.run_saved_model(predict.load_saved_model(folder), texts, pairs)
    x = pre.features(texts, pairs)
    memory = predict_outputs(encoder, x, n)
    if "logits" in memory:
        logits = memory["logits"] - memory["logits"].max(-1, keepdims=True)
        probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        return float(np.abs(probs - exported["scores"]).max())
    key = "score" if "score" in memory else "embedding"
    return float(np.abs(memory[key] - exported[key]).max())


def check_word_export(folder, encoder, pre, data, info: dict, n: int = 32) -> tuple[float, int]:
    """Token classification / QA: (max |exported − in-memory| score, the number of words or
    questions whose label / answer differ) on the first test examples, raw strings into the
    SavedModel vs. the Python tokenization + the in-memory model (pipeline.predict)."""
    from pipeline import predict

    examples = data.test[:n]
    serve = predict.load_saved_model(folder)
    if info["task"] == "token_classification":
        texts = [" ".join(e.words) for e in examples]
        exported = predict.run_token_model(serve, texts)
        memory = predict.python_tag(encoder, pre, texts, info["labels"])
        pairs = [(a, b) for x, y in zip(exported, memory)
                 for a, b in zip(zip(x["labels"], x["scores"]), zip(y["labels"], y["scores"]))]
        mismatches = sum(a[0] != b[0] for a, b in pairs) + \
            sum(len(x["labels"]) != len(y["labels"]) for x, y in zip(exported, memory))
        diff = max([abs(a[1] - b[1]) for a, b in pairs], default=0.0)
        return float(diff), int(mismatches)
    questions, contexts = [e.question for e in examples], [e.context for e in examples]
    exported = predict.run_qa_model(serve, questions, contexts)
    memory = predict.python_answer(encoder, pre, questions, contexts, info)
    mismatches = sum(x["answer"] != y["answer"] for x, y in zip(exported, memory))
    diffs = [abs(x[k] - y[k]) for x, y in zip(exported, memory) for k in ("score", "null_score")
             if np.isfinite(x[k]) and np.isfinite(y[k])]
    mismatches += sum(np.isfinite(x["score"]) != np.isfinite(y["score"])
                      for x, y in zip(exported, memory))
    return float(max(diffs, default=0.0)), int(mismatches)


def _write_predictions(path: Path, task: str, data: fd.TaskData, prediction: dict) -> None:
    rows = []
    for i, example in enumerate(data.test):
        if task == "classification":
            row = {"text": example.text, "gold": example.label,
                   "predicted": data.labels[int(prediction["y_pred"][i])]}
            if example.text_pair is not None:
                row["text_pair"] = example.text_pair
        elif task == "regression":
            row = {"text": example.text, "text_pair": example.text_pair, "gold": example.label,
                   "predicted": float(prediction["y_pred"][i])}
        elif task == "token_classification":
            row = {"words": example.words, "gold": example.tags, "predicted": prediction["tags"][i]}
        elif task == "question_answering":
            row = {"id": example.qid, "question": example.question,
                   "gold": [a for a, _ in example.answers],
                   "predicted": prediction["answers"][example.qid]}
        else:
            top = int(prediction["top1"][i])
            row = {"query": example.text, "gold": example.text_pair,
                   "top1": data.test[top].text_pair}
        rows.append(json.dumps(row, ensure_ascii=False))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------
# Hyperparameter sweep
# ---------------------------------------------------------------------------
def parse_grid(items: list[str]) -> dict:
    """["learning_rate=1e-4,3e-4", "epochs=2,3"] -> {"learning_rate": [1e-4, 3e-4], ...}."""
    grid = {}
    for item in items:
        key, _, values = item.partition("=")
        grid[key.strip()] = [_scalar(v.strip()) for v in values.split(",") if v.strip()]
    return grid


def _scalar(text: str):
    """"3" -> 3, "1e-4" -> 0.0001 (YAML 1.1 would keep it a string), "none" -> "none"."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return yaml.safe_load(text)


def sweep(config: Config, grid: dict | None = None, log=print) -> dict:
    """Runs every point of `grid` (default: `finetune.sweep`) as a nested MLflow run, picks the
    best by the validation metric, and writes <run_dir>/finetune/<name>.sweep.json. The points
    are evaluated, not exported; fine-tune the best one with `make finetune ARGS=...`."""
    grid = grid if grid is not None else parse_grid(config.finetune.sweep)
    if not grid:
        raise FinetuneError("finetune.sweep is empty; give a grid, e.g. "
                            "finetune.sweep='[\"learning_rate=1e-4,3e-4\", \"epochs=2,3\"]'")
    keys = list(grid)
    points = [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]
    log(f"sweep: {len(points)} points over {', '.join(keys)}")
    results = []
    for i, point in enumerate(points, start=1):
        overrides = [f"finetune.{k}={v}" for k, v in point.items()]
        # Re-validate every point (ranges, cross-checks) through the config loader.
        raw = config_lib.to_dict(config)
        for k, v in point.items():
            raw["finetune"][k] = v
        raw["finetune"]["sweep"] = []
        point_config = config_lib._build(Config, raw, "", f"sweep point {overrides}")
        config_lib.validate(point_config, f"sweep point {' '.join(overrides)}")
        label = " ".join(f"{k}={v}" for k, v in point.items())
        log(f"sweep: point {i}/{len(points)}: {label}")
        parent = mlflow.active_run()
        context = (mlflow.start_run(run_name=f"sweep {i}: {label}", nested=True,
                                    experiment_id=parent.info.experiment_id,
                                    tags={"pipeline.stage": "finetune-sweep"})
                   if parent else contextlib.nullcontext())
        with context as child:
            if child is not None:
                mlflow.log_params({f"finetune.{k}": v for k, v in point.items()})
            result = run(point_config, log=log, write_outputs=False)
            if child is not None:  # the kept epoch's metrics, comparable across the points
                mlflow.log_metrics({**{f"validation_{k}": v for k, v in
                                       _floats(result["validation"]).items()},
                                    **{f"test_{k}": v for k, v in
                                       _floats(result["test"]).items()}})
        results.append({"point": point, "metric": result["metric"],
                        "validation": _floats(result["validation"]),
                        "test": _floats(result["test"]), "best_epoch": result["best_epoch"],
                        "seconds": result["seconds"],
                        "mlflow_run_id": child.info.run_id if child is not None else None})
    metric = results[0]["metric"]
    best = max(results, key=lambda r: r["validation"][metric])
    summary = {"metric": f"validation_{metric}", "grid": grid, "points": results, "best": best}
    paths = Artifacts(config.run_dir).finetune(output_name(config.finetune))
    artifacts.write_text_atomic(paths.sweep, json.dumps(summary, indent=2, default=float))
    log(f"sweep: best {' '.join(f'{k}={v}' for k, v in best['point'].items())}: validation "
        f"{metric} {best['validation'][metric]:.4f}, test {metric} {best['test'][metric]:.4f} "
        f"({paths.sweep})")
    if mlflow.active_run():
        mlflow.log_metrics({f"best_validation_{metric}": best["validation"][metric],
                            f"best_test_{metric}": best["test"][metric]})
        mlflow.log_params({f"best.{k}": v for k, v in best["point"].items()})
        if best["mlflow_run_id"]:
            mlflow.set_tag("sweep.best_run_id", best["mlflow_run_id"])
        mlflow.log_artifact(str(paths.sweep), "sweep")
    return summary


def _floats(d: dict) -> dict:
    return {k: v for k, v in d.items() if isinstance(v, float)}
