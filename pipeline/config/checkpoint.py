"""`model.init_from` alone is enough: the checkpoint's sizes, vocab and casing fill the config.

A published checkpoint already says what the model is. When `model.init_from` is set, the keys
below come from the checkpoint (`models.convert.describe`: its config.json, bert_config.json or
the .keras file's config, and the vocab.txt released with it):

    model.num_layers, hidden_dim, num_heads, intermediate_dim, max_sequence_length,
    num_segments, activation, layer_norm_epsilon, embedding_size, share_layers;
    vocab.from_file (its vocab.txt), vocab.lowercase (its casing), vocab.size.

Which value wins where a key is also written elsewhere:
  - not written anywhere (a default): the checkpoint's value;
  - written where `model.init_from` is written, or later (both in the config file, or the key
    given as a command-line override): it must agree with the checkpoint, else a ConfigError
    names both values;
  - written earlier (in the config file, while `model.init_from` comes from the command line):
    the checkpoint's value replaces it, and a warning names each key replaced. This is what
    lets `make pretrain ARGS="model.init_from=<dir>"` run on the BERT-tiny demo config.

`model.preset` follows the same rule (its sizes against the checkpoint's); where it does not
contradict, it is set to the preset of the checkpoint's sizes if one matches.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from models import presets
from pipeline.config.keys import ConfigError

LOG = logging.getLogger("pipeline.config")

# model.* key -> the architecture key of models.convert (BertEncoder's argument).
MODEL_KEYS = {
    "num_layers": "num_layers", "hidden_dim": "hidden_dim", "num_heads": "num_heads",
    "intermediate_dim": "intermediate_dim", "max_sequence_length": "max_sequence_length",
    "num_segments": "num_segments", "activation": "activation",
    "layer_norm_epsilon": "layer_norm_epsilon", "embedding_size": "embedding_dim",
    "share_layers": "share_layers",
}
SIZE_KEYS = ("num_layers", "hidden_dim", "num_heads", "intermediate_dim")


def _lookup(raw: dict, key: str):
    node = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None, False
        node = node[part]
    return node, True


def _set(raw: dict, key: str, value) -> None:
    section, name = key.split(".")
    node = raw.setdefault(section, {})
    if not isinstance(node, dict):
        raise ConfigError(f"key {section} must be a section (a mapping), got {node!r}")
    node[name] = value


def _same(key: str, given, wanted) -> bool:
    if key == "vocab.from_file":  # the same file, or a copy of it (a model's vocab beside it)
        if not given:
            return False
        a, b = Path(str(given)).resolve(), Path(str(wanted)).resolve()
        return a == b or (a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes())
    if isinstance(wanted, float):
        try:
            return math.isclose(float(given), wanted, rel_tol=1e-6)
        except (TypeError, ValueError):
            return False
    if isinstance(wanted, bool):
        return given is wanted or str(given).lower() == str(wanted).lower()
    return given == wanted or str(given) == str(wanted)


def checkpoint_keys(described) -> dict:
    """{config key: value} that the checkpoint decides."""
    arch = described.architecture
    keys = {f"model.{key}": arch[name] for key, name in MODEL_KEYS.items()}
    if keys["model.embedding_size"] == arch["hidden_dim"]:
        keys["model.embedding_size"] = None
    keys["model.share_layers"] = bool(keys["model.share_layers"])
    if described.vocab_file is not None:
        keys["vocab.from_file"] = str(described.vocab_file)
        keys["vocab.lowercase"] = bool(described.lowercase)
        keys["vocab.size"] = described.vocab_size
    return keys


def _preset_of(arch: dict) -> str:
    for name, sizes in presets.PRESETS.items():
        if all(sizes.get(key) == arch[key] for key in SIZE_KEYS):
            return name
    return ""


def fill_from_checkpoint(raw: dict, file_raw: dict, override_keys: set, source: str) -> dict:
    """`raw` (the file's sections with the overrides applied) with the checkpoint's keys filled
    in (see the module docstring); raises ConfigError on a contradiction. `file_raw` is the
    config file's own mapping, `override_keys` the dotted keys given on the command line."""
    from models.convert.common import ConversionError
    from models.convert.describe import describe

    init_from, _ = _lookup(raw, "model.init_from")
    if not init_from:
        return raw
    init_later = "model.init_from" in override_keys  # from the command line, after the file
    try:
        described = describe(init_from)
    except ConversionError as err:
        raise ConfigError(f"{source}: key model.init_from = {init_from!r}: {err}") from err
    wanted = checkpoint_keys(described)
    if described.vocab_file is None:
        given, found = _lookup(raw, "vocab.from_file")
        if not (found and given):
            raise ConfigError(
                f"{source}: key model.init_from = {init_from!r} has no vocab.txt beside it; put "
                f"the vocab.txt released with the checkpoint there (`python -m models.convert "
                f"import-hf` writes it beside the .keras file) or set vocab.from_file")

    replaced = []

    def decide(key: str, value, theirs=None) -> None:
        given, found = _lookup(raw, key)
        if not found or _same(key, given, value):
            if not found:
                _set(raw, key, value)
            return
        in_file = _lookup(file_raw, key)[1] and key not in override_keys
        if in_file and init_later:
            replaced.append(f"{key}: {given!r} -> {value!r}")
            _set(raw, key, value)
            return
        where = "the command line" if key in override_keys else "the config file"
        raise ConfigError(
            f"{source}: key {key} = {given!r} (from {where}) contradicts model.init_from = "
            f"{init_from!r}, whose {theirs or key.split('.')[1]} is {value!r}; remove the key "
            f"(the checkpoint decides it) or start from another checkpoint")

    arch = described.architecture
    sizes_text = ", ".join(f"{key} {arch[key]}" for key in SIZE_KEYS)
    preset_given, has_preset = _lookup(raw, "model.preset")
    matching = _preset_of(arch)
    if has_preset and preset_given in presets.PRESETS and preset_given != matching:
        # The preset names sizes; any value that is not the checkpoint's contradicts it.
        if "model.preset" in override_keys or not init_later:
            where = "the command line" if "model.preset" in override_keys else "the config file"
            raise ConfigError(
                f"{source}: key model.preset = {preset_given!r} (from {where}) contradicts "
                f"model.init_from = {init_from!r}, whose sizes are {sizes_text}"
                f"{f' (preset {matching!r})' if matching else ''}; remove the key (the "
                f"checkpoint decides the sizes) or start from another checkpoint")
        replaced.append(f"model.preset: {preset_given!r} -> sizes {sizes_text}")
        _set(raw, "model.preset", matching or "base")  # the explicit sizes below decide
    elif not has_preset and matching:
        _set(raw, "model.preset", matching)
    for key, value in wanted.items():
        decide(key, value)
    if replaced:
        LOG.warning("config: model.init_from = %s decides these keys of %s: %s",
                    init_from, source, "; ".join(replaced))
    return raw
