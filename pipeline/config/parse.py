"""Reading a config section's raw mapping into its dataclass: unknown keys (with a "did you
mean"), each value coerced to its declared type (`_build`, `_coerce`), and `ConfigError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing


class ConfigError(ValueError):
    """A config file or override holds a value the pipeline cannot use."""


def _build(cls, raw, prefix: str, source: str):
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
