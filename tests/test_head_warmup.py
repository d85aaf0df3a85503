"""The head warm-up of continued pretraining (pipeline/training/head_warmup.py): a checkpoint
without pretraining heads first trains its new heads alone, the encoder and its token
embedding (the tied MLM decoder) frozen; then everything trains, the new weights at
train.new_weights_lr_multiplier × the rate; a killed run resumes in the phase it was in; a
checkpoint with heads gets no warm-up.

Real parts: a tiny BERT exported to a Hugging Face directory by our exporter (heads stripped
for the encoder-only case), the pretrain stage's own training (`pretrain.run`) on synthetic
records (tests/test_training.py's `write_pretraining_data`).
"""

from __future__ import annotations

import json
import logging
import types

import keras
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from models import convert, keras_compat
from models.bert import BertEncoder
from models.pretraining import BertPretrainer
from pipeline import artifacts
from pipeline.stages import pretrain
from pipeline.training import callbacks, checkpoints, head_warmup

from tests.test_training import die_after_checkpoint, no_export, tiny_config, write_pretraining_data

HEADS = ("mlm_head/", "nsp_head/")


def write_checkpoint(folder, vocab, heads: bool):
    """A Hugging Face BERT directory of test_tiny.yaml's sizes over `vocab`."""
    keras.utils.set_random_seed(7)
    encoder = BertEncoder(vocabulary_size=len(vocab), num_layers=1, num_heads=2, hidden_dim=32,
                          intermediate_dim=64, max_sequence_length=64)
    convert.export_huggingface(BertPretrainer(encoder, compile=False), vocab, folder,
                               lowercase=True)
    if not heads:
        state = load_file(str(folder / "model.safetensors"))
        save_file({k: v for k, v in state.items() if not k.startswith("cls.")},
                  str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    run = tmp_path_factory.mktemp("vocab")
    write_pretraining_data(run)
    return artifacts.Artifacts(run).vocab_file.read_text().splitlines()


@pytest.fixture(scope="module")
def encoder_only(tmp_path_factory, vocab):
    return write_checkpoint(tmp_path_factory.mktemp("enc") / "encoder-only", vocab, heads=False)


@pytest.fixture(scope="module")
def with_heads(tmp_path_factory, vocab):
    return write_checkpoint(tmp_path_factory.mktemp("full") / "with-heads", vocab, heads=True)


def snapshots(monkeypatch) -> dict:
    """{step: {variable path: array}} of the model when training starts and at every
    checkpoint written."""
    taken = {}
    save = callbacks.Checkpointer.save

    def keep(model):
        taken[checkpoints.global_step(model)] = {
            v.path: np.array(keras.ops.convert_to_numpy(v)) for v in model.weights
            if not v.path.endswith(checkpoints.SEED_STATE)}

    def save_and_keep(self):
        save(self)
        keep(self.model)

    monkeypatch.setattr(callbacks.Checkpointer, "save", save_and_keep)
    monkeypatch.setattr(callbacks.Checkpointer, "on_train_begin",
                        lambda self, logs=None: keep(self.model))
    return taken


def train(run_dir, checkpoint, *args):
    write_pretraining_data(run_dir)
    return pretrain.run(tiny_config(run_dir, f"model.init_from={checkpoint}",
                                    "train.head_warmup_until_plateau=false", *args))


def imported(checkpoint) -> dict:
    model = convert.load_pretrainer(checkpoint).model
    return {v.path: np.array(keras.ops.convert_to_numpy(v)) for v in model.weights}


def moved(before: dict, after: dict, paths) -> list:
    return [p for p in paths if np.abs(after[p] - before[p]).max() > 0]


def test_the_encoder_stays_fixed_while_the_new_heads_learn_then_both_move(
        tmp_path, monkeypatch, caplog, encoder_only):
    no_export(monkeypatch)
    taken = snapshots(monkeypatch)
    caplog.set_level(logging.INFO, logger="pipeline")
    result = train(tmp_path / "run", encoder_only, "train.steps=6", "train.checkpoint_every=2",
                   "train.head_warmup_steps=2", "train.warmup_steps=1")
    assert result["step"] == 6
    start, warmed, after = taken[0], taken[2], taken[4]
    encoder = [p for p in start if not p.startswith(HEADS)]
    heads = [p for p in start if p.startswith(HEADS)]
    assert "token_embedding/embeddings" in encoder and len(encoder) > 10
    assert {"mlm_head/intermediate_dense/kernel", "mlm_head/output_bias",
            "nsp_head/kernel"} <= set(heads)
    # Training started from the checkpoint's encoder.
    source = imported(encoder_only)
    for path in encoder:
        np.testing.assert_array_equal(start[path], source[path], err_msg=path)
    # Warm-up: not one encoder value moved (nor the token embedding, the tied decoder); every
    # head variable did.
    assert moved(start, warmed, encoder) == []
    assert moved(start, warmed, heads) == heads
    # After it: the encoder and the heads both move.
    assert "token_embedding/embeddings" in moved(warmed, after, encoder)
    assert len(moved(warmed, after, encoder)) >= len(encoder) - 2  # (an unused row's owner)
    assert moved(warmed, after, heads) == heads
    said = "\n".join(caplog.messages)
    assert "head warm-up: only mlm_head, nsp_head train" in said
    assert "head warm-up ended at step 2 (its 2 updates done)" in said
    record = head_warmup.read_record(artifacts.Artifacts(tmp_path / "run").checkpoint_dir)
    assert record.unfrozen_at == 2 and record.heads == ["mlm_head", "nsp_head"]


def test_a_run_stopped_inside_the_warm_up_exports_a_model_that_trains_everything(
        tmp_path, monkeypatch, encoder_only):
    exported = []
    monkeypatch.setattr(pretrain, "export", lambda model, paths, lowercase: exported.append(
        [(layer.name, layer.trainable) for layer in keras_compat.flatten_layers(model)]))
    result = train(tmp_path / "run", encoder_only, "train.steps=6", "train.max_seconds=0.001",
                   "train.head_warmup_steps=5")
    assert result["step"] < 5  # stopped by the time budget, inside the warm-up
    assert exported and all(trainable for _, trainable in exported[0]), exported


def test_the_multiplier_scales_the_update_of_the_new_weights(tmp_path, monkeypatch,
                                                            encoder_only):
    """Two runs, multiplier 1 and 4, identical to the end of the warm-up; the first update
    after it moves each new weight 4 times as far, the encoder the same."""
    no_export(monkeypatch)
    deltas = {}
    for factor in (1, 4):
        taken = snapshots(monkeypatch)
        train(tmp_path / f"x{factor}", encoder_only, "train.steps=3", "train.checkpoint_every=1",
              "train.head_warmup_steps=2", "train.warmup_steps=0",
              f"train.new_weights_lr_multiplier={factor}")
        deltas[factor] = {p: taken[3][p] - taken[2][p] for p in taken[3]}
        previous = taken
    new = [p for p in deltas[1] if p.startswith(HEADS)]
    encoder = [p for p in deltas[1] if not p.startswith(HEADS)]
    assert previous[2]  # the warm-up ran in both
    for path in new:
        assert np.abs(deltas[1][path]).max() > 0, path
        np.testing.assert_allclose(deltas[4][path], 4 * deltas[1][path], rtol=1e-3, atol=1e-9,
                                   err_msg=path)
    for path in encoder:
        np.testing.assert_allclose(deltas[4][path], deltas[1][path], rtol=1e-4, atol=1e-9,
                                   err_msg=path)
    assert np.abs(deltas[1]["token_embedding/embeddings"]).max() > 0


def test_a_checkpoint_with_heads_gets_no_warm_up(tmp_path, monkeypatch, caplog, with_heads):
    no_export(monkeypatch)
    taken = snapshots(monkeypatch)
    caplog.set_level(logging.INFO, logger="pipeline")
    train(tmp_path / "run", with_heads, "train.steps=2", "train.checkpoint_every=2",
          "train.warmup_steps=1")
    encoder = [p for p in taken[0] if not p.startswith(HEADS)]
    assert "token_embedding/embeddings" in moved(taken[0], taken[2], encoder)
    assert "head warm-up" not in "\n".join(caplog.messages)
    assert head_warmup.read_record(artifacts.Artifacts(tmp_path / "run").checkpoint_dir) is None
    # The plan: no new weight, or only an NSP head that no loss trains: no warm-up.
    train_config = types.SimpleNamespace(head_warmup_steps=-1, steps=1000,
                                         head_warmup_until_plateau=True,
                                         new_weights_lr_multiplier=1.0, max_seconds=0.0)
    assert head_warmup.plan(train_config, [], tmp_path, 0, 1.0, resumed=False) is None
    nsp_only = head_warmup.plan(train_config, ["nsp_head/kernel", "nsp_head/bias"], tmp_path, 0,
                                0.0, resumed=False)
    assert nsp_only.steps == 0 and not nsp_only.warming(0)
    auto = head_warmup.plan(train_config, ["mlm_head/output_bias"], tmp_path, 0, 0.0,
                            resumed=False)
    assert auto.steps == head_warmup.AUTO_STEPS and auto.heads == ["mlm_head"]


def test_under_a_time_budget_the_warm_up_ends_with_a_quarter_of_it(tmp_path, monkeypatch,
                                                                   caplog, encoder_only):
    """300 updates can be a whole train.max_seconds on a slow machine: the warm-up ends once a
    quarter of the budget is spent, and the encoder trains for the rest."""
    no_export(monkeypatch)
    caplog.set_level(logging.INFO, logger="pipeline")
    result = train(tmp_path / "run", encoder_only, "train.steps=100000", "train.max_seconds=20",
                   "train.head_warmup_steps=90000", "train.checkpoint_every=100000",
                   "train.heldout_every=100000", "train.heldout_batches=1")
    said = "\n".join(caplog.messages)
    assert "of train.max_seconds spent: 5 s)" in said, said[-2000:]
    paths = artifacts.Artifacts(tmp_path / "run")
    record = head_warmup.read_record(paths.checkpoint_dir)
    assert 5 <= record.unfrozen_seconds < 20 and 0 < record.unfrozen_at < result["step"]
    # The held-out curve: step 0, the unfreeze (between two probes: probed then), the end.
    curve = json.loads(paths.heldout_curve.read_text())["curve"]
    assert [step for step, _, _ in curve] == [0, record.unfrozen_at, result["step"]]


@pytest.mark.slow
@pytest.mark.parametrize("killed_at", [2, 4])
def test_a_killed_run_resumes_in_its_phase(tmp_path, monkeypatch, caplog, encoder_only,
                                           killed_at):
    """Killed after the checkpoint at step 2 (inside the warm-up of 3) or 4 (after it): the
    resumed run ends with the uninterrupted run's weights."""
    no_export(monkeypatch)
    args = ["train.steps=6", "train.checkpoint_every=2", "train.head_warmup_steps=3",
            "train.warmup_steps=1"]
    straight = train(tmp_path / "straight", encoder_only, *args)
    revive = die_after_checkpoint(
        monkeypatch, lambda ckpt: checkpoints.global_step(ckpt.model) == killed_at)
    with pytest.raises(Exception, match="") as killed:
        train(tmp_path / "killed", encoder_only, *args)
    assert type(killed.value).__name__ == "Killed"
    revive()
    caplog.set_level(logging.INFO, logger="pipeline")
    caplog.clear()
    resumed = pretrain.run(tiny_config(tmp_path / "killed", f"model.init_from={encoder_only}",
                                       "train.head_warmup_until_plateau=false", *args))
    assert resumed["start_step"] == killed_at and resumed["step"] == 6
    said = "\n".join(caplog.messages)
    assert ("head warm-up ended at step 3" in said) == (killed_at < 3)
    assert ("resuming after the head warm-up (the encoder unfroze at step 3)" in said) == (
        killed_at > 3)
    assert resumed["weights_sha256"] == straight["weights_sha256"]
