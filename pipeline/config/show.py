"""`bert-pipeline config show | docs`: the effective config as commented YAML, and the generated
reference page docs/configuration.md.

    bert-pipeline config show [--config FILE] [section.key=value ...]
        the config a command would run with (FILE + overrides, validated, model.init_from's
        keys filled in) as YAML, each key's help, type and allowed values above it as a
        comment, "default: X" where the value is not the default
    bert-pipeline config show --defaults
        every key's default
    bert-pipeline config docs [--output PATH]
        the Markdown reference docs/configuration.md (an introduction, then a table of the
        keys per section); --output writes it in place (whole, or not at all):
        `make config-docs`

A bad config is one line on stderr naming the key, the value and what is allowed, exit 2. The
YAML read back (`--config` of the output) gives the same config.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

import yaml

from pipeline.config.keys import ConfigError, Key, declared, sections
from pipeline.config.load import load
from pipeline.config.sections import Config, to_dict

EXIT_BAD_INPUT = 2
WIDTH = 100

GENERATED_NOTE = ("<!-- Generated from the key declarations (pipeline/config/sections.py, "
                  "beam_jobs/settings.py) by `make config-docs`; edit those, not this page "
                  "(tests/test_config_docs.py fails when it is stale). The introduction is "
                  "pipeline/config/show.py's INTRO. -->")

INTRO = """\
# Configuration

YAML files in `configs/`, validated on load: a bad value is reported in one line with the file,
the key, the value and what is allowed, and the command exits with status 2.

| file | what |
|---|---|
| `configs/pretrain_tiny.yaml` | the default demo: Brown corpus, BERT-tiny, CPU |
| `configs/nightly.yaml` | what the scheduling recipes in `deploy/` run: one cycle of the scheduled loop a night (`bert-pipeline cycle`), in `runs/nightly` |
| `configs/continue_pretraining.yaml` | continued pretraining of a published checkpoint (`model.init_from`) on your text: a trained model's learning rate, step-0 held-out probe ([checkpoints](checkpoints.md#continue-pretraining-a-published-checkpoint)) |
| `configs/finetune_*.yaml`, `glue.yaml`, `multitask_brown.yaml`, `distill_brown.yaml` | fine-tuning: Brown genre/POS, GLUE, SQuAD, search; all GLUE tasks ([GLUE](glue.md)); multi-task; distillation |
| `configs/test_tiny.yaml` | the smallest useful pipeline (tests, smoke runs) |
| `configs/albert_tiny.yaml` | ALBERT-style (factorized embeddings, shared layers, SOP) at test size |
| `configs/pretrain_base.yaml`, `pretrain_large.yaml` | BERT-Base / BERT-Large on your corpus (GPUs: `train.strategy: mirrored`) |
| `configs/pretrain_two_phase.yaml` | two-phase pretraining (short, then long sequences) at test size |

Override any key on the command line: `make pretrain ARGS="train.steps=300 model.preset=mini"`
or `python -m pipeline data --config configs/pretrain_tiny.yaml data.dupe_factor=5`. A key not
given keeps its default (the tables below). To see what a command will run with, every key with
its help as a comment:

    bert-pipeline config show --config configs/pretrain_tiny.yaml train.steps=300
    bert-pipeline config show --defaults

Each key is declared once, with its type, default, allowed values or range and help: in
`pipeline/config/sections.py`, or in `beam_jobs/settings.py` for the keys the Beam jobs read
(`vocab.*`, most of `data.*`; the jobs' flags are made from the same declaration). Rules that
tie keys together (e.g. `data.max_predictions_per_seq` below `data.max_seq_length - 3`) are in
`pipeline/config/load.py`. The sizes and ALBERT switches are explained on
[models](models.md), the fine-tuning keys on [fine-tuning](finetuning.md), the Beam runner keys
(`data.beam_args`, `data.workers`, `data.remote_dir`) on [scaling out](scaling-out.md).
`model.initializer_range` is 0.02 (the paper's, chosen for hidden 768); the default recipe uses
0.09 for BERT-tiny (hidden 128): see [How good is the
model?](quality.md#how-was-the-default-recipe-chosen).

## Two-phase pretraining

`configs/pretrain_two_phase.yaml`: with `data.phases: ["128/20", "512/80"]` the data stage writes
`data/phase1/` and `data/phase2/`, and the pretrain stage trains phase 1 on `data/phase1/`
(checkpoints in `pretrain/checkpoints/phase1/`), then phase 2 on `data/phase2/` starting from
phase 1's final weights with a fresh optimizer and its own schedule (`train.phases[1]`,
checkpoints in `pretrain/checkpoints/phase2/`). Each phase is its own MLflow run under the
pipeline run (`pipeline.stage = pretrain.phase1`, …, with its step metrics and held-out eval at
its sequence length); the `pretrain` stage run holds the final eval and the exported model,
which is phase 2's. A re-run after phase 1 finished goes straight to phase 2's latest checkpoint.

## Your own corpus

How big a vocabulary, which model and sequence length, and how long each stage takes per MB of
text: [your own corpus](your-corpus.md). The keys:
`corpus.source: files` and `corpus.path: "/data/text/*.txt"` (comma-separate several globs;
plain, `.gz` or `.bz2` files, read as a stream) in `corpus.format`, e.g.
`make pretrain ARGS="corpus.source=files corpus.format=text corpus.path='/data/docs/*.txt.gz'"`
(the examples below give the keys besides `corpus.source=files`):

| format | the file | example |
|---|---|---|
| `google` (default) | one sentence per line, blank line between documents, used as it is | `corpus.format=google corpus.path='/data/sents/*.txt'` |
| `text` | raw text, a document per line (lines of any length) | `corpus.format=text corpus.path='/data/docs/*.txt.gz'` |
| `text` + `corpus.documents: blank_line` | documents separated by blank lines, their lines (hard-wrapped text, paragraphs) joined | `corpus.format=text corpus.documents=blank_line corpus.path='/data/books/*.txt'` |
| `jsonl` | one JSON object per line, a document, its text in the field `corpus.text_key` (default `text`) | `corpus.format=jsonl corpus.text_key=body corpus.path='/data/dump/*.jsonl.bz2'` |

Raw text (`text`, `jsonl`) is split into sentences by [nupunkt](https://pypi.org/project/nupunkt/),
chosen by measurement over five other splitters (`bench/sentence_splitters.md`); then
`corpus.max_line_chars` applies to each sentence. A file that is not UTF-8, a line that is not
JSON, a record without its text, a corrupt archive: exit 2 naming the file and line.
"""

# The heading of each section's table (their anchors are linked from other pages).
TITLES = {"": "Top-level keys", "corpus": "Corpus keys", "vocab": "Vocabulary keys",
          "data": "Data keys", "model": "Model keys", "train": "Training keys",
          "tracking": "Tracking keys", "finetune": "Fine-tuning keys",
          "multitask": "Multi-task keys", "distill": "Distillation keys",
          "cycle": "Cycle keys"}

_SECTION = "|".join(name for name in TITLES if name)  # corpus|vocab|...
# Words set as code: dotted keys (train.steps, finetune.*), $VARS, names with an _ or a <name>,
# paths (docs/gpu.md, data/phase1/, gs://bucket); and a key's values where they are listed.
_CODE_WORD = re.compile(r"^[\w<>.*/:@=+$\[\]-]+$")
_CODE_HINT = re.compile(rf"^(?:{_SECTION})\.|^\$|_\w|<\w+>|\w/.*\.|\w/$|://")


def _code_word(core: str, values: tuple, before: str, after: str, tail: str) -> bool:
    if not core or not _CODE_WORD.match(core) or core.startswith("http"):
        return False
    listed = "|" in (before, after) or tail.startswith(":")  # "a | b", "a: what a does"
    return bool(_CODE_HINT.search(core)) or (core in values and listed)


def value_text(value) -> str:
    """A value as YAML writes it in flow style: 8000, true, '', [], [--runner=DirectRunner]."""
    return yaml.safe_dump([value], default_flow_style=True, width=1 << 20).strip()[1:-1]


def _cell(text: str, values: tuple = ()) -> str:
    """Prose for a table cell: names, paths and the key's `values` set as code (no stray HTML or
    emphasis), pipes escaped; what is already `code` is kept as it is."""
    out = []
    for i, part in enumerate(text.split("`")):
        if i % 2:  # inside a code span
            out.append(f"`{part}`")
            continue
        words = part.split(" ")
        for j, word in enumerate(words):
            lead = len(word) - len(word.lstrip("(\"["))
            core = word[lead:].rstrip(",;:.)\"]")
            tail = word[lead + len(core):]
            before = words[j - 1] if j else ""
            after = words[j + 1] if j + 1 < len(words) else ""
            if _code_word(core, values, before, after, tail):
                words[j] = f"{word[:lead]}`{core}`{tail}"
            else:
                words[j] = word.replace("<", "&lt;")
        out.append(" ".join(words).replace(" | ", " \\| "))
    return "".join(out)


def row(key: Key) -> str:
    words = key.words()
    values = tuple(key.choices or ()) + tuple(v for v in re.split(r"[\s|:]+", words) if v)
    allowed = [", ".join(f"`{c}`" for c in key.choices) if key.choices else "",
               key.range_text(), _cell(words, values if " | " in words else ())]
    return (f"| `{key.name}` | {key.type_text()} | `{value_text(key.default)}` | "
            f"{'; '.join(part for part in allowed if part)} | "
            f"{_cell(key.help, tuple(key.choices or ()))} |")


def markdown() -> str:
    """docs/configuration.md: GENERATED_NOTE, INTRO, then a table per section (key, type,
    default, allowed, help) read from the key declarations; tests/test_config_docs.py fails
    when the committed page differs.

    >>> "| `vocab.size` | int | `8000` | >= 10 and <= 1000000 |" in markdown()
    True
    """
    keys = declared(Config)
    classes = {"": Config, **sections(Config)}
    out = [GENERATED_NOTE, "", INTRO.rstrip("\n"), "", "## Reference", "",
           ("Every key, by section: its type, its default, what it allows (the values, or the "
            "range; rules that compare keys are checked too) and what it does."), ""]
    for section, cls in classes.items():
        rows = [key for key in keys.values() if key.section == section]
        doc = " ".join((cls.__doc__ or "").split())
        out += [f"### {TITLES.get(section, section)}", ""]
        if section:
            out += [f"`{section}:` {_cell(doc)}", ""]
        out += ["| key | type | default | allowed | what |", "|---|---|---|---|---|"]
        out += [row(key) for key in rows] + [""]
    return "\n".join(out).rstrip("\n") + "\n"


def _comment(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, WIDTH - len(indent) - 2, initial_indent=f"{indent}# ",
                         subsequent_indent=f"{indent}#   ", break_on_hyphens=False)


def _key_lines(key: Key, value, indent: str) -> list[str]:
    about = key.type_text()
    if key.allowed_text():
        about += f"; {key.allowed_text()}"
    if value != key.default:
        about += f"; default: {value_text(key.default)}"
    name = key.name.rpartition(".")[2]
    return (_comment(f"{key.help} [{about}]", indent)
            + [f"{indent}{name}: {value_text(value)}"])


def render(config: Config, header: str) -> str:
    """`config` as YAML, every key under its help (a comment); yaml.safe_load reads it back as
    to_dict(config)."""
    keys, values = declared(Config), to_dict(config)
    classes = sections(Config)
    lines = _comment(header, "")
    for name, value in values.items():
        if name not in classes:
            lines += [""] + _key_lines(keys[name], value, "")
            continue
        doc = " ".join((classes[name].__doc__ or "").split())
        lines += ["", *_comment(doc, ""), f"{name}:"]
        for sub, sub_value in value.items():
            lines += _key_lines(keys[f"{name}.{sub}"], sub_value, "  ")
    return "\n".join(lines) + "\n"


def _write(path: str, text: str) -> None:
    from pipeline.artifacts import write_text_atomic

    write_text_atomic(Path(path), text)


def build_parser() -> argparse.ArgumentParser:
    """`config show | docs`'s parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(
        prog="bert-pipeline config", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1])
    commands = parser.add_subparsers(dest="command", metavar="show|docs")
    show = commands.add_parser("show", help="the effective config (or --defaults) as YAML")
    show.add_argument("overrides", nargs="*", metavar="section.key=value",
                      help="overrides, as on a pipeline command line")
    show.add_argument("--config", default=None,
                      help="YAML config file, or a shipped config's name (default: none, "
                           "the defaults with the overrides)")
    show.add_argument("--defaults", action="store_true", help="every key's default")
    docs = commands.add_parser("docs", help="the Markdown reference of every key")
    docs.add_argument("--output", metavar="PATH",
                      help="write it there (replaced whole) instead of printing it")
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "config":
        argv = argv[1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "docs":
        page = markdown()
        if args.output:
            _write(args.output, page)
        else:
            sys.stdout.write(page)
        return 0
    if args.command != "show":
        print("error: choose a command: bert-pipeline config show [--config FILE] "
              "[key=value ...] | show --defaults | docs", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.defaults and (args.config or args.overrides):
        print("error: config show --defaults shows the defaults alone; drop --config and the "
              "overrides, or drop --defaults", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        config = load(args.config, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.defaults:
        header = "Every key's default (bert-pipeline config show --defaults)."
    else:
        given = " ".join([args.config or "the defaults", *args.overrides])
        header = f"The effective config of {given} (bert-pipeline config show)."
    sys.stdout.write(render(config, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
