"""GLUE end to end (pipeline/stages/glue.py, pipeline/finetuning/glue.py) on a tiny GLUE folder of
every task's shape, written here with made-up sentences: every task trains and is scored, the
averages follow the benchmark's definition (checked against figures worked out by hand), the
submission files have the leaderboard's names, header, rows and labels; bad input is exit 2.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil

import keras
import mlflow
import pytest

from models.bert import BertEncoder
from pipeline import cli
from pipeline.finetuning import glue
from tests.test_finetune_data import WORDS, write_vocab

NOUNS = ["cat", "dog", "bird", "house", "tree", "river", "hill", "road", "city"]
MNLI_PARSES = "promptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t" \
              "sentence1_parse\tsentence2_parse"


def sent(rng) -> str:
    words = [rng.choice(NOUNS)] + [rng.choice(WORDS[:14]) for _ in range(rng.randint(2, 6))]
    return " ".join(words).capitalize() + "."


def write_glue(folder, rng, n_train=20, n_dev=8, n_test=5):
    """Every GLUE task folder as the GLUE download script writes it (columns, headers, files),
    plus diagnostic/diagnostic.tsv. Returns {submission file: its test file's rows}."""
    def write(task, name, header, rows):
        (folder / task).mkdir(parents=True, exist_ok=True)
        lines = ([header] if header else []) + ["\t".join(map(str, row)) for row in rows]
        (folder / task / name).write_text("\n".join(lines) + "\n", encoding="utf-8")

    nli, binary = ["entailment", "neutral", "contradiction"], ["entailment", "not_entailment"]
    mnli = f"index\t{MNLI_PARSES}\tsentence1\tsentence2"
    for split, n in (("train", n_train), ("dev", n_dev)):
        s = [(sent(rng), sent(rng)) for _ in range(n)]
        write("CoLA", f"{split}.tsv", "",  # no header
              [("gj04", i % 2, "" if i % 2 else "*", a) for i, (a, _) in enumerate(s)])
        write("SST-2", f"{split}.tsv", "sentence\tlabel", [(a, i % 2) for i, (a, _) in enumerate(s)])
        write("MRPC", f"{split}.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
              [(i % 2, i, i + 100, a, b) for i, (a, b) in enumerate(s)])
        write("STS-B", f"{split}.tsv", "index\tgenre\tfilename\tyear\told_index\tsource1\t"
              "source2\tsentence1\tsentence2\tscore",
              [(i, "main-news", "x", 2012, i, "n", "n", a, b, f"{i * 0.7 % 5:.3f}")
               for i, (a, b) in enumerate(s)])
        write("QQP", f"{split}.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
              [(i, 2 * i, 2 * i + 1, a + "?", b + "?", i % 2) for i, (a, b) in enumerate(s)])
        write("QNLI", f"{split}.tsv", "index\tquestion\tsentence\tlabel",
              [(i, a, b, binary[i % 2]) for i, (a, b) in enumerate(s)])
        write("RTE", f"{split}.tsv", "index\tsentence1\tsentence2\tlabel",
              [(i, a, b, binary[i % 2]) for i, (a, b) in enumerate(s)])
        write("WNLI", f"{split}.tsv", "index\tsentence1\tsentence2\tlabel",  # mostly 0
              [(i, a, b, int(i % 3 == 0)) for i, (a, b) in enumerate(s)])
    for name, labels in (("train.tsv", 1), ("dev_matched.tsv", 5), ("dev_mismatched.tsv", 5)):
        n = n_train if name == "train.tsv" else n_dev
        header = mnli + "".join(f"\tlabel{k + 1}" for k in range(labels)) + "\tgold_label"
        write("MNLI", name, header, [(i, i, f"{i}e", "fiction", *["(x)"] * 4, sent(rng),
                                      sent(rng), *[nli[i % 3]] * (labels + 1)) for i in range(n)])
    # The unlabelled test files (CoLA's has a header; QQP's index column is `id`), each with
    # its own row count.
    tests = {"CoLA": "index\tsentence", "SST-2": "index\tsentence",
             "MRPC": "index\t#1 ID\t#2 ID\t#1 String\t#2 String",
             "STS-B": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1"
                      "\tsentence2",
             "QQP": "id\tquestion1\tquestion2", "QNLI": "index\tquestion\tsentence",
             "RTE": "index\tsentence1\tsentence2", "WNLI": "index\tsentence1\tsentence2"}
    counts = {}
    for k, (task, header) in enumerate(tests.items()):
        texts = 1 if task in ("CoLA", "SST-2") else 2
        other = header.count("\t") - texts
        counts[f"{task}.tsv"] = n = n_test + k
        write(task, "test.tsv", header, [(1000 + i, *["x"] * other, *(sent(rng) for _ in range(texts)))
                                         for i in range(n)])
    for name, sub, n in (("test_matched.tsv", "MNLI-m.tsv", 6),
                         ("test_mismatched.tsv", "MNLI-mm.tsv", 7)):
        write("MNLI", name, mnli, [(i, i, f"{i}e", "fiction", *["(x)"] * 4, sent(rng), sent(rng))
                                   for i in range(n)])
        counts[sub] = n
    write("diagnostic", "diagnostic.tsv", "index\tsentence1\tsentence2",
          [(i, sent(rng), sent(rng)) for i in range(9)])
    counts["AX.tsv"] = 9
    return counts


@pytest.fixture(scope="module")
def encoder_files(tmp_path_factory):
    """(encoder .keras, vocab.txt): a 1-layer, hidden-32 BERT, randomly initialised."""
    folder = tmp_path_factory.mktemp("pretrained")
    vocab = write_vocab(folder / "vocab.txt")
    keras.utils.set_random_seed(0)
    BertEncoder(vocabulary_size=len(vocab), num_layers=1, num_heads=2, hidden_dim=32,
                intermediate_dim=64, max_sequence_length=64, dropout=0.0).save(
        folder / "encoder.keras")
    return folder / "encoder.keras", folder / "vocab.txt"


def run_cli(*args) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(list(args))
    return code, err.getvalue()


def cli_args(tmp_path, encoder_files, glue_dir, *more):
    model, vocab = encoder_files
    return ["glue", "--config", "configs/glue.yaml", f"run_dir={tmp_path}/run",
            f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
            f"finetune.glue_dir={glue_dir}", f"finetune.init_from={model}",
            f"finetune.vocab_file={vocab}", "finetune.max_seq_length=32",
            "finetune.batch_size=8", "finetune.max_steps=2", "finetune.epochs=1",
            "finetune.validation_fraction=0.2", "finetune.baselines=false",
            # each task's feature job on Beam's in-process engine: the DirectRunner would first
            # try Prism, whose binary it downloads (no network in tests; configs/test_tiny.yaml)
            'data.beam_args=["--runner=FnApiRunner"]', *more]


# ---------------------------------------------------------------------------
# The averages, against figures worked out by hand from the definitions
# ---------------------------------------------------------------------------
def test_glue_score_and_paper_average_by_hand():
    entries = {"CoLA": {"mcc": 0.60}, "SST-2": {"accuracy": 0.90},
               "MRPC": {"f1": 0.80, "accuracy": 0.70}, "STS-B": {"pearson": 0.86,
                                                                 "spearman": 0.84},
               "QQP": {"f1": 0.70, "accuracy": 0.90}, "MNLI-m": {"accuracy": 0.84},
               "MNLI-mm": {"accuracy": 0.82}, "QNLI": {"accuracy": 0.91},
               "RTE": {"accuracy": 0.66}, "WNLI": {"accuracy": 0.65}}
    # Task scores: CoLA .60, SST-2 .90, MRPC (.80+.70)/2 = .75, STS-B (.86+.84)/2 = .85,
    # QQP (.70+.90)/2 = .80, MNLI (.84+.82)/2 = .83, QNLI .91, RTE .66, WNLI .65;
    # sum 6.95, GLUE score 6.95 / 9.
    score = glue.glue_score(entries)
    assert score["score"] == pytest.approx(6.95 / 9) and score["complete"]
    assert glue.task_scores(entries)["mnli"] == pytest.approx(0.83)
    # Paper: MNLI-m .84 + MNLI-mm .82 + QQP F1 .70 + QNLI .91 + SST-2 .90 + CoLA .60 +
    # STS-B Spearman .84 + MRPC F1 .80 + RTE .66 = 7.07 over 9 entries, WNLI left out.
    paper = glue.paper_average(entries)
    assert paper["score"] == pytest.approx(7.07 / 9) and paper["entries"] == 9
    # The paper's Table 1 BERT-Base test row gives its published 79.6.
    table1 = {"MNLI-m": 84.6, "MNLI-mm": 83.4, "QQP": 71.2, "QNLI": 90.5, "SST-2": 93.5,
              "CoLA": 52.1, "STS-B": 85.8, "MRPC": 88.9, "RTE": 66.4}
    metric = dict(glue.PAPER_ENTRIES)
    assert round(glue.paper_average({k: {metric[k]: v} for k, v in table1.items()})["score"],
                 1) == 79.6
    # A partial set: only the tasks present, flagged.
    part = glue.glue_score({"CoLA": {"mcc": 0.5}, "MNLI-m": {"accuracy": 0.8}})
    assert part["score"] == pytest.approx(0.5) and not part["complete"]  # MNLI needs both


# ---------------------------------------------------------------------------
# Bad input: one line, exit 2
# ---------------------------------------------------------------------------
def test_bad_glue_dir_or_task_names_exit_2(tmp_path, encoder_files):
    empty = tmp_path / "empty"
    empty.mkdir()
    rng = random.Random(1)
    some = tmp_path / "some"
    write_glue(some, rng, n_train=6, n_dev=3, n_test=2)
    cases = [((empty,), "holds no GLUE task folder"),
             ((tmp_path / "nope",), "does not exist"),
             ((some, "--tasks", "cola,squad"), "unknown GLUE task 'squad'")]
    shutil.rmtree(some / "RTE")
    cases.append(((some, "--tasks", "rte"), "GLUE task 'rte' was named but"))
    for (glue_dir, *more), words in cases:
        code, err = run_cli(*cli_args(tmp_path, encoder_files, glue_dir, *more))
        assert code == 2, err
        lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in err, err
    code, err = run_cli("finetune", "--tasks", "cola")
    assert code == 2 and "--tasks" in err
    # Registering needs the SavedModel that finetune.export = false does not write: refused
    # before anything trains.
    write_glue(tmp_path / "full", rng, n_train=6, n_dev=3, n_test=2)
    code, err = run_cli(*cli_args(tmp_path, encoder_files, tmp_path / "full", "--tasks", "cola",
                                  "finetune.register_model=true"))
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "finetune.export=true" in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "run" / "finetune" / "glue_cola").exists()


@pytest.mark.slow
def test_export_switch_writes_the_saved_model_or_not(tmp_path, encoder_files):
    """finetune.export = true (the finetune stage's default): the raw-text SavedModel, checked
    against the in-memory model, and the submission file. False (configs/glue.yaml) is the
    every-task end-to-end test's setting: no SavedModel, no check, the submission files all
    the same (predicted from model.keras)."""
    counts = write_glue(tmp_path / "glue_data", random.Random(2), n_train=8, n_dev=4, n_test=3)
    for export in ("true",):
        run = tmp_path / f"export_{export}"
        code, err = run_cli(*cli_args(run, encoder_files, tmp_path / "glue_data", "--tasks",
                                      "sst-2", f"finetune.export={export}"))
        assert code == 0, err
        model_dir = run / "run" / "finetune" / "glue_sst-2"
        assert (model_dir / "model.keras").is_file()
        assert (model_dir / "saved_model").is_dir() == (export == "true")
        assert ("export_max_abs_diff" in json.loads((model_dir / "metrics.json").read_text())) \
            == (export == "true")
        lines = (run / "run" / "glue" / "submission" / "SST-2.tsv").read_text().splitlines()
        assert lines[0] == "index\tprediction" and len(lines) == counts["SST-2.tsv"] + 1
        assert {ln.split("\t")[1] for ln in lines[1:]} <= {"0", "1"}


def test_test_file_reader_and_submission_text(tmp_path):
    (tmp_path / "t.tsv").write_text("id\tquestion1\tquestion2\n7\tA cat?\tA dog?\n9\tB?\tC?\n")
    indices, examples = glue.read_test(tmp_path / "t.tsv", "qqp")
    assert indices == ["7", "9"] and (examples[1].text, examples[1].text_pair) == ("B?", "C?")
    assert glue.submission_text(indices, ["1", "0"]) == "index\tprediction\n7\t1\n9\t0\n"
    (tmp_path / "bad.tsv").write_text("index\tsentence1\tsentence2\n0\tA\tB\n1\tonly one\n")
    with pytest.raises(glue.GlueError, match=r"bad.tsv:3: 2 fields"):
        glue.read_test(tmp_path / "bad.tsv", "rte")
    with pytest.raises(glue.GlueError, match="no column 'sentence'"):
        glue.read_test(tmp_path / "t.tsv", "cola")
    assert glue.canonical("SST2") == "sst-2" and glue.canonical("stsb") == "sts-b"
    assert glue.canonical("squad") == ""


# ---------------------------------------------------------------------------
# End to end through the CLI
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_make_glue_every_task_end_to_end(tmp_path, encoder_files):
    counts = write_glue(tmp_path / "glue_data", random.Random(0))
    code, err = run_cli(*cli_args(tmp_path, encoder_files, tmp_path / "glue_data"))
    assert code == 0, err
    out = tmp_path / "run" / "glue"
    results = json.loads((out / "results.json").read_text())
    assert list(results["tasks"]) == list(glue.ENTRIES)  # every task, the leaderboard's order
    for task, record in results["tasks"].items():
        for name, _, metrics in glue.ENTRIES[task]:
            assert set(record["entries"][name]) == set(metrics)
        assert record["steps"] == (0 if task == "wnli" else 2), task  # max_steps
        model_dir = tmp_path / "run" / "finetune" / f"glue_{task}"
        assert (model_dir / "model.keras").exists() or task == "wnli"
        # configs/glue.yaml: finetune.export = false, the test files predicted from model.keras
        assert not (model_dir / "saved_model").exists(), task
        if task != "wnli":
            assert "export_max_abs_diff" not in json.loads(
                (model_dir / "metrics.json").read_text()), task
    # The averages of results.json are those of its own entries.
    entries = {n: v for r in results["tasks"].values() for n, v in r["entries"].items()}
    assert results["glue_score"]["score"] == pytest.approx(glue.glue_score(entries)["score"])
    assert results["glue_score"]["complete"] and results["bert_paper_average"]["entries"] == 9
    # WNLI: the majority class of train ("0"), everywhere.
    assert "majority class ('0')" in results["tasks"]["wnli"]["method"]

    # Submission files: names, header, one row per test row, the leaderboard's labels.
    files = sorted(p.name for p in (out / "submission").iterdir())
    assert files == sorted(counts)
    for name, n in counts.items():
        lines = (out / "submission" / name).read_text().splitlines()
        assert lines[0] == "index\tprediction" and len(lines) == n + 1, name
        task = glue.canonical(name[:-4].replace("-mm", "").replace("-m", "")) or "mnli"
        values = [ln.split("\t")[1] for ln in lines[1:]]
        allowed = glue.SUBMISSION_LABELS[task]
        if isinstance(allowed, set):
            assert set(values) <= allowed, (name, values)
        else:
            assert all(0.0 <= float(v) <= 5.0 for v in values)
        if name not in ("MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"):
            assert lines[1].split("\t")[0] == "1000"  # the test file's own index
    assert set((out / "submission" / "WNLI.tsv").read_text().split()[3::2]) == {"0"}
    md = (out / "results.md").read_text()
    assert "| MNLI-mm | accuracy |" in md and "**GLUE score**" in md and "9 of 9 tasks" in md

    # MLflow: the invocation's run, the glue stage's run, one child run per task.
    by_stage = {}
    for run in search_runs(tmp_path):
        by_stage.setdefault(run.data.tags.get("pipeline.stage"), []).append(run)
    stage_run = by_stage["glue"][0]
    assert stage_run.data.metrics["glue_score_dev"] == pytest.approx(
        results["glue_score"]["score"])
    task_runs = by_stage["glue-task"]
    assert sorted(r.data.tags["glue.task"] for r in task_runs) == sorted(glue.ENTRIES)
    assert {r.data.tags["mlflow.parentRunId"] for r in task_runs} == {stage_run.info.run_id}

    # One task again, over a learning-rate grid (the paper's protocol): a model per point, the
    # best dev score kept; the other tasks' results and files stay (same encoder).
    before = (out / "submission" / "CoLA.tsv").read_text()
    code, err = run_cli(*cli_args(tmp_path, encoder_files, tmp_path / "glue_data",
                                  "--tasks", "RTE", 'finetune.sweep=["learning_rate=0.003,2e-5"]'))
    assert code == 0, err
    again = json.loads((out / "results.json").read_text())
    assert list(again["tasks"]) == list(glue.ENTRIES)
    assert again["tasks"]["cola"].get("earlier") and not again["tasks"]["rte"].get("earlier")
    rte = again["tasks"]["rte"]
    assert [t["point"] for t in rte["trials"]] == [{"learning_rate": 0.003},
                                                  {"learning_rate": 2e-5}]
    assert [t["model_dir"].rsplit("/", 1)[1] for t in rte["trials"]] == ["glue_rte_p1",
                                                                         "glue_rte_p2"]
    best = max(rte["trials"], key=lambda t: t["score"])
    assert rte["model_dir"] == best["model_dir"] and rte["point"] == best["point"]
    assert glue.task_scores(rte["entries"])["rte"] == pytest.approx(best["score"])
    entries = {n: v for r in again["tasks"].values() for n, v in r["entries"].items()}
    assert again["glue_score"]["score"] == pytest.approx(glue.glue_score(entries)["score"])
    assert sorted(p.name for p in (out / "submission").iterdir()) == sorted(counts)
    assert (out / "submission" / "CoLA.tsv").read_text() == before
    assert "(earlier run)" in (out / "results.md").read_text()
    points = [r for r in search_runs(tmp_path) if r.data.tags.get("pipeline.stage") == "glue-point"]
    assert len(points) == 2
    assert {r.data.tags["mlflow.parentRunId"] for r in points} == {rte["mlflow_run_id"]}


def search_runs(tmp_path) -> list:
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    try:
        return mlflow.search_runs(search_all_experiments=True, output_format="list")
    finally:
        mlflow.set_tracking_uri(None)
