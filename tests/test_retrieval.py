"""pipeline/serving/search.py and pipeline/tools/retrieval_eval.py: passage splitting (the shared window function), best-passage document
scores, recall@k / MRR on a labelled query set against hand-computed values, the passage index,
`predict --passages`, and the Brown query set."""

from __future__ import annotations

import contextlib
import io
import json
import logging

import keras
import numpy as np
import pytest

from models import preprocessor
from models.bert import BertEncoder
from models.heads import BertSentenceEncoder
from pipeline import artifacts
from pipeline.serving import search
from pipeline.text import windows
from pipeline.tools import predict, retrieval_eval
from tests.test_finetune_data import write_vocab


@pytest.fixture(scope="module")
def pre(tmp_path_factory):
    vocab = write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    return preprocessor.TextPreprocessor(vocab, lowercase=True, seq_length=10)


class BagOfWords:
    """A stand-in sentence encoder: the embedding is the count of each vocabulary id (special
    tokens left out), so cosine similarity = word overlap. No training needed."""

    def __init__(self, pre):
        self.size, self.special = len(pre.vocab), {pre.cls_id, pre.sep_id, pre.pad_id}

    def predict(self, x, batch_size=None, verbose=0):
        out = np.zeros((len(x["token_ids"]), self.size), np.float32)
        for i, row in enumerate(x["token_ids"]):
            for t in row:
                if t not in self.special:
                    out[i, t] += 1
        return {"embedding": out}


# --- metrics on hand-computed values ------------------------------------------------------------
def test_document_scores_take_the_best_passage():
    scores = np.array([[0.1, 0.9, 0.4, 0.3], [0.8, 0.2, 0.1, 0.7]])
    doc = np.array([0, 0, 1, 2])
    np.testing.assert_allclose(search.document_scores(scores, doc, 4),
                               [[0.9, 0.4, 0.3, -np.inf], [0.8, 0.1, 0.7, -np.inf]])


def test_ranking_metrics_by_hand():
    doc_ids = ["a", "b", "c", "d"]
    scores = np.array([[0.9, 0.1, 0.5, 0.2],   # ranking a c d b; relevant b -> rank 4
                       [0.1, 0.2, 0.3, 0.4],   # d c b a; relevant {c, a} -> c at 2, a at 4
                       [0.7, 0.6, 0.5, 0.4]])  # a b c d; relevant a -> rank 1
    relevant = [{"b"}, {"c", "a"}, "a"]
    r = retrieval_eval.ranking_metrics(scores, doc_ids, relevant, ks=(1, 2, 3))
    assert r["recall_at_1"] == pytest.approx((0 + 0 + 1) / 3)
    assert r["recall_at_2"] == pytest.approx((0 + 0.5 + 1) / 3)
    assert r["recall_at_3"] == pytest.approx((0 + 0.5 + 1) / 3)
    assert r["mrr"] == pytest.approx((1 / 4 + 1 / 2 + 1) / 3)
    assert r["queries"] == 3
    with pytest.raises(ValueError, match="not among the documents"):
        retrieval_eval.ranking_metrics(scores, doc_ids, [{"z"}, {"a"}, {"a"}])
    with pytest.raises(ValueError, match="shape"):
        retrieval_eval.ranking_metrics(scores[:2], doc_ids, relevant)


# --- passages ----------------------------------------------------------------------------------
def test_split_passages_cover_the_document_with_char_spans(pre):
    text = "the cat sat over a big red house , the dog ran under the old tree ."
    passages = search.split_passages([text, "a cat"], pre, length=4, stride=3)
    words = text.split()  # every word here is one piece
    assert [ids for ids, d in zip(passages.ids, passages.doc) if d == 0] == \
        [[pre.vocab.index(w) for w in words[s:s + n]] for s, n in
         windows.spans(len(words), 4, 3)]
    assert passages.doc.tolist().count(1) == 1
    first = passages.char_spans[0]
    assert text[first[0]:first[1]] == "the cat sat over"
    covered = set()
    for ids in passages.ids[:-1]:
        covered.update(ids)
    assert {pre.vocab.index(w) for w in words} <= covered


def test_passage_index_finds_late_text_that_truncation_misses(pre, tmp_path):
    """Two long documents that share their opening; the query's words are only in one
    document's tail. Truncated (symmetric) retrieval cannot tell them apart, passage max can."""
    opening = "the cat sat over a big red house the dog ran"
    docs = [opening + " under the old tree who saw paris", opening + " over the new road where london"]
    queries, relevant = ["who saw paris", "where london"], [{"d0"}, {"d1"}]
    encoder = BagOfWords(pre)
    q = search.embed(encoder, pre.features(queries))
    d = search.embed(encoder, pre.features(docs))  # first 8 pieces: the shared opening
    symmetric = retrieval_eval.ranking_metrics(q @ d.T, ["d0", "d1"], relevant)
    index = search.PassageIndex.build(encoder, pre, docs, ["d0", "d1"], length=8, stride=4)
    asymmetric = retrieval_eval.ranking_metrics(index.scores(q), ["d0", "d1"], relevant)
    assert asymmetric["recall_at_1"] == 1.0 and asymmetric["mrr"] == 1.0
    assert symmetric["recall_at_1"] == 0.5  # a tie: both queries rank d0 first
    best = index.best_passages(q)
    start, end = index.char_spans[best[1, 1]]
    assert "london" in docs[1][start:end]
    index.save(tmp_path / "index.npz")
    loaded = search.PassageIndex.load(tmp_path / "index.npz")
    np.testing.assert_allclose(loaded.scores(q), index.scores(q))
    assert loaded.doc_ids == ["d0", "d1"] and loaded.char_spans == index.char_spans
    with pytest.raises(ValueError, match="does not fit"):
        search.PassageIndex.build(encoder, pre, docs, length=9)


def test_predict_search_with_passages(tmp_path):
    """`predict --documents --passages` on a semantic_search model folder."""
    folder = tmp_path / "search"
    folder.mkdir()
    write_vocab(folder / "vocab.txt")
    keras.utils.set_random_seed(0)
    backbone = BertEncoder(vocabulary_size=len((folder / "vocab.txt").read_text().split()),
                           num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32,
                           max_sequence_length=16, dropout=0.0)
    BertSentenceEncoder(backbone).save(folder / "model.keras")
    (folder / "task.json").write_text(json.dumps({"task": "semantic_search", "labels": None,
                                                  "max_seq_length": 12, "lowercase": True}))
    docs = ["the cat sat over a big red house the dog ran under the old tree who saw paris",
            "a small bird found the river"]
    (tmp_path / "docs.txt").write_text("\n".join(docs) + "\n")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = predict.main(["predict", "--model", str(folder), "--documents",
                             str(tmp_path / "docs.txt"), "--query", "who saw paris",
                             "--passages", "--passage-stride", "5", "--top-k", "2"])
    assert code == 0
    row = json.loads(buffer.getvalue())
    # 18 + 6 pieces, passages of 10 every 5: 3 + 1.
    assert row["passages"] == 4 and [r["rank"] for r in row["results"]] == [1, 2]
    for r in row["results"]:
        assert r["passage"] and r["passage"] in r["document"]
    assert row["results"][0]["score"] >= row["results"][1]["score"]
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert predict.main(["predict", "--model", str(folder), "--documents",
                             str(tmp_path / "docs.txt"), "--query", "x", "--passages",
                             "--passage-length", "40"]) == 2
    assert "does not fit" in err.getvalue()


# --- the Brown query set ------------------------------------------------------------------------
def test_brown_query_set_removes_each_query_from_its_document():
    doc_ids, documents, queries, relevant = retrieval_eval.brown_query_set(
        artifacts.BROWN_TARBALL, n_queries=20, seed=1)
    assert len(doc_ids) == len(documents) == 500 and len(queries) == 20
    assert len({next(iter(r)) for r in relevant}) == 20
    for query, rel in zip(queries, relevant):
        (doc_id,) = rel
        assert len(query.split()) >= 10
        assert query not in documents[doc_ids.index(doc_id)]
    again = retrieval_eval.brown_query_set(artifacts.BROWN_TARBALL, n_queries=20, seed=1)
    assert again[2] == queries  # seeded
    # Training pairs for a search model on the collection never contain a query sentence.
    pairs = retrieval_eval.brown_training_pairs(artifacts.BROWN_TARBALL, queries, per_document=3)
    assert len(pairs) == 1500 and all(p["query"] and p["document"] for p in pairs)
    held_out = set(queries)
    assert not any(p["query"] in held_out or any(q in p["document"] for q in held_out)
                   for p in pairs)


def test_evaluate_retrieval_reports_every_method(pre, caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    docs = ["the cat sat over a big red house the dog ran under the old tree who saw paris",
            "the cat sat over a big red house the dog ran over the new road where london",
            "a small bird found the river by the hill"]
    result = retrieval_eval.evaluate_retrieval(BagOfWords(pre), pre, ["a", "b", "c"], docs,
                                               ["who saw paris", "where london", "bird river"],
                                               [{"a"}, {"b"}, {"c"}], 8, 4)
    assert set(result) == {"symmetric_truncated", "asymmetric_passage_max", "tfidf_document",
                           "bm25_document", "tfidf_passage_max", "setup"}
    assert result["asymmetric_passage_max"]["mrr"] == 1.0
    assert result["symmetric_truncated"]["mrr"] < 1.0
    assert result["tfidf_document"]["recall_at_1"] == 1.0  # word overlap: exact here
    assert result["bm25_document"]["recall_at_1"] == 1.0
    said = [r.getMessage() for r in caplog.records if r.name == "pipeline.tools.retrieval_eval"]
    assert [line.split(" (")[0] for line in said] == ["retrieval: symmetric done",
                                                     f"retrieval: {result['setup']['passages']} passages indexed"], said
