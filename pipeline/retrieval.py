"""Asymmetric retrieval: short queries against long documents with the bi-encoder search model.

A document longer than the encoder's window is split into passages of `passage_length` word
pieces starting every `passage_stride` pieces (the window function of `pipeline/windows.py`,
shared with SQuAD's doc stride and long-document classification); every passage is embedded
(mean pooling, L2-normalised: the `semantic_search` model, or any BERT encoder with mean
pooling) and kept in a `PassageIndex`; a document's score for a query is its best passage's
cosine similarity. "Symmetric" retrieval embeds each document once, truncated to the window.

Metrics on a labelled query set (query -> relevant document id(s)): `ranking_metrics` gives
recall@k and MRR (pipeline/metrics.py definitions) from a (queries, documents) score matrix.

Command line (re-runs the Brown evaluation of the README):

    python -m pipeline retrieval-eval [--model runs/default/pretrain/model.keras | <finetune dir>]
        [--vocab runs/default/vocab/vocab.txt] [--queries 500] [--passage-length 126]
        [--passage-stride 63] [--out runs/default/retrieval/brown_eval.json]

Query set: from each Brown document one sentence (seeded, >= `min_words` words) is taken out
and becomes the query; the document without that sentence is the only relevant one. Reported:
recall@1/5/10 and MRR for symmetric (whole document truncated), asymmetric (passage max) and
TF-IDF cosine (whole document, and passage max) retrieval.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline import metrics
from pipeline.windows import spans


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


def ranking_metrics(scores: np.ndarray, doc_ids: list, relevant: list, ks=(1, 5, 10)) -> dict:
    """recall@k for each k and MRR of a (queries, documents) score matrix against the labelled
    relevant ids of each query (a set, or one id)."""
    scores = np.asarray(scores)
    if scores.shape != (len(relevant), len(doc_ids)):
        raise ValueError(f"scores have shape {scores.shape} but there are {len(relevant)} "
                         f"queries and {len(doc_ids)} documents")
    relevant = [set(r) if isinstance(r, (set, list, tuple, frozenset)) else {r} for r in relevant]
    unknown = set().union(*relevant) - set(doc_ids)
    if unknown:
        raise ValueError(f"relevant ids not among the documents: {sorted(unknown)[:5]}")
    ranked = rank(scores, doc_ids)
    out = {f"recall_at_{k}": metrics.recall_at_k(ranked, relevant, k) for k in ks}
    out["mrr"] = metrics.mean_reciprocal_rank(ranked, relevant)
    out["queries"] = len(relevant)
    return out


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
    from pipeline.finetune_data import basic_tokens

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
        with np.load(path) as f:
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
def load_encoder(model: str, vocab: str = "", seq_length: int = 128, lowercase: bool = True):
    """(sentence encoder with an "embedding" output, TextPreprocessor) from a semantic_search
    finetune folder, or from any .keras model holding a BERT encoder (mean pooling added)."""
    from pipeline import finetune_data as fd

    path = Path(model)
    if path.is_dir():
        from pipeline.predict import Predictor

        predictor = Predictor(path)
        if predictor.task != "semantic_search":
            raise ValueError(f"{path} is a {predictor.task} model; give a semantic_search model "
                             f"folder or a .keras encoder")
        return predictor.keras_parts()
    if path.suffix != ".keras" or not path.is_file():
        raise FileNotFoundError(f"{path}: give a semantic_search model folder "
                                f"(<run_dir>/finetune/<name>) or a .keras model file")
    from models.heads import BertSentenceEncoder
    from pipeline.stages.finetune import load_backbone

    vocab_path = Path(vocab) if vocab else path.parent.parent / "vocab" / "vocab.txt"
    backbone = load_backbone(path)
    if seq_length > backbone.max_sequence_length:
        raise ValueError(f"seq_length {seq_length} exceeds the encoder's "
                         f"{backbone.max_sequence_length} positions")
    words = fd.read_vocab(vocab_path)
    pre = fd.TextPreprocessor(words, fd.vocab_lowercase(vocab_path, lowercase), seq_length)
    return BertSentenceEncoder(backbone), pre


# ---------------------------------------------------------------------------
# The Brown evaluation
# ---------------------------------------------------------------------------
def brown_query_set(tarball, n_queries: int = 500, seed: int = 12345, min_words: int = 10):
    """(doc_ids, documents, queries, relevant): one held-out sentence per sampled document."""
    from pipeline.stages.corpus import read_brown

    rng = random.Random(seed)
    doc_ids, documents, queries, relevant = [], [], [], []
    for doc_id, sentences in read_brown(Path(tarball)):
        candidates = [i for i, s in enumerate(sentences) if len(s.split()) >= min_words]
        doc_ids.append(doc_id)
        if not candidates:
            documents.append(" ".join(sentences))
            continue
        pick = rng.choice(candidates)
        queries.append(sentences[pick])
        relevant.append({doc_id})
        documents.append(" ".join(s for i, s in enumerate(sentences) if i != pick))
    if n_queries and len(queries) > n_queries:
        keep = sorted(rng.sample(range(len(queries)), n_queries))
        queries, relevant = [queries[i] for i in keep], [relevant[i] for i in keep]
    return doc_ids, documents, queries, relevant


def brown_training_pairs(tarball, queries: list[str], per_document: int = 10,
                         seed: int = 12345, min_words: int = 10) -> list[dict]:
    """(sentence, its neighbours) pairs from every Brown document for training a search model
    on the collection: the query is a sentence, the document the two sentences before and
    after it. The evaluation's query sentences (`queries`) are never used."""
    from pipeline.stages.corpus import read_brown

    held_out, rng, pairs = set(queries), random.Random(seed + 1), []
    for doc_id, sentences in read_brown(Path(tarball)):
        ok = [i for i, s in enumerate(sentences)
              if len(s.split()) >= min_words and s not in held_out]
        for i in rng.sample(ok, min(per_document, len(ok))):
            context = [s for j, s in enumerate(sentences[max(0, i - 2):i + 3], max(0, i - 2))
                       if j != i and s not in held_out]
            pairs.append({"query": sentences[i], "document": " ".join(context), "doc": doc_id})
    return pairs


def tfidf_scores(documents, queries, passages: Passages | None = None, pre=None):
    """TF-IDF cosine of each query with each document (or, with `passages`, its best passage,
    passages decoded back to their word pieces' text)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vec = TfidfVectorizer(sublinear_tf=True).fit(documents)
    q = vec.transform(queries)
    if passages is None:
        return (q @ vec.transform(documents).T).toarray()
    texts = [" ".join(pre.vocab[i] for i in ids).replace(" ##", "") for ids in passages.ids]
    return document_scores((q @ vec.transform(texts).T).toarray(), passages.doc, len(documents))


def evaluate_retrieval(encoder, pre, doc_ids, documents, queries, relevant,
                       passage_length: int, passage_stride: int, log=print) -> dict:
    """Symmetric (truncated document) vs asymmetric (passage max) vs TF-IDF on one query set."""
    started = time.time()
    q = embed(encoder, pre.features(list(queries)))
    d = embed(encoder, pre.features(list(documents)))  # truncated to the window
    results = {"symmetric_truncated": ranking_metrics(q @ d.T, doc_ids, relevant)}
    log(f"retrieval: symmetric done ({time.time() - started:.0f} s)")
    index = PassageIndex.build(encoder, pre, documents, doc_ids, passage_length, passage_stride)
    results["asymmetric_passage_max"] = ranking_metrics(index.scores(q), doc_ids, relevant)
    log(f"retrieval: {len(index):,} passages indexed ({time.time() - started:.0f} s)")
    results["tfidf_document"] = ranking_metrics(tfidf_scores(documents, queries), doc_ids,
                                                relevant)
    passages = split_passages(documents, pre, passage_length, passage_stride)
    results["tfidf_passage_max"] = ranking_metrics(
        tfidf_scores(documents, queries, passages, pre), doc_ids, relevant)
    results["setup"] = {"documents": len(documents), "queries": len(queries),
                        "passages": len(index), "passage_length": passage_length,
                        "passage_stride": passage_stride, "seq_length": pre.seq_length,
                        "seconds": round(time.time() - started, 1)}
    return results


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "retrieval-eval":
        argv = argv[1:]
    from pipeline import artifacts

    parser = argparse.ArgumentParser(prog="python -m pipeline retrieval-eval",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--run_dir", default="runs/default")
    parser.add_argument("--model", default="", help="a semantic_search finetune folder or a "
                        ".keras encoder (default: <run_dir>/pretrain/model.keras, mean pooling)")
    parser.add_argument("--vocab", default="", help="vocab.txt for a .keras model (default: "
                                                    "<run_dir>/vocab/vocab.txt)")
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--passage-length", type=int, default=0,
                        help="pieces per passage (default: seq_length - 2)")
    parser.add_argument("--passage-stride", type=int, default=0,
                        help="pieces between passage starts (default: half a passage)")
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--tarball", default=str(artifacts.BROWN_TARBALL))
    parser.add_argument("--out", default="", help="results JSON (default: "
                                                  "<run_dir>/retrieval/brown_eval.json)")
    parser.add_argument("--write-training-pairs", default="", metavar="JSONL",
                        help="instead: write (query, document) pairs for fine-tuning a "
                             "semantic_search model on Brown, the query sentences left out")
    args = parser.parse_args(argv)
    paths = artifacts.Artifacts(args.run_dir)
    if args.write_training_pairs:
        queries = brown_query_set(args.tarball, args.queries, args.seed)[2]
        pairs = brown_training_pairs(args.tarball, queries, seed=args.seed)
        artifacts.write_text_atomic(Path(args.write_training_pairs),
                                    "".join(json.dumps(p) + "\n" for p in pairs))
        print(f"wrote {len(pairs)} pairs to {args.write_training_pairs}")
        return 0
    try:
        model = args.model or str(artifacts.require(paths.model_keras, "the pretrained model",
                                                    "train"))
        encoder, pre = load_encoder(model, args.vocab or str(paths.vocab_file), args.seq_length)
        length = args.passage_length or pre.seq_length - 2
        stride = args.passage_stride or max(1, length // 2)
        if length > pre.seq_length - 2 or stride < 1:
            raise ValueError(f"--passage-length {length} / --passage-stride {stride}: the length "
                             f"must be 1..{pre.seq_length - 2}, the stride >= 1")
        doc_ids, documents, queries, relevant = brown_query_set(args.tarball, args.queries,
                                                                args.seed)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"retrieval: {len(queries)} queries against {len(documents)} Brown documents; "
          f"model {model}")
    results = evaluate_retrieval(encoder, pre, doc_ids, documents, queries, relevant, length,
                                 stride)
    results["setup"].update({"model": model, "seed": args.seed})
    out = Path(args.out) if args.out else paths.retrieval_eval
    artifacts.write_text_atomic(out, json.dumps(results, indent=2))
    print(f"{'method':<24} recall@1  recall@5  recall@10  MRR")
    for name, r in results.items():
        if name != "setup":
            print(f"{name:<24} {r['recall_at_1']:.3f}     {r['recall_at_5']:.3f}     "
                  f"{r['recall_at_10']:.3f}      {r['mrr']:.3f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
