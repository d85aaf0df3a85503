"""Loading a config: a YAML file plus `section.key=value` overrides -> a `Config`, validated
against every declared choice and range (pipeline/config/keys.py) and the rules that tie keys
together (phases, fine-tuning datasets, multi-task and cycle entries, distillation).

Each failure is a `ConfigError` naming the source, the key, the value and what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import sys
import typing
from dataclasses import dataclass
from pathlib import Path

import yaml

from models import presets
from pipeline.config import task_registry
from pipeline.config.checkpoint import fill_from_checkpoint
from pipeline.config.keys import ConfigError, _build, _coerce, check_range, declared
from pipeline.config.sections import (
    GLUE_TASK_NAMES,
    TRAIN_PHASE_KEYS,
    Config,
    FinetuneConfig,
    TrainConfig,
    get,
    model_architecture,
    to_dict,
)

KEYS = declared(Config)
# key -> the values allowed
CHOICES = {name: key.choices for name, key in KEYS.items() if key.choices}
# (key, lowest allowed, highest allowed or None, inclusive low?)
RANGES = [(name, *key.range()) for name, key in KEYS.items() if key.range()]


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


def _check_declared(config: Config, source: str, prefix: str = "") -> None:
    """Every declared choice, then every declared range, of the keys starting with `prefix`."""
    for key, allowed in CHOICES.items():
        if key.startswith(prefix) and get(config, key) not in allowed:
            raise ConfigError(f"{source}: key {key} = {get(config, key)!r} is not allowed; "
                              f"choose one of: {', '.join(allowed)}")
    for key, low, high, inclusive in RANGES:
        if key.startswith(prefix):
            check_range(key, get(config, key), low, high, inclusive, source)


def validate(config: Config, source: str = "<config>") -> None:
    """Checks choices, ranges and the cross-field rules; raises ConfigError naming the key."""
    _check_declared(config, source)
    if config.vocab.from_file and not Path(config.vocab.from_file).is_file():
        raise ConfigError(f"{source}: key vocab.from_file = {config.vocab.from_file!r}: no such file; "
                          f"give the path of a vocab.txt (one token per line) or leave it empty "
                          f"to learn a vocabulary from the corpus")
    if config.corpus.source == "files" and not config.corpus.path:
        raise ConfigError(f"{source}: key corpus.path is empty but corpus.source = 'files'; "
                          f"set corpus.path to a glob of your files (in corpus.format)")
    if config.corpus.format == "jsonl" and not config.corpus.text_key.strip():
        raise ConfigError(f"{source}: key corpus.text_key is empty but corpus.format = 'jsonl'; "
                          f"set it to the field of each JSON record that holds the text")
    arch = model_architecture(config)
    embedding_size = config.model.embedding_size
    if embedding_size is not None and not 1 <= embedding_size <= arch["hidden_dim"]:
        raise ConfigError(
            f"{source}: key model.embedding_size = {embedding_size!r} is out of range; it must be "
            f"null (= the hidden size) or an integer from 1 to the hidden size "
            f"{arch['hidden_dim']} (ALBERT uses 128)")
    if arch["hidden_dim"] % arch["num_heads"]:
        raise ConfigError(
            f"{source}: key model.num_heads = {arch['num_heads']}: hidden size "
            f"{arch['hidden_dim']} (model.hidden_dim) is not divisible by it; choose a number of "
            f"heads that divides the hidden size (e.g. {arch['hidden_dim'] // 64 or 1})")
    # With data.phases the phases' lengths replace data.max_seq_length (_validate_phases).
    if not config.data.phases and config.data.max_seq_length > config.model.max_sequence_length:
        raise ConfigError(
            f"{source}: key data.max_seq_length = {config.data.max_seq_length} is larger than the "
            f"model's position table (model.max_sequence_length = "
            f"{config.model.max_sequence_length}); lower data.max_seq_length or raise "
            f"model.max_sequence_length")
    if config.data.max_predictions_per_seq > config.data.max_seq_length - 3:
        raise ConfigError(
            f"{source}: key data.max_predictions_per_seq = {config.data.max_predictions_per_seq} "
            f"must be below data.max_seq_length - 3 = {config.data.max_seq_length - 3}")
    _validate_phases(config, source)
    _validate_training_masks(config, source)
    for phase in train_phases(config, source):
        _validate_steps_per_execution(phase, source)
    if config.train.decay_over == "max_seconds" and not config.train.max_seconds:
        raise ConfigError(f"{source}: key train.decay_over = max_seconds needs a budget: set "
                          f"train.max_seconds (now 0) or use train.decay_over = steps")
    if config.train.warmup_steps > config.train.steps:
        raise ConfigError(f"{source}: key train.warmup_steps = {config.train.warmup_steps} is more "
                          f"than train.steps = {config.train.steps}; lower it")
    _validate_finetune(config, source)
    _validate_steps_per_execution(config.finetune, source, "finetune", ("checkpoint_every",))
    _validate_multitask(config, source)
    _validate_distill(config, source)
    cycle_tasks(config, source)
    if config.model.init_from:
        value = config.model.init_from
        problem = _init_from_problem(Path(value))
        if problem:
            raise ConfigError(f"{source}: key model.init_from = {value!r} {problem}; "
                              f"it must be a .keras file (python -m models.convert import-hf / "
                              f"import-google), a Hugging Face BERT directory (config.json) or a "
                              f"Google BERT directory (bert_config.json)")


def _validate_training_masks(config: Config, source: str) -> None:
    """train.masked_lm_prob / max_predictions_per_seq change masks drawn in training."""
    tc, dc = config.train, config.data
    for key in ("masked_lm_prob", "max_predictions_per_seq"):
        value = getattr(tc, key)
        if value and dc.masking != "dynamic":
            raise ConfigError(f"{source}: key train.{key} = {value} applies to masks drawn in "
                              f"training only, and data.masking is {dc.masking!r}; set "
                              f"data.masking=dynamic (then make data) or remove train.{key}")
    lengths = [seq for seq, _ in data_phases(config)]
    if tc.max_predictions_per_seq > min(lengths) - 3:
        raise ConfigError(f"{source}: key train.max_predictions_per_seq = "
                          f"{tc.max_predictions_per_seq} must be below data.max_seq_length - 3 "
                          f"= {min(lengths) - 3}")


def _validate_steps_per_execution(tc: TrainConfig, source: str, prefix: str = "train",
                                  keys=("checkpoint_every", "log_every", "heldout_every")) -> None:
    """Callbacks see every steps_per_execution-th batch only (micro-batches, under gradient
    accumulation): the updates they act on must fall on those batches. train.* (`tc`), or
    the same keys of finetune.* (prefix "finetune": its checkpoint_every)."""
    n, accum = tc.steps_per_execution, tc.grad_accum_steps
    for key in keys:
        value = getattr(tc, key)
        if (value * accum) % n:
            shown = (f"{prefix}.{key} × {prefix}.grad_accum_steps = {value} × {accum}"
                     if accum > 1 else f"{prefix}.{key} = {value}")
            raise ConfigError(f"{source}: key {prefix}.steps_per_execution = {n}: {shown} is "
                              f"not a multiple of it; make it one (or set {prefix}."
                              f"steps_per_execution to a divisor, e.g. 1)")


def data_phases(config: Config) -> list[tuple[int, int]]:
    """[(max_seq_length, max_predictions_per_seq)] of each data phase ("128/20" or "128:20");
    without data.phases, the one phase of data.max_seq_length / data.max_predictions_per_seq."""
    if not config.data.phases:
        return [(config.data.max_seq_length, config.data.max_predictions_per_seq)]
    phases = []
    for item in config.data.phases:
        parts = str(item).replace(":", "/").split("/")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(item)
        phases.append((int(parts[0]), int(parts[1])))
    return phases


def _validate_phases(config: Config, source: str) -> None:
    try:
        phases = data_phases(config)
    except ValueError as err:
        raise ConfigError(f"{source}: key data.phases = {config.data.phases!r}: {str(err)!r} is not "
                          f"max_seq_length/max_predictions_per_seq; write e.g. "
                          f"[\"128/20\", \"512/80\"]") from None
    for seq, pred in phases if config.data.phases else []:
        if seq < 8 or seq > config.model.max_sequence_length or not 1 <= pred <= seq - 3:
            raise ConfigError(
                f"{source}: key data.phases = {config.data.phases!r}: phase {seq}/{pred} needs "
                f"8 <= max_seq_length <= model.max_sequence_length "
                f"({config.model.max_sequence_length}) and 1 <= max_predictions_per_seq <= "
                f"max_seq_length - 3")


def train_phases(config: Config, source: str = "<config>") -> list[TrainConfig]:
    """The TrainConfig of each data phase: train.* with that phase's train.phases entry
    applied. Without data.phases: [config.train]. Raises ConfigError naming the bad key."""
    tc = config.train
    if not config.data.phases:
        if tc.phases:
            raise ConfigError(f"{source}: key train.phases = {tc.phases!r} is set but data.phases "
                              f"is empty; set data.phases (e.g. [\"128/20\", \"512/80\"]) or "
                              f"remove train.phases")
        return [tc]
    count = len(config.data.phases)
    if tc.phases and len(tc.phases) != count:
        raise ConfigError(f"{source}: key train.phases has {len(tc.phases)} entries but "
                          f"data.phases = {config.data.phases!r} has {count}; give one mapping "
                          f"per data phase, in order")
    hints = typing.get_type_hints(TrainConfig)
    out = []
    for i, entry in enumerate(tc.phases or [{}] * count):
        where = f"train.phases[{i}]"
        unknown = sorted(set(entry) - set(TRAIN_PHASE_KEYS))
        if unknown:
            raise ConfigError(f"{source}: key {where}.{unknown[0]} cannot be set per phase; "
                              f"allowed: {', '.join(TRAIN_PHASE_KEYS)} (the other train.* keys "
                              f"apply to every phase)")
        values = {k: _coerce(v, hints[k], f"{where}.{k}", source) for k, v in entry.items()}
        phase = dataclasses.replace(tc, phases=[], **values)
        for key, low, high, inclusive in RANGES:
            name = key.partition(".")[2]
            if not key.startswith("train.") or name not in entry:
                continue
            check_range(f"{where}.{name}", getattr(phase, name), low, high, inclusive, source)
        if phase.warmup_steps > phase.steps:
            raise ConfigError(f"{source}: key {where}.warmup_steps = {phase.warmup_steps} is more "
                              f"than that phase's steps = {phase.steps}; lower it")
        out.append(phase)
    return out


def _init_from_problem(path: Path) -> str:
    """Why `path` cannot be a model.init_from checkpoint ("" if it can)."""
    if not path.exists():
        return "does not exist"
    if path.is_file():
        return "" if path.suffix == ".keras" else "is a file but not a .keras file"
    if (path / "config.json").is_file() or (path / "bert_config.json").is_file():
        return ""
    return "is a directory without config.json or bert_config.json"


def _task_class(fc, source: str):
    """The task class `finetune.task` names, asked of the task registry now."""
    task = task_registry.lookup(fc.task)
    if task is None:
        hint = (", ".join(task_registry.names()) or
                "none is registered: import pipeline.finetuning.tasks before loading a config")
        raise ConfigError(f"{source}: key finetune.task = {fc.task!r} is not allowed; "
                          f"choose one of: {hint}")
    return task


def null_score_threshold(value) -> float | None:
    """finetune.null_score_threshold: None for "auto" (chosen on the validation split), else
    the number; ValueError for anything else."""
    text = str(value).strip().lower()
    if text == "auto":
        return None
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if not math.isfinite(number):
        raise ValueError(f"finetune.null_score_threshold = {value!r} is neither auto nor a "
                         f"finite number; give auto (the best-F1 threshold of the validation "
                         f"split) or a number such as 0.0 (the null score minus the best span "
                         f"score above which the answer is \"\")")
    return number


def _validate_finetune(config: Config, source: str) -> None:
    fc = config.finetune
    task = _task_class(fc, source)
    try:
        null_score_threshold(fc.null_score_threshold)
    except ValueError as err:
        raise ConfigError(f"{source}: key {err}") from None
    allowed = task.datasets
    if fc.dataset not in allowed:
        raise ConfigError(f"{source}: key finetune.dataset = {fc.dataset!r} cannot feed "
                          f"finetune.task = {fc.task!r}; choose one of: {', '.join(allowed)}")
    if fc.dataset in ("csv", "tsv", "jsonl", "conll", "squad") and not fc.train_file:
        raise ConfigError(f"{source}: key finetune.train_file is empty but finetune.dataset = "
                          f"{fc.dataset!r}; set it to the training file")
    if fc.dataset == "glue":
        if fc.glue_task not in GLUE_TASK_NAMES:
            raise ConfigError(f"{source}: key finetune.glue_task = {fc.glue_task!r} is not allowed; "
                              f"choose one of: {', '.join(GLUE_TASK_NAMES)}")
        if not fc.glue_dir:
            raise ConfigError(f"{source}: key finetune.glue_dir is empty but finetune.dataset = "
                              f"'glue'; set it to the GLUE download folder (glue_data/)")
    problem = task.check_config(fc)
    if problem:
        raise ConfigError(f"{source}: key {problem}")
    if (fc.validation_file or fc.test_file) and fc.dataset not in ("csv", "tsv", "jsonl",
                                                                   "conll", "squad"):
        raise ConfigError(f"{source}: key finetune.validation_file / test_file only apply to "
                          f"file datasets, not finetune.dataset = {fc.dataset!r}")
    if fc.validation_fraction + fc.test_fraction >= 0.9:
        raise ConfigError(f"{source}: key finetune.validation_fraction + test_fraction = "
                          f"{fc.validation_fraction + fc.test_fraction} leaves too little to "
                          f"train on; keep the sum below 0.9")
    if fc.long_doc_aggregation != "none":
        if not task.windows or fc.text_pair_column:
            raise ConfigError(f"{source}: key finetune.long_doc_aggregation = "
                              f"{fc.long_doc_aggregation!r} applies to single-text "
                              f"classification only (finetune.task = {fc.task!r}"
                              f"{', text_pair_column set' if fc.text_pair_column else ''}); "
                              f"allowed there: none")
        if fc.window_stride > fc.max_seq_length - 2:
            raise ConfigError(f"{source}: key finetune.window_stride = {fc.window_stride} is "
                              f"longer than a window (finetune.max_seq_length - 2 = "
                              f"{fc.max_seq_length - 2} pieces), so text would be skipped; it "
                              f"must be >= 1 and <= {fc.max_seq_length - 2}")
    if not fc.recipe_learning_rates:
        raise ConfigError(f"{source}: key finetune.recipe_learning_rates is empty; give the "
                          f"learning rates recipe auto tries, e.g. "
                          f"finetune.recipe_learning_rates='[2e-5, 5e-5, 1e-4, 3e-4]'")
    for rate in fc.recipe_learning_rates:
        try:
            value = float(rate)
        except ValueError:
            value = math.nan
        if not 0.0 < value <= 0.01:  # finetune.learning_rate's range (NaN fails too)
            raise ConfigError(f"{source}: key finetune.recipe_learning_rates item {rate!r} is not "
                              f"a learning rate; each must be a number > 0 and <= 0.01 "
                              f"(e.g. [2e-5, 5e-5, 1e-4, 3e-4])")
    for item in fc.sweep:
        key, _, values = item.partition("=")
        if not values or key.strip() not in {f.name for f in dataclasses.fields(FinetuneConfig)}:
            raise ConfigError(f"{source}: key finetune.sweep item {item!r} must look like "
                              f"KEY=V1,V2 with KEY a finetune key (e.g. learning_rate=1e-4,3e-4)")


# The ranges people use (Devlin et al. 2019, appendix A.3; Google's small-BERT README for
# models below BERT-Base). Values outside them are allowed, with a warning.
FINETUNE_USUAL = {
    "learning_rate": (1e-5, 3e-4, ("BERT-Base/Large use 2e-5..5e-5; Google's small BERTs "
                                   "3e-5..3e-4")),
    "batch_size": (8, 128, "16..128"),
    "epochs": (2, 10, "2..10 (4 for Google's small BERTs)"),
    "warmup_fraction": (0.0, 0.2, "0..0.2 (BERT: 0.1)"),
}


def finetune_warnings(config: Config) -> list[str]:
    """Hyperparameters outside the usual BERT fine-tuning ranges (allowed, but worth a look)."""
    out = []
    for key, (low, high, usual) in FINETUNE_USUAL.items():
        value = getattr(config.finetune, key)
        if not low <= value <= high:
            out.append(f"finetune.{key} = {value} is outside the usual range ({usual})")
    return out


# Multi-task fine-tuning: the tasks whose class says `multitask` (a per-batch loss on one
# text or pair); the keys shared by all tasks (one encoder, one optimizer, one schedule)
# cannot be set per task.


MULTITASK_SHARED_KEYS = ("init_from", "vocab_file", "freeze", "trainable_last_n", "learning_rate",
                         "epochs", "max_steps", "warmup_fraction", "weight_decay", "clipnorm",
                         "seed", "sweep", "register_model", "registered_model", "name")


MULTITASK_OWN_KEYS = ("name", "weight", "sampling_ratio")


@dataclass
class MultitaskTask:
    name: str
    weight: float
    sampling_ratio: float
    finetune: FinetuneConfig  # the `finetune` section with this task's keys applied


def multitask_tasks(config: Config, source: str = "<config>") -> list[MultitaskTask]:
    """The entries of `multitask.tasks`, checked, each with its own FinetuneConfig."""
    out, seen = [], set()
    finetune_keys = {f.name for f in dataclasses.fields(FinetuneConfig)}
    for i, entry in enumerate(config.multitask.tasks):
        where = f"multitask.tasks[{i}]"
        name = entry.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", name or ""):
            raise ConfigError(f"{source}: key {where}.name = {name!r} is not allowed; give each "
                              f"task a name of letters, digits, _ or - (it prefixes its metrics)")
        if name in seen:
            raise ConfigError(f"{source}: key {where}.name = {name!r} is used twice; task names "
                              f"must be unique")
        seen.add(name)
        where = f"multitask.tasks[{i}] ({name})"
        unknown = sorted(set(entry) - finetune_keys - set(MULTITASK_OWN_KEYS))
        shared = sorted((set(entry) & set(MULTITASK_SHARED_KEYS)) - set(MULTITASK_OWN_KEYS))
        if unknown:
            raise ConfigError(f"{source}: key {where}.{unknown[0]} is unknown; allowed: "
                              f"{', '.join(MULTITASK_OWN_KEYS)} and the finetune data keys "
                              f"(task, dataset, train_file, max_examples, max_seq_length, ...)")
        if shared:
            raise ConfigError(f"{source}: key {where}.{shared[0]} cannot differ per task (one "
                              f"encoder, one optimizer); set finetune.{shared[0]} instead")
        weight = _coerce(entry.get("weight", 1.0), float, f"{where}.weight", source)
        ratio = _coerce(entry.get("sampling_ratio", 1.0), float, f"{where}.sampling_ratio", source)
        if weight < 0:
            raise ConfigError(f"{source}: key {where}.weight = {weight} is out of range; it must "
                              f"be >= 0 (0 trains nothing through this task's loss)")
        if ratio <= 0:
            raise ConfigError(f"{source}: key {where}.sampling_ratio = {ratio} is out of range; "
                              f"it must be > 0")
        raw = {**to_dict(config)["finetune"],
               **{k: v for k, v in entry.items() if k not in MULTITASK_OWN_KEYS}}
        fc = _build(FinetuneConfig, raw, f"{where}.", source)
        fc = dataclasses.replace(fc, name=name)
        allowed = [name for name in task_registry.names()
                   if task_registry.lookup(name).multitask]
        if not _task_class(fc, source).multitask:
            raise ConfigError(f"{source}: key {where}.task = {fc.task!r} is not allowed in "
                              f"multi-task training; choose one of: {', '.join(allowed)}")
        task_config = dataclasses.replace(config, finetune=fc)
        try:
            _check_declared(task_config, "", "finetune.")
            _validate_finetune(task_config, "")
        except ConfigError as err:
            message = str(err).lstrip(": ").replace("finetune.", f"{where}.")
            raise ConfigError(f"{source}: {message}") from None
        out.append(MultitaskTask(name, weight, ratio, fc))
    return out


def _validate_multitask(config: Config, source: str) -> None:
    tasks = multitask_tasks(config, source)
    if tasks and sum(t.weight for t in tasks) <= 0:
        raise ConfigError(f"{source}: key multitask.tasks: every weight is 0; give at least one "
                          f"task a weight > 0")


def _validate_distill(config: Config, source: str) -> None:
    dc = config.distill
    if dc.student_preset and dc.student_preset not in presets.PRESETS:
        raise ConfigError(f"{source}: key distill.student_preset = {dc.student_preset!r} is not "
                          f"allowed; choose one of: {', '.join(presets.PRESETS)} (or leave it "
                          f"empty for the teacher's sizes)")
    if dc.hidden_dim and dc.num_heads and dc.hidden_dim % dc.num_heads:
        raise ConfigError(f"{source}: key distill.num_heads = {dc.num_heads} does not divide "
                          f"distill.hidden_dim = {dc.hidden_dim}; choose a divisor")


# `bert-pipeline cycle` (pipeline/cycle.py): the tasks it fine-tunes, and its overrides.
CYCLE_TASK_KEYS = ("config", "name", "metric", "registered_model", "overrides")


@dataclass
class CycleTask:
    name: str  # --task NAME, and the cycle's file names for it
    config: str  # a finetune config file (or a shipped config's name): its finetune section
    metric: str  # the test metric that decides promotion ("": the task's own)
    registered_model: str  # "": the task config's finetune.registered_model, else bert-<name>
    overrides: list  # finetune.key=value items applied on top of the file's finetune section


def cycle_tasks(config: Config, source: str = "<config>") -> list[CycleTask]:
    """The entries of `cycle.tasks` and `cycle.continued`, checked (not yet the files they name:
    `bert-pipeline cycle` loads those before it trains anything)."""
    for item in config.cycle.continued:
        if not re.fullmatch(r"[a-z_]+\.[a-z_.]+=.*", item):
            raise ConfigError(f"{source}: key cycle.continued item {item!r} is not a "
                              f"section.key=value override (e.g. train.learning_rate=0.0003)")
    out, seen = [], set()
    for i, entry in enumerate(config.cycle.tasks):
        where = f"cycle.tasks[{i}]"
        unknown = sorted(set(entry) - set(CYCLE_TASK_KEYS))
        if unknown:
            raise ConfigError(f"{source}: unknown key {where}.{unknown[0]}; allowed: "
                              f"{', '.join(CYCLE_TASK_KEYS)}")
        path = entry.get("config")
        if not isinstance(path, str) or not path.strip():
            raise ConfigError(f"{source}: key {where}.config is missing; give the finetune config "
                              f"file of the task (e.g. configs/finetune_brown.yaml)")
        name = str(entry.get("name") or Path(path).stem)
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in seen:
            raise ConfigError(f"{source}: key {where}.name = {name!r} is "
                              f"{'used twice' if name in seen else 'not allowed'}; give each "
                              f"task a unique name of letters, digits, _, . or -")
        seen.add(name)
        overrides = _coerce(entry.get("overrides", []), list, f"{where}.overrides", source)
        bad = [o for o in overrides if not re.fullmatch(r"finetune\.[a-z_]+=.*", o)]
        if bad:
            raise ConfigError(f"{source}: key {where}.overrides item {bad[0]!r} is not a "
                              f"finetune.key=value override (e.g. finetune.epochs=2)")
        out.append(CycleTask(name, path, str(entry.get("metric") or ""),
                             str(entry.get("registered_model") or ""), overrides))
    return out
