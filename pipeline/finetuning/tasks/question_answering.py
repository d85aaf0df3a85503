"""Span question answering (SQuAD v1.1 / v2.0): start and end logits over the context
(models/heads.py BertSpanExtractor); long contexts in windows every `doc_stride` pieces;
answers by BERT's n-best search over every window of a question.
"""

from __future__ import annotations

import dataclasses

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


@register
class QuestionAnswering(FinetuneTask):
    name = "question_answering"
    datasets = ("squad",)
    metric = "f1"
    pooled = False
    output = "start_logits"
    targets = {"start_logits": "start_positions", "end_logits": "end_positions"}
    inputs = ("question", "context")

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
        from pipeline.finetuning import features, metrics

        fc = self.fc
        search = features.SpanSearch(split.examples, fc.n_best, fc.max_answer_length)
        for rows, x in self.batches(split, 2 * fc.batch_size):  # windows, streamed
            out = predict_batch(model, x)
            search.add(out["start_logits"], out["end_logits"], rows["example_index"],
                       rows["span_start"], rows["span_end"], rows["max_context"])
        answers = search.answers(fc.version_2, fc.null_score_threshold)
        gold = {e.qid: [a for a, _ in e.answers] for e in split.examples}
        return metrics.squad_evaluate(gold, answers), {"answers": answers}

    def prediction_row(self, example, prediction, i, data) -> dict:
        return {"id": example.qid, "question": example.question,
                "gold": [a for a, _ in example.answers],
                "predicted": prediction["answers"][example.qid]}

    # ---- outputs ---------------------------------------------------------------------
    def task_info(self, data) -> dict:
        return {k: getattr(self.fc, k) for k in SEARCH_KEYS}

    def serving_module(self, model, pre, labels, pair, info):
        """`info`: the search settings (task.json keys); a missing one takes finetune.*'s
        default."""
        from pipeline.config import FinetuneConfig
        from pipeline.serving import word_serving

        defaults = dataclasses.asdict(FinetuneConfig())
        settings = {k: (info or {}).get(k, defaults[k]) for k in SEARCH_KEYS}
        return word_serving.build_qa_module(model, pre, **settings)

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
