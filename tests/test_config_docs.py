"""One declaration per config key (pipeline/config/sections.py, beam_jobs/settings.py), and what
comes from it: docs/configuration.md (generated; stale = a failure), `bert-pipeline config show`
and the Beam jobs' flags (no second definition with defaults of its own)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import yaml

from beam_jobs import pretraining_data, settings
from pipeline import config as config_lib
from pipeline.config import data_job, show
from pipeline.config.keys import declared, sections
from pipeline.config.sections import Config, DataConfig, VocabConfig

ROOT = Path(__file__).resolve().parents[1]
KEYS = declared(Config)
# The job flags that are config keys: flag -> key.
JOB_FLAGS = {f"--{settings.flag_of(cls, f.name)}": f"{section}.{f.name}"
             for cls, section in ((settings.VocabSettings, "vocab"), (settings.DataSettings, "data"))
             for f in dataclasses.fields(cls)}


def test_the_reference_page_is_generated_and_current():
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == show.markdown(), (
        "docs/configuration.md is stale: the key declarations changed; run `make config-docs` "
        "(python -m pipeline config docs --output docs/configuration.md) and commit it")
    for name, key in KEYS.items():  # every key has its row, with its default
        assert f"| `{name}` | {key.type_text()} | `{show.value_text(key.default)}` |" in page
    for title in ("## Two-phase pretraining", "## Your own corpus", "### Training keys"):
        assert title in page  # anchors other pages link to


def test_every_key_has_a_one_line_help_a_known_type_and_a_valid_default():
    assert len(KEYS) > 150
    for name, key in KEYS.items():
        assert key.help and "\n" not in key.help and len(key.help) < 400, name
        assert key.type_text() in ("int", "float", "bool", "string", "list",
                                   "list of mappings", "int or null"), name
    defaults = config_lib.to_flat_dict(config_lib.load(None))  # the defaults pass validation
    assert set(defaults) == set(KEYS)
    # A key whose values a rule checks says so in words: the docs show them.
    assert "question_answering" in KEYS["finetune.task"].allowed_text()
    assert "cola" in KEYS["finetune.glue_task"].allowed_text()


def _sections_of(text: str) -> dict:
    """{dotted key: (its comment text, unwrapped)} of `config show`'s YAML."""
    out, comment, section = {}, [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            comment = []
        elif stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
        elif stripped.endswith(":") and not line.startswith(" "):
            section, comment = stripped[:-1], []
        else:
            name = stripped.split(":", 1)[0]
            out[f"{section}.{name}" if line.startswith(" ") else name] = " ".join(comment)
            comment = []
    return out


def test_config_show_is_the_effective_config_with_each_keys_help(tmp_path, capsys):
    args = ["config", "show", "--config", "configs/test_tiny.yaml", "train.steps=77",
            "vocab.size=300"]
    assert show.main(args) == 0
    text = capsys.readouterr().out
    config = config_lib.load("configs/test_tiny.yaml", ["train.steps=77", "vocab.size=300"])
    assert yaml.safe_load(text) == config_lib.to_dict(config)
    comments = _sections_of(text)
    assert set(comments) == set(KEYS)
    for name, key in KEYS.items():
        assert comments[name].startswith(key.help), name
    assert "default: 8000" in comments["vocab.size"] and ">= 10" in comments["vocab.size"]
    assert "default:" not in comments["model.activation"]  # where it is the default
    saved = tmp_path / "shown.yaml"  # the output is a config file giving the same config
    saved.write_text(text)
    assert config_lib.load(saved) == config

    assert show.main(["config", "show", "--defaults"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == dataclasses.asdict(Config())


@pytest.mark.parametrize("args, words", [
    (["show", "train.stepz=3"], ["key train.stepz", "did you mean train.steps"]),
    (["show", "vocab.size=5"], ["key vocab.size = 5 is out of range", ">= 10"]),
    (["show", "--config", "nope.yaml"], ["nope.yaml not found"]),
    (["show", "--defaults", "train.steps=3"], ["drop --defaults"]),
    ([], ["choose a command"]),
])
def test_config_show_refuses_bad_input_in_one_line(args, words, capsys):
    assert show.main(["config", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    for word in words:
        assert word in captured.err


def test_config_docs_writes_the_page_whole(tmp_path, capsys):
    target = tmp_path / "configuration.md"
    assert show.main(["config", "docs", "--output", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == show.markdown()
    assert [p.name for p in tmp_path.iterdir()] == ["configuration.md"]  # nothing left aside
    assert show.main(["config", "docs"]) == 0
    assert capsys.readouterr().out == show.markdown()


def _add_argument_calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
                and node.args and isinstance(node.args[0], ast.Constant)):
            yield node.args[0].value


def test_no_beam_job_declares_a_config_backed_flag_of_its_own():
    """The vocab and data jobs' flags that are config keys come from the declaration
    (settings.add_flags): no add_argument names them, so none has a default of its own; and the
    code that launches the jobs does not spell them out (data_job makes their command lines
    from the same declaration)."""
    assert {"--vocab_size", "--lowercase", "--max_seq_length", "--objective"} <= set(JOB_FLAGS)
    for path in sorted((ROOT / "beam_jobs").glob("*.py")):
        for flag in _add_argument_calls(path):
            assert flag not in JOB_FLAGS, f"{path.name} declares {flag} ({JOB_FLAGS[flag]}) again"
    spelled = []  # in the jobs, and where the pipeline launches them
    for folder in ("beam_jobs", "pipeline/stages", "pipeline/config"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value in JOB_FLAGS:
                    spelled.append(f"{path.relative_to(ROOT)}: {node.value}")
    assert not spelled, spelled


def test_the_config_sections_are_the_jobs_declaration_not_a_copy():
    """vocab.* and data.*'s job keys are declared once (beam_jobs/settings.py): the config's
    sections inherit those fields, they do not declare them again."""
    for config_cls, job_cls in ((VocabConfig, settings.VocabSettings),
                                (DataConfig, settings.DataSettings)):
        assert issubclass(config_cls, job_cls)
        own = {node.target.id for node in ast.walk(ast.parse(
            (ROOT / "pipeline/config/sections.py").read_text(encoding="utf-8")))
            if isinstance(node, ast.ClassDef) and node.name == config_cls.__name__
            for node in node.body if isinstance(node, ast.AnnAssign)}
        assert not own & {f.name for f in dataclasses.fields(job_cls)}, config_cls.__name__
    assert sections(Config)["vocab"] is VocabConfig


def test_the_jobs_take_every_key_from_the_config_and_its_range(tmp_path):
    config = config_lib.load("configs/test_tiny.yaml", [
        "vocab.size=321", "vocab.lowercase=false", "vocab.max_words=77", "data.objective=sop",
        "data.masked_lm_prob=0.2", "data.num_shards=3", "data.group_size_mb=2.5"])
    vocab_args = data_job.vocab_job_args(config, "in/*.txt", "out/vocab.txt")
    pairs = dict(zip(vocab_args[::2], vocab_args[1::2]))
    for field in dataclasses.fields(settings.VocabSettings):
        flag = f"--{settings.flag_of(settings.VocabSettings, field.name)}"
        assert pairs[flag] == data_job._flag(getattr(config.vocab, field.name)), flag
    for path in (tmp_path / "in.txt", tmp_path / "vocab.txt"):
        path.write_text("x\n")
    args, _ = pretraining_data.parse_args(data_job.job_args(
        config, str(tmp_path / "in.txt"), str(tmp_path / "vocab.txt"), str(tmp_path / "o"),
        "train"))
    for field in dataclasses.fields(settings.DataSettings):
        assert getattr(args, field.name) == getattr(config.data, field.name), field.name
    assert args.lowercase is False
    # Without the flags (the job run by hand) the declaration's defaults, and its ranges.
    args, _ = pretraining_data.parse_args(["--input", str(tmp_path / "in.txt"), "--output_dir",
                                           str(tmp_path / "o"), "--vocab_file",
                                           str(tmp_path / "vocab.txt")])
    defaults = Config()
    assert {f.name: getattr(args, f.name) for f in dataclasses.fields(settings.DataSettings)} \
        == {f.name: getattr(defaults.data, f.name)
            for f in dataclasses.fields(settings.DataSettings)}
    for bad in (["--max_seq_length", "7"], ["--masked_lm_prob", "0"], ["--phases", "128:20,6:2"],
                ["--objective", "mlp"]):
        with pytest.raises(SystemExit) as info:
            pretraining_data.parse_args(["--input", str(tmp_path / "in.txt"), "--output_dir",
                                         str(tmp_path / "o"), "--vocab_file",
                                         str(tmp_path / "vocab.txt"), *bad])
        assert info.value.code == 2


def test_beam_side_copies_agree_with_the_declaration():
    """Values other modules still hold beside the declaration (beam_jobs/instances.py, reading.py
    are not derived from it yet): they must not drift from it."""
    from beam_jobs import instances, reading

    data = {f.name: f for f in dataclasses.fields(settings.DataSettings)}
    for field in dataclasses.fields(instances.InstanceSettings):
        assert field.default == data[field.name].default, field.name
    assert instances.OBJECTIVES == data["objective"].metadata["choices"]
    assert instances.MASKINGS == data["masking"].metadata["choices"]
    assert reading.INPUT_FORMATS == settings.INPUT_FORMATS == KEYS["corpus.format"].choices
