"""What a config key is: declared with `key(...)` (`beam_jobs.settings.setting`: type, default,
choices or range, help), read back as a `Key` (`declared`), its raw value parsed to its type
(`_build`, `_coerce`) and checked against its range (`check_range`); every failure a
`ConfigError`.

    >>> from pipeline.config.sections import Config
    >>> size = declared(Config)["vocab.size"]
    >>> size.default, size.type_text(), size.allowed_text()
    (8000, 'int', '>= 10 and <= 1000000')
"""

from __future__ import annotations

import dataclasses
import difflib
import typing


class ConfigError(ValueError):
    """A config file or override holds a value the pipeline cannot use."""


def _range_text(low, high, inclusive: bool) -> str:
    """">= 1", "> 0.0 and <= 1.0": a range as the messages and the docs say it."""
    return f"{'>=' if inclusive else '>'} {low}" + ("" if high is None else f" and <= {high}")


@dataclasses.dataclass(frozen=True)
class Key:
    name: str  # dotted: "vocab.size", "run_dir"
    type: object  # the annotation, resolved: int, float, bool, str, list, list[dict], int | None
    default: object
    help: str
    choices: tuple | None
    bounds: dict  # {"ge"/"gt"/"le": value}
    allowed: object  # what a rule in load.py allows, in words (or a function giving them)

    @property
    def section(self) -> str:
        return self.name.rpartition(".")[0]

    def range(self) -> tuple | None:
        """(low, high or None, low inclusive?) as check_range takes it."""
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
        return _range_text(*self.range()) if self.range() else ""

    def words(self) -> str:
        """What a rule in load.py allows, in words ("" if nothing is said)."""
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


def check_range(key: str, value, low, high, inclusive: bool, source: str) -> None:
    """Raises ConfigError unless low <= value (low < value if not `inclusive`) and, with a
    `high`, value <= high; the message names the source, the key, the value and the range."""
    too_low = value < low if inclusive else value <= low
    if too_low or (high is not None and value > high):
        raise ConfigError(f"{source}: key {key} = {value!r} is out of range; it must be "
                          f"{_range_text(low, high, inclusive)}")


def _build(cls, raw, prefix: str, source: str):
    """The dataclass `cls` from its raw mapping: unknown keys refused (with a "did you mean"),
    each value coerced to its declared type."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: key {prefix.rstrip('.') or '<top>'} must be a mapping, "
                          f"got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), list(fields), n=1)
        hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
        raise ConfigError(f"{source}: unknown key {prefix}{unknown[0]}{hint}; allowed keys "
                          f"here: {', '.join(sorted(fields))}")
    kwargs = {}
    for name, value in raw.items():
        key = prefix + name
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, key + ".", source)
        else:
            choices = fields[name].metadata.get("choices")
            kwargs[name] = _coerce(value, hint, key, source, choices)
    return cls(**kwargs)


def _coerce(value, hint, key: str, source: str, choices=None):
    """`value` as the type `hint` (a YAML true/false as "true"/"false" for a key whose
    `choices` have them, e.g. auto | true | false), else a ConfigError naming the key."""

    def bad(expected):
        return ConfigError(f"{source}: key {key} = {value!r} is not {expected}")

    if hint is bool:
        if isinstance(value, bool):
            return value
        raise bad("a boolean (true or false)")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise bad("an integer")
        return int(value)
    if hint is float:
        if isinstance(value, str):  # YAML reads "1e-4" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise bad("a number") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        return float(value)
    if hint is str:
        if value is None:
            return ""
        if isinstance(value, bool) and "true" in (choices or ()):
            return "true" if value else "false"  # YAML true/false for auto|true|false keys
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise bad("a string")
        return str(value)
    if hint == (int | None):  # null (None) or an integer, e.g. model.embedding_size
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "null",
                                                                                  "none")):
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise bad("null or an integer")
        return int(value)
    if hint == list[dict]:  # e.g. multitask.tasks: a list of mappings, kept as they are
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise bad("a YAML list of mappings, one per entry, e.g. [{key: value}, {key: value}]")
        return [dict(v) for v in value]
    if hint is list:
        if isinstance(value, str):
            return value.split()
        if not isinstance(value, list):
            raise bad("a list")
        return [str(v) for v in value]
    raise AssertionError(f"unhandled config type {hint} for {key}")
