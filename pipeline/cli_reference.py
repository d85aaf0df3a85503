"""docs/cli.md, generated: every command a user runs (`python -m pipeline ...`, `python -m
models.convert ...`, the scripts under bench/ that `make bench-*` runs), each with its usage line,
what it does and a table of its arguments (default, help), read from the commands' own argparse
parsers: each command's module has a `build_parser()` that builds it without TensorFlow, MLflow
or the other heavy libraries (they are imported inside the functions that use them).

    python -m pipeline.cli_reference [--output PATH]     (`make cli-docs`: docs/cli.md)

tests/test_cli_reference.py fails when the committed page differs from what this makes. Why
here, beside cli.py: it reads cli.py's parser and TOOLS, which the libraries may not import
(import-linter, pyproject.toml). The benchmarks are scripts, found by path under bench/ and
imported as `bench.NAME` (as the scripts import each other).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "cli.md"
WIDTH = 100  # of the usage lines (argparse wraps them; the terminal's width would vary)

GENERATED_NOTE = ("<!-- Generated from the commands' parsers (each module's build_parser()) by "
                  "`make cli-docs`; edit those, not this page (tests/test_cli_reference.py fails "
                  "when it is stale). The introduction is pipeline/cli_reference.py's INTRO. -->")

INTRO = """\
# Command line

Every command, its usage and each of its arguments with its default, generated from the
commands' own parsers (`make cli-docs`); `-h` / `--help` prints the same for one command.
The [configuration](configuration.md) keys (`section.key=value` on any pipeline command line)
have their own reference.

- `python -m pipeline COMMAND` is `bert-pipeline COMMAND` once the package is installed. Every
  such command also takes `--run-root DIR` (where relative run directories, the MLflow store and
  the downloads go; default: `$BERT_PIPELINE_ROOT`, the checkout, or the current directory) and
  `-v` / `--verbose` (every library's lines on the console), before or after the command name.
- Flags are kebab-case (`--top-k`, `--run-dir`). A former spelling with underscores still
  works where a command lists it under "Former spellings".
- Exit codes: 0 done, 1 failed, 2 bad input (one line saying what to change); the stages and
  the cycle also 3 nothing to do, 4 already running, 5 out of disk space
  ([exit codes](troubleshooting.md#exit-codes)).
- Not listed here: the Beam jobs the vocab and data stages run, which also run alone
  (`python -m beam_jobs.vocab`, `python -m beam_jobs.pretraining_data`, `--help` for their flags:
  [scaling out](scaling-out.md)); their flags keep the config keys' names and Beam's own
  underscore style (`--max_seq_length` beside `--temp_location`). And the official SQuAD
  scoring (`python -m pipeline.finetuning.squad_official`: [SQuAD](squad.md)).
"""


@dataclasses.dataclass
class Command:
    """One command as a user types it, with the parser that reads its arguments."""

    name: str  # "python -m pipeline fill-mask", "python bench/bench_train.py"
    parser: argparse.ArgumentParser
    summary: str = ""  # the subcommand's one-line help, where the parser has no description
    section: str = ""  # the heading of the page section it is listed under


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """{name: (its parser, its one-line help)} of a parser's subcommands."""
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            out.update({name: (sub, helps.get(name, "")) for name, sub in action.choices.items()})
    return out


def _builder(module: str):
    """`module`'s build_parser (every command's module has one: this page is made from it)."""
    build = getattr(importlib.import_module(module), "build_parser", None)
    if build is None:
        raise AttributeError(f"{module} has no build_parser(): a command's module builds its "
                             f"argparse parser there, without importing TensorFlow "
                             f"(pipeline/cli_reference.py makes docs/cli.md from it)")
    return build


def pipeline_commands() -> list[Command]:
    """`python -m pipeline`: the stages' parser, then each command of cli.py's TOOLS (one of a
    module's subcommands where several commands share it: fill-mask, nsp, attention, embed; each
    subcommand where the command has them: config show, config docs)."""
    from pipeline import cli

    section = "Pipeline: python -m pipeline"
    out = [Command("python -m pipeline", cli.build_parser("python -m pipeline"), section=section)]
    for name, target in cli.TOOLS.items():
        parser = _builder(target.split(":")[0])()
        subs = _subcommands(parser)
        if name in subs:
            out.append(Command(f"python -m pipeline {name}", subs[name][0], subs[name][1],
                               section))
        elif subs:
            out += [Command(f"python -m pipeline {name} {sub}", p, help_, section)
                    for sub, (p, help_) in subs.items()]
        else:
            out.append(Command(f"python -m pipeline {name}", parser, section=section))
    return out


def converter_commands() -> list[Command]:
    """`python -m models.convert import-hf | import-google | export-hf`."""
    parser = _builder("models.convert.__main__")()
    return [Command(f"python -m models.convert {name}", sub, help_,
                    "Checkpoints: python -m models.convert")
            for name, (sub, help_) in _subcommands(parser).items()]


def bench_commands() -> list[Command]:
    """Every script under bench/ with a `build_parser()`, as `python bench/NAME.py`. Importing a
    benchmark may set its environment (gpu_bench.py: KERAS_BACKEND=jax, for its own run):
    the process's environment and sys.path are put back afterwards."""
    scripts = sorted(f for f in (ROOT / "bench").glob("*.py")
                     if "\ndef build_parser(" in f.read_text(encoding="utf-8"))
    environ, path = dict(os.environ), list(sys.path)
    try:
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        out = []
        for script in scripts:
            parser = _builder(f"bench.{script.stem}")()
            parser.prog = f"python bench/{script.name}"  # argparse's default: sys.argv[0]
            out.append(Command(parser.prog, parser, section="Benchmarks (bench/)"))
        return out
    finally:
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update({k: v for k, v in environ.items() if os.environ.get(k) != v})
        sys.path[:] = path


def this_command() -> Command:
    return Command("python -m pipeline.cli_reference", build_parser(),
                   section="Generating this page")


def commands() -> list[Command]:
    """Every command the page documents, in its order."""
    return [*pipeline_commands(), *converter_commands(), *bench_commands(), this_command()]


def make_targets(makefile: Path = ROOT / "Makefile") -> dict[str, list[str]]:
    """{what a recipe runs ("pipeline finetune", "pipeline config docs", "bench/bench_train.py",
    "pipeline.cli_reference"): the make targets whose recipe runs it}."""
    out: dict[str, list[str]] = {}
    targets: list[str] = []
    for line in makefile.read_text(encoding="utf-8").splitlines():
        if not line.startswith("\t"):
            m = re.match(r"^([\w-]+(?:\s+[\w-]+)*)\s*:(?!=)", line)
            targets = m.group(1).split() if m and not line.startswith(".") else []
            continue
        for target in targets:
            if m := re.search(r"\$\(PY\) (bench/\w+\.py)", line):
                out.setdefault(m.group(1), []).append(target)
            elif m := re.search(r"\$\(PY\) -m ([\w.]+)((?: (?:\$@|[a-z][\w-]*))*)", line):
                words = [m.group(1), *(target if w == "$@" else w for w in m.group(2).split())]
                out.setdefault(" ".join(words), []).append(target)
    return out


def run_by(listed: list[Command], targets: dict[str, list[str]]) -> dict[str, list[str]]:
    """{command name: the make targets that run it}: a recipe's command is the longest command
    of the page it starts with (`pipeline finetune`: the stages' parser; `pipeline server
    start`: the server's)."""
    names = {c.name.removeprefix("python -m ").removeprefix("python "): c.name for c in listed}
    out: dict[str, list[str]] = {}
    for runs, make in targets.items():
        words = runs.split()
        for n in range(len(words), 0, -1):
            if " ".join(words[:n]) in names:
                out.setdefault(names[" ".join(words[:n])], []).extend(make)
                break
    return out


# ---- rendering ----

def _text(text: str) -> str:
    """Prose for Markdown (a table cell, a paragraph): one line; outside `code` spans no stray
    HTML (<run_dir>), emphasis (*) or column break (|)."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):
        parts[i] = (parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                    .replace("*", "\\*").replace("|", "\\|"))
    return "`".join(parts)


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest if not action.option_strings else action.dest.upper()


def _argument(action: argparse.Action) -> str:
    """`--top-k TOP_K`, `--verbose` (also `-v`), `text`."""
    if not action.option_strings:
        return f"`{_metavar(action)}`"
    longs = [o for o in action.option_strings if o.startswith("--")] or action.option_strings
    shorts = [o for o in action.option_strings if o not in longs]
    value = "" if action.nargs == 0 else f" {_metavar(action)}"
    also = f" (also {', '.join(f'`{o}`' for o in shorts)})" if shorts else ""
    return f"`{longs[0]}{value}`{also}" + "".join(f", `{o}{value}`" for o in longs[1:])


def _default(action: argparse.Action) -> str:
    if action.required and action.nargs not in ("?", "*"):  # (argparse: a "*" is required)
        return "required"
    if action.nargs == 0 or action.default in (None, "", [], argparse.SUPPRESS):
        return ""  # a switch, or nothing
    value = action.default
    if isinstance(value, (str, Path)) and Path(value).is_absolute():
        try:  # a path in the checkout, as the checkout's (this page is the same in every one)
            value = Path(value).relative_to(ROOT).as_posix()
        except ValueError:
            pass
    return f"`{value}`"


def _help(action: argparse.Action, prog: str) -> str:
    """The help text as --help shows it (argparse's %(default)s, %(prog)s expanded)."""
    if not action.help:
        return ""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = prog
    if params.get("choices") is not None:
        params["choices"] = ", ".join(map(str, params["choices"]))
    return _text(action.help % params)


def usage(parser: argparse.ArgumentParser) -> str:
    """argparse's usage line, wrapped at WIDTH whatever the terminal."""
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def former_spellings(parser: argparse.ArgumentParser) -> dict[str, str]:
    """{hidden flag: the flag it is the former spelling of} (pipeline.tools.old_spelling: the
    same dest, help suppressed, the name with _ for -)."""
    shown = {o: a for a in parser._actions if a.help != argparse.SUPPRESS
             for o in a.option_strings}
    out = {}
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            for flag in action.option_strings:
                now = shown.get(flag.replace("_", "-"))
                if "_" in flag and now is not None and now.dest == action.dest:
                    out[flag] = flag.replace("_", "-")
    return out


def section(command: Command, make: list[str]) -> list[str]:
    """A command's part of the page: heading, what it does, usage, its arguments."""
    parser = command.parser
    about = command.summary or (parser.description or "")
    if parser.description and command.summary and parser.description != command.summary:
        about = f"{command.summary}. {parser.description}"
    lines = [f"### `{command.name}`", ""]
    if about:
        lines += [_text(about), ""]
    if make:
        lines += ["Run by " + ", ".join(f"`make {t}`" for t in dict.fromkeys(make)) + ".", ""]
    lines += ["```text", usage(parser), "```", ""]
    rows = [a for a in parser._actions if a.help != argparse.SUPPRESS
            and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    if rows:
        lines += ["| argument | default | help |", "|---|---|---|"]
        lines += [f"| {_argument(a)} | {_default(a)} | {_help(a, parser.prog)} |" for a in rows]
        lines.append("")
    former = former_spellings(parser)
    if former:
        lines += ["Former spellings, still accepted: "
                  + ", ".join(f"`{old}` (`{new}`)" for old, new in sorted(former.items())) + ".",
                  ""]
    return lines


def markdown(listed: list[Command] | None = None, makefile: Path = ROOT / "Makefile") -> str:
    """The whole page: INTRO, then a section per group of commands."""
    listed = commands() if listed is None else listed
    make = run_by(listed, make_targets(makefile))
    lines = [GENERATED_NOTE, "", INTRO.rstrip("\n"), ""]
    current = None
    for command in listed:
        if command.section != current:
            current = command.section
            lines += [f"## {current}", ""]
        lines += section(command, make.get(command.name, []))
    return "\n".join(lines).rstrip("\n") + "\n"


def build_parser() -> argparse.ArgumentParser:
    """This generator's own parser (the page lists it too)."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.cli_reference",
        description="Write the command-line reference, docs/cli.md, from the commands' parsers.")
    parser.add_argument("--output", metavar="PATH",
                        help="write it there (replaced whole) instead of printing it")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    page = markdown()
    if args.output:
        from pipeline.artifacts import write_text_atomic

        write_text_atomic(Path(args.output), page)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
