"""`bert-pipeline config show | docs`: the effective config as commented YAML, and the generated
reference page docs/configuration.md.

    bert-pipeline config show [--config FILE] [section.key=value ...]
        the config a command would run with (FILE + overrides, validated, model.init_from's
        keys filled in) as YAML, each key's help, type and allowed values above it as a
        comment, "default: X" where the value is not the default
    bert-pipeline config show --defaults
        every key's default
    bert-pipeline config docs [--output PATH]
        the Markdown reference (pipeline/config/reference.py); --output writes it in place
        (whole, or not at all): `make config-docs`

A bad config is one line on stderr naming the key, the value and what is allowed, exit 2. The
YAML read back (`--config` of the output) gives the same config.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from pipeline.config import reference
from pipeline.config.keys import Key, declared, sections
from pipeline.config.load import load
from pipeline.config.sections import Config, ConfigError, to_dict

EXIT_BAD_INPUT = 2
WIDTH = 100


def _comment(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, WIDTH - len(indent) - 2, initial_indent=f"{indent}# ",
                         subsequent_indent=f"{indent}#   ", break_on_hyphens=False)


def _key_lines(key: Key, value, indent: str) -> list[str]:
    about = key.type_text()
    if key.allowed_text():
        about += f"; {key.allowed_text()}"
    if value != key.default:
        about += f"; default: {reference.value_text(key.default)}"
    name = key.name.rpartition(".")[2]
    return (_comment(f"{key.help} [{about}]", indent)
            + [f"{indent}{name}: {reference.value_text(value)}"])


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
        page = reference.markdown()
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
