"""Look inside a trained BERT: fill-mask, next-sentence probability, attention maps, embeddings.

    python -m pipeline fill-mask "The man went to the [MASK]." [--top-k 5] [--json]
    python -m pipeline nsp "The man went to the store." "He bought a gallon of milk." [--json]
    python -m pipeline attention "The cat sat on the mat because it was tired." \\
        [--layers 0,1|all] [--heads all|0,1] [--out attention/]
    python -m pipeline embed "first text" "second text" | --input texts.txt \\
        --pooling cls|mean|tokens --out vectors.npy|vectors.parquet

Every command takes the model from a run directory (`--run-dir runs/default`, the
default: `<run_dir>/pretrain/model.keras` + `<run_dir>/vocab/vocab.txt`, casing from
`vocab.json`) or from `--model PATH` (a `.keras` file, e.g. an imported checkpoint,
or a SavedModel directory) with `--vocab PATH` (found beside the model when omitted;
add `--cased` for a cased vocab without a `vocab.json`). fill-mask and nsp run on
either format; attention and embed need the `.keras` model, because the SavedModel's
`serve` endpoint returns only the MLM and NSP logits.

Exit codes: 0 success; 2 bad input (no [MASK], text longer than the model takes,
unknown model path, missing vocab), with a message saying what to change.

The functions behind these commands are in pipeline/inspection/.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.inspection.plots import plot_attention
from pipeline.inspection.probes import (
    POOLINGS,
    InspectError,
    LoadedModel,
    attention_maps,
    embed,
    fill_mask,
    load,
    nsp_probability,
    save_embeddings,
    token_labels,
)
from pipeline.text.tokenizer import Tokenizer
from pipeline.text.vocab import TextError
from pipeline.tools import console, old_spelling


# ---------------------------------------------------------------------------
# Command line (a thin layer over the functions above).
# ---------------------------------------------------------------------------
def _parse_indices(text: str, count: int, what: str) -> list[int]:
    if text.strip().lower() == "all":
        return list(range(count))
    try:
        indices = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InspectError(f"--{what} takes 'all' or comma-separated numbers, got {text!r}") from None
    bad = [i for i in indices if not 0 <= i < count]
    if bad or not indices:
        raise InspectError(f"--{what} {text!r}: the model has {count} {what} (0..{count - 1})")
    return indices


def build_parser() -> argparse.ArgumentParser:
    """The parser of fill-mask, nsp, attention and embed (docs/cli.md is generated from it)."""
    common = argparse.ArgumentParser(add_help=False)
    source = common.add_argument_group("model and vocab")
    run_dir = source.add_argument(
        "--run-dir", help="a run directory (default runs/default when --model is not given): "
                          "<run_dir>/pretrain/model.keras and <run_dir>/vocab/vocab.txt")
    old_spelling(source, "--run_dir", run_dir)
    source.add_argument("--model", help="a .keras file or a SavedModel directory")
    source.add_argument("--vocab", help="vocab.txt (default: the run's, or beside the model)")
    source.add_argument("--cased", action="store_true",
                        help="the vocab is cased (default: vocab.json beside it, else uncased)")
    common.add_argument("-v", "--verbose", action="store_true",
                        help="every library's INFO lines too (TensorFlow, Keras) on stderr")
    parser = argparse.ArgumentParser(prog="python -m pipeline",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("fill-mask", parents=[common], help="top-k tokens for each [MASK]")
    p.add_argument("text", help='text with one or more [MASK], e.g. "The man went to the [MASK]."')
    old_spelling(p, "--top_k", p.add_argument("--top-k", type=int, default=5,
                                              help="how many tokens for each [MASK]"))
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p = commands.add_parser("nsp", parents=[common], help="probability that B follows A")
    p.add_argument("text_a", help="sentence A")
    p.add_argument("text_b", help="sentence B: does it follow A?")
    p.add_argument("--json", action="store_true", help="print JSON instead of a line")
    p = commands.add_parser("attention", parents=[common], help="attention heat maps (PNG)")
    p.add_argument("text", help="the text (sentence A)")
    p.add_argument("text_b", nargs="?", help="optional second sentence ([CLS] A [SEP] B [SEP])")
    p.add_argument("--layers", default="all", help="'all' or e.g. 0,1")
    p.add_argument("--heads", default="all", help="'all' or e.g. 0,3 (per-head PNGs)")
    p.add_argument("--out", default="attention", help="output folder (default ./attention)")
    p = commands.add_parser("embed", parents=[common], help="[CLS]/mean/per-token vectors")
    p.add_argument("texts", nargs="*", help="texts to embed (or --input)")
    p.add_argument("--input", help="a text file, one text per line (blank lines skipped)")
    p.add_argument("--pooling", choices=POOLINGS, default="cls",
                   help="cls: the [CLS] vector; mean: the tokens' mean; tokens: one per token")
    p.add_argument("--out", required=True, help="file.npy or file.parquet")
    old_spelling(p, "--batch_size", p.add_argument("--batch-size", type=int, default=32,
                                                   help="texts per forward pass"))
    p.add_argument("--truncate", action="store_true",
                   help="cut texts longer than the model takes instead of failing")
    return parser


def _load(args) -> tuple[LoadedModel, Tokenizer]:
    return load(run_dir=args.run_dir, model=args.model, vocab=args.vocab,
                lowercase=False if args.cased else None)


def _fill_mask(args) -> None:
    model, tokenizer = _load(args)
    results = fill_mask(model, tokenizer, args.text, args.top_k)
    tokens = token_labels(tokenizer, args.text)
    positions = [i for i, t in enumerate(tokens) if t == "[MASK]"]
    if args.json:
        print(json.dumps({"text": args.text, "tokens": tokens, "masks": [
            {"position": p, "predictions": r} for p, r in zip(positions, results)]}, indent=2))
        return
    print(" ".join(tokens))
    for n, (position, predictions) in enumerate(zip(positions, results), 1):
        print(f"\n[MASK] {n} (token {position})")
        print(f"  {'rank':>4}  {'token':<20} probability")
        for rank, p in enumerate(predictions, 1):
            print(f"  {rank:>4}  {p['token']:<20} {p['probability']:.4f}")


def _nsp(args) -> None:
    model, tokenizer = _load(args)
    probability = nsp_probability(model, tokenizer, args.text_a, args.text_b)
    if args.json:
        print(json.dumps({"text_a": args.text_a, "text_b": args.text_b,
                          "is_next_probability": probability}, indent=2))
    else:
        print(f"P(B follows A) = {probability:.4f}")


def _attention(args) -> None:
    model, tokenizer = _load(args)
    encoder = model.encoder("attention")
    layers = _parse_indices(args.layers, len(encoder.transformer_layers), "layers")
    heads = _parse_indices(args.heads, encoder.transformer_layers[0].num_heads, "heads")
    maps = attention_maps(model, tokenizer, args.text, args.text_b)
    tokens = token_labels(tokenizer, args.text, args.text_b)
    written = plot_attention(maps, tokens, args.out, layers=layers, heads=heads)
    arrays = Path(args.out) / "attention.npz"
    np.savez(arrays, weights=maps, tokens=np.array(tokens))
    print(f"{len(written)} PNGs in {args.out} ({len(layers)} layer(s) x {len(heads)} head(s) + "
          f"one grid per layer); all weights (layers, heads, seq, seq) in {arrays}")
    for path in written:
        print(f"  {path}")


def _embed(args) -> None:
    texts = list(args.texts)
    if args.input:
        path = Path(args.input)
        if not path.is_file():
            raise InspectError(f"--input {path} not found")
        texts += [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                  if line.strip()]
    if not texts:
        raise InspectError("no texts: give them as arguments or --input FILE (one per line)")
    if Path(args.out).suffix not in (".npy", ".parquet"):
        raise InspectError(f"--out {args.out} must end in .npy or .parquet")
    model, tokenizer = _load(args)
    vectors = embed(model, tokenizer, texts, args.pooling, args.batch_size, args.truncate)
    tokens = None
    if args.pooling == "tokens":
        inputs = tokenizer.encode([(t, None) for t in texts], model.max_sequence_length,
                                  truncate=args.truncate)
        tokens = [tokenizer.tokens(ids[mask == 1])
                  for ids, mask in zip(inputs["token_ids"], inputs["padding_mask"])]
    out = save_embeddings(vectors, args.out, texts, tokens)
    shape = (f"{len(vectors)} x (tokens) x {vectors[0].shape[1]}" if args.pooling == "tokens"
             else " x ".join(map(str, vectors.shape)))
    print(f"wrote {shape} {args.pooling} vectors to {out}")


COMMANDS = {"fill-mask": _fill_mask, "nsp": _nsp, "attention": _attention, "embed": _embed}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pipeline fill-mask|nsp|attention|embed ...`; argv[0] is the command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # argparse: --help (0) or a usage error (2), already printed
        return int(exit_.code or 0)
    console(args.verbose)
    try:
        COMMANDS[args.command](args)
    except TextError as err:  # InspectError and the tokenizer's vocab errors
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
