"""The `data` section as the Beam job's command line and as the settings stats.json records.

Both come from one declaration, the fields of `beam_jobs.instances.InstanceSettings` (which
are also the job's flags), so a setting added there reaches the job from the config by name:
`data.<field>` becomes `--<field>`.

    >>> from pipeline.config import load
    >>> args = job_args(load(None), "corpus/train/*.txt", "vocab.txt", "out", "eval")
    >>> args[args.index("--seed") + 1], args[args.index("--num_shards") + 1]
    ('12346', '1')
"""

from __future__ import annotations

from beam_jobs.instances import INSTANCE_FLAGS
from pipeline.config.sections import Config
from pipeline.config.validation import data_phases


def _flag(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def instance_settings(config: Config) -> dict:
    """data.<field> for every field of InstanceSettings (the first phase's lengths)."""
    settings = {name: getattr(config.data, name) for name in INSTANCE_FLAGS}
    settings["max_seq_length"], settings["max_predictions_per_seq"] = data_phases(config)[0]
    return settings


def job_args(config: Config, input_glob: str, vocab_file: str, output_dir: str,
             split: str) -> list[str]:
    """The Beam job's command line for one split (beam_jobs/pretraining_data.py)."""
    dc = config.data
    values = {**{name: getattr(dc, name) for name in INSTANCE_FLAGS},
              # The held-out split gets its own seed so its masks differ from training's.
              "seed": dc.seed if split == "train" else dc.seed + 1,
              "num_shards": dc.num_shards if split == "train" else 1,
              "group_size_mb": dc.group_size_mb}
    args = ["--input", input_glob, "--output_dir", output_dir, "--split", split,
            "--vocab_file", vocab_file, "--lowercase", _flag(config.vocab.lowercase)]
    for name, value in values.items():
        args += [f"--{name}", _flag(value)]
    if dc.phases:
        args += ["--phases", ",".join(f"{s}:{p}" for s, p in data_phases(config))]
    return args + list(dc.beam_args)
