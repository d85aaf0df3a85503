"""Bad input, counted (docs/troubleshooting.md, Bad inputs): each row of BAD_INPUTS is a bad corpus, vocabulary,
config, labelled file, checkpoint or command-line value given to a run directory whose stages
all completed. Each gets exit 2 and one line on the console naming the file or key (no
traceback there: it is in the run's log file), and nothing in the run directory changes."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from conftest import make_corpus
from pipeline import cli


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


def _evil_keras(path: Path) -> Path:
    import keras

    inputs = keras.Input((2,))
    outputs = keras.layers.Lambda(lambda x: x * 2.0)(inputs)
    keras.Model(inputs, outputs).save(path)
    return path


ROWS = "text,label\n" + "".join(f"A {w} sat here,{'pos' if i % 2 else 'neg'}\n"
                                 for i, w in enumerate(["cat", "dog", "bird", "fish"] * 10))


def _csv(tmp, body=ROWS):
    return ["finetune", "finetune.dataset=csv",
            f"finetune.train_file={_write(tmp / 'train.csv', body)}"]


# (name, argv builder given a scratch folder, what the one line must name)
BAD_INPUTS = [
    # Configs and command-line values.
    ("unknown config key", lambda t: ["pretrain", "train.stepz=5"], "train.stepz"),
    ("value of the wrong type", lambda t: ["pretrain", "train.steps=many"], "train.steps"),
    ("value out of range", lambda t: ["pretrain", "train.learning_rate=-0.1"],
     "train.learning_rate"),
    ("value not among the choices", lambda t: ["pretrain", "train.optimizer=sgd"],
     "train.optimizer"),
    ("override without '='", lambda t: ["pretrain", "train.steps"], "train.steps"),
    ("warmup longer than training", lambda t: ["pretrain", "train.warmup_steps=100"],
     "train.warmup_steps"),
    ("more predictions than fit in a sequence",
     lambda t: ["data", "data.max_predictions_per_seq=40"], "data.max_predictions_per_seq"),
    ("time-budget decay without a budget", lambda t: ["pretrain", "train.decay_over=max_seconds"],
     "train.decay_over"),
    ("unknown stage", lambda t: ["pretrian"], "pretrian"),
    ("config file missing", lambda t: ["pretrain", "--config", str(t / "nope.yaml")],
     "nope.yaml"),
    ("config file not YAML", lambda t: ["pretrain", "--config", str(
        _write(t / "broken.yaml", "train: [steps: 5\n"))], "broken.yaml"),
    ("config section not a mapping", lambda t: ["pretrain", "--config", str(
        _write(t / "flat.yaml", "train: 5\n"))], "train"),
    # Corpora.
    ("corpus file not UTF-8", lambda t: ["corpus", "--force", "corpus.path=" + str(
        _write(t / "bad.txt", b"A good line .\n\xff\xfe not UTF-8 .\n"))], "bad.txt"),
    ("blank corpus", lambda t: ["corpus", "--force", "corpus.path=" + str(
        _write(t / "blank.txt", "\n\n  \n"))], "blank.txt"),
    ("corpus glob matching nothing",
     lambda t: ["corpus", "--force", f"corpus.path={t / 'nothing' / '*.txt'}"], "nothing"),
    ("corpus line over corpus.max_line_chars", lambda t: ["corpus", "--force", "corpus.path=" + str(
        _write(t / "long.txt", "word " * 5000 + "\n")), "corpus.max_line_chars=1000"],
     "long.txt"),
    # Vocabularies.
    ("vocab with a duplicate token", lambda t: ["vocab", "--force", "vocab.from_file=" + str(
        _write(t / "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nthe\n"))], "duplicate"),
    ("vocab without [MASK]", lambda t: ["vocab", "--force", "vocab.from_file=" + str(
        _write(t / "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n"))], "[MASK]"),
    ("vocab file missing", lambda t: ["vocab", "--force", f"vocab.from_file={t / 'none.txt'}"],
     "none.txt"),
    # Stages, data and checkpoints.
    ("TFRecords made for another sequence length", lambda t: ["pretrain", "data.max_seq_length=64"],
     "data.max_seq_length"),
    ("resuming checkpoints under other settings",
     lambda t: ["pretrain", "train.learning_rate=0.0005"], "train.learning_rate"),
    ("model.init_from not a model", lambda t: ["pretrain", "--force", "model.init_from=" + str(
        _write(t / "model.txt", "not a model"))], "model.init_from"),
    # Labelled files and fine-tuning models.
    ("labelled CSV without the label column",
     lambda t: [*_csv(t, "sentence,tag\nA cat,pos\n"), "finetune.text_column=sentence"], "label"),
    ("labelled file missing", lambda t: ["finetune", "finetune.dataset=csv",
                                         f"finetune.train_file={t / 'absent.csv'}"], "absent.csv"),
    ("JSON lines file with a broken line", lambda t: [
        "finetune", "finetune.dataset=jsonl", "finetune.train_file=" + str(
            _write(t / "train.jsonl", '{"text": "a", "label": "x"}\n{"text": "b",\n'))],
     "train.jsonl"),
    ("fine-tuning from a model file that is missing",
     lambda t: [*_csv(t), f"finetune.init_from={t / 'gone.keras'}"], "gone.keras"),
    ("fine-tuning from a .keras file carrying code (safe mode)",
     lambda t: [*_csv(t), f"finetune.init_from={_evil_keras(t / 'evil.keras')}"], "evil.keras"),
    # Raw-text corpora (corpus.format).
    ("corpus.format not among the choices", lambda t: ["corpus", "--force", "corpus.format=html"],
     "corpus.format"),
    ("JSON lines corpus with a line that is not JSON", lambda t: [
        "corpus", "--force", "corpus.format=jsonl", "corpus.path=" + str(
            _write(t / "docs.jsonl", '{"text": "A sentence."}\n{"text": \n'))], "docs.jsonl:2"),
    ("JSON lines corpus record without its text field", lambda t: [
        "corpus", "--force", "corpus.format=jsonl", "corpus.path=" + str(
            _write(t / "docs.jsonl", '{"text": "A sentence."}\n{"body": "B."}\n'))],
     "docs.jsonl:2"),
    ("corrupt .gz corpus file", lambda t: ["corpus", "--force", "corpus.format=text",
                                           "corpus.path=" + str(_write(
                                               t / "docs.txt.gz", b"\x1f\x8b\x08\x00 garbage"))],
     "docs.txt.gz"),
]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A run directory whose four stages completed (configs/test_tiny.yaml)."""
    root = tmp_path_factory.mktemp("made")
    make_corpus(root / "raw")
    assert cli.main(["all", "--config", "configs/test_tiny.yaml", *_run_args(root)]) == 0
    return root


def _run_args(root: Path) -> list[str]:
    return [f"run_dir={root / 'run'}", f"corpus.path={root / 'raw'}/*.txt",
            f"tracking.tracking_uri=sqlite:///{root / 'm.db'}", "tracking.register_encoder=false",
            "finetune.register_model=false"]


def _snapshot(run_dir: Path) -> dict:
    """Every file of the run directory and its bytes' digest (the logs and lock aside)."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()
            and p.relative_to(run_dir).parts[0] not in ("logs", ".pipeline.lock")}


def test_the_table_has_at_least_25_rows():
    assert len(BAD_INPUTS) >= 25 and len({name for name, _, _ in BAD_INPUTS}) == len(BAD_INPUTS)


@pytest.mark.parametrize("name,argv,names", BAD_INPUTS, ids=[row[0] for row in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(name, argv, names, made, tmp_path,
                                                           capsys):
    shutil.copytree(made / "run", tmp_path / "run", ignore=shutil.ignore_patterns("logs"))
    before = _snapshot(tmp_path / "run")
    args = argv(tmp_path)
    if "--config" not in args:
        args += ["--config", "configs/test_tiny.yaml"]
    keys = {a.split("=")[0] for a in args}
    base = [f"run_dir={tmp_path / 'run'}", f"corpus.path={made / 'raw'}/*.txt",
            f"tracking.tracking_uri=sqlite:///{tmp_path / 'm.db'}",
            "tracking.register_encoder=false", "finetune.register_model=false"]
    overrides = [a for a in base if a.split("=")[0] not in keys]
    capsys.readouterr()
    assert cli.main([*args, *overrides]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, (out + err)[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and names in errors[0], err[-2000:]
    assert _snapshot(tmp_path / "run") == before  # nothing overwritten, nothing added
    logs = list((tmp_path / "run" / "logs").glob("*.log"))  # where the details go, if anywhere
    assert all("error:" in log.read_text() for log in logs)


def _shard(run: Path) -> Path:
    return sorted((run / "data").glob("train-*.tfrecord"))[0]


@pytest.mark.parametrize("damage", ["truncated mid-record", "one byte altered"])
def test_a_damaged_shard_is_named_before_any_work(damage, made, tmp_path, capsys):
    """The data stage writes every shard's bytes, sha256 and record count last
    (data/checksums.json); the pretrain stage and the reuse of the data stage check them
    first: a damaged shard is exit 2 naming it and the command that rebuilds it."""
    import json

    from pipeline import artifacts

    shutil.copytree(made / "run", tmp_path / "run", ignore=shutil.ignore_patterns("logs"))
    run = tmp_path / "run"
    listed = json.loads((run / "data" / "checksums.json").read_text())["files"]
    shard = _shard(run)
    assert listed[shard.name]["records"] == artifacts.tfrecord_count(shard) > 0
    assert json.loads((run / "data" / "stats.json").read_text())["shards"][shard.name] == \
        listed[shard.name]  # stats.json records them too
    data = bytearray(shard.read_bytes())
    if damage == "truncated mid-record":
        shard.write_bytes(bytes(data[: len(data) - 7]))
        with pytest.raises(artifacts.AlteredArtifact, match="truncated"):
            artifacts.tfrecord_count(shard)
    else:
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    args = [f"run_dir={run}", f"corpus.path={made / 'raw'}/*.txt",
            f"tracking.tracking_uri=sqlite:///{tmp_path / 'm.db'}", "--config",
            "configs/test_tiny.yaml"]
    for stages in (["pretrain", "--force"], ["data"], ["all"]):
        capsys.readouterr()
        assert cli.main([*stages, *args]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines()
                  if line.startswith("error:")]
        assert len(errors) == 1 and shard.name in errors[0], errors
        assert "make data ARGS=--force" in errors[0]
    assert not list((run / "pretrain").glob("checkpoints.aside-*"))  # refused before --force acted


def _flip_a_byte(path: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


# (what is damaged, the file, the invocations that must refuse it, the rebuild command named)
DAMAGED_OUTPUTS = [
    ("a corpus file", lambda run: sorted((run / "corpus" / "train").glob("*.txt"))[0],
     [["corpus"], ["vocab", "--force"], ["data", "--force"]], "make corpus ARGS=--force"),
    ("the vocab", lambda run: run / "vocab" / "vocab.txt",
     [["vocab"], ["data", "--force"], ["all"]], "make vocab ARGS=--force"),
    ("the pretrained model", lambda run: run / "pretrain" / "model.keras",
     [["pretrain"], _csv], "make train ARGS=--force"),
]


@pytest.mark.parametrize("what,damaged,invocations,rebuild", DAMAGED_OUTPUTS,
                         ids=[row[0] for row in DAMAGED_OUTPUTS])
def test_every_stage_output_is_checked_before_it_is_used(what, damaged, invocations, rebuild,
                                                         made, tmp_path, capsys):
    """Each cached stage's output carries checksums.json (written last, before the stage's
    marker); reusing it, or running a stage that reads it, first checks it: an altered file is
    exit 2 naming it and the command that rebuilds it, and nothing in the run changes."""
    shutil.copytree(made / "run", tmp_path / "run", ignore=shutil.ignore_patterns("logs"))
    run = tmp_path / "run"
    for stage in ("corpus", "vocab", "pretrain"):
        assert (run / stage / "checksums.json").is_file()
    assert "checkpoints/" not in (run / "pretrain" / "checksums.json").read_text()
    path = _flip_a_byte(damaged(run))
    before = _snapshot(run)
    base = [f"run_dir={run}", f"corpus.path={made / 'raw'}/*.txt",
            f"tracking.tracking_uri=sqlite:///{tmp_path / 'm.db'}", "--config",
            "configs/test_tiny.yaml", "finetune.register_model=false"]
    for invocation in invocations:
        args = invocation(tmp_path) if callable(invocation) else invocation
        capsys.readouterr()
        assert cli.main([*args, *base]) == 2, args
        errors = [line for line in capsys.readouterr().err.splitlines()
                  if line.startswith("error:")]
        assert len(errors) == 1 and path.name in errors[0] and rebuild in errors[0], errors
        assert _snapshot(run) == before
