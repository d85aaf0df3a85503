"""bench/bench_baselines.py: the baselines of a fine-tuning config's split, without a model,
on a small CSV task; a bad config exits 2 in one line."""

from __future__ import annotations

import random

from bench import bench_baselines


def test_prints_every_row_and_the_strongest_last(tmp_path, capsys):
    rng = random.Random(0)
    words = {"animal": "cat dog horse cow", "place": "city river hill town"}
    rows = ["text,label"] + [
        f"the {rng.choice(words[label].split())} and the {rng.choice(words[label].split())},{label}"
        for label in ("animal", "place") * 60]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "c.yaml").write_text(
        f"finetune:\n  task: classification\n  dataset: csv\n  train_file: {tmp_path}/t.csv\n")
    assert bench_baselines.main(["--config", str(tmp_path / "c.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("bench-baselines: CPU ") and "avx2" in out[0]
    assert any(line.strip().startswith("tfidf_svm") and "C=" in line for line in out)
    printed = {line.split()[0]: float(line.split()[2]) for line in out
               if line.startswith("  ") and " test " in line}
    assert set(printed) == {"majority", "bow_lr", "tfidf_lr", "tfidf_svm", "tfidf_char_svm"}
    *head, name, value = out[-1].split()
    assert head == ["bench-baselines:", f"{tmp_path}/c.yaml", "accuracy", "best"]
    assert float(value) == max(printed.values()) == printed[name]


def test_a_bad_config_exits_2(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("finetune:\n  task: classification\n  dataset: csv\n"
                                     f"  train_file: {tmp_path}/missing.csv\n")
    assert bench_baselines.main(["--config", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.csv" in err[0]
