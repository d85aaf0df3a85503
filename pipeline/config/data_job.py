"""The Beam jobs' command lines made from the config, and the settings stats.json records.

The jobs' flags that are config keys are declared once, in beam_jobs/settings.py
(`VocabSettings`, `DataSettings`), which the config's `vocab` and `data` sections subclass:
`settings_args` turns a section into the job's flags by that declaration (`vocab.size` ->
`--vocab_size 8000`), so a key added there reaches the job from the config by name, with no
second list of flags here or in the stages.

    >>> from pipeline.config import load
    >>> args = job_args(load(None), "corpus/train/*.txt", "vocab.txt", "out", "eval")
    >>> args[args.index("--seed") + 1], args[args.index("--num_shards") + 1]
    ('12346', '1')
    >>> args = vocab_job_args(load(None, ["vocab.size=300"]), "corpus/*.txt", "vocab.txt")
    >>> args[args.index("--vocab_size") + 1]
    '300'
    >>> "--progress_dir" in args, runs_locally(load(None, ['data.beam_args=["--runner=PrismRunner"]']))
    (False, True)
"""

from __future__ import annotations

import dataclasses
import math
import os

from beam_jobs.instances import INSTANCE_FLAGS
from beam_jobs.settings import DataSettings, ProgressSettings, VocabSettings, flag_of
from pipeline.config.load import data_phases
from pipeline.config.sections import Config


def _flag(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def settings_args(settings_cls, section, names=None, **values) -> list[str]:
    """["--flag", "value", ...] for every field of `settings_cls` (or of `names`), the values
    from the config `section` (a subclass of it), or from `values` where given."""
    args = []
    for field in dataclasses.fields(settings_cls):
        if names is None or field.name in names:
            value = values[field.name] if field.name in values else getattr(section, field.name)
            args += [f"--{flag_of(settings_cls, field.name)}", _flag(value)]
    return args


def progress_args(progress_dir: str | None) -> list[str]:
    """The jobs' --progress_dir flag (beam_jobs/progress.py), none without a folder."""
    return settings_args(ProgressSettings, None, progress_dir=progress_dir) if progress_dir else []


def vocab_job_args(config: Config, input_glob: str, output: str,
                   input_bytes: int = 0, progress_dir: str | None = None) -> list[str]:
    """The vocab job's command line (beam_jobs/vocab.py): every vocab.* key it reads;
    `progress_dir`: where its workers tell their progress (only for `runs_locally`)."""
    return (["--input", input_glob, "--output", output]
            + settings_args(VocabSettings, config.vocab) + progress_args(progress_dir)
            + beam_args(config, input_bytes))


def instance_settings(config: Config) -> dict:
    """data.<field> for every field of InstanceSettings (the first phase's lengths)."""
    settings = {name: getattr(config.data, name) for name in INSTANCE_FLAGS}
    settings["max_seq_length"], settings["max_predictions_per_seq"] = data_phases(config)[0]
    return settings


# Runners whose workers data.workers sets (the others bring their own).
DIRECT_RUNNERS = ("DirectRunner", "FnApiRunner")


def _runner(beam_args: list) -> str:
    for i, arg in enumerate(beam_args):
        if arg.startswith("--runner="):
            return arg.split("=", 1)[1].rsplit(".", 1)[-1]
        if arg == "--runner" and i + 1 < len(beam_args):
            return beam_args[i + 1].rsplit(".", 1)[-1]
    return "DirectRunner"


def runs_directly(config: Config) -> bool:
    """Whether data.beam_args name a direct runner (whose processes data.workers sets)."""
    return _runner(list(config.data.beam_args)) in DIRECT_RUNNERS


def _environment(beam_args: list) -> str:
    for i, arg in enumerate(beam_args):
        if arg.startswith("--environment_type="):
            return arg.split("=", 1)[1].upper()
        if arg == "--environment_type" and i + 1 < len(beam_args):
            return beam_args[i + 1].upper()
    return ""


def runs_locally(config: Config) -> bool:
    """Whether the jobs' workers are threads or processes of this machine (a direct runner,
    Prism, or any runner with LOOPBACK workers), so that they can write progress files the
    stage reads (beam_jobs/progress.py). Dask, Flink, Spark, Dataflow: no."""
    args = list(config.data.beam_args)
    environment = _environment(args)
    if environment == "LOOPBACK":
        return True
    if environment in ("DOCKER", "EXTERNAL"):
        return False
    return _runner(args) in (*DIRECT_RUNNERS, "PrismRunner")


def workers(config: Config, input_bytes: int) -> int:
    """The direct runner's processes for a job reading `input_bytes` (data.workers; 0 = every
    core once the input holds two groups of data.group_size_mb, so that each process has a
    group to work on, else one). Measured on 2 cores (docs/scaling-out.md): starting the
    workers costs about 1.5 s, so 2 processes were 1 s slower on 6 MB, level on 24 MB and
    20% faster on 48 MB."""
    if config.data.workers:
        return config.data.workers
    groups = math.ceil(input_bytes / (config.data.group_size_mb * (1 << 20)))
    return min(os.cpu_count() or 1, groups) if groups >= 2 else 1


def beam_args(config: Config, input_bytes: int) -> list[str]:
    """data.beam_args, plus the multi-process direct runner's flags when `workers` says more
    than one process and the flags name a direct runner without choosing its workers."""
    args = list(config.data.beam_args)
    count = workers(config, input_bytes)
    chosen = any(a.startswith(("--direct_num_workers", "--direct_running_mode")) for a in args)
    if count > 1 and runs_directly(config) and not chosen:
        args += [f"--direct_num_workers={count}", "--direct_running_mode=multi_processing"]
    return args


def job_args(config: Config, input_glob: str, vocab_file: str, output_dir: str,
             split: str, input_bytes: int = 0, progress_dir: str | None = None) -> list[str]:
    """The Beam job's command line for one split (beam_jobs/pretraining_data.py);
    `progress_dir`: where its workers tell their progress (only for `runs_locally`)."""
    dc = config.data
    args = ["--input", input_glob, "--output_dir", output_dir, "--split", split,
            "--vocab_file", vocab_file,
            *settings_args(VocabSettings, config.vocab, names=("lowercase",)),
            # The held-out split gets its own seed so its masks differ from training's.
            *settings_args(DataSettings, dc, seed=dc.seed if split == "train" else dc.seed + 1,
                           num_shards=dc.num_shards if split == "train" else 1)]
    if dc.phases:
        args += ["--phases", ",".join(f"{s}:{p}" for s, p in data_phases(config))]
    return args + progress_args(progress_dir) + beam_args(config, input_bytes)
