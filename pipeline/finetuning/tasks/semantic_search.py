"""Semantic search: a bi-encoder (models/heads.py BertSentenceEncoder, mean pooling, unit
vectors) trained on (text, text_pair) pairs with in-batch negatives; scored by recall@k and
MRR of each text's own pair among all the split's pairs; TF-IDF as the baseline.
"""

from __future__ import annotations

import numpy as np

from pipeline.finetuning.tasks.base import (
    FinetuneTask,
    Split,
    predict_batch,
    predict_outputs,
    register,
)


def retrieval_metrics(scores: np.ndarray, documents: list[str]) -> tuple[dict, dict]:
    """Query i's relevant documents: every document whose text equals document i's."""
    from pipeline.finetuning import metrics

    ranked = [list(np.argsort(-row)) for row in scores]
    by_text: dict[str, set] = {}
    for i, text in enumerate(documents):
        by_text.setdefault(text, set()).add(i)
    relevant = [by_text[text] for text in documents]
    result = {f"recall_at_{k}": metrics.recall_at_k(ranked, relevant, k) for k in (1, 5, 10)}
    result["mrr"] = metrics.mean_reciprocal_rank(ranked, relevant)
    return result, {"top1": [r[0] for r in ranked]}


@register
class SemanticSearch(FinetuneTask):
    name = "semantic_search"
    datasets = ("csv", "tsv", "jsonl")
    metric = "mrr"
    always_pair = True
    pooled = False
    requires_label = False
    output = "similarity"
    targets = {"similarity": "similarity"}

    @classmethod
    def check_config(cls, fc) -> str:
        if not fc.text_pair_column:
            return ("finetune.text_pair_column is empty but finetune.task = 'semantic_search' "
                    "trains on (text, text_pair) pairs; name the column of each text's matching "
                    "document")
        return ""

    def make_split(self, examples, pre, labels, pair) -> Split:
        """Both sides packed as single texts, a_* and b_* inputs."""
        a = pre.features([e.text for e in examples])
        b = pre.features([e.text_pair for e in examples])
        x = {**{"a_" + k: v for k, v in a.items()}, **{"b_" + k: v for k, v in b.items()}}
        return Split(examples, x, {"similarity": np.zeros(len(examples), np.float32)})

    def build_model(self, backbone, num_labels):
        from models import heads

        self.freeze(backbone)
        return heads.BertSentenceEncoder(backbone)

    def trainer(self, model):
        from models import heads

        return heads.BertBiEncoderTrainer(model, self.fc.similarity_scale)

    def losses(self) -> dict:
        from models import heads

        return {"loss": {"similarity": heads.InBatchNegativesLoss()}}

    def evaluate(self, model, split, data, encoder=None):
        """Each text's own text_pair is the relevant document among all of them."""
        encoder = encoder or model
        parts: dict = {"q": [], "d": [], "index": []}
        for rows, x in self.batches(split, 2 * self.fc.batch_size):
            for side, prefix in (("q", "a_"), ("d", "b_")):
                inputs = {k[2:]: v for k, v in x.items() if k.startswith(prefix)}
                parts[side].append(predict_batch(encoder, inputs)["embedding"])
            parts["index"].append(np.asarray(rows["example_index"]).reshape(-1))
        order = np.argsort(np.concatenate(parts["index"]), kind="stable")
        q, d = (np.concatenate(parts[side])[order] for side in ("q", "d"))
        return retrieval_metrics(q @ d.T, [e.text_pair for e in split.examples])

    def baselines(self, data, seed):
        """TF-IDF (sublinear tf, fitted on the training pairs) and BM25 with k1/b tuned on
        the validation split (pipeline/finetuning/baselines.py)."""
        import time

        from sklearn.feature_extraction.text import TfidfVectorizer

        from pipeline.finetuning import baselines

        started = time.time()
        vec = TfidfVectorizer(sublinear_tf=True).fit([e.text for e in data.train] +
                                                     [e.text_pair for e in data.train])
        q = vec.transform([e.text for e in data.test])
        d = vec.transform([e.text_pair for e in data.test])
        out = {"tfidf": retrieval_metrics((q @ d.T).toarray(),
                                          [e.text_pair for e in data.test])[0],
               "bm25": baselines.bm25_search(
                   data.validation, data.test,
                   lambda scores, split: retrieval_metrics(scores,
                                                           [e.text_pair for e in split])[0],
                   data.metric)}
        baselines.log.info(f"finetune: baselines in {time.time() - started:.1f} s")
        return out

    def prediction_row(self, example, prediction, i, data) -> dict:
        return {"query": example.text, "gold": example.text_pair,
                "top1": data.test[int(prediction["top1"][i])].text_pair}

    # ---- outputs ---------------------------------------------------------------------
    def serving_module(self, model, pre, labels, pair, info):
        from pipeline.serving import export

        return export.build_serving_module(model, pre, export.embedding_outputs, labels, False)

    def check_export(self, folder, model, pre, data, info) -> dict:
        from pipeline.serving import export

        texts = [e.text for e in data.test[:32]]
        exported = export.run_saved_model(export.load_saved_model(folder), texts)
        memory = predict_outputs(model, pre.features(texts), 32)
        return {"export_max_abs_diff":
                float(np.abs(memory["embedding"] - exported["embedding"]).max())}

    def predict_rows(self, predictor, texts, pairs) -> list[dict]:
        from pipeline.serving.export import run_saved_model

        out = run_saved_model(predictor.serve, texts)
        return [{"text": t, "embedding": [round(float(x), 6) for x in out["embedding"][i]]}
                for i, t in enumerate(texts)]

    def search_rows(self, predictor, documents, queries, top_k: int = 5,
                    passages: tuple | None = None) -> list[dict]:
        """The top `top_k` documents per query. `passages`: (length, stride) of the passages
        long documents are cut into (0: the defaults), or None: a vector per document."""
        if passages is not None:  # long documents: passage vectors, document score = best passage
            from pipeline.serving.search import search_rows

            model, pre = predictor.keras_parts()
            passage_length, passage_stride = passages
            return search_rows(model, pre, documents, queries, top_k, passage_length or None,
                               passage_stride or None)
        from pipeline.serving.export import run_saved_model

        index = run_saved_model(predictor.serve, documents)["embedding"]  # (docs, hidden), unit
        query = run_saved_model(predictor.serve, queries)["embedding"]  # (queries, hidden)
        scores = query @ index.T  # cosine similarities
        rows = []
        for q, row in zip(queries, scores):
            order = np.argsort(-row)[:top_k]
            rows.append({"query": q, "results": [
                {"rank": r + 1, "score": round(float(row[i]), 6), "document": documents[i]}
                for r, i in enumerate(order)]})
        return rows
