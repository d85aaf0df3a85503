"""`python -m pipeline predict`: a fine-tuned model's predictions on raw text.

Command line (every task through its SavedModel; a model folder written before token
classification and QA had one falls back to the `.keras` model and the Python tokenization):

    python -m pipeline predict --model runs/default/finetune/brown_genre --text "The jury said ..."
    python -m pipeline predict --model runs/default/finetune/brown_genre --file texts.txt
    python -m pipeline predict --model models:/bert-brown-genre/1 --text "..."   # MLflow registry
    python -m pipeline predict --model DIR --text "A" --text-pair "B"              # sentence pairs
    python -m pipeline predict --model DIR --question "Who?" --context "..."      # QA
    python -m pipeline predict --model DIR --documents docs.txt --query "..." --top-k 5  # search
    python -m pipeline predict --model DIR --documents long.txt --query "..." --passages  # long docs

`--file`: one example per line (sentence pairs: text TAB text_pair; QA: JSON lines with
"question" and "context"); `-` reads standard input. Output: one JSON object per example.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.tools import parse


def _read_lines(path: str) -> list[str]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def build_parser() -> argparse.ArgumentParser:
    """predict's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline predict", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[3:]))
    parser.add_argument("--model", required=True,
                        help="<run_dir>/finetune/<name>, or models:/NAME/VERSION (MLflow registry)")
    parser.add_argument("--text", action="append", default=[], help="a text (repeatable)")
    parser.add_argument("--text-pair", action="append", default=[],
                        help="the second text of a pair, one per --text")
    parser.add_argument("--file", help="one example per line (pairs: text TAB text_pair; QA: "
                                       "JSON lines with question and context); - for stdin")
    parser.add_argument("--question", action="append", default=[],
                        help="question answering: a question (repeatable), one per --context")
    parser.add_argument("--context", action="append", default=[],
                        help="question answering: the text its --question is answered from")
    parser.add_argument("--documents", help="semantic search: a file with one document per line")
    parser.add_argument("--query", action="append", default=[], help="semantic search query")
    parser.add_argument("--top-k", type=int, default=5,
                        help="semantic search: documents listed per query")
    parser.add_argument("--passages", action="store_true",
                        help="search: index long documents as passages (document score = best "
                             "passage; pipeline/serving/search.py)")
    parser.add_argument("--passage-length", type=int, default=0,
                        help="--passages: word pieces per passage (default max_seq_length - 2)")
    parser.add_argument("--passage-stride", type=int, default=0,
                        help="--passages: pieces between passage starts (default half a passage)")
    parser.add_argument("--tracking-uri", default="",
                        help="for models:/ URIs (default: $MLFLOW_TRACKING_URI or ./mlflow.db)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="every library's INFO lines too (TensorFlow, MLflow) on stderr")
    return parser


def main(argv=None) -> int:
    args = parse(build_parser(), argv, "predict")
    try:
        rows = _predict(args)
    except (FileNotFoundError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for row in rows:
        print(json.dumps(row, ensure_ascii=False))
    return 0


def _predict(args) -> list[dict]:
    from pipeline.tools.predictor import Predictor  # (TensorFlow: not for --help, docs/cli.md)

    texts, pairs = list(args.text), list(args.text_pair) or None
    if args.model.startswith("models:/") or args.model.startswith("runs:/"):
        return _predict_mlflow(args, texts, pairs)
    predictor = Predictor(args.model)
    if args.documents or args.query:
        if not (args.documents and args.query):
            raise ValueError("semantic search needs both --documents FILE and --query TEXT")
        return predictor.search(_read_lines(args.documents), args.query, args.top_k,
                                args.passages, args.passage_length, args.passage_stride)
    if args.question or (args.file and hasattr(predictor.task, "answer_rows")):
        questions, contexts = list(args.question), list(args.context)
        if args.file:
            for line in _read_lines(args.file):
                item = json.loads(line)
                questions.append(item["question"])
                contexts.append(item["context"])
        if len(questions) != len(contexts):
            raise ValueError(f"{len(questions)} --question but {len(contexts)} --context")
        return predictor.answer(questions, contexts)
    if args.file:
        for line in _read_lines(args.file):
            if predictor.info.get("pair"):
                if "\t" not in line:
                    raise ValueError(f"{args.file}: this model takes text pairs; write each line "
                                     f"as text TAB text_pair (got {line[:60]!r})")
                a, b = line.split("\t", 1)
                texts.append(a)
                pairs = (pairs or []) + [b]
            else:
                texts.append(line)
    if not texts:
        raise ValueError("nothing to predict: give --text, --file, --question/--context or "
                         "--documents/--query")
    if predictor.info.get("pair") and (pairs is None or len(pairs) != len(texts)):
        raise ValueError("this model takes text pairs: give one --text-pair per --text")
    return predictor.texts(texts, pairs if predictor.info.get("pair") else None)


def _predict_mlflow(args, texts, pairs) -> list[dict]:
    import mlflow
    import pandas as pd

    from pipeline import artifacts

    uri = args.tracking_uri or __import__("os").environ.get("MLFLOW_TRACKING_URI") or \
        f"sqlite:///{artifacts.MLFLOW_DB}"
    mlflow.set_tracking_uri(uri)
    if args.question or args.context:  # a question_answering model
        if len(args.question) != len(args.context):
            raise ValueError(f"{len(args.question)} --question but {len(args.context)} --context")
        frame = pd.DataFrame({"question": args.question, "context": args.context})
        out = mlflow.pyfunc.load_model(args.model).predict(frame)
        return [{"question": q, **{k: (v.item() if hasattr(v, "item") else v)
                                   for k, v in row.items()}}
                for q, (_, row) in zip(args.question, out.iterrows())]
    if args.file:
        texts += _read_lines(args.file)
    frame = pd.DataFrame({"text": texts})
    if pairs:
        frame["text_pair"] = pairs
    out = mlflow.pyfunc.load_model(args.model).predict(frame)
    return [{"text": t, **{k: (v.tolist() if hasattr(v, "tolist") else v)
                           for k, v in row.items()}}
            for t, (_, row) in zip(texts, out.iterrows())]
