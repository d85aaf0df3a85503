"""Asymmetric retrieval: short queries against long documents with the bi-encoder search model.

A document longer than the encoder's window is split into passages of `passage_length` word
pieces starting every `passage_stride` pieces (the window function of `pipeline/text/windows.py`,
shared with SQuAD's doc stride and long-document classification); every passage is embedded
(mean pooling, L2-normalised: the `semantic_search` model, or any BERT encoder with mean
pooling) and kept in a `PassageIndex`; a document's score for a query is its best passage's
cosine similarity. "Symmetric" retrieval embeds each document once, truncated to the window.

The evaluation on Brown (recall@k, MRR) is `python -m pipeline retrieval-eval`
(pipeline/tools/retrieval_eval.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.text.windows import spans


# ---------------------------------------------------------------------------
# Scores -> metrics
# ---------------------------------------------------------------------------
def document_scores(passage_scores: np.ndarray, passage_doc: np.ndarray, n_docs: int) -> np.ndarray:
    """(queries, passages) scores -> (queries, documents): each document's best passage.
    A document without passages scores -inf.

    >>> document_scores(np.array([[0.1, 0.9, 0.4]]), np.array([0, 0, 1]), 3).tolist()
    [[0.9, 0.4, -inf]]
    """
    passage_scores = np.asarray(passage_scores, np.float64)
    out = np.full((passage_scores.shape[0], n_docs), -np.inf)
    for p, d in enumerate(np.asarray(passage_doc)):
        np.maximum(out[:, d], passage_scores[:, p], out=out[:, d])
    return out


def rank(scores: np.ndarray, doc_ids: list) -> list[list]:
    """Document ids of each query, best first (ties: the earlier document first)."""
    order = np.argsort(-np.asarray(scores, np.float64), axis=1, kind="stable")
    return [[doc_ids[i] for i in row] for row in order]


# ---------------------------------------------------------------------------
# Passages
# ---------------------------------------------------------------------------
@dataclass
class Passages:
    ids: list  # word-piece ids of each passage
    doc: np.ndarray  # (passages,) index of its document
    char_spans: list  # (start, end) character span of each passage in its document


def split_passages(texts: list[str], pre, length: int, stride: int, max_passages: int = 0
                   ) -> Passages:
    """Every document cut into windows of `length` pieces every `stride` pieces
    (`windows.spans`); words are tokenized one by one (BERT's basic split) so each passage
    keeps its character span for display."""
    from pipeline.text.preprocessor import basic_tokens

    tokens = [basic_tokens(t) for t in texts]
    pieces = pre.tokenize_words([w for doc in tokens for w, _, _ in doc]) if any(tokens) else []
    ids, doc_of, char_spans, k = [], [], [], 0
    for d, doc in enumerate(tokens):
        doc_ids, owner = [], []
        for t in range(len(doc)):
            word = pieces[k + t] or [pre.unk_id]
            doc_ids.extend(word)
            owner.extend([t] * len(word))
        k += len(doc)
        for start, n in spans(len(doc_ids), length, stride, max_passages):
            ids.append(doc_ids[start:start + n])
            doc_of.append(d)
            char_spans.append((doc[owner[start]][1], doc[owner[start + n - 1]][2]) if n else (0, 0))
    return Passages(ids, np.asarray(doc_of, np.int64), char_spans)


def pack(piece_ids: list[list[int]], pre, seq_length: int | None = None) -> dict:
    """`[CLS] ids [SEP]` rows padded to `seq_length` (as the preprocessor packs one text)."""
    seq = seq_length or pre.seq_length
    token_ids = np.full((len(piece_ids), seq), pre.pad_id, np.int32)
    for i, ids in enumerate(piece_ids):
        row = [pre.cls_id] + list(ids[:seq - 2]) + [pre.sep_id]
        token_ids[i, :len(row)] = row
    return {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids),
            "padding_mask": (token_ids != pre.pad_id).astype(np.int32)}


def embed(encoder, x: dict, batch_size: int = 256) -> np.ndarray:
    """Unit-norm embeddings (rows) from a model with an "embedding" output."""
    out = np.asarray(encoder.predict(x, batch_size=batch_size, verbose=0)["embedding"], np.float32)
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


class PassageIndex:
    """Passage vectors of a document collection; `search` scores documents by best passage."""

    def __init__(self, vectors: np.ndarray, passage_doc: np.ndarray, doc_ids: list,
                 char_spans: list | None = None):
        self.vectors, self.passage_doc = np.asarray(vectors, np.float32), np.asarray(passage_doc)
        self.doc_ids, self.char_spans = list(doc_ids), char_spans

    @classmethod
    def build(cls, encoder, pre, documents: list[str], doc_ids: list | None = None,
              length: int | None = None, stride: int | None = None, max_passages: int = 0,
              batch_size: int = 256) -> "PassageIndex":
        length = length or pre.seq_length - 2
        if length > pre.seq_length - 2:
            raise ValueError(f"passage length {length} does not fit the model's "
                             f"{pre.seq_length} positions ([CLS] + passage + [SEP]); give at "
                             f"most {pre.seq_length - 2}")
        stride = stride or max(1, length // 2)
        passages = split_passages(documents, pre, length, stride, max_passages)
        vectors = embed(encoder, pack(passages.ids, pre), batch_size)
        return cls(vectors, passages.doc,
                   list(doc_ids) if doc_ids is not None else list(range(len(documents))),
                   passages.char_spans)

    def __len__(self):
        return len(self.vectors)

    def scores(self, query_vectors: np.ndarray) -> np.ndarray:
        """(queries, documents): cosine of each document's best passage."""
        return document_scores(np.asarray(query_vectors) @ self.vectors.T, self.passage_doc,
                               len(self.doc_ids))

    def best_passages(self, query_vectors: np.ndarray) -> np.ndarray:
        """(queries, documents): the index of each document's best passage."""
        s = np.asarray(query_vectors) @ self.vectors.T
        best = np.full((s.shape[0], len(self.doc_ids)), -1)
        top = np.full((s.shape[0], len(self.doc_ids)), -np.inf)
        for p, d in enumerate(self.passage_doc):
            better = s[:, p] > top[:, d]
            top[better, d], best[better, d] = s[better, p], p
        return best

    def save(self, path) -> None:
        from pipeline.artifacts import atomic_file

        with atomic_file(Path(path), "wb") as handle:
            np.savez(handle, vectors=self.vectors, passage_doc=self.passage_doc,
                     doc_ids=np.asarray([str(d) for d in self.doc_ids]),
                     char_spans=np.asarray(self.char_spans or [], np.int64).reshape(-1, 2))

    @classmethod
    def load(cls, path) -> "PassageIndex":
        with np.load(path, allow_pickle=False) as f:  # an index is arrays only, never objects
            return cls(f["vectors"], f["passage_doc"], f["doc_ids"].tolist(),
                       [tuple(s) for s in f["char_spans"].tolist()])


def search_rows(encoder, pre, documents: list[str], queries: list[str], top_k: int = 5,
                length: int | None = None, stride: int | None = None) -> list[dict]:
    """`predict --passages`: each query's top documents by best passage, with that passage."""
    index = PassageIndex.build(encoder, pre, documents, length=length, stride=stride)
    q = embed(encoder, pre.features(list(queries)))
    scores, best = index.scores(q), index.best_passages(q)
    rows = []
    for i, query in enumerate(queries):
        order = np.argsort(-scores[i], kind="stable")[:top_k]
        results = []
        for r, d in enumerate(order):
            start, end = index.char_spans[best[i, d]]
            results.append({"rank": r + 1, "score": round(float(scores[i, d]), 6),
                            "document": documents[d], "passage": documents[d][start:end]})
        rows.append({"query": query, "passages": len(index), "results": results})
    return rows


# ---------------------------------------------------------------------------
# Encoders
# ---------------------------------------------------------------------------
