"""Bad input: one line on the console (what, where, how to fix), exit 2, no traceback there; the
traceback is in the run's log file."""

from __future__ import annotations

import pytest

from pipeline import cli


def _case(name, tmp_path, corpus_dir):
    run = [f"run_dir={tmp_path / 'run'}", f"tracking.tracking_uri=sqlite:///{tmp_path / 'm.db'}"]
    if name == "non-UTF-8 file":
        (tmp_path / "bad.txt").write_bytes(b"A good line .\n\xff\xfe not UTF-8 .\n")
        return ["corpus", *run, f"corpus.path={tmp_path / 'bad.txt'}"], "bad.txt"
    if name == "blank corpus":
        (tmp_path / "blank.txt").write_text("\n\n  \n")
        return ["corpus", *run, f"corpus.path={tmp_path / 'blank.txt'}"], "blank.txt"
    if name == "glob matching nothing":
        return ["corpus", *run, f"corpus.path={tmp_path / 'nothing' / '*.txt'}"], "nothing"
    if name == "duplicate vocab tokens":
        (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nthe\n")
        return ["corpus", "vocab", *run, f"corpus.path={corpus_dir}/*.txt",
                f"vocab.from_file={tmp_path / 'vocab.txt'}"], "duplicate"
    (tmp_path / "train.csv").write_text("sentence,tag\nA cat,pos\nA dog,neg\n")
    return ["finetune", *run, "finetune.dataset=csv", f"finetune.train_file={tmp_path / 'train.csv'}",
            "finetune.text_column=sentence"], "label"


@pytest.mark.parametrize("name", ["non-UTF-8 file", "blank corpus", "glob matching nothing",
                                  "duplicate vocab tokens", "CSV without the label column"])
def test_bad_input_is_one_line_and_exit_2(name, tmp_path, corpus_dir, capsys):
    argv, names = _case(name, tmp_path, corpus_dir)
    assert cli.main([*argv, "--config", "configs/test_tiny.yaml"]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, (out + err)[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and names in errors[0], err[-2000:]
    logs = list((tmp_path / "run" / "logs").glob("*.log"))
    assert logs and "Traceback" in logs[0].read_text()  # the details, for whoever debugs it
