"""`bert-pipeline cycle` (pipeline/cycle.py): which incoming text is new, the exit codes the
schedulers act on (0 done, 3 nothing new, 4 already running, 2 bad input), and cycles on tiny
data end to end: the first trains and registers (champion = v1 of each task), the second finds no
new text (exit 3, nothing trained, no MLflow run), the third continues pretraining on the new
file only, step by step as the Airflow DAG runs it, and promotes only where the new model beats
the champion on the same test split (one task forced to lose, one to win, by the champion's
logged score), the comparison on the new versions and the review page on the cycle's run.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

import mlflow
import pytest
import yaml

from pipeline import artifacts, cli, cycle
from pipeline.tools import cycle_state
from tests.conftest import make_corpus


# ---------------------------------------------------------------------------
# What is new
# ---------------------------------------------------------------------------
def test_scan_takes_new_and_changed_files_once(tmp_path):
    incoming = tmp_path / "in"
    incoming.mkdir()
    (incoming / "a.txt").write_text("one.\n")
    (incoming / "b.txt").write_text("two.\n")
    (incoming / ".hidden.txt").write_text("x\n")
    (incoming / "c.txt.part").write_text("being uploaded\n")
    cycles = cycle_state.Cycles(tmp_path / "run")
    new, settling = cycles.scan("in/*.txt, in/*.part", 0, tmp_path)  # relative: below the root
    assert [os.path.basename(f["path"]) for f in new] == ["a.txt", "b.txt"] and not settling
    record = cycles.open_new(new)
    assert cycles.open_cycle()["number"] == 1 and record["base"] is None
    snapshot = cycles.folder(record) / record["files"][0]["snapshot"]
    assert snapshot.read_text() == "one.\n"
    cycles.close(record, keep=1)
    assert cycles.open_cycle() is None and cycles.last_done()["number"] == 1
    assert cycles.scan("in/*.txt", 0, tmp_path) == ([], [])  # nothing new

    (incoming / "a.txt").write_text("one, changed.\n")  # taken whole again
    shutil.copy(incoming / "b.txt", incoming / "b-copy.txt")  # contents trained on: not new
    os.utime(incoming / "b.txt", ns=(1, 1))  # touched, same contents: not new
    (incoming / "d.txt").write_text("fresh.\n")
    new, _ = cycles.scan(str(incoming / "*.txt"), 0, tmp_path)
    assert {os.path.basename(f["path"]): f["changed"] for f in new} == {"a.txt": True,
                                                                         "d.txt": False}
    new, settling = cycles.scan(str(incoming / "*.txt"), 3600, tmp_path)  # still being written?
    assert not new and len(settling) == 3  # recent (b-copy.txt too: not yet read)
    second = cycles.open_new(cycles.scan(str(incoming / "*.txt"), 0, tmp_path)[0])
    assert second["number"] == 2 and second["base"] == 1
    cycles.close(second, keep=1)  # cycle folders beyond cycle.keep_cycles are removed
    assert not cycles.folder(record).exists() and cycles.folder(second).is_dir()


# ---------------------------------------------------------------------------
# Exit codes without training
# ---------------------------------------------------------------------------
@pytest.fixture
def run_root(tmp_path, monkeypatch):
    """Runs, the MLflow store and its artifacts under tmp_path (not the checkout)."""
    old = artifacts.RUN_ROOT
    monkeypatch.delenv(artifacts.RUN_ROOT_VARIABLE, raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    artifacts.set_run_root(tmp_path)
    yield tmp_path
    artifacts.set_run_root(old)
    mlflow.set_tracking_uri(None)


def _args(root, *extra):
    """(No 1-second matmul timing per pretrain: the MFU figure is tests/test_training.py's.)"""
    return ["cycle", "--config", "configs/test_tiny.yaml", f"cycle.incoming={root}/incoming/*.txt",
            "cycle.settle_seconds=0", f"tracking.tracking_uri=sqlite:///{root}/mlflow.db",
            "train.peak_flops_seconds=0", *extra]


def test_exit_codes_before_any_training(run_root, capsys):
    (run_root / "incoming").mkdir()
    assert cli.main(_args(run_root)) == cli.EXIT_NOTHING_TO_DO  # no text at all yet
    assert not (run_root / "mlflow.db").exists()  # nothing new: no MLflow run either
    assert "nothing new" in capsys.readouterr().out
    assert cli.main(_args(run_root, "--step", "promote")) == cli.EXIT_NOTHING_TO_DO

    make_corpus(run_root / "incoming", documents=6)
    with cli.RunLock(run_root / "runs" / "test"):  # another invocation holds the lock
        assert cli.main(_args(run_root)) == cli.EXIT_ALREADY_RUNNING
    assert "already running" in capsys.readouterr().err

    (run_root / "nofinetune.yaml").write_text("train:\n  steps: 3\n")
    for extra, says in [
        (["cycle.incoming="], "cycle.incoming is empty"),
        (['cycle.tasks=[{"config":"nowhere/task.yaml"}]'], "'nowhere/task.yaml': no such file"),
        ([f'cycle.tasks=[{{"config":"{run_root}/nofinetune.yaml"}}]'], "no finetune section"),
        (['cycle.tasks=[{"config":"configs/finetune_brown.yaml","overrides":["finetune.epochs=0"]}]'],
         "finetune.epochs = 0 is out of range"),
        (["--step", "finetune", "--task", "nope"], "--task 'nope' is not a task"),
        (["cycle.continued=[train.steps]"], "is not a section.key=value override"),
    ]:
        assert cli.main(_args(run_root, *extra)) == cli.EXIT_BAD_INPUT, extra
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (run_root / "runs" / "test" / "cycles").exists()  # nothing opened


# ---------------------------------------------------------------------------
# A step's log: its own file, a quiet console
# ---------------------------------------------------------------------------
def test_a_step_logs_to_its_file_and_the_console_shows_its_start_and_end(run_root, capsys):
    """The pretrain step of a cycle whose new text holds a file that is not UTF-8: the corpus
    stage refuses it (exit 2, the one error line on the console); everything the step said is
    in <cycle>/logs/steps/pretrain.log, also on the cycle's MLflow run; -v shows it all."""
    make_corpus(run_root / "incoming", documents=4)
    (run_root / "incoming" / "latin1.txt").write_bytes(b"A fine line.\n\xe9t\xe9 here.\n")
    assert cli.main(_args(run_root)) == cli.EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    cycle_dir = run_root / "runs" / "test" / "cycles" / "0001"
    step_log = cycle_dir / "logs" / "steps" / "pretrain.log"
    assert out.splitlines()[1:] == [f"pretrain: started (log: {step_log})",
                                    out.splitlines()[-1]], out
    assert out.splitlines()[0].startswith("cycle 1: opened on 3 new file(s)")
    assert out.splitlines()[-1].startswith("pretrain: failed in "), out
    (error,) = err.splitlines()  # the corpus stage's one line, on the console
    assert error.startswith("error: ") and "latin1.txt:2 is not UTF-8 text" in error, err
    text = step_log.read_text()
    for said in ("pretrain: started", "MLflow run ", f"corpus: started (log: {cycle_dir}/logs/",
                 error, "pretrain: failed in "):
        assert said in text, (said, text)
    client = mlflow.MlflowClient()
    (run,) = _cycle_runs(client)
    assert run.info.status == "FAILED" and run.data.tags["cycle.failed_step"] == "pretrain"
    (kept,) = client.list_artifacts(run.info.run_id, "logs")
    assert kept.path == "logs/pretrain.log"
    copy = client.download_artifacts(run.info.run_id, kept.path, str(run_root / "kept"))
    assert Path(copy).read_text() == text

    # -v (as `bert-pipeline cycle -v` passes it on): the step's lines on the console too; the
    # cycle under way continues with the same files, and the last log is kept beside the new.
    assert cycle.main([*_args(run_root), "-v"]) == cli.EXIT_BAD_INPUT
    out = capsys.readouterr().out
    assert "MLflow run " in out and "corpus: started" in out and "pretrain: failed" in out
    assert step_log.with_name("pretrain.previous.log").read_text() == text
    assert out.startswith("cycle 1: under way since")


# ---------------------------------------------------------------------------
# Cycles end to end
# ---------------------------------------------------------------------------
def _task_files(root) -> dict:
    """A labelled CSV (animal vs place sentences) and two finetune configs on it (the same
    test split), registered under two names; name -> its cycle.tasks entry."""
    rng = random.Random(0)
    animals, places = ["cat", "dog", "bird"], ["house", "tree", "river", "hill", "road", "city"]
    filler = ["the", "a", "big", "small", "red", "blue", "saw", "heard", "found", "old", "new", "happy"]
    rows = ["text,label"]
    for i in range(60):
        words = [rng.choice(animals if i % 2 else places)] + rng.sample(filler, 3)
        rng.shuffle(words)
        rows.append(f"{' '.join(words).capitalize()}.,{'animal' if i % 2 else 'place'}")
    (root / "labelled.csv").write_text("\n".join(rows) + "\n")
    tasks = {}
    for name, baselines in (("topic", True), ("topic_b", False)):
        (root / f"{name}.yaml").write_text(yaml.safe_dump({"finetune": {
            "task": "classification", "dataset": "csv", "train_file": str(root / "labelled.csv"),
            "max_seq_length": 16, "batch_size": 8, "epochs": 1, "learning_rate": 0.001,
            "baselines": baselines, "random_init_baseline": False,
            "registered_model": f"bert-cycle-{name.replace('_', '-')}"}}))
        tasks[name] = {"config": str(root / f"{name}.yaml")}
    return tasks


def _cycle_runs(client):
    return client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`cycle.number` != ''")


@pytest.mark.slow
def test_cycles_train_register_skip_and_promote_only_if_better(run_root, capsys):
    make_corpus(run_root / "incoming", documents=30, seed=0)
    tasks = _task_files(run_root)
    args = _args(run_root, "cycle.tasks=" + json.dumps([tasks["topic"]]),
                 "cycle.continued=[train.learning_rate=0.0005]")
    names = {"topic": "bert-cycle-topic", "topic_b": "bert-cycle-topic-b"}
    root = run_root / "runs" / "test"
    started = time.time()

    # 1. The first cycle: all the text; the task registered, v1 its champion.
    assert cli.main(args) == cli.EXIT_OK, capsys.readouterr().err[-3000:]
    client = mlflow.MlflowClient()
    champion = client.get_model_version_by_alias(names["topic"], "champion")
    assert str(champion.version) == "1" and champion.tags["promotion"] == "no champion yet"
    assert champion.tags["cycle.number"] == "1" and "eval.test_accuracy" in champion.tags
    (run,) = _cycle_runs(client)
    assert run.info.status == "FINISHED" and run.data.tags["cycle.new_files"] == "2"
    children = client.search_runs([run.info.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{run.info.run_id}'")
    assert len(children) == 2  # the pretraining pipeline run, the task's
    assert champion.run_id == run.info.run_id  # the version's source run: the cycle's
    listed = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
    assert {"report/topic_confusion_matrix.png", "report/topic_finetuning_curves.png",
            "report/pretraining_curves.png", "report/cycle_report.md"} <= listed
    assert "cycle_report.html" in {a.path for a in client.list_artifacts(run.info.run_id)}
    page = (root / "cycles" / "0001" / "report" / "cycle_report.html").read_text()
    assert page.count("data:image/png;base64,") >= 3 and "no champion yet" in page
    assert "baseline majority" in page  # the baselines, on the same test split
    # ...and the margin against the strongest of them, as metrics.json says it
    best = json.loads((root / "cycles" / "0001" / "finetune" / "topic" / "metrics.json")
                      .read_text())["best_baseline"]
    assert "Against the strongest baseline" in page
    assert f"{best['name']}: " in page and f"{best['margin_points']:+.1f}" in page
    # Each step's log in the cycle's logs/steps/ and on its run; the console: a line per step
    # start and end, and what the cycle decided (the stages' lines are in the steps' logs).
    steps = root / "cycles" / "0001" / "logs" / "steps"
    step_logs = ["evaluate.log", "finetune-topic.log", "pretrain.log", "promote.log"]
    assert sorted(p.name for p in steps.iterdir()) == step_logs
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id, "logs")) == [
        f"logs/{name}" for name in step_logs]
    assert "registry: bert-cycle-topic v1: promoted to champion" in (
        steps / "promote.log").read_text()
    out = capsys.readouterr().out.splitlines()
    assert "cycle 1: topic: v1 promoted to champion (no champion yet)" in out
    assert [line.split(":")[0] for line in out if " started (log: " in line] == [
        "pretrain", "finetune-topic", "evaluate", "promote"]
    assert not [line for line in out if line.startswith(("MLflow run", "corpus:", "  model"))]
    first_seconds = time.time() - started

    # 2. No new text: exit 3, nothing trained, no MLflow run, no version.
    assert cli.main(args) == cli.EXIT_NOTHING_TO_DO
    assert len(_cycle_runs(client)) == 1
    assert len(client.search_model_versions(f"name = '{names['topic']}'")) == 1

    # 3. New text, and a second task whose model was registered before (by hand, say). By
    # construction: topic's champion holds a score no accuracy can beat, topic_b's one any
    # accuracy beats (the comparison reads the holder's score logged on the same split).
    client.set_model_version_tag(names["topic"], "1", "eval.test_accuracy", "2.0")
    client.copy_model_version(f"models:/{names['topic']}/1", names["topic_b"])
    for key, value in {"eval.test_accuracy": "-1.0", "cycle.number": "",
                       "eval.test_split": champion.tags["eval.test_split"]}.items():
        client.set_model_version_tag(names["topic_b"], "1", key, value)
    client.set_registered_model_alias(names["topic_b"], "champion", "1")
    args = [a for a in args if not a.startswith("cycle.tasks=")]
    args.append("cycle.tasks=" + json.dumps([tasks["topic"], tasks["topic_b"]]))
    extra = run_root / "extra"
    make_corpus(extra, documents=40, seed=1)
    shutil.copy(extra / "part-0.txt", run_root / "incoming" / "day-2.txt")

    # Step by step, as the Airflow DAG's tasks run it, continued from cycle 1's encoder.
    assert cli.main([*args, "--step", "pretrain"]) == cli.EXIT_OK
    cycle2 = root / "cycles" / "0002"
    assert [p.name for p in (cycle2 / "incoming").iterdir()] == ["0000-day-2.txt"]  # new only
    used = yaml.safe_load((cycle2 / "configs" / "pretrain.yaml").read_text())
    assert used["model"]["init_from"] == str(root / "cycles" / "0001" / "pretrain" / "model.keras")
    assert used["vocab"]["from_file"] == str(root / "cycles" / "0001" / "vocab" / "vocab.txt")
    assert used["train"]["learning_rate"] == 0.0005  # cycle.continued
    capsys.readouterr()
    assert cli.main([*args, "--step", "evaluate"]) == cli.EXIT_BAD_INPUT  # not fine-tuned yet
    assert "has not done finetune yet" in capsys.readouterr().err
    assert cli.main([*args, "--step", "finetune", "--task", "topic"]) == cli.EXIT_OK
    # The rest of the cycle under way: pretrain and topic are done, not done again.
    assert cli.main(args) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "pretrain already done" in out and "topic already fine-tuned" in out
    for task, name in names.items():
        new = client.get_model_version(name, "2")
        value = float(new.tags["eval.test_accuracy"])
        old = client.get_model_version(name, "1")
        holder = float(old.tags["eval.test_accuracy"])
        promoted = str(client.get_model_version_by_alias(name, "champion").version) == "2"
        assert promoted == (value > holder), (task, value, holder)  # the decision = the numbers
        assert promoted == (task == "topic_b")
        assert new.tags["cycle.number"] == "2"
        assert new.tags["eval.test_split"] == old.tags["eval.test_split"]  # the same test split
        said = "beats" if promoted else "does not beat"
        assert f"{said} champion v1's {holder:.4f}" in new.tags["promotion"]
        assert said in new.description and new.description.startswith("Cycle 2")
    run2 = next(r for r in _cycle_runs(client) if r.data.tags["cycle.number"] == "2")
    assert run2.data.tags["cycle.base"] == "1" and run2.info.status == "FINISHED"
    assert "not promoted" in run2.data.tags["cycle.topic.decision"]
    page = (cycle2 / "report" / "cycle_report.html").read_text()
    assert "does not beat champion v1" in page and "v2 promoted to champion" in page

    # Killed after its versions were registered and promoted, before the cycle was closed: the
    # next invocation finishes it, registering nothing again and keeping the decisions.
    record = json.loads((cycle2 / "cycle.json").read_text())
    record["status"] = "open"
    del record["steps"]["promote"]
    (cycle2 / "cycle.json").write_text(json.dumps(record))
    assert cli.main(args) == cli.EXIT_OK
    for name in names.values():
        assert len(client.search_model_versions(f"name = '{name}'")) == 2
    assert str(client.get_model_version_by_alias(names["topic_b"], "champion").version) == "2"
    assert str(client.get_model_version_by_alias(names["topic"], "champion").version) == "1"
    assert "beats champion v1" in client.get_model_version(names["topic_b"], "2").description
    assert json.loads((cycle2 / "cycle.json").read_text())["status"] == "done"
    assert cli.main(args) == cli.EXIT_NOTHING_TO_DO
    print(f"first cycle {first_seconds:.0f} s, all {time.time() - started:.0f} s")


@pytest.mark.slow
def test_cycles_from_a_published_checkpoint_make_its_direct_fine_tune_the_first_champion(
        run_root, capsys):
    """`model.init_from` in the cycle's config: the first cycle continues pretraining the
    checkpoint and also fine-tunes the checkpoint as it is on each task; that direct model is
    registered first and made champion, and the adapted one is promoted only when it beats it
    on the same test split. Forced by the direct model's logged score (written before the
    evaluate step): any accuracy beats -1.0. One task: a model that does not beat its champion
    stays unpromoted in the test above (the same rule, the same registry calls), and the
    wording of both outcomes against the direct model is checked in
    test_the_comparison_with_the_direct_fine_tune_says_which_way_it_went."""
    from tests.test_init_from import write_checkpoint

    checkpoint = write_checkpoint(run_root / "published" / "bert-tiny-uncased", heads=False)
    make_corpus(run_root / "incoming", documents=30, seed=0)
    tasks = _task_files(run_root)
    args = _args(run_root, f"model.init_from={checkpoint}",
                 "cycle.tasks=" + json.dumps([tasks["topic_b"]]))
    name = "bert-cycle-topic-b"
    assert cli.main([*args, "--step", "pretrain"]) == cli.EXIT_OK
    assert cli.main([*args, "--step", "finetune"]) == cli.EXIT_OK
    cycle1 = run_root / "runs" / "test" / "cycles" / "0001"
    used = yaml.safe_load((cycle1 / "configs" / "finetune-topic_b_direct.yaml").read_text())
    assert used["finetune"]["init_from"] == str(checkpoint)  # the checkpoint as it is
    adapted = yaml.safe_load((cycle1 / "configs" / "finetune-topic_b.yaml").read_text())
    assert adapted["finetune"]["init_from"] == str(cycle1 / "pretrain" / "model.keras")
    path = cycle1 / "finetune" / "topic_b_direct" / "metrics.json"
    metrics = json.loads(path.read_text())
    metrics["test"]["accuracy"] = -1.0
    path.write_text(json.dumps(metrics))
    capsys.readouterr()
    assert cli.main(args) == cli.EXIT_OK  # evaluate, promote
    assert "beats the checkpoint fine-tuned directly, -1.0000" in capsys.readouterr().out
    client = mlflow.MlflowClient()
    direct, new = (client.get_model_version(name, v) for v in ("1", "2"))
    assert direct.tags["cycle.arm"] == "direct" and new.tags["cycle.arm"] == "adapted"
    assert "fine-tuned directly: the first champion" in direct.tags["promotion"]
    assert new.tags["eval.test_split"] == direct.tags["eval.test_split"]
    value, holder = (float(v.tags["eval.test_accuracy"]) for v in (new, direct))
    assert value > holder == -1.0
    assert str(client.get_model_version_by_alias(name, "champion").version) == "2"
    page = (cycle1 / "report" / "cycle_report.html").read_text()
    assert "topic_b: direct vs adapted" in page


def test_the_comparison_with_the_direct_fine_tune_says_which_way_it_went():
    from pipeline.tools.cycle_report import compare_direct

    adapted = {"metric": "accuracy", "value": 0.75, "split_id": "s1"}
    assert compare_direct(adapted, {"value": 2.0, "split_id": "s1"}) == (
        "test_accuracy 0.7500 does not beat the checkpoint fine-tuned directly, 2.0000 (-1.2500)")
    assert compare_direct(adapted, {"value": -1.0, "split_id": "s1"}) == (
        "test_accuracy 0.7500 beats the checkpoint fine-tuned directly, -1.0000 (+1.7500)")
    assert "another test split: not comparable" in compare_direct(
        adapted, {"value": 0.5, "split_id": "s2"})
