"""SQuAD as the official evaluation scripts score it, and the files they read.

Written from the definitions of `evaluate-v2.0.py` (SQuAD 2.0, Rajpurkar, Jia and Liang
2018; the scripts are on the SQuAD site) and checked against figures worked out by hand from
them (tests/test_squad_v2.py):

- per question, `exact` and `f1` of the prediction against each gold answer, the best kept
  (lower case, punctuation, articles a/an/the and extra whitespace removed; F1 over the
  normalised tokens; an empty side scores 1 only if both are empty). A gold answer that
  normalises to nothing is dropped; a question with none left is answered by "" alone.
  A question is "HasAns" when its `answers` list is not empty;
- with a no-answer probability per question (`--na-prob-file`), a question whose probability
  exceeds `--na-prob-thresh` (default 1.0) is scored as if the prediction were "";
- `exact`, `f1`, `total` over all questions, the same prefixed `HasAns_` / `NoAns_` over the
  answerable / unanswerable ones (a prefix only when such questions exist);
- `best_exact` / `best_f1`: the score if the questions whose probability is above a
  threshold were given "", at the best threshold; `best_exact_thresh` / `best_f1_thresh`: that
  threshold (questions taken in increasing probability; the first strictly better total wins;
  0.0 when answering nothing is best).

The files (`write_predictions`, `write_na_probs`):

    predictions.json   {question id: answer text}, "" for "no answer" (both versions)
    na_prob.json       {question id: sigmoid(null score - best span score)}: the model's
                       probability that the question has no answer, if its choice were only
                       between [CLS] and its best span (v2.0)

    python evaluate-v2.0.py dev-v2.0.json predictions.json --na-prob-file na_prob.json
    python -m pipeline.finetuning.squad_official dev-v2.0.json predictions.json \\
        --na-prob-file na_prob.json        # the same keys and figures, without the script

`choose_null_threshold` is the same search on the best non-empty span of every question,
in score units (null score minus best span score), which fine-tuning runs on the validation
split to pick `finetune.null_score_threshold = auto`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from pipeline.finetuning.metrics import normalize_answer, squad_exact_match, squad_f1

PREDICTIONS = "predictions.json"
NA_PROBS = "na_prob.json"
V2_KEYS = ("exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact",
           "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh", "best_f1",
           "best_f1_thresh")


# ---------------------------------------------------------------------------
# Gold answers
# ---------------------------------------------------------------------------
def gold_of(examples) -> tuple[dict, dict]:
    """({question id: gold answer texts}, {question id: has an answer}) of QAExamples."""
    gold, has_answer = {}, {}
    for e in examples:
        texts = [] if e.is_impossible else [text for text, _ in e.answers]
        gold[e.qid], has_answer[e.qid] = texts, bool(texts)
    return gold, has_answer


def read_gold(path) -> tuple[dict, dict]:
    """The gold of a SQuAD JSON file (data[].paragraphs[].qas[]: id, answers[].text), as the
    official script reads it. Raises ValueError naming the file and what is wrong."""
    try:
        articles = json.loads(Path(path).read_text(encoding="utf-8"))["data"]
        gold, has_answer = {}, {}
        for article in articles:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    qid = str(qa["id"])
                    gold[qid] = [str(a["text"]) for a in qa["answers"]]
                    has_answer[qid] = bool(qa["answers"])
    except OSError as err:
        raise ValueError(f"{path}: cannot read it ({err.strerror}); give the SQuAD JSON file "
                         f"(e.g. dev-v2.0.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not SQuAD JSON ({type(err).__name__}: {err}); it needs "
                         f"data[].paragraphs[].qas[] with id and answers[].text") from None
    if not gold:
        raise ValueError(f"{path}: no questions in data[].paragraphs[].qas[]; give the SQuAD "
                         f"file the predictions are for")
    return gold, has_answer


# ---------------------------------------------------------------------------
# The v2.0 evaluation
# ---------------------------------------------------------------------------
def raw_scores(gold: dict, predictions: dict) -> tuple[dict, dict]:
    """({qid: exact}, {qid: f1}) in 0..1 for the questions that have a prediction."""
    exact, f1 = {}, {}
    for qid, answers in gold.items():
        if qid not in predictions:
            continue  # the official script prints "Missing prediction" and leaves it out
        answers = [a for a in answers if normalize_answer(a)] or [""]
        exact[qid] = max(squad_exact_match(predictions[qid], a) for a in answers)
        f1[qid] = max(squad_f1(predictions[qid], a) for a in answers)
    return exact, f1


def apply_no_answer_threshold(scores: dict, na_probs: dict, has_answer: dict,
                              na_prob_thresh: float) -> dict:
    """Questions whose no-answer probability exceeds the threshold score as if answered ""."""
    return {q: float(not has_answer[q]) if na_probs[q] > na_prob_thresh else s
            for q, s in scores.items()}


def _totals(exact: dict, f1: dict, qids) -> dict:
    qids = list(qids)
    return {"exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
            "f1": 100.0 * sum(f1[q] for q in qids) / len(qids), "total": len(qids)}


def find_best_threshold(predictions: dict, scores: dict, na_probs: dict,
                        has_answer: dict) -> tuple[float, float]:
    """(best score in percent, its threshold): every question starts at "no answer" (1 for
    an unanswerable one, 0 for the rest); in increasing `na_probs` order each question in
    turn keeps its prediction (+ its score if answerable, -1 if unanswerable and the
    prediction is not empty); the running total's first strict maximum gives the threshold
    (the probability of the question just added; 0.0 if answering nothing is best)."""
    current = best = sum(not v for v in has_answer.values())
    threshold = 0.0
    for qid in sorted(na_probs, key=lambda q: na_probs[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, threshold = current, na_probs[qid]
    return 100.0 * best / len(scores), threshold


def evaluate_v2(gold: dict, has_answer: dict, predictions: dict, na_probs: dict | None = None,
                na_prob_thresh: float = 1.0) -> dict:
    """What `evaluate-v2.0.py` prints for these predictions (and `--na-prob-file` values):
    the keys of V2_KEYS in that order (best_* only with `na_probs`; HasAns_* / NoAns_* only
    when such questions exist)."""
    exact_raw, f1_raw = raw_scores(gold, predictions)
    if not exact_raw:
        raise ValueError("none of the questions has a prediction; nothing to score")
    probs = na_probs if na_probs is not None else {q: 0.0 for q in predictions}
    missing = [q for q in exact_raw if q not in probs]
    if missing:
        raise ValueError(f"the no-answer probabilities miss {len(missing)} predicted question(s), "
                         f"e.g. {missing[0]!r}; give one for every question of predictions.json")
    exact = apply_no_answer_threshold(exact_raw, probs, has_answer, na_prob_thresh)
    f1 = apply_no_answer_threshold(f1_raw, probs, has_answer, na_prob_thresh)
    result = _totals(exact, f1, exact)
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [q for q, v in has_answer.items() if v is wanted and q in exact]
        if qids:
            result.update({f"{prefix}_{k}": v for k, v in _totals(exact, f1, qids).items()})
    if na_probs is not None:
        for name, scores in (("exact", exact_raw), ("f1", f1_raw)):
            best, threshold = find_best_threshold(predictions, scores, probs, has_answer)
            result[f"best_{name}"], result[f"best_{name}_thresh"] = best, threshold
    return result


# ---------------------------------------------------------------------------
# Null scores
# ---------------------------------------------------------------------------
def na_probability(null_score: float, span_score: float) -> float:
    """P(no answer) if the choice were only between [CLS] (the null score) and the best span:
    sigmoid(null - span); 1.0 when there is no span (its score -inf)."""
    diff = float(null_score) - float(span_score)
    if math.isnan(diff):
        return 1.0
    if diff >= 0:
        return 1.0 / (1.0 + math.exp(-diff))
    e = math.exp(diff)
    return e / (1.0 + e)


def choose_null_threshold(gold: dict, has_answer: dict, spans: dict, diffs: dict) -> float:
    """The threshold t (score units) with the best F1 when a question is answered with its
    best span `spans[qid]` iff `diffs[qid]` (null score - best span score) <= t, else "".

    `find_best_threshold`'s search on `diffs`, with questions of equal difference taken
    together (a threshold answers all of them or none) and, when answering nothing is best,
    a threshold just below the smallest difference (the official script says 0.0)."""
    _, f1 = raw_scores(gold, spans)
    order = sorted(f1, key=lambda q: diffs[q])
    if not order:
        raise ValueError("no question to choose a null-score threshold on")
    current = best = sum(not has_answer[q] for q in order)
    threshold = float(np.nextafter(diffs[order[0]], -np.inf))
    i = 0
    while i < len(order):
        d = diffs[order[i]]
        while i < len(order) and diffs[order[i]] == d:
            q = order[i]
            current += f1[q] if has_answer[q] else (-1 if spans[q] else 0)
            i += 1
        if current > best and math.isfinite(d):
            best, threshold = current, float(d)
    return threshold


def answers_at(spans: dict, diffs: dict, threshold: float) -> dict:
    """{qid: its best span, or "" where null score - span score > threshold}."""
    return {q: "" if diffs[q] > threshold else text for q, text in spans.items()}


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------
def write_predictions(path, predictions: dict) -> None:
    """predictions.json: {question id: answer text} (written aside, then moved into place)."""
    from pipeline import artifacts

    artifacts.write_text_atomic(Path(path), json.dumps(
        {str(q): str(a) for q, a in predictions.items()}, ensure_ascii=False, indent=1) + "\n")


def write_na_probs(path, na_probs: dict) -> None:
    """na_prob.json: {question id: probability of no answer} (floats written to round-trip)."""
    from pipeline import artifacts

    artifacts.write_text_atomic(Path(path), json.dumps(
        {str(q): float(p) for q, p in na_probs.items()}, indent=1) + "\n")


def _read_mapping(path, kind: str, what: str) -> dict:
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"{path}: cannot read it ({err.strerror}); give the {what}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not JSON ({err}); give the {what}") from None
    if not isinstance(value, dict):  # a bad file, reported like the others
        raise ValueError(  # noqa: TRY004
            f"{path}: a JSON {type(value).__name__}, not an object; the {what} maps each "
            f"question id to {kind}")
    for qid, v in value.items():
        good = isinstance(v, str) if kind == "its answer text" else (
            isinstance(v, (int, float)) and not isinstance(v, bool))
        if not good:
            raise ValueError(f"{path}: question {qid!r} has {json.dumps(v)[:40]}; the {what} "
                             f"maps each question id to {kind}")
    return value


def main(argv=None) -> int:
    """`python -m pipeline.finetuning.squad_official DATA PREDICTIONS [--na-prob-file F]`:
    evaluate-v2.0.py's JSON on stdout; a bad file is one line on stderr and exit 2."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.finetuning.squad_official",
        description="SQuAD v2.0 evaluation with the official script's definitions and keys.")
    parser.add_argument("data_file", help="the SQuAD JSON file (e.g. dev-v2.0.json)")
    parser.add_argument("pred_file", help="predictions.json: {question id: answer text}")
    parser.add_argument("--na-prob-file", "-n", help="na_prob.json: {question id: P(no answer)}")
    parser.add_argument("--na-prob-thresh", "-t", type=float, default=1.0,
                        help="a question whose P(no answer) exceeds this scores as \"\"")
    parser.add_argument("--out-file", "-o", help="write the JSON here instead of stdout")
    args = parser.parse_args(argv)
    try:
        gold, has_answer = read_gold(args.data_file)
        predictions = _read_mapping(args.pred_file, "its answer text", "predictions file")
        na_probs = (_read_mapping(args.na_prob_file, "a number", "no-answer probability file")
                    if args.na_prob_file else None)
        for qid in gold:
            if qid not in predictions:
                print(f"Missing prediction for {qid}", file=sys.stderr)
        result = evaluate_v2(gold, has_answer, predictions, na_probs, args.na_prob_thresh)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    if args.out_file:
        from pipeline import artifacts

        artifacts.write_text_atomic(Path(args.out_file), text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
