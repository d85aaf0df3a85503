"""Token-classification and QA features in numpy, and the way back from predictions.

Token classification and QA features are built in numpy from word-piece ids
(`token_features`, `qa_features`), with the bookkeeping to map predictions back to words and
character spans (`token_predictions`, `qa_predictions`).

QA contexts longer than the window are split with `pipeline.text.windows.spans` (Google's
doc stride); a token's prediction counts in the window where it has the most context.
"""

from __future__ import annotations

import numpy as np

from pipeline.finetuning.readers import FinetuneDataError
from models.preprocessor import TextPreprocessor
from pipeline.text.preprocessor import basic_tokens
from pipeline.text.windows import is_max_context as _max_context  # BERT's _check_is_max_context
from pipeline.text.windows import spans as window_spans


# ---------------------------------------------------------------------------
# Token classification features
# ---------------------------------------------------------------------------
def token_features(examples: list, pre: TextPreprocessor, labels: list | None) -> dict:
    """Word-level tags → word-piece features: the tag goes on the first piece of each word,
    the other pieces (and [CLS], [SEP], padding) get weight 0. Words that do not fit in
    `seq_length - 2` pieces are cut (counted in "truncated_words").

    Returns numpy arrays token_ids, segment_ids, padding_mask, labels, weights (batch, seq)
    and "word_positions": per example the position of each kept word's first piece.
    """
    seq = pre.seq_length
    flat = [w for e in examples for w in e.words]
    pieces = pre.tokenize_words(flat)
    index = {tag: i for i, tag in enumerate(labels or [])}
    n = len(examples)
    token_ids = np.full((n, seq), pre.pad_id, np.int32)
    label_ids = np.zeros((n, seq), np.int32)
    weights = np.zeros((n, seq), np.float32)
    positions, truncated, k = [], 0, 0
    for i, example in enumerate(examples):
        ids, pos = [pre.cls_id], []
        for j, word in enumerate(example.words):
            word_pieces = pieces[k + j] or [pre.unk_id]
            if len(ids) + len(word_pieces) > seq - 1:
                truncated += len(example.words) - j
                break
            pos.append(len(ids))
            if labels is not None and example.tags:
                label_ids[i, len(ids)] = index[example.tags[j]]
                weights[i, len(ids)] = 1.0
            ids.extend(word_pieces)
        k += len(example.words)
        ids.append(pre.sep_id)
        token_ids[i, :len(ids)] = ids
        positions.append(pos)
    return {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids),
            "padding_mask": (token_ids != pre.pad_id).astype(np.int32), "labels": label_ids,
            "weights": weights, "word_positions": positions, "truncated_words": truncated}


def token_predictions(logits: np.ndarray, features: dict, examples: list, labels: list,
                      fallback: str) -> list[list[str]]:
    """Per-word tags from (batch, seq, classes) logits: the first piece's argmax; words cut by
    truncation get `fallback` (e.g. "O")."""
    best = logits.argmax(-1)
    out = []
    for i, example in enumerate(examples):
        pos = features["word_positions"][i]
        tags = [labels[best[i, p]] for p in pos]
        out.append(tags + [fallback] * (len(example.words) - len(tags)))
    return out


def qa_features(examples: list, pre: TextPreprocessor, max_query_length: int,
                doc_stride: int) -> dict:
    """[CLS] question [SEP] context window [SEP] features, several windows per long context.

    Windows of the context start every `doc_stride` pieces. A window that does not contain
    the whole answer (or an unanswerable question) points start and end at 0 ([CLS]).
    Returns numpy inputs, "start_positions", "end_positions", and per feature its example
    index, the character span of each context position and whether that position has its
    maximum context in this window.
    """
    seq = pre.seq_length
    questions = pre.tokenize_words([e.question for e in examples])
    tokens_per_example = [basic_tokens(e.context) for e in examples]
    flat = [t for tokens in tokens_per_example for t, _, _ in tokens]
    pieces = pre.tokenize_words(flat)
    rows = {"token_ids": [], "segment_ids": [], "start_positions": [], "end_positions": []}
    meta = {"example_index": [], "char_spans": [], "max_context": []}
    k = 0
    for ex_index, (example, tokens) in enumerate(zip(examples, tokens_per_example)):
        q = questions[ex_index][:max_query_length] or [pre.unk_id]
        doc_ids, doc_token = [], []  # piece ids and the basic token each belongs to
        for t in range(len(tokens)):
            word_pieces = pieces[k + t] or [pre.unk_id]
            doc_ids.extend(word_pieces)
            doc_token.extend([t] * len(word_pieces))
        k += len(tokens)
        answer = None
        if example.answers and not example.is_impossible:
            text, start_char = example.answers[0]
            end_char = start_char + len(text)
            inside = [t for t, (_, s, e) in enumerate(tokens) if e > start_char and s < end_char]
            if inside:
                first = doc_token.index(inside[0])
                last = len(doc_token) - 1 - doc_token[::-1].index(inside[-1])
                answer = (first, last)
        room = seq - len(q) - 3
        if room < 1:
            raise FinetuneDataError(f"finetune.max_seq_length {seq} leaves no room for the context "
                                    f"after a question of {len(q)} pieces; lower "
                                    f"max_query_length")
        windows = window_spans(len(doc_ids), room, doc_stride)  # shared with long documents
        for w, (start, length) in enumerate(windows):
            ids = [pre.cls_id] + q + [pre.sep_id] + doc_ids[start:start + length] + [pre.sep_id]
            offset = len(q) + 2
            segments = [0] * offset + [1] * (length + 1)
            spans = [None] * seq
            maxc = [False] * seq
            for i in range(length):
                _, s, e = tokens[doc_token[start + i]]
                spans[offset + i] = (s, e)
                maxc[offset + i] = _max_context(windows, start + i, w)
            s_pos = e_pos = 0
            if answer and answer[0] >= start and answer[1] < start + length:
                s_pos, e_pos = answer[0] - start + offset, answer[1] - start + offset
            pad = seq - len(ids)
            rows["token_ids"].append(ids + [pre.pad_id] * pad)
            rows["segment_ids"].append(segments + [0] * pad)
            rows["start_positions"].append(s_pos)
            rows["end_positions"].append(e_pos)
            meta["example_index"].append(ex_index)
            meta["char_spans"].append(spans)
            meta["max_context"].append(maxc)
    out = {k: np.asarray(v, np.int32) for k, v in rows.items()}
    out["padding_mask"] = (out["token_ids"] != pre.pad_id).astype(np.int32)
    out.update(meta)
    return out


def span_arrays(features: dict) -> dict:
    """The QA bookkeeping of `qa_features` as fixed-shape arrays (a row per feature):
    "span_start" / "span_end" (the character span of each context position, -1 elsewhere)
    and "max_context" (1 where the position has its maximum context in this window)."""
    spans = features["char_spans"]
    start = np.full((len(spans), len(spans[0]) if spans else 0), -1, np.int64)
    end = start.copy()
    for f, row in enumerate(spans):
        for i, span in enumerate(row):
            if span is not None:
                start[f, i], end[f, i] = span
    return {"span_start": start, "span_end": end,
            "max_context": np.asarray(features["max_context"], np.int64).reshape(start.shape)}


class SpanSearch:
    """BERT's n-best answer search, fed one batch of windows at a time (in any order).

    For each window, the `n_best` highest start and end logits are paired; a pair counts if
    both lie in the context, end >= start, the span has at most `max_answer_length` pieces and
    the start has its maximum context in this window. The score is start + end logit; a
    question keeps its best span over all its windows, and its null score (the [CLS] start +
    end logits) is the minimum over them. Memory: a score and a text per question.
    """

    def __init__(self, examples: list, n_best: int = 20, max_answer_length: int = 30):
        self.examples, self.n_best, self.max_answer_length = examples, n_best, max_answer_length
        self.best: dict[int, tuple[float, str]] = {}
        self.null: dict[int, float] = {}

    def add(self, start_logits, end_logits, rows: dict) -> None:
        """One batch of windows: logits (windows, seq) and their rows' bookkeeping
        ("example_index", "span_start", "span_end", "max_context")."""
        example_index, span_start = rows["example_index"], rows["span_start"]
        span_end, max_context = rows["span_end"], rows["max_context"]
        for f, ex_index in enumerate(np.asarray(example_index).reshape(-1).tolist()):
            s_logits, e_logits = start_logits[f], end_logits[f]
            spans_start, spans_end, maxc = span_start[f], span_end[f], max_context[f]
            context = self.examples[ex_index].context
            self.null[ex_index] = min(self.null.get(ex_index, np.inf),
                                      float(s_logits[0] + e_logits[0]))
            starts = np.argsort(-s_logits)[:self.n_best]
            ends = np.argsort(-e_logits)[:self.n_best]
            for s in starts:
                if spans_start[s] < 0 or not maxc[s]:
                    continue
                for e in ends:
                    if spans_start[e] < 0 or e < s or e - s + 1 > self.max_answer_length:
                        continue
                    score = float(s_logits[s] + e_logits[e])
                    if ex_index not in self.best or score > self.best[ex_index][0]:
                        self.best[ex_index] = (score, context[spans_start[s]:spans_end[e]])

    def candidates(self) -> dict:
        """{question id: (best span text or "", its score or -inf, null score)}: every
        question's best non-empty answer before any no-answer decision (SQuAD v2's threshold
        search runs on these, squad_official.choose_null_threshold)."""
        out = {}
        for ex_index, example in enumerate(self.examples):
            score, text = self.best.get(ex_index, (-np.inf, ""))
            out[example.qid] = (text, score, self.null.get(ex_index, -np.inf))
        return out

    def answers(self, version_2: bool = False, null_score_threshold: float = 0.0,
                scores: dict | None = None) -> dict:
        """{question id: answer text}; with `version_2`, "" when the null score exceeds the
        best span's score by more than `null_score_threshold`. `scores`, if given, receives
        {question id: (best span score or -inf, null score)}."""
        predictions = {}
        for qid, (text, score, null) in self.candidates().items():
            if version_2 and null - score > null_score_threshold:
                text = ""
            predictions[qid] = text
            if scores is not None:
                scores[qid] = (score, null)
        return predictions


def qa_predictions(examples: list, features: dict, logits: dict, settings: dict | None = None,
                   scores: dict | None = None) -> dict:
    """{question id: answer text} by `SpanSearch` over all the windows of `qa_features`, from
    the model's "start_logits" and "end_logits" (`logits`). `settings` (task.json's keys):
    n_best (20), max_answer_length (30), version_2 (false), null_score_threshold (0.0)."""
    settings = settings or {}
    search = SpanSearch(examples, settings.get("n_best", 20),
                        settings.get("max_answer_length", 30))
    if len(features["example_index"]):
        search.add(np.asarray(logits["start_logits"], np.float32),
                   np.asarray(logits["end_logits"], np.float32),
                   {"example_index": features["example_index"], **span_arrays(features)})
    return search.answers(settings.get("version_2", False),
                          settings.get("null_score_threshold", 0.0), scores)


def python_tag(model, pre, texts, labels) -> list[dict]:
    """`run_token_model`'s output from a Keras model and the Python-side tokenization
    (token_features / token_predictions above): the reference the export is checked
    against, and the fallback for model folders without a token-classification SavedModel."""
    from pipeline.finetuning.features import token_features, token_predictions
    from pipeline.finetuning.readers import TokenExample

    examples = [TokenExample(t.split(), []) for t in texts]
    features = token_features(examples, pre, None)
    logits = np.asarray(model.predict({k: features[k] for k in
                                       ("token_ids", "segment_ids", "padding_mask")},
                                      verbose=0)["logits"], np.float64)
    fallback = "O" if "O" in labels else labels[0]
    tags = token_predictions(logits, features, examples, labels, fallback)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    rows = []
    for i, (example, positions) in enumerate(zip(examples, features["word_positions"])):
        scores = [float(probs[i, p].max()) for p in positions]
        rows.append({"words": example.words, "labels": tags[i],
                     "scores": scores + [0.0] * (len(example.words) - len(scores))})
    return rows


def python_answer(model, pre, questions, contexts, info: dict) -> list[dict]:
    """`run_qa_model`'s output from a Keras model and the Python-side tokenization
    (qa_features / qa_predictions above; no character offsets: start = end = -1
    unless the answer text is found in the context)."""
    from pipeline.finetuning.features import qa_features, qa_predictions
    from pipeline.finetuning.readers import QAExample

    examples = [QAExample(str(i), q, c, []) for i, (q, c) in enumerate(zip(questions, contexts))]
    features = qa_features(examples, pre, info["max_query_length"], info["doc_stride"])
    out = model.predict({k: features[k] for k in ("token_ids", "segment_ids", "padding_mask")},
                        verbose=0)
    scores: dict = {}
    answers = qa_predictions(examples, features, out, info, scores=scores)
    rows = []
    for e in examples:
        text = answers[e.qid]
        start = e.context.find(text) if text else -1
        rows.append({"answer": text, "score": scores[e.qid][0], "null_score": scores[e.qid][1],
                     "start": start, "end": start + len(text) if start >= 0 else -1})
    return rows
