import json

import pytest

from pipeline import config as config_lib
from pipeline.config import ConfigError
from pipeline.config.keys import declared


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_defaults_and_shipped_configs_load():
    config = config_lib.load("configs/pretrain_tiny.yaml")
    assert config.model.preset == "tiny"
    assert config_lib.model_architecture(config)["hidden_dim"] == 128
    for name in ("pretrain_base.yaml", "pretrain_large.yaml", "test_tiny.yaml",
                 "pretrain_tiny_paper.yaml"):
        config_lib.load(f"configs/{name}")


def test_overrides_are_typed_and_applied(tmp_path):
    config = config_lib.load(write(tmp_path, "train:\n  steps: 1000\n"),
                             ["train.steps=2000", "model.preset=mini", "vocab.lowercase=false"])
    assert config.train.steps == 2000 and config.model.preset == "mini"
    assert config.vocab.lowercase is False
    flat = config_lib.to_flat_dict(config)
    assert flat["train.steps"] == 2000 and "data.beam_args" in flat


@pytest.mark.parametrize("text, words", [
    ("model:\n  num_heads: 5\n", ["model.num_heads", "5", "divisible"]),
    ("data:\n  max_seq_length: 1024\n", ["data.max_seq_length", "1024", "position table"]),
    ("train:\n  strategy: gpu\n", ["train.strategy", "'gpu'", "mirrored"]),
    ("train:\n  steps: many\n", ["train.steps", "'many'", "integer"]),
    ("train:\n  stepz: 3\n", ["stepz", "allowed keys", "steps"]),
    ("data:\n  masked_lm_prob: 1.5\n", ["data.masked_lm_prob", "1.5", "<= 1.0"]),
    ("corpus:\n  source: files\n", ["corpus.path", "files"]),
])
def test_bad_values_name_key_value_and_allowed(tmp_path, text, words):
    with pytest.raises(ConfigError) as info:
        config_lib.load(write(tmp_path, text))
    message = str(info.value)
    assert str(tmp_path / "c.yaml") in message
    for word in words:
        assert word in message, (word, message)


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        config_lib.load(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="section.key=value"):
        config_lib.load(None, ["train.steps"])


def test_dump_round_trips(tmp_path):
    config = config_lib.load(None, ["train.steps=700"])
    path = write(tmp_path, config_lib.dump_yaml(config))
    assert config_lib.load(path) == config


def test_exponent_floats_from_the_command_line():
    config = config_lib.load(None, ["train.learning_rate=1e-4", "train.steps=2000"])
    assert config.train.learning_rate == 1e-4
    with pytest.raises(ConfigError, match="train.learning_rate = 'fast' is not a number"):
        config_lib.load(None, ["train.learning_rate=fast"])


def test_data_workers_choose_the_direct_runners_processes(monkeypatch):
    """data.workers 0 (auto): every core once a job's input holds two groups, one process
    below; N: N processes; only for direct runners, and never over flags the user gave."""
    from pipeline.config import data_job

    monkeypatch.setattr(data_job.os, "cpu_count", lambda: 2)
    mb = 1 << 20
    auto = config_lib.load(None, ["data.group_size_mb=4"])
    multi = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    assert data_job.beam_args(auto, 4 * mb) == ["--runner=DirectRunner"]  # one group
    assert data_job.beam_args(auto, 4 * mb + 1) == ["--runner=DirectRunner", *multi]
    assert data_job.workers(auto, 400 * mb) == 2  # at most the cores
    three = config_lib.load(None, ["data.workers=3"])
    assert data_job.beam_args(three, 0)[-2:] == ["--direct_num_workers=3",
                                                 "--direct_running_mode=multi_processing"]
    one = config_lib.load(None, ["data.workers=1"])
    assert data_job.beam_args(one, 400 * mb) == ["--runner=DirectRunner"]
    for given in (['--runner=DaskRunner'], ["--runner", "DataflowRunner"],
                  ["--runner=DirectRunner", "--direct_num_workers=1"]):
        config = config_lib.load(None, ["data.beam_args=" + json.dumps(given)])
        assert data_job.beam_args(config, 400 * mb) == given
    job = data_job.job_args(auto, "in/*.txt", "vocab.txt", "out", "train", 9 * mb)
    assert job[-2:] == multi
    with pytest.raises(ConfigError, match="data.workers"):
        config_lib.load(None, ["data.workers=-1"])



KEYS = declared(config_lib.Config)
RANGED = sorted(name for name, key in KEYS.items() if key.range())
CHOSEN = sorted(name for name, key in KEYS.items() if key.choices)


def _step(key) -> float | int:
    return 0.5 if key.type is float else 1


@pytest.mark.parametrize("name", RANGED)
def test_every_declared_range_is_checked_with_its_message(name):
    """Each key's range comes from its declaration alone: just below it (and above its top,
    where it has one) is refused in the one-line format; the bound itself is accepted."""
    key = KEYS[name]
    low, high, inclusive = key.range()
    below = low - _step(key) if inclusive else low
    with pytest.raises(ConfigError) as info:
        config_lib.load(None, [f"{name}={below!r}"])
    assert str(info.value) == (f"<defaults>: key {name} = {below!r} is out of range; it must be "
                               f"{key.range_text()}")
    if high is not None:
        with pytest.raises(ConfigError, match=f"key {name} = .* is out of range"):
            config_lib.load(None, [f"{name}={high + _step(key)!r}"])


@pytest.mark.parametrize("name", CHOSEN)
def test_every_declared_choice_is_checked_with_its_message(name):
    choices = KEYS[name].choices
    with pytest.raises(ConfigError) as info:
        config_lib.load(None, [f"{name}=nope"])
    assert str(info.value) == (f"<defaults>: key {name} = 'nope' is not allowed; choose one of: "
                               f"{', '.join(choices)}")
