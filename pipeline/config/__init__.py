"""The pipeline's configuration: one declaration per key, loaded from YAML, validated on load.

    keys.py        what a key is: declared with `key(default, help, ge/gt/le or choices)`
                   (beam_jobs/settings.py's `setting`), read back as a `Key` with its type,
                   default, allowed values or range and help (`declared`), its raw value parsed
                   to its type, its range checked; `ConfigError`
    sections.py    the declaration: one dataclass per section (corpus, vocab, data, model,
                   train, tracking, finetune, multitask, distill, cycle), one `key(...)` per
                   key; the `vocab` and `data` sections subclass beam_jobs/settings.py, where
                   the keys the Beam jobs read are declared (the jobs' flags come from there
                   too); flattening for MLflow, `dump_yaml`
    load.py        `load(path, overrides)`: YAML + `section.key=value` overrides -> a Config
                   validated (every choice and range, the rules that compare keys: phases,
                   fine-tuning, multi-task, distillation, cycle); `from_dict`
    checkpoint.py  model.init_from: the checkpoint's sizes, vocab and casing fill the config
    task_registry.py  finetune.task name -> task class (filled by pipeline/finetuning/tasks/)
    data_job.py    the Beam jobs' command lines from the config (by the declaration)
    show.py        `bert-pipeline config show [--defaults] | docs`: the config as commented
                   YAML, docs/configuration.md (`make config-docs`)

    >>> config = load(None, ["train.steps=500"])
    >>> config.train.steps, config.model.preset
    (500, 'tiny')

Every bad value is a `ConfigError` naming the file, the key, the value and what is allowed.
"""

from pipeline.config.keys import ConfigError
from pipeline.config.load import (
    MultitaskTask,
    data_phases,
    finetune_warnings,
    from_dict,
    load,
    multitask_tasks,
    train_phases,
    validate,
)
from pipeline.config.sections import (
    Config,
    CorpusConfig,
    DataConfig,
    DistillConfig,
    FinetuneConfig,
    ModelConfig,
    MultitaskConfig,
    TrackingConfig,
    TrainConfig,
    VocabConfig,
    dump_yaml,
    get,
    model_architecture,
    to_dict,
    to_flat_dict,
    training_masks,
)

__all__ = [
    "Config", "ConfigError", "CorpusConfig", "DataConfig", "DistillConfig", "FinetuneConfig",
    "ModelConfig", "MultitaskConfig", "MultitaskTask", "TrackingConfig", "TrainConfig",
    "VocabConfig", "data_phases", "dump_yaml", "finetune_warnings", "from_dict", "get", "load",
    "model_architecture", "multitask_tasks", "to_dict", "to_flat_dict", "train_phases",
    "training_masks", "validate",
]
