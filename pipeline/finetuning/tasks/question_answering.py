"""Span question answering (SQuAD v1.1 / v2.0): start and end logits over the context
(models/heads.py BertSpanExtractor); long contexts in windows every `doc_stride` pieces;
answers by BERT's n-best search over every window of a question.

SQuAD v2.0 answers "" when the null ([CLS]) score minus the best span's score exceeds
`finetune.null_score_threshold`. With `auto` (the default) the threshold is the official
evaluation's best-F1 threshold on the validation split (squad_official.choose_null_threshold),
chosen for the weights evaluated: every epoch's validation picks its own and returns it in its
result, and the kept epoch's result carries it to the test split and the export (`keep`). It
is saved in task.json and baked into the raw-text SavedModel. Metrics are evaluate-v2.0.py's
(squad_official.evaluate_v2) on the written predictions.json and na_prob.json; v1.1 keeps
evaluate-v1.1.py's exact_match / f1.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from pipeline.finetuning.tasks.base import (
    INPUTS,
    FinetuneTask,
    Split,
    predict_batch,
    register,
)

# The settings of the answer search, saved in task.json and baked into the SavedModel.
SEARCH_KEYS = ("max_query_length", "doc_stride", "n_best", "max_answer_length", "version_2",
               "null_score_threshold")


def fixed_threshold(value) -> float | None:
    """finetune.null_score_threshold / task.json's value: None for auto, else the number."""
    from pipeline.config.load import null_score_threshold

    return None if value is None else null_score_threshold(value)


@register
class QuestionAnswering(FinetuneTask):
    name = "question_answering"
    datasets = ("squad",)
    metric = "f1"
    points = 1.0  # EM / F1 are in percent already
    pooled = False
    output = "start_logits"
    targets = {"start_logits": "start_positions", "end_logits": "end_positions"}
    inputs = ("question", "context")
    # The threshold chosen on validation for the kept weights (`keep`); None: none told yet.
    kept_threshold: float | None = None

    @classmethod
    def check_config(cls, fc) -> str:
        if fc.max_query_length + 3 >= fc.max_seq_length:
            return (f"finetune.max_query_length = {fc.max_query_length} leaves no room for the "
                    f"context in finetune.max_seq_length = {fc.max_seq_length}; lower it")
        return ""

    def read_file(self, path, fc) -> list:
        from pipeline.finetuning.readers import read_squad

        return read_squad(path)

    def make_split(self, examples, pre, labels, pair) -> Split:
        from pipeline.finetuning import features

        f = features.qa_features(examples, pre, self.fc.max_query_length, self.fc.doc_stride)
        return Split(examples, {k: f[k] for k in INPUTS},
                     {"start_logits": f["start_positions"], "end_logits": f["end_positions"]},
                     None, f)

    def row_meta(self, split, start) -> dict:
        """A row is a window: its question's index, and each position's character span and
        maximum-context flag (features.span_arrays)."""
        from pipeline.finetuning import features

        return {"example_index": start + np.asarray(split.meta["example_index"], np.int64),
                **features.span_arrays(split.meta)}

    def build_model(self, backbone, num_labels):
        from models import heads

        self.freeze(backbone)
        return heads.BertSpanExtractor(backbone)

    def losses(self) -> dict:
        import keras

        ce = keras.losses.SparseCategoricalCrossentropy
        return {"loss": {"start_logits": ce(from_logits=True), "end_logits": ce(from_logits=True)},
                "loss_weights": {"start_logits": 0.5, "end_logits": 0.5}}

    def compile(self, model, optimizer, loss_weight: float = 1.0, **options) -> None:
        losses = self.losses()
        losses["loss_weights"] = {k: v * float(loss_weight)
                                  for k, v in losses["loss_weights"].items()}
        model.compile(optimizer=optimizer, **{"jit_compile": False, **losses, **options})

    def evaluate(self, model, split, data, encoder=None):
        """v1.1: evaluate-v1.1.py's exact_match / f1. v2.0: evaluate-v2.0.py's keys on the
        answers at the null-score threshold (auto: chosen here when `split` is the validation
        split, else the kept epoch's, `keep`) and the no-answer probabilities, plus
        "null_score_threshold" (score units)."""
        from pipeline.finetuning import features, metrics
        from pipeline.finetuning import squad_official as official

        fc = self.fc
        search = features.SpanSearch(split.examples, fc.n_best, fc.max_answer_length)
        for rows, x in self.batches(split, 2 * fc.batch_size):  # windows, streamed
            out = predict_batch(model, x)
            search.add(out["start_logits"], out["end_logits"], rows)
        if not fc.version_2:
            answers = search.answers()
            gold = {e.qid: [a for a, _ in e.answers] for e in split.examples}
            return metrics.squad_evaluate(gold, answers), {"answers": answers}
        candidates = search.candidates()
        spans = {q: text for q, (text, _, _) in candidates.items()}
        diffs = {q: float(null) - float(score) for q, (_, score, null) in candidates.items()}
        gold, has_answer = official.gold_of(split.examples)
        threshold, source = self._threshold(split, data, lambda: official.choose_null_threshold(
            gold, has_answer, spans, diffs))
        answers = official.answers_at(spans, diffs, threshold)
        na_probs = {q: official.na_probability(null, score)
                    for q, (_, score, null) in candidates.items()}
        result = {k: float(v) for k, v in
                  official.evaluate_v2(gold, has_answer, answers, na_probs).items()}
        result["null_score_threshold"] = float(threshold)
        return result, {"answers": answers, "na_probs": na_probs,
                        "null_score_threshold": float(threshold),
                        "null_score_threshold_source": source}

    def _threshold(self, split, data, choose):
        """(threshold, "config" | "validation") on `split`; `choose()`: the threshold chosen
        on it (when it is the validation split)."""
        fixed = fixed_threshold(self.fc.null_score_threshold)
        if fixed is not None:
            return fixed, "config"
        if data is not None and split.examples is data.validation:
            return choose(), "validation"
        if self.kept_threshold is None:
            raise ValueError("finetune.null_score_threshold = auto, but no validation result "
                             "with a chosen threshold was kept for these weights; evaluate the "
                             "validation split and pass its result to `keep` first, or set the "
                             "key to a number")
        return self.kept_threshold, "validation"

    def keep(self, validation: dict) -> None:
        """The kept epoch's threshold (auto, v2.0): the one its validation result chose."""
        threshold = validation.get("null_score_threshold")
        self.kept_threshold = None if threshold is None else float(threshold)

    def baselines(self, data, seed):
        """The SQuAD paper's sliding-window baseline: the span whose surrounding words
        overlap the question most, its span length and window (and v2.0's no-answer cut)
        tuned on the validation split (pipeline/finetuning/baselines.py)."""
        import time

        from pipeline.finetuning import baselines, metrics
        from pipeline.finetuning import squad_official as official

        def evaluate(examples, answers, na_probs):
            if not self.fc.version_2:
                return metrics.squad_evaluate({e.qid: [a for a, _ in e.answers]
                                               for e in examples}, answers)
            gold, has_answer = official.gold_of(examples)
            return {k: float(v) for k, v in
                    official.evaluate_v2(gold, has_answer, answers, na_probs).items()}

        started = time.time()
        out = {"sliding_window": baselines.qa_window(data.train, data.validation, data.test,
                                                     evaluate, self.fc.version_2)}
        baselines.log.info(f"finetune: baselines in {time.time() - started:.1f} s")
        return out

    def test_artifacts(self, results, predictions, data, out, title) -> None:
        """predictions.json (and v2.0's na_prob.json) of each test split, in the official
        scripts' formats; also logged to the MLflow run (finetune/)."""
        from pipeline.finetuning import squad_official as official
        from pipeline.tracking import outbox

        for name, prediction in predictions.items():
            prefix = "" if name == "test" else f"{name}_"
            files = [(official.PREDICTIONS, official.write_predictions, "answers")]
            if "na_probs" in prediction:
                files.append((official.NA_PROBS, official.write_na_probs, "na_probs"))
            for filename, write, key in files:
                path = Path(out.dir) / f"{prefix}{filename}"
                write(path, prediction[key])
                outbox.log_text(path.read_text(encoding="utf-8"), f"finetune/{path.name}")

    def prediction_row(self, example, prediction, i, data) -> dict:
        row = {"id": example.qid, "question": example.question,
               "gold": [a for a, _ in example.answers],
               "predicted": prediction["answers"][example.qid]}
        if "na_probs" in prediction:
            row["no_answer_probability"] = prediction["na_probs"][example.qid]
        return row

    # ---- outputs ---------------------------------------------------------------------
    def task_info(self, data) -> dict:
        """The search settings; v2.0 with auto: the threshold is filled in by `export` (the
        kept epoch's, chosen on validation: `keep`)."""
        info = {k: getattr(self.fc, k) for k in SEARCH_KEYS}
        fixed = fixed_threshold(self.fc.null_score_threshold)
        info["null_score_threshold"] = fixed if fixed is not None or self.fc.version_2 else 0.0
        info["null_score_threshold_source"] = ("config" if fixed is not None else
                                               "validation" if self.fc.version_2 else "unused")
        return info

    def search_settings(self, info) -> dict:
        """build_qa_module's keyword arguments from `info` (task.json keys; a missing one
        takes finetune.*'s default), the threshold resolved: a number saved there, else the
        kept epoch's, chosen on validation (`keep`)."""
        from pipeline.config import FinetuneConfig

        defaults = dataclasses.asdict(FinetuneConfig())
        settings = {k: (info or {}).get(k, defaults[k]) for k in SEARCH_KEYS}
        threshold = fixed_threshold(settings["null_score_threshold"])
        if threshold is None and settings["version_2"]:
            threshold = self.kept_threshold
            if threshold is None:
                raise ValueError("the SQuAD v2 null-score threshold is auto but no validation "
                                 "result with a chosen threshold was kept; evaluate the "
                                 "validation split and pass its result to `keep` first, or "
                                 "give finetune.null_score_threshold a number")
        settings["null_score_threshold"] = float(threshold or 0.0)
        return settings

    def export(self, model, pre, folder, info) -> None:
        """The SavedModel with the threshold resolved (`search_settings`); `info` and the
        task.json beside `folder` get it too."""
        settings = self.search_settings(info)
        if info is not None and info.get("null_score_threshold") != \
                settings["null_score_threshold"]:
            info["null_score_threshold"] = settings["null_score_threshold"]
            task_json = Path(folder).parent / "task.json"
            if task_json.is_file():
                saved = json.loads(task_json.read_text())
                saved["null_score_threshold"] = settings["null_score_threshold"]
                from pipeline import artifacts

                artifacts.write_text_atomic(task_json, json.dumps(saved, indent=2))
        super().export(model, pre, folder, info)

    def serving_module(self, model, pre, labels, pair, info):
        """`info`: the search settings (task.json keys), resolved by `search_settings`."""
        from pipeline.serving import word_serving

        return word_serving.build_qa_module(model, pre, **self.search_settings(info))

    def check_export(self, folder, model, pre, data, info) -> dict:
        """Max |exported − in-memory| span / null score and the number of questions whose
        answer differs, on the first test questions."""
        from pipeline.finetuning import features
        from pipeline.serving import export

        examples = data.test[:32]
        questions, contexts = [e.question for e in examples], [e.context for e in examples]
        exported = export.run_qa_model(export.load_saved_model(folder), questions, contexts)
        memory = features.python_answer(model, pre, questions, contexts, info)
        mismatches = sum(x["answer"] != y["answer"] for x, y in zip(exported, memory))
        diffs = [abs(x[k] - y[k]) for x, y in zip(exported, memory)
                 for k in ("score", "null_score") if np.isfinite(x[k]) and np.isfinite(y[k])]
        mismatches += sum(np.isfinite(x["score"]) != np.isfinite(y["score"])
                          for x, y in zip(exported, memory))
        return {"export_max_abs_diff": float(max(diffs, default=0.0)),
                "export_mismatches": int(mismatches)}

    def answer_rows(self, predictor, questions, contexts) -> list[dict]:
        """Per question: the answer span of its context ("" for none), its start + end logit
        and character offsets (the SavedModel; a folder without one: the .keras model)."""
        from pipeline.finetuning import features
        from pipeline.serving.export import run_qa_model

        if predictor.paths.saved_model.is_dir():
            out = run_qa_model(predictor.serve, questions, contexts)
        else:
            model, pre = predictor.keras_parts()
            out = features.python_answer(model, pre, questions, contexts, predictor.info)
        return [{"question": q, **o} for q, o in zip(questions, out)]
