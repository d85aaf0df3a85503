"""bench/bench_finetune.py: the passages of the memory run, the TSV files both sides read, the
split, our stage's command line, the timings read from its log lines, the report and its
goals; and the race itself on tiny data: from a pretrained start (a BERT-tiny in a pretrain
run's layout, exported for transformers) through both sides to the last line, and from a
published-style Hugging Face directory whose tokenizer gives one token another id, which
fails the race before any run."""

import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from bench import bench_finetune as bench
from bench import protocol

SENTENCES = [f"s{i}." for i in range(7)]


def test_passages_cut_consecutive_sentences():
    assert bench.passages(SENTENCES, 3) == ["s0. s1. s2.", "s3. s4. s5.", "s6."]
    assert bench.passages(SENTENCES, 3, 1) == ["s0.", "s1. s2. s3.", "s4. s5. s6."]
    assert bench.passages([], 3) == [] and bench.passages(["a"], 3, 2) == ["a"]


def test_variants_differ_but_keep_the_sentences():
    copies = [bench.variant(SENTENCES, 3, copy, seed=1) for copy in range(8)]
    assert copies[0] == bench.passages(SENTENCES, 3)  # as the finetune stage cuts them
    assert len({tuple(c) for c in copies}) == 8
    for passages in copies:
        assert sorted(" ".join(passages).split()) == sorted(SENTENCES)
    assert copies == [bench.variant(SENTENCES, 3, copy, seed=1) for copy in range(8)]  # seeded


def test_replicated_rows_start_with_the_training_rows():
    documents = {"d1": SENTENCES, "d2": SENTENCES[:4]}
    rows = bench.replicated_rows(documents, ["d1", "d2"], {"d1": "x", "d2": "y"}, 3, 8, seed=5)
    first = [(t, "x") for t in bench.passages(SENTENCES, 3)] + \
        [(t, "y") for t in bench.passages(SENTENCES[:4], 3)]
    assert rows[:len(first)] == first
    assert 8 * len(first) <= len(rows) <= 8 * len(first) + 2 * 2  # an offset adds <= 1 per doc


def test_cap_is_seeded_and_keeps_the_order():
    rows = list(range(100))
    kept = bench.cap(rows, 10, seed=3)
    assert kept == sorted(kept) and len(kept) == 10 and kept == bench.cap(rows, 10, seed=3)
    assert bench.cap(rows, 0, 3) == rows and bench.cap(rows, 500, 3) == rows


def test_tsv_round_trip_keeps_quotes_tabs_and_newlines(tmp_path):
    rows = [('He said "no".', "press"), ("a\tb", "fiction"), ('"quoted"\nnext', "learned")]
    bench.write_tsv(tmp_path / "x.tsv", rows)
    assert bench.read_tsv(tmp_path / "x.tsv") == rows


@pytest.mark.skipif(not bench.BROWN.is_file(), reason="the Brown corpus (make setup) is missing")
def test_splits_are_disjoint_and_the_memory_run_is_copies_times_larger(tmp_path):
    args = SimpleNamespace(sentences_per_example=3, split_seed=12345, seed=12345, max_rows=0,
                           copies=8)
    split = bench.make_splits(args, tmp_path)
    counts = split["counts"]
    texts = {n: {t for t, _ in bench.read_tsv(tmp_path / f"{n}.tsv")}
             for n in ("train", "validation", "test")}
    assert not (texts["train"] & texts["test"]) and not (texts["validation"] & texts["test"])
    assert split["labels"] == ["fiction", "learned", "nonfiction", "press"]
    assert 7.9 < counts["train_big"] / counts["train"] < 8.2
    assert counts["test"] > 2000 and counts["validation"] > 2000


def test_our_command_switches_off_what_the_peer_does_not_do(tmp_path):
    args = SimpleNamespace(batch_size=32, steps=500, seq_len=128, learning_rate=3e-4,
                           warmup_fraction=0.1, weight_decay=0.01, dropout=0.1, seed=7,
                           hold_in_memory=False)
    settings = {"data": str(tmp_path), "tracking_uri": "sqlite:////tmp/x.db", "lowercase": True,
                "init_dir": str(tmp_path / "init")}
    command = bench.our_command(args, settings, "train.tsv", 1000, tmp_path / "run")
    overrides = dict(item.split("=", 1) for item in command if "=" in item)
    assert command[2:4] == ["pipeline", "finetune"]
    for key in ("baselines", "random_init_baseline", "register_model"):
        assert overrides[f"finetune.{key}"] == "false"
    assert overrides["finetune.max_steps"] == "500"
    assert overrides["finetune.epochs"] == str(math.ceil(500 / math.ceil(1000 / 32)))  # 16
    assert overrides["finetune.init_from"].endswith("init/model.keras")
    assert overrides["finetune.precision"] == "float32"  # as the peer (no bf16/fp16)
    args.hold_in_memory = True  # the same command, run by a process that first holds features
    held = bench.our_command(args, settings, "train.tsv", 1000, tmp_path / "run")
    assert held[1] == "-c" and held[3:5] == [str(tmp_path / "train.tsv"), "128"]
    assert held[5:] == command[2:]


LOG = [
    (5.0, "finetune: classification on tsv: 1,000 train / 200 validation / 100 test examples"),
    (7.0, "finetune: wrote 1,300 feature rows of 3 splits to /x/finetune_features/ab (Beam)"),
    (9.0, ("finetune: /x/model.keras → BertClassifier, 5,405,956 parameters (5,405,956 "
           "trainable, freeze=none); 40 steps (2 epoch(s) of 32), batch 32, lr 0.0003")),
    (13.0, "finetune: step 10/40  loss 1.3  80 examples/s"),
    (15.0, "finetune: step 20/40  loss 1.3  160 examples/s"),
    (17.0, "finetune: step 30/40  loss 1.3  160 examples/s"),
    (20.0, "finetune: epoch 1  step 32  loss 1.2  validation accuracy 0.4  (11 s)"),
    (25.0, "finetune: epoch 2  step 40  loss 1.1  validation accuracy 0.5  (16 s)"),
    (27.0, "finetune: test (100 examples)   accuracy 0.5   macro_f1 0.4   mcc 0.1"),
    (30.0, "finetune: wrote /x/finetune/bench"),
]


def test_timeline_reads_our_stage_log_lines():
    marks = bench.timeline(LOG)
    assert (marks["data"], marks["built"], marks["epoch"], marks["test"], marks["wrote"]) == (
        5.0, 9.0, 25.0, 27.0, 30.0)
    assert marks["epochs"] == 2 and marks["progress"] == {10: 13.0, 20: 15.0, 30: 17.0}
    parts = bench.our_parts({"marks": marks, "wall": 31.0}, {"validation": 200, "test": 100})
    assert parts["steps + validation"] == 16.0
    assert parts["validation (estimate)"] == 2 * 2.0 * 200 / 100  # two passes, twice the rows
    assert sum(v for k, v in parts.items() if k != "validation (estimate)") == 31.0


def test_fit_segments_cut_both_at_the_same_steps():
    ours = {"marks": bench.timeline(LOG)}  # built 9, steps 10/30 at 13/17, last epoch at 25
    peer = {"train_call": 100.0, "times": {"train": 45.0},
            "step_ends": [100.0 + i for i in range(1, 41)]}  # 1 s per step, 5 s of validation
    segments = bench.fit_segments(ours, peer)
    assert (segments["a"], segments["b"]) == (10, 30)
    assert segments["ours"] == [4.0, 4.0, 8.0]  # sums to the headline seconds 25 - 9
    assert segments["transformers"] == [10.0, 20.0, 15.0]  # sums to 45
    ours["marks"]["progress"] = {10: 13.0}
    assert bench.fit_segments(ours, peer) is None


def test_macro_f1_is_sklearns_and_the_bootstrap_brackets_the_gap():
    from sklearn.metrics import f1_score

    labels = ["a", "b", "c", "d"]  # "d" is never seen: F1 0, as sklearn's zero_division=0
    gold = list("aabbbccaacbb") * 5
    ours, theirs = list("abbbbccaaccb") * 5, list("aabcbcaaabbb") * 5
    for predicted in (ours, theirs):
        assert bench.macro_f1(gold, predicted, labels) == pytest.approx(
            f1_score(gold, predicted, labels=labels, average="macro", zero_division=0))
    gap = bench.macro_f1(gold, ours, labels) - bench.macro_f1(gold, theirs, labels)
    low, high = bench.paired_bootstrap(gold, ours, theirs, labels, rounds=200)
    assert low <= gap <= high and low < high
    assert bench.paired_bootstrap(gold, ours, ours, labels, rounds=50) == (0.0, 0.0)


def test_report_ends_with_the_line_of_the_issue(tmp_path, capsys):
    labels = ["a", "b"]
    test_rows = [("t", "a"), ("u", "b"), ("v", "b"), ("w", "a")]
    marks = {**bench.timeline(LOG), "epochs": 1}
    ours = {"fit": 16.0, "wall": 31.0, "marks": marks, "peak_rss_mib": 1000.0, "cpu_s": 30.0,
            "peak_tree_mib": 1000.0,
            "load": (1.0, 1.0), "selection_metric": "accuracy", "predicted": ["a", "b", "a", "a"],
            "rss_by_phase": {"steps + validation": 900.0}, "validation_macro_f1": 0.5}
    ours.update(macro_f1=bench.macro_f1([r[1] for r in test_rows], ours["predicted"], labels),
                accuracy=0.75)
    big = {**ours, "peak_rss_mib": 1100.0, "peak_tree_mib": 1100.0,
           "rss_by_phase": {"steps + validation": 990.0}}
    peer = {"times": {"imports": 1, "tokenize": 1, "load": 1, "train": 32.0, "test": 2},
            "train_call": 0.0, "step_ends": [0.5 * i for i in range(1, 41)],
            "evaluations": [{"seconds": 2.0, "eval_accuracy": 0.5, "eval_macro_f1": 0.4}],
            "eval_seconds": 2.0, "threads": 2, "wall": 40.0, "peak_rss_mib": 700.0, "cpu_s": 40,
            "load": (1.0, 1.0), "macro_f1": 0.5, "accuracy": 0.5, "validation_macro_f1": 0.4,
            "predicted": ["a", "a", "b", "a"]}
    args = SimpleNamespace(steps=40, batch_size=32, seq_len=128, copies=8, work=tmp_path,
                           threads=2, hold_in_memory=False)
    split = {"counts": {"train": 1000, "validation": 200, "test": 100, "train_big": 8000},
             "labels": labels}
    # three rounds (seeds): their seconds 48, 32, 16 against our 16 (ratios 3, 2, 1); round 3
    # busy; their median macro-F1 0.5 is below bag-of-words (0.6), ours 0.7333 above it
    slower = {**peer, "times": {**peer["times"], "train": 48.0}, "macro_f1": 0.6}
    faster = {**peer, "times": {**peer["times"], "train": 16.0}, "macro_f1": 0.4}
    rounds = [{"round": i + 1, "load": load, "cores": 2, "busy_above": 2, "busy": load > 2,
               "order": ["ours", "transformers"], "results": {"ours": ours, "transformers": p}}
              for i, (load, p) in enumerate(((0.5, slower), (1.0, peer), (3.5, faster)))]
    baselines = {"bow_lr": {"macro_f1": 0.6, "accuracy": 0.6}, "best": "tfidf_svm",
                 "tfidf_svm": {"macro_f1": 0.65, "accuracy": 0.7}}
    closer = {**rounds[1], "results": {"ours": ours, "transformers": {**peer, "macro_f1": 0.7}}}
    starts = {"published": {"label": "published checkpoint", "init": {}, "rounds": rounds},
              "tiny": {"label": "our pretrained BERT-tiny", "init": {}, "rounds": [closer]}}
    line = bench.report(args, split, test_rows, starts, baselines, big)
    printed = capsys.readouterr().out
    assert line == "bench-finetune: metric 0.7333 transformers 0.5000 speed-ratio 2.00 " \
                   "memory-growth 1.10"
    assert "speed-ratio 2.00 (1.00-3.00)" in printed and "BUSY: round(s) 3 of 3" in printed
    assert "the median round (by speed-ratio): round 2" in printed
    assert "steady steps: ours 200 ms/step, transformers 500 ms/step" in printed
    assert "published checkpoint: speed-ratio 2.00 >= 1.5 met; metric not judged: " \
           "transformers not above bag-of-words (0.6000)" in printed
    assert "our pretrained BERT-tiny: speed-ratio 2.00 >= 1.5 met; metric |ours - theirs| " \
           "0.0333 <= 0.01 MISSED (both above bag-of-words 0.6000)" in printed
    result = json.loads((tmp_path / "result.json").read_text())
    published = result["starts"]["published"]
    assert published["protocol"]["busy_rounds"] == [3] and published["protocol"]["threads"] == 2
    assert [r["ratio"] for r in published["rounds"]] == [3.0, 2.0, 1.0]
    assert published["spreads"]["peer_macro_f1"]["min"] == 0.4
    assert published["median_round"] == 2 and not published["parity"]["judged"]
    assert result["starts"]["tiny"]["parity"]["judged"] and result["headline_start"] == "published"
    # 100 MiB more for 7,000 added rows: 142.9 MiB per 10k rows, above their features' 14.6
    assert result["memory_per_rows"]["mib_per_10k_rows"] == pytest.approx(100 / 7000 * 10_000)
    assert not result["memory_per_rows"]["met"] and "per 10k added rows 142.9 <= 14.6 MiB " \
        "MISSED" in printed
    # without a memory run (--copies 1) the line says n/a
    assert bench.report(args, split, test_rows, starts, baselines, None).endswith(
        "memory-growth n/a")


def test_parity_is_judged_only_where_both_beat_bag_of_words():
    assert bench.parity(0.70, 0.695, 0.6) == {
        "judged": True, "met": True, "diff": pytest.approx(0.005),
        "note": "|ours - theirs| 0.0050 <= 0.01 met (both above bag-of-words 0.6000)"}
    assert bench.parity(0.70, 0.68, 0.6)["met"] is False
    below = bench.parity(0.59, 0.58, 0.6)
    assert not below["judged"] and below["met"] is None
    assert below["note"].endswith("ours and transformers not above bag-of-words (0.6000)")
    assert bench.parity(0.6, 0.7, 0.6)["note"].startswith("not judged: ours not above")


CHECKED = {"vocab_differ": 0, "first_vocab_difference": "", "rows_same_ids": 90, "rows": 90,
           "first_row_differing": -1, "only_ours": [], "only_theirs": [], "weights": 39,
           "weights_max_abs_diff": 0.0, "worst_weight": "pooler.dense.weight",
           "peer_dtypes": ["float32"], "pooled_max_abs_diff": 3e-7}


@pytest.mark.parametrize("change, reason", [
    ({}, None),
    ({"rows_same_ids": 89, "first_row_differing": 7}, "1 of 90 rows get other token ids"),
    ({"weights_max_abs_diff": 0.02}, "weights differ by up to 2.00e-02"),
    ({"weights_max_abs_diff": float("nan")}, "weights differ"),
    ({"only_theirs": ["pooler.dense.bias"]}, "weights on one side only"),
    ({"peer_dtypes": ["bfloat16"]}, "not float32"),
    ({"pooled_max_abs_diff": 1e-3}, "pooled [CLS] outputs differ"),
])
def test_each_difference_between_the_sides_is_a_reason_to_stop(change, reason):
    reasons = bench.mismatches({**CHECKED, **change})
    assert reasons == [] if reason is None else (len(reasons) == 1 and reason in reasons[0])


def test_starts_are_checked_before_anything_runs(tmp_path, capsys):
    for argv in (["--starts", "tiny,tiny"], ["--starts", ""], ["--starts", "random"],
                 ["--copies", "0"]):
        with pytest.raises(SystemExit) as err:
            bench.parse_args(argv)
        assert err.value.code == 2
    assert bench.parse_args(["--starts", "tiny, published"]).starts == ["tiny", "published"]
    capsys.readouterr()
    work = tmp_path / "w"
    code = bench.main(["--starts", "tiny", "--tiny-model", str(tmp_path / "none.keras"),
                       "--work", str(work)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert ("none.keras" in err and "make pretrain" in err) if bench.BROWN.is_file() \
        else "make setup" in err
    assert not work.exists()


# ---------------------------------------------------------------------------
# The race on tiny data, from a pretrained start (real processes, real files)
# ---------------------------------------------------------------------------
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz",
          *(f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"), ".", ",", "the", "of", "and", "to",
          "in", "he", "was", "it", "that", "is", "for", "his", "on", "with", "as", "she"]
TINY = ["--max-rows", "40", "--steps", "2", "--batch-size", "8", "--seq-len", "16",
        "--repeat", "1", "--copies", "1"]


def tiny_pretrain_run(folder):
    """A BERT-tiny in a pretrain run's layout: <run>/pretrain/model.keras, <run>/vocab/."""
    import keras

    from models import build_pretrainer

    keras.utils.set_random_seed(0)
    (folder / "pretrain").mkdir(parents=True)
    (folder / "vocab").mkdir()
    (folder / "vocab" / "vocab.txt").write_text("\n".join(TOKENS) + "\n")
    (folder / "vocab" / "vocab.json").write_text('{"lowercase": true}')
    build_pretrainer(len(TOKENS), "tiny", max_sequence_length=32).save(
        folder / "pretrain" / "model.keras")
    return folder / "pretrain" / "model.keras"


def published_dir(folder):
    """A Hugging Face directory as published checkpoints come: a BertModel (encoder + pooler,
    no pretraining heads) saved by transformers, vocab.txt and tokenizer_config.json."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(TOKENS), hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=64, hidden_act="gelu")
    transformers.BertModel(config).save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(TOKENS) + "\n")
    (folder / "tokenizer_config.json").write_text('{"do_lower_case": true}')
    return folder


@pytest.mark.slow  # minutes: real child processes of both sides
@pytest.mark.skipif(not bench.BROWN.is_file(), reason="the Brown corpus (make setup) is missing")
def test_the_race_runs_from_our_pretrained_bert_tiny(tmp_path, capsys):
    model = tiny_pretrain_run(tmp_path / "run")
    work = tmp_path / "work"
    assert bench.main(["--starts", "tiny", "--tiny-model", str(model), *TINY,
                       "--work", str(work)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[-1].startswith("bench-finetune: metric ")
    assert printed.splitlines()[-1].endswith(" memory-growth n/a")
    assert "bag-of-words (counts + logistic regression) test macro-F1" in printed
    result = json.loads((work / "result.json").read_text())
    tiny = result["starts"]["tiny"]
    init = tiny["init"]  # exported for transformers by our converter, then checked equal
    assert (work / "hf_tiny" / "model.safetensors").is_file()
    assert init["vocab_differ"] == 0 and init["rows_same_ids"] == init["rows"] == 120
    assert init["weights_max_abs_diff"] == 0.0 and init["weights"] > 30
    assert init["only_ours"] == [] and init["only_theirs"] == []
    assert init["peer_dtypes"] == ["float32"] and init["pooled_max_abs_diff"] < 1e-4
    assert tiny["ours"]["seed"] == tiny["transformers"]["seed"] == 12345
    assert 0.0 <= tiny["spreads"]["ours_macro_f1"]["median"] <= 1.0
    assert "bow_lr" in result["baselines"] and tiny["parity"]["note"]
    settings = json.loads((work / "settings" / "peer_tiny_r1.json").read_text())
    assert settings["learning_rate"] == 3e-4 and settings["seq_len"] == 16


@pytest.mark.slow  # minutes: real child processes of both sides
@pytest.mark.skipif(not bench.BROWN.is_file(), reason="the Brown corpus (make setup) is missing")
def test_a_token_with_another_id_on_the_transformers_side_fails_the_race(tmp_path, capsys):
    """A published-style directory whose tokenizer.json (what transformers reads) has one token
    changed from its vocab.txt (what our importer reads): the race stops before any run."""
    import transformers

    checkpoint = published_dir(tmp_path / "published")
    changed = ["thee" if token == "the" else token for token in TOKENS]
    transformers.BertTokenizer(vocab={t: i for i, t in enumerate(changed)}).backend_tokenizer \
        .save(str(checkpoint / "tokenizer.json"))
    capsys.readouterr()
    work = tmp_path / "work"
    code = bench.main(["--starts", "published", "--checkpoint", str(checkpoint), *TINY,
                       "--work", str(work)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "the published start differs between ours and transformers" in err
    assert "'the': id 59 in ours, none in theirs" in err and "rows get other token ids" in err
    assert not list(work.glob("ours_*")) and not list(work.glob("peer_*"))  # nothing raced
    found = json.loads((work / "init_published" / "init.json").read_text())
    assert found["weights_max_abs_diff"] == 0.0 and found["only_theirs"] == []  # weights agree
