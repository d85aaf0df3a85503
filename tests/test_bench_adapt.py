"""bench/bench_adapt.py's own helpers: the last line, the median/spread and the goals on given
numbers, the DAPT corpus (training-split documents only, checked against the finetune stage's
split of configs/finetune_brown.yaml), the fine-tuning command's recipe and the one-line
refusals of bad arguments. The bench itself (`make bench-adapt`, ~1 hour) is not run here."""

import pytest

from bench import bench_adapt as bench
from bench.finetune_data import BROWN


def test_last_line_format():
    medians = {"direct": 0.61234, "dapt": 0.6, "tapt": 0.625, "dapt+tapt": 0.63}
    assert bench.last_line(medians, 0.6164) == (
        "bench-adapt: direct 0.6123 dapt 0.6000 tapt 0.6250 dapt+tapt 0.6300 "
        "best-baseline 0.6164")
    assert bench.last_line({"direct": 0.5}, None) == (
        "bench-adapt: direct 0.5000 dapt n/a tapt n/a dapt+tapt n/a best-baseline n/a")


def test_spread_is_median_min_max():
    assert bench.spread([0.6, 0.5, 0.7]) == {"median": 0.6, "min": 0.5, "max": 0.7, "n": 3}
    assert bench.spread([0.5, 0.7])["median"] == pytest.approx(0.6)
    assert bench.spread([0.42]) == {"median": 0.42, "min": 0.42, "max": 0.42, "n": 1}


def medians(direct, dapt, tapt, both):
    return {"direct": direct, "dapt": dapt, "tapt": tapt, "dapt+tapt": both}


def test_goals_met_and_each_one_missed():
    seconds = medians(100, 150, 120, 190)
    met = bench.check_goals(medians(0.60, 0.605, 0.612, 0.611), 0.61, seconds)
    assert met["best"] == "tapt" and met["met"]
    assert met["gain"] == pytest.approx(0.012) and met["time_ratio"] == pytest.approx(1.2)
    # +0.9 point: below the +1 point goal
    small = bench.check_goals(medians(0.60, 0.605, 0.609, 0.6), 0.5, seconds)
    assert not small["gain_met"] and small["baseline_met"] and not small["met"]
    # the best arm under the strongest baseline
    under = bench.check_goals(medians(0.60, 0.62, 0.6, 0.6), 0.63, seconds)
    assert under["gain_met"] and not under["baseline_met"] and not under["met"]
    assert under["baseline_margin"] == pytest.approx(-0.01)
    # the best arm (dapt+tapt) takes more than twice direct's time
    slow = bench.check_goals(medians(0.60, 0.61, 0.61, 0.65), 0.6, medians(100, 150, 120, 201))
    assert slow["best"] == "dapt+tapt" and not slow["time_met"] and not slow["met"]
    # exactly +1 point and exactly twice the time count as met
    edge = bench.check_goals(medians(0.60, 0.61, 0.5, 0.5), 0.61, medians(100, 200, 1, 1))
    assert edge["gain_met"] and edge["time_met"] and edge["met"]


def test_dapt_documents_keep_only_the_given_groups_in_order():
    docs = [("a", ["x"]), ("b", ["y"]), ("c", ["z"]), ("d", ["w"])]
    assert bench.dapt_documents(docs, {"d", "b"}) == [("b", ["y"]), ("d", ["w"])]
    sample = bench.dapt_documents(docs, {"a", "b", "c", "d"}, max_docs=2, seed=1)
    assert len(sample) == 2 and sample == sorted(sample)
    assert sample == bench.dapt_documents(docs, {"a", "b", "c", "d"}, max_docs=2, seed=1)


def test_write_dapt_corpus_one_file_per_document(tmp_path):
    size = bench.write_dapt_corpus(tmp_path, [("brown/ca01", ["One .", "Two ."])])
    assert (tmp_path / "brown_ca01.txt").read_text() == "One .\nTwo .\n\n"
    assert size == len("One .\nTwo .\n\n")


@pytest.mark.skipif(not BROWN.is_file(), reason="the Brown corpus (make setup)")
def test_dapt_corpus_is_the_training_split_documents_only(tmp_path):
    from pipeline.config import load
    from pipeline.finetuning import data as finetune_data
    from pipeline.text.sources import read_brown

    task = finetune_data.load_task(load("configs/finetune_brown.yaml", []).finetune)
    groups = task.splits["split"]["groups"]
    chosen = bench.dapt_documents(read_brown(BROWN), groups["train"])
    ids = {doc for doc, _ in chosen}
    assert ids == {e.group for e in task.train}
    assert not ids & {e.group for e in task.validation}
    assert not ids & {e.group for e in task.test}
    bench.write_dapt_corpus(tmp_path, chosen)
    written = {p.stem for p in tmp_path.glob("*.txt")}
    assert written == {doc.replace("/", "_") for doc in ids}
    held_out = set(groups["validation"]) | set(groups["test"])
    assert not written & {doc.replace("/", "_") for doc in held_out}


def test_finetune_command_is_the_same_recipe_for_every_arm(tmp_path):
    args = bench.parse_args(["--seq-len", "64", "--epochs", "2", "--learning-rate", "1e-4"])
    one = bench.finetune_command("c.yaml", tmp_path / "r1", tmp_path, tmp_path / "a.keras",
                                 tmp_path / "vocab.txt", args, 1, "sqlite:///x")
    two = bench.finetune_command("c.yaml", tmp_path / "r2", tmp_path, tmp_path / "b.keras",
                                 tmp_path / "vocab.txt", args, 2, "sqlite:///x")
    keys = lambda cmd: {a.split("=", 1)[0]: a.split("=", 1)[1] for a in cmd if "=" in a}
    a, b = keys(one), keys(two)
    differ = {k for k in a if a[k] != b[k]}
    assert differ == {"run_dir", "finetune.init_from", "finetune.seed"}
    for key in ("finetune.baselines", "finetune.random_init_baseline",
                "finetune.register_model", "finetune.export"):
        assert a[key] == "false"
    assert a["finetune.max_seq_length"] == "64" and a["finetune.epochs"] == "2"
    assert one[1:4] == ["-m", "pipeline", "finetune"]


def test_quick_sets_tiny_budgets_unless_given():
    args = bench.parse_args(["--quick", "--max-train", "200"])
    assert args.max_train == 200 and args.seeds == [1] and args.epochs == 1
    assert args.dapt_seconds == 60 and args.tapt_seconds == 60 and args.tapt_max_passages == 1000
    full = bench.parse_args([])
    assert full.seeds == [1, 2, 3] and full.max_train == 1500 and full.epochs == 2
    assert full.dapt_max_docs == 0 and full.tapt_max_passages == 0


@pytest.mark.parametrize("argv, words", [
    (["--seeds", "1,x"], "integer seeds"),
    (["--seeds", ","], "one or more"),
    (["--seeds", "1,1"], "repeated"),
    (["--max-train", "-1"], "--max-train"),
    (["--tapt-max-passages", "-5"], "--tapt-max-passages"),
    (["--epochs", "0"], "--epochs"),
    (["--seq-len", "4"], "--seq-len"),
    (["--learning-rate", "0"], "--learning-rate"),
    (["--dapt-seconds", "0"], "--dapt-seconds"),
    (["--pretrain", "train.warmup_steps"], "KEY=VALUE"),
    (["--max-train", "many"], "invalid int"),
    (["--threads", "-1"], "--threads"),
])
def test_bad_arguments_one_line_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bench-adapt: error:") and words in err


def test_bad_config_and_checkpoint_one_line_exit_2(tmp_path, capsys):
    assert bench.main(["--config", str(tmp_path / "none.yaml"), "--work",
                       str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err
    assert bench.main(["--checkpoint", str(tmp_path), "--work", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--checkpoint" in err and "config.json" in err


def test_pretrain_command_keeps_the_bench_keys_last(tmp_path):
    command = bench.pretrain_command(tmp_path / "m.keras", tmp_path / "run", "c/*.txt",
                                     "google", 120, "sqlite:///x",
                                     ("train.warmup_steps=10", "train.max_seconds=5"))
    keys = [a for a in command if "=" in a]
    assert keys.index("train.warmup_steps=10") < keys.index("corpus.source=files")
    assert keys[-2:] == ["train.max_seconds=120", "tracking.tracking_uri=sqlite:///x"]
    assert "corpus.text_key=text" not in command
    jsonl = bench.pretrain_command(tmp_path / "m.keras", tmp_path / "run", "t.jsonl", "jsonl",
                                   60, "sqlite:///x")
    assert "corpus.format=jsonl" in jsonl and "corpus.text_key=text" in jsonl
