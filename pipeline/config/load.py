"""Loading: a YAML file plus `section.key=value` overrides -> a validated `Config`."""

from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.config.sections import Config, ConfigError, _build
from pipeline.config.validation import validate


def load(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Reads a YAML config file (or the defaults), applies `key=value` overrides, validates."""
    source = str(path) if path else "<defaults>"
    raw: dict = {}
    if path:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} not found; pass an existing file with --config "
                              f"(see configs/)")
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from err
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections, "
                              f"got {type(raw).__name__}")
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value "
                              f"(e.g. train.steps=100)")
        key, _, value = item.partition("=")
        node = raw
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node[parts[-1]] = yaml.safe_load(value) if value.strip() else ""
    return from_dict(raw, source)


def from_dict(raw: dict, source: str) -> Config:
    """A validated Config from a nested mapping of sections (missing keys: the defaults)."""
    config = _build(Config, raw, prefix="", source=source)
    validate(config, source)
    return config
