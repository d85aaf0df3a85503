"""Distillation: the losses against hand-computed values, the student's initialisation from the
teacher, and the distill stage end to end on a tiny fine-tuned teacher (2 layers -> 1 layer)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import keras
import mlflow
import numpy as np
import pytest

from models import distill as distill_lib
from models import heads
from models.bert import BertEncoder
from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.finetuning import distillation, outputs, task_model, tasks
from pipeline.finetuning import train as finetuning
from pipeline.stages import distill

from tests.test_finetune import ANIMALS, PLACES, sentence, sqlite_mlflow  # noqa: F401
from tests.test_finetune_data import write_vocab
from tests.test_tracking_outage import store  # noqa: F401


def _softmax(z):
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def test_soft_target_loss_is_kl_at_temperature_times_t_squared():
    teacher = np.array([[2.0, 1.0, 0.0], [0.5, -1.0, 3.0]], "float32")
    student = np.array([[0.0, 1.0, 0.5], [1.0, 1.0, 1.0]], "float32")
    T = 3.0
    p, q = _softmax(teacher / T), _softmax(student / T)
    expected = T * T * np.mean(np.sum(p * np.log(p / q), axis=-1))
    assert float(distill_lib.soft_target_loss(teacher, student, T)) == pytest.approx(
        expected, rel=1e-5)
    # The first example by hand: p = softmax([2/3, 1/3, 0]), q = softmax([0, 1/3, 1/6]).
    p0 = np.exp([2 / 3, 1 / 3, 0]) / np.exp([2 / 3, 1 / 3, 0]).sum()
    q0 = np.exp([0, 1 / 3, 1 / 6]) / np.exp([0, 1 / 3, 1 / 6]).sum()
    one = float(distill_lib.soft_target_loss(teacher[:1], student[:1], T))
    assert one == pytest.approx(9 * sum(a * math.log(a / b) for a, b in zip(p0, q0)), rel=1e-5)
    assert float(distill_lib.soft_target_loss(teacher, teacher, T)) == pytest.approx(0, abs=1e-6)


def test_alpha_one_is_soft_only_and_alpha_zero_is_hard_only():
    rng = np.random.default_rng(0)
    teacher, student = rng.normal(size=(2, 4, 3)).astype("float32")
    labels_a, labels_b = np.array([0, 1, 2, 0]), np.array([2, 2, 1, 1])
    other_teacher = rng.normal(size=(4, 3)).astype("float32")
    ce = -np.mean(np.log(_softmax(student)[np.arange(4), labels_a]))
    soft = distill_lib.soft_target_loss(teacher, student, 2.0)

    total_1a = distill_lib.distillation_loss(labels_a, teacher, student, 2.0, 1.0)[0]
    total_1b = distill_lib.distillation_loss(labels_b, teacher, student, 2.0, 1.0)[0]
    assert float(total_1a) == pytest.approx(float(soft)) == pytest.approx(float(total_1b))
    total_0a = distill_lib.distillation_loss(labels_a, teacher, student, 2.0, 0.0)[0]
    total_0b = distill_lib.distillation_loss(labels_a, other_teacher, student, 2.0, 0.0)[0]
    assert float(total_0a) == pytest.approx(ce, rel=1e-5) == pytest.approx(float(total_0b))
    half = distill_lib.distillation_loss(labels_a, teacher, student, 2.0, 0.5)[0]
    assert float(half) == pytest.approx(0.5 * float(soft) + 0.5 * ce, rel=1e-5)


def test_hidden_state_losses():
    a = np.array([[1.0, 0.0], [0.0, 2.0]], "float32")
    b = np.array([[1.0, 0.0], [0.0, -2.0]], "float32")
    # MSE: the mean over features, then over rows: (0 + (0 + 16) / 2) / 2.
    assert float(distill_lib.hidden_state_loss(a, b, "mse")) == pytest.approx(4.0)
    assert float(distill_lib.hidden_state_loss(a, b, "cosine")) == pytest.approx((0 + 2) / 2)
    seq_a, seq_b = np.stack([a, a]), np.stack([a, b])  # (batch 2, seq 2, hidden 2)
    assert float(distill_lib.hidden_state_loss(seq_a, seq_b, "cosine",
                                               np.ones((2, 2)))) == pytest.approx(2 / 4)
    masked = distill_lib.hidden_state_loss(seq_a, seq_b, "cosine", np.array([[0, 1], [0, 1]]))
    assert float(masked) == pytest.approx(1.0)  # only the second token of each row counts


def test_student_starts_from_every_other_teacher_layer():
    teacher = BertEncoder(vocabulary_size=30, num_layers=4, num_heads=2, hidden_dim=16,
                          intermediate_dim=32, max_sequence_length=16)
    sizes = distill_lib.student_sizes(teacher)
    assert sizes == {"num_layers": 2, "hidden_dim": 16, "num_heads": 2, "intermediate_dim": 32}
    student = distill_lib.build_student(teacher, sizes)
    assert distill_lib.init_from_teacher(student, teacher) == [0, 2]
    for i, j in ((0, 0), (1, 2)):
        for s, t in zip(student.transformer_layers[i].get_weights(),
                        teacher.transformer_layers[j].get_weights()):
            np.testing.assert_array_equal(s, t)
    assert [distill_lib.teacher_layer_for_match(i, 2, 4) for i in range(2)] == [1, 3]
    narrow = distill_lib.build_student(teacher, distill_lib.student_sizes(teacher, hidden_dim=8))
    with pytest.raises(ValueError, match="differ in width"):
        distill_lib.init_from_teacher(narrow, teacher)


def write_topic_data(folder, n=80):
    rng = random.Random(0)
    rows = ["text,label"] + [f"{sentence(rng, ANIMALS if i % 2 else PLACES)},"
                             f"{'animal' if i % 2 else 'place'}" for i in range(n)]
    (folder / "topic.csv").write_text("\n".join(rows) + "\n")


def teacher_config(folder, *overrides):
    return config_lib.load(None, [
        f"run_dir={folder}/run", f"finetune.init_from={folder}/encoder.keras",
        f"finetune.vocab_file={folder}/vocab.txt", "finetune.dataset=csv",
        f"finetune.train_file={folder}/topic.csv", "finetune.name=topic",
        "finetune.max_seq_length=16", "finetune.batch_size=8", "finetune.epochs=2",
        "finetune.learning_rate=0.003", "finetune.baselines=false",
        "finetune.register_model=false", *overrides])


def write_encoder(folder):
    vocab = write_vocab(folder / "vocab.txt")
    keras.utils.set_random_seed(0)
    BertEncoder(vocabulary_size=len(vocab), num_layers=2, num_heads=2, hidden_dim=32,
                intermediate_dim=64, max_sequence_length=32, dropout=0.0).save(
        folder / "encoder.keras")


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A 2-layer classifier in the finetune stage's folder layout, written with the stage's own
    helpers (task.json, config.yaml) but not trained: fast. The slow test below distils a
    teacher that the finetune stage really trained."""
    from pipeline.finetuning import data as fd

    folder = tmp_path_factory.mktemp("teacher")
    write_encoder(folder)
    write_topic_data(folder)
    config = teacher_config(folder)
    data = fd.load_task(config.finetune)
    out = artifacts.Artifacts(config.run_dir).finetune("topic")
    out.dir.mkdir(parents=True)
    backbone = task_model.load_backbone(folder / "encoder.keras")
    tasks.get("classification", config.finetune).build_model(
        backbone, len(data.labels)).save(out.model_keras)
    (out.vocab_file).write_text((folder / "vocab.txt").read_text())
    out.task_json.write_text(json.dumps(outputs.task_info(config, data, True, "encoder.keras")))
    out.config.write_text(config_lib.dump_yaml(config))
    return folder, out.dir


def distill_config(folder, teacher, *overrides):
    return config_lib.load(None, [f"run_dir={folder}/run", f"distill.teacher={teacher}",
                                  "distill.batch_size=8", "distill.learning_rate=0.003",
                                  "distill.num_layers=1", "distill.temperature=2.0", *overrides])


@pytest.mark.slow
def test_distill_stage_trains_a_smaller_student_and_logs_it(teacher_dir, sqlite_mlflow):  # noqa: F811
    folder, teacher = teacher_dir
    config = distill_config(folder, teacher, "distill.epochs=4", "distill.alpha=0.7",
                            "distill.hidden_loss=cosine", "distill.init_from_teacher=false")
    _, experiment = sqlite_mlflow
    with mlflow.start_run(experiment_id=experiment) as run:
        results = distill.run(config)
    history = results["history"]
    assert len(history) >= 3
    assert history[-1]["loss"] < history[0]["loss"]  # the student learns from random init
    s = results["distillation"]
    assert s["student"]["parameters"] < s["teacher"]["parameters"]
    assert s["student"]["num_layers"] == 1 and s["teacher"]["num_layers"] == 2
    assert s["student"]["examples_per_second"] > 0 and s["teacher"]["examples_per_second"] > 0
    assert s["student"]["test_accuracy"] == results["test"]["accuracy"]

    paths = artifacts.Artifacts(config.run_dir).distill("topic_student")
    for path in (paths.model_keras, paths.saved_model, paths.task_json, paths.vocab_file,
                 paths.metrics, paths.distill_json):
        assert path.exists(), path
    saved = keras.models.load_model(paths.model_keras, compile=False)
    assert isinstance(saved, heads.BertClassifier) and saved.backbone.num_layers == 1
    assert saved.count_params() == s["student"]["parameters"]
    assert json.loads(paths.distill_json.read_text())["speedup"] == pytest.approx(s["speedup"])

    logged = mlflow.MlflowClient().get_run(run.info.run_id).data
    for key in ("student_test_accuracy", "teacher_test_accuracy", "student_parameters",
                "teacher_parameters", "student_examples_per_second",
                "teacher_examples_per_second", "train_soft_loss", "train_hidden_loss"):
        assert key in logged.metrics, key
    assert logged.metrics["student_parameters"] == s["student"]["parameters"]
    assert logged.metrics["train_hidden_loss"] > 0


def test_student_initialised_from_the_teacher_and_config_errors(teacher_dir):
    folder, teacher = teacher_dir
    config = distill_config(folder, teacher, "distill.max_steps=2", "distill.name=init",
                            "distill.hidden_loss=mse", "distill.hidden_match=layers",
                            "distill.hidden_dim=16", "distill.num_heads=2")
    results = distill.run(config, write_outputs=False)  # projection 16 -> 32
    assert results["distillation"]["student"]["initialised_from_teacher_layers"] is None
    with pytest.raises(distillation.DistillError, match="init_from_teacher = true"):
        distill.run(distill_config(folder, teacher, "distill.hidden_dim=16", "distill.num_heads=2",
                                   "distill.init_from_teacher=true"))
    with pytest.raises(config_lib.ConfigError, match="distill.temperature"):
        distill_config(folder, teacher, "distill.temperature=0")
    with pytest.raises(config_lib.ConfigError, match="student_preset = 'huge'"):
        distill_config(folder, teacher, "distill.student_preset=huge")
    with pytest.raises(FileNotFoundError, match="finetune stage"):
        distill.run(distill_config(folder, folder / "nowhere"))


@pytest.mark.slow  # the finetune stage trains the teacher first
def test_distill_a_teacher_trained_by_the_finetune_stage(tmp_path, sqlite_mlflow):  # noqa: F811
    """(The teacher without its raw-text SavedModel: distillation reads model.keras, and the
    finetune stage's export is tested in tests/test_finetune.py.)"""
    write_encoder(tmp_path)
    write_topic_data(tmp_path)
    teacher = finetuning.fine_tune(teacher_config(tmp_path, "finetune.export=false"))
    config = distill_config(tmp_path, teacher["output_dir"], "distill.epochs=2")
    _, experiment = sqlite_mlflow
    with mlflow.start_run(experiment_id=experiment):
        results = distill.run(config)
    s = results["distillation"]
    assert s["student"]["initialised_from_teacher_layers"] == [0]  # every other of 2 layers
    assert s["teacher"]["test_accuracy"] == pytest.approx(teacher["test"]["accuracy"])
    assert s["student"]["parameters"] < s["teacher"]["parameters"]
    # The finetune stage wrote checksums.json last; distillation checks the teacher first.
    teacher_model = Path(teacher["output_dir"]) / "model.keras"
    listed = json.loads((Path(teacher["output_dir"]) / "checksums.json").read_text())["files"]
    assert listed["model.keras"]["bytes"] == teacher_model.stat().st_size
    data = bytearray(teacher_model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    teacher_model.write_bytes(bytes(data))
    with pytest.raises(artifacts.AlteredArtifact, match="model.keras.*make finetune"):
        distill.run(config, write_outputs=False)


# ---------------------------------------------------------------------------
# Fine-tuning's fit path: progress lines, resume after a kill, a tracking outage
# ---------------------------------------------------------------------------
class Killed(Exception):
    """A simulated kill right after the first checkpoint was written."""


def progress_lines(lines, label: str) -> tuple[list[int], list[int]]:
    """(the steps of the progress lines, the steps of the epoch lines) that `label` printed, each
    line in fine-tuning's format (`finetune: step 10/24  loss 0.6931  52 examples/s`,
    `finetune: epoch 1  step 6  loss 0.6931  validation accuracy 0.5000  (3 s)`); any other
    line of that label naming a step fails."""
    import re

    step = re.compile(rf"^{re.escape(label)}: step (\d+)/\d+  loss \d+\.\d{{4}}  [\d,]+ examples/s$")
    epoch = re.compile(rf"^{re.escape(label)}: epoch \d+  step (\d+)  loss \d+\.\d{{4}}  "
                       rf"validation \S+ \d+\.\d{{4}}  \(\d+ s\)$")
    steps, epochs = [], []
    for line in lines:
        if m := step.match(line):
            steps.append(int(m.group(1)))
        elif m := epoch.match(line):
            epochs.append(int(m.group(1)))
        else:
            assert not line.startswith(f"{label}: step ") and not line.startswith(
                f"{label}: epoch "), line
    return steps, epochs


def killed_after_first_checkpoint(monkeypatch, run):
    """`run()` killed (an exception) right after its first checkpoint was written."""
    from pipeline.finetuning import runtime

    save = runtime.Checkpoints.save

    def save_then_die(self, model, evaluator):
        if save(self, model, evaluator) is not None:
            raise Killed
    monkeypatch.setattr(runtime.Checkpoints, "save", save_then_die)
    with pytest.raises(Killed):
        run()
    monkeypatch.setattr(runtime.Checkpoints, "save", save)


def run_through_an_outage(uri: str, run_id: str, run) -> tuple[dict, list, int]:
    """`run()` under the stage run `run_id` with the tracking store gone (an address nobody
    listens on) from the start; then the store `uri` is back and the outbox is sent. Returns the
    run's result, its console lines and the calls sent (none may be left)."""
    from pipeline.tracking import outbox
    from tests.conftest import PipelineLines
    from tests.test_tracking import free_port

    with mlflow.start_run(run_id=run_id):
        mlflow.set_tracking_uri(f"http://127.0.0.1:{free_port()}")  # nobody listens there
        with PipelineLines() as lines:
            result = run()
        assert outbox.is_down()
        mlflow.set_tracking_uri(uri)  # the store is back
        sent, left = outbox.flush()
        assert left == 0
    return result, lines, sent


def outage_metric_history(run_id, key) -> list[int]:
    return sorted(m.step for m in mlflow.MlflowClient().get_metric_history(run_id, key))


@pytest.mark.slow  # three runs of the stage, outputs written
def test_distill_prints_progress_resumes_after_a_kill_and_loses_nothing_in_an_outage(
        teacher_dir, store, monkeypatch):  # noqa: F811
    """The uninterrupted run, with the tracking store down throughout: fine-tuning's progress
    and epoch lines; once the store answers, every logged step and final figure is there. A run
    killed after its first checkpoint (epoch 1's end) and started again resumes there and ends
    with the uninterrupted run's history, test metrics and kept epoch."""
    from tests.conftest import PipelineLines

    folder, teacher = teacher_dir
    uri, run_id = store

    def config(name):
        return distill_config(folder, teacher, "distill.epochs=3", "distill.hidden_loss=mse",
                              f"distill.name={name}", "distill.init_from_teacher=false")

    straight, lines, sent = run_through_an_outage(uri, run_id,
                                                  lambda: distill.run(config("straight")))
    assert sent > 10
    total = straight["distillation"]["total_steps"]
    per_epoch = total // 3
    steps, epochs = progress_lines(lines, "distill")
    assert steps == list(range(10, total + 1, 10)), lines  # every 10 updates (at least)
    assert epochs == [per_epoch, 2 * per_epoch, total], lines
    assert outage_metric_history(run_id, "train_loss") == sorted(steps + epochs)
    assert outage_metric_history(run_id, "train_soft_loss") == epochs
    logged = mlflow.MlflowClient().get_run(run_id).data
    assert logged.metrics["student_test_accuracy"] == straight["test"]["accuracy"]
    assert logged.params["distill.total_steps"] == str(total)
    assert [a.path for a in mlflow.MlflowClient().list_artifacts(run_id, "distill")] == [
        "distill/distill.json"]

    killed_after_first_checkpoint(monkeypatch, lambda: distill.run(config("resumed")))
    checkpoints = Path(config("resumed").run_dir) / "distill" / ".checkpoints" / "resumed"
    assert [p.name for p in checkpoints.glob("ckpt-*")] == [f"ckpt-{per_epoch:08d}"]
    with PipelineLines() as lines:
        resumed = distill.run(config("resumed"))
    assert (f"distill: resuming from ckpt-{per_epoch:08d} (step {per_epoch} of {total}, "
            f"epoch 2)") in lines
    assert resumed["history"] == straight["history"]  # exact: the epochs' losses and metrics
    assert resumed["test"] == straight["test"] and resumed["best_epoch"] == straight["best_epoch"]
    assert not checkpoints.exists()  # removed once the output folder is complete
