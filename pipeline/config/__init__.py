"""The pipeline's configuration: one declaration per key, loaded from YAML, validated on load.

    sections.py    the declaration: one dataclass per section (corpus, vocab, data, model,
                   train, tracking, finetune, multitask, distill, cycle), one `key(default,
                   help, ge/gt/le or choices)` per key; the `vocab` and `data` sections subclass
                   beam_jobs/settings.py, where the keys the Beam jobs read are declared (the
                   jobs' flags come from there too); flattening for MLflow, `dump_yaml`
    keys.py        reading the declaration: every key with its type, default, allowed values
                   or range and help (`declared`)
    allowed.py     CHOICES and RANGES, read from the declaration
    task_registry.py  finetune.task name -> task class (filled by pipeline/finetuning/tasks/)
    validation.py  `validate` (every choice and range, one range check, the rules that compare
                   keys), the phase, multi-task, fine-tuning and cycle rules
    parse.py       a section's raw mapping -> its dataclass, values coerced to their types
    load.py        `load(path, overrides)`: YAML + `section.key=value` overrides -> a
                   validated Config; `from_dict`
    checkpoint.py  model.init_from: the checkpoint's sizes, vocab and casing fill the config
    data_job.py    the Beam jobs' command lines from the config (by the declaration)
    show.py        `bert-pipeline config show [--defaults] | docs`
    reference.py   docs/configuration.md, generated (`make config-docs`)

    >>> config = load(None, ["train.steps=500"])
    >>> config.train.steps, config.model.preset
    (500, 'tiny')

Every bad value is a `ConfigError` naming the file, the key, the value and what is allowed.
"""

from pipeline.config.load import from_dict, load
from pipeline.config.sections import (
    Config,
    ConfigError,
    CorpusConfig,
    DataConfig,
    DistillConfig,
    FinetuneConfig,
    ModelConfig,
    MultitaskConfig,
    TrackingConfig,
    TrainConfig,
    VocabConfig,
    _build,
    _coerce,
    dump_yaml,
    get,
    model_architecture,
    to_dict,
    to_flat_dict,
    training_masks,
)
from pipeline.config.validation import (
    MultitaskTask,
    data_phases,
    finetune_warnings,
    multitask_tasks,
    train_phases,
    validate,
)

__all__ = [
    "Config", "ConfigError", "CorpusConfig", "DataConfig", "DistillConfig", "FinetuneConfig",
    "ModelConfig", "MultitaskConfig", "MultitaskTask", "TrackingConfig", "TrainConfig",
    "VocabConfig", "_build", "_coerce", "data_phases", "dump_yaml", "finetune_warnings",
    "from_dict", "get", "load", "model_architecture", "multitask_tasks", "to_dict",
    "to_flat_dict", "train_phases", "training_masks", "validate",
]
