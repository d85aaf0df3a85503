"""Reading the declaration: every config key of a section class (pipeline/config/sections.py,
beam_jobs/settings.py) as a `Key` with its type, default, allowed values or range and help,
for the validation (allowed.py), `config show` and the reference docs (reference.py).

    >>> from pipeline.config.sections import Config
    >>> size = declared(Config)["vocab.size"]
    >>> size.default, size.type_text(), size.allowed_text()
    (8000, 'int', '>= 10 and <= 1000000')
"""

from __future__ import annotations

import dataclasses
import typing


@dataclasses.dataclass(frozen=True)
class Key:
    name: str  # dotted: "vocab.size", "run_dir"
    type: object  # the annotation, resolved: int, float, bool, str, list, list[dict], int | None
    default: object
    help: str
    choices: tuple | None
    bounds: dict  # {"ge"/"gt"/"le": value}
    allowed: object  # what a rule in validation.py allows, in words (or a function giving them)

    @property
    def section(self) -> str:
        return self.name.rpartition(".")[0]

    def range(self) -> tuple | None:
        """(low, high or None, low inclusive?) as validation's check_range takes it."""
        if "ge" in self.bounds:
            return self.bounds["ge"], self.bounds.get("le"), True
        if "gt" in self.bounds:
            return self.bounds["gt"], self.bounds.get("le"), False
        return None

    def type_text(self) -> str:
        return {int: "int", float: "float", bool: "bool", str: "string", list: "list",
                list[dict]: "list of mappings",
                (int | None): "int or null"}.get(self.type, str(self.type))

    def range_text(self) -> str:
        """">= 1", "> 0.0 and <= 1.0", or ""."""
        limits = self.range()
        if not limits:
            return ""
        low, high, inclusive = limits
        return f"{'>=' if inclusive else '>'} {low}" + ("" if high is None else f" and <= {high}")

    def words(self) -> str:
        """What a rule in validation.py allows, in words ("" if nothing is said)."""
        return self.allowed() if callable(self.allowed) else self.allowed

    def allowed_text(self) -> str:
        """"a | b", ">= 1 and <= 1000", or the declaration's words (and both where both)."""
        parts = [" | ".join(self.choices) if self.choices else "", self.range_text(),
                 self.words()]
        return "; ".join(part for part in parts if part)


def declared(cls, prefix: str = "") -> dict[str, Key]:
    """{dotted name: Key} of every key of the dataclass `cls`, its sections' keys included,
    in declaration order."""
    hints = typing.get_type_hints(cls)
    out = {}
    for field in dataclasses.fields(cls):
        name, hint = prefix + field.name, hints[field.name]
        if dataclasses.is_dataclass(hint):
            out.update(declared(hint, name + "."))
            continue
        meta = field.metadata
        if "help" not in meta:
            raise TypeError(f"{cls.__name__}.{field.name} is not declared with key(...) "
                            f"(pipeline/config/sections.py): no help, range or choices")
        default = (field.default_factory() if field.default is dataclasses.MISSING
                   else field.default)
        out[name] = Key(name, hint, default, meta["help"], meta["choices"],
                        {k: meta[k] for k in ("ge", "gt", "le") if k in meta}, meta["allowed"])
    return out


def sections(cls) -> dict[str, type]:
    """{section name: its dataclass} of `cls` (the Config), in order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)
            if dataclasses.is_dataclass(hints[f.name])}
