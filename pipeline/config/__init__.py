"""The pipeline's configuration: dataclasses, loaded from YAML, validated on load.

    sections.py    one dataclass per section (corpus, vocab, data, model, train, tracking,
                   finetune, multitask, distill) with every key's default and meaning;
                   flattening for MLflow (`to_flat_dict`), `dump_yaml`
    allowed.py     what each key allows: its choices or its range
    validation.py  `validate` (every choice and range, one range check, cross-key rules),
                   the phase, multi-task and fine-tuning rules
    load.py        `load(path, overrides)`: YAML + `section.key=value` overrides -> a
                   validated Config; `from_dict`

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
