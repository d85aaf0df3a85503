"""Command line: import Google / Hugging Face BERT checkpoints, export to Hugging Face.

    python -m models.convert import-hf DIR --out model.keras [--vocab-out vocab.txt]
    python -m models.convert import-google DIR --out model.keras [--vocab-out vocab.txt]
    python -m models.convert export-hf model.keras --vocab vocab.txt --out DIR [--cased|--uncased]

The vocab is written beside the .keras file as vocab.txt unless --vocab-out
says otherwise (`pipeline`'s `model.init_from` reads it from there to check
that the run's vocab is the checkpoint's). Exit status 2 on a bad checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _import(kind: str, args) -> int:
    from models import convert

    importer = convert.import_huggingface if kind == "hf" else convert.import_google
    lowercase = None if args.lowercase is None else args.lowercase == "true"
    imported = importer(args.directory, lowercase=lowercase)
    out = Path(args.out)
    if out.suffix != ".keras":
        raise convert.ConversionError(f"--out {out}: must end in .keras")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".tmp-{os.getpid()}-{out.name}")
    imported.model.save(str(tmp))
    os.replace(tmp, out)
    vocab_out = Path(args.vocab_out) if args.vocab_out else out.parent / "vocab.txt"
    if imported.vocab:
        convert.write_vocab(imported.vocab, vocab_out)
        # The casing travels with the vocab: model.init_from and the tokenizers read it here.
        vocab_out.with_name("vocab.json").write_text(json.dumps(
            {"lowercase": imported.lowercase, "strip_accents": imported.lowercase,
             "imported_from": str(args.directory)}, indent=2) + "\n", encoding="utf-8")
    summary = {
        "model": str(out),
        "vocab": str(vocab_out) if imported.vocab else None,
        "lowercase": imported.lowercase,
        "architecture": imported.architecture,
        "parameters": imported.model.count_params(),
        "missing": imported.missing,
    }
    print(json.dumps(summary, indent=2))
    if not imported.vocab:
        print(f"warning: {args.directory} has no vocab.txt; tokenize with the checkpoint's own "
              f"vocabulary", file=sys.stderr)
    return 0


def _export(args) -> int:
    from models import convert

    imported = convert.load_pretrainer(args.model)
    lowercase = {"cased": False, "uncased": True}.get(args.casing)
    out = convert.export_huggingface(imported.model, args.vocab, args.out, lowercase=lowercase)
    print(f"wrote {out} (config.json, model.safetensors, vocab.txt, tokenizer_config.json)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The converter's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(
        prog="python -m models.convert",
        description="Import Google / Hugging Face BERT checkpoints into this project's "
                    "BertPretrainer (.keras), or export one to a Hugging Face directory.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, what in (("import-hf", "a Hugging Face BERT directory (config.json, "
                                     "model.safetensors or pytorch_model.bin, vocab.txt)"),
                       ("import-google", "a Google BERT directory (bert_config.json, "
                                         "bert_model.ckpt.*, vocab.txt)")):
        p = sub.add_parser(name, help=f"import {what}")
        p.add_argument("directory", help="the checkpoint's directory")
        p.add_argument("--out", required=True, help="the .keras file to write")
        p.add_argument("--vocab-out", default="",
                       help="where to write vocab.txt (default: beside --out)")
        p.add_argument("--lowercase", choices=("true", "false"), default=None,
                       help="the vocabulary's casing (default: from the checkpoint / vocab)")
    p = sub.add_parser("export-hf", help="export a .keras BertPretrainer to a Hugging Face dir")
    p.add_argument("model", help="a .keras file (or an HF / Google directory)")
    p.add_argument("--vocab", required=True, help="the vocab.txt the model was trained with")
    p.add_argument("--out", required=True, help="the directory to write")
    casing = p.add_mutually_exclusive_group()
    casing.add_argument("--cased", dest="casing", action="store_const", const="cased",
                        help="the vocabulary is cased (default: guessed from its tokens)")
    casing.add_argument("--uncased", dest="casing", action="store_const", const="uncased",
                        help="the vocabulary is lowercased (default: guessed from its tokens)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from models.convert import ConversionError

    try:
        if args.command == "import-hf":
            return _import("hf", args)
        if args.command == "import-google":
            return _import("google", args)
        return _export(args)
    except (ConversionError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
