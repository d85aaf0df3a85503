"""Loading: a YAML file plus `section.key=value` overrides -> a validated `Config`."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import yaml

from pipeline.config.checkpoint import fill_from_checkpoint
from pipeline.config.sections import Config, ConfigError, _build
from pipeline.config.validation import validate


def config_dirs() -> list[Path]:
    """Where shipped configs are: the checkout's configs/, or the installed package's copy."""
    return [Path(__file__).resolve().parents[2] / "configs",
            Path(sys.prefix) / "share" / "bert-pipeline" / "configs"]


def shipped_configs() -> list[str]:
    return sorted({p.stem for folder in config_dirs() if folder.is_dir()
                   for p in folder.glob("*.yaml")})


def find_config(name: str | Path) -> Path:
    """A config file by path, or a shipped config by name ("pretrain_tiny", or a path such as
    "configs/pretrain_tiny.yaml" that does not exist here but names a shipped one)."""
    path = Path(name)
    if path.is_file():
        return path
    file_name = path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml"
    for folder in config_dirs():
        if (folder / file_name).is_file():
            return folder / file_name
    raise ConfigError(f"config file {name} not found; pass an existing YAML file with --config, "
                      f"or the name of a shipped one: {', '.join(shipped_configs())}")


def load(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Reads a YAML config file (or the defaults), applies `key=value` overrides, validates."""
    source = str(path) if path else "<defaults>"
    raw: dict = {}
    if path:
        path = find_config(path)
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from err
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections, "
                              f"got {type(raw).__name__}")
    file_raw, override_keys = copy.deepcopy(raw), set()
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
        override_keys.add(".".join(parts))
    # model.init_from: the checkpoint's sizes, vocab and casing (pipeline/config/checkpoint.py).
    raw = fill_from_checkpoint(raw, file_raw, override_keys, source)
    return from_dict(raw, source)


def from_dict(raw: dict, source: str) -> Config:
    """A validated Config from a nested mapping of sections (missing keys: the defaults)."""
    config = _build(Config, raw, prefix="", source=source)
    validate(config, source)
    return config
