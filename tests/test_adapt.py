"""`python -m pipeline adapt` (pipeline/adapt.py): task-adaptive pretraining on the text of the
task's training split only, then fine-tuning from that model, as one command; bad input is one
line and exit 2. The checkpoint is a tiny encoder-only Hugging Face directory written here."""

from __future__ import annotations

import json
import random

import mlflow
import pytest
import yaml

from pipeline import artifacts, cli
from tests.conftest import WORDS
from tests.test_init_from import write_checkpoint


def _task(tmp_path, **finetune) -> str:
    rng = random.Random(0)
    rows = ["text,label"] + [
        f"the {rng.choice(['cat', 'dog'] if i % 2 else ['house', 'tree'])} sat near the "
        f"{rng.choice(WORDS)} {i}.,{'animal' if i % 2 else 'place'}" for i in range(60)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    section = {"task": "classification", "dataset": "csv",
               "train_file": str(tmp_path / "train.csv"), "name": "topic",
               "max_seq_length": 16, "batch_size": 8, "epochs": 1, "baselines": False,
               "register_model": False, **finetune}
    path = tmp_path / "topic.yaml"
    path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"), "finetune": section,
                                    "tracking": {"tracking_uri":
                                                 f"sqlite:///{tmp_path}/mlflow.db"}}))
    return str(path)


@pytest.mark.slow
def test_adapt_pretrains_on_the_training_split_only_then_fine_tunes_from_it(tmp_path, capsys):
    checkpoint = write_checkpoint(tmp_path / "published", heads=False)
    config = _task(tmp_path, init_from=str(checkpoint))
    try:
        assert cli.main(["adapt", "--config", config, "--pretrain-config",
                         "configs/test_tiny.yaml", "--pretrain", "train.steps=4"]) == 0
    finally:
        mlflow.set_tracking_uri(None)
    out = capsys.readouterr().out
    folder = tmp_path / "run" / "tapt" / "topic"
    corpus = [json.loads(line)["text"] for line in
              (folder / "task_text" / "train.jsonl").read_text().splitlines()]
    splits = json.loads(artifacts.Artifacts(tmp_path / "run").finetune("topic").splits
                        .read_text())
    # The corpus is the training split's text (each row ends with its number), and none of
    # validation's or test's: the rows the finetune stage's splits.json puts in train.
    numbers = sorted(int(t.rsplit(" ", 1)[1].rstrip(".")) for t in corpus)
    train_rows = sorted(int(g.rsplit(":", 1)[1]) - 2 for g in splits["split"]["groups"]["train"])
    assert numbers == train_rows and len(numbers) == splits["counts"]["train"] < 60
    # Continued from the checkpoint, then the task fine-tuned from the adapted model.
    adapted = artifacts.Artifacts(folder)
    assert adapted.model_keras.is_file()
    assert adapted.vocab_file.read_text() == (checkpoint / "vocab.txt").read_text()
    info = json.loads(artifacts.Artifacts(tmp_path / "run").finetune("topic").task_json
                      .read_text())
    assert info["init_from"] == str(adapted.model_keras)
    assert f"adapt: {len(corpus)} training examples of {config}" in out


def test_adapt_without_a_model_or_text_is_one_line_and_exit_2(tmp_path, capsys):
    assert cli.main(["adapt", "--config", _task(tmp_path)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "finetune.init_from is empty" in err[0]
    config = _task(tmp_path, init_from=str(tmp_path), text_column="missing")
    assert cli.main(["adapt", "--config", config]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing" in err[0], err
