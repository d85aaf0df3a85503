"""What a script's source says of its flags and where a dotted module lives, read without
importing it (tests/test_docs_truth.py checks the docs' commands against these)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def literal(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


@functools.cache
def parser_of(file: Path, is_helper: bool = False) -> tuple[dict[str, bool], set[str]] | None:
    """({--flag: takes a value} of every add_argument in `file`, and of the shared flags a
    bench adds through a helper of bench/ (`machine.add_quick(parser, ...)`), the names of its
    add_parser subcommands), or None where the flags cannot be read from the source. In a
    helper (`is_helper`), a flag named at run time (a contender process's hidden flags) is
    left out instead."""
    tree = ast.parse(file.read_text(encoding="utf-8"))
    flags, subcommands, known = {}, set(), True
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr == "parse_known_args":
            return None  # unknown flags are passed on: any flag is accepted
        helper = ROOT / "bench" / f"{getattr(node.func.value, 'id', '')}.py"
        if node.func.attr.startswith("add_") and file.parent == ROOT / "bench" \
                and helper.is_file() and helper != file:
            shared = parser_of(helper, is_helper=True)
            flags.update(shared[0] if shared else {})
        names = [literal(a) for a in node.args]
        if node.func.attr == "add_parser":
            if names and names[0]:
                subcommands.add(names[0])
            else:
                known = False  # a subcommand named at run time: none checked
        if node.func.attr != "add_argument":
            continue
        if not names or None in names:
            if is_helper:
                continue
            return None  # names computed at run time
        action = next((literal(k.value) for k in node.keywords if k.arg == "action"), "store")
        value = action not in ("store_true", "store_false", "store_const", "count", "help",
                               "version")
        flags.update({n: value for n in names if n.startswith("-")})
    return (flags, subcommands if known else set()) if flags or subcommands else None


def module_file(dotted: str, main: bool = False) -> Path | None:
    """The file of a project module (`python -m` needs a package's __main__.py)."""
    base = ROOT.joinpath(*dotted.split("."))
    for file in (base.with_suffix(".py"), base / ("__main__.py" if main else "__init__.py")):
        if file.is_file():
            return file
    return None
