"""Training at scale on one process: resume with the data position after a kill, checkpoint
rotation, the out-of-memory guard, throughput, LAMB, FLOPs/MFU, the strategies, the held-out
probe, the time budget, and the GPU benchmark script running without TensorFlow. The train
step itself (accumulation, clipping, mixed precision, XLA, the non-finite-loss guard, the fused
kernels) is tested in tests/test_train_step.py.

The data is written by `write_pretraining_data` (synthetic records in the TFRecord schema
and a Google-layout vocab: milliseconds, no Beam), so these tests exercise training only; it
and `tiny_config` are shared with the other training tests (test_train_step,
test_pretrain_phases, test_distributed).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import models
from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.stages import pretrain
from pipeline.training import callbacks, checkpoints, inputs, pretrainer
from pipeline.training import strategy as strategy_lib

PROJECT = artifacts.PROJECT_ROOT
SEQ, PREDICTIONS = 32, 5


def write_pretraining_data(run_dir, train_files=2, records_per_file=48, eval_records=16,
                           full_weights=False, seed=0) -> int:
    """A vocab and train/eval TFRecords as the data stage writes them; returns the vocab size.

    Sequences of 12..SEQ tokens ([CLS] A [SEP] B [SEP]), 15% of them masked (1..PREDICTIONS
    predictions, or all PREDICTIONS slots real with `full_weights`), random NSP labels.
    """
    paths = artifacts.Artifacts(run_dir)
    vocab = (["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]",
             "[MASK]"] + [f"w{i}" for i in range(200)])
    paths.vocab_file.parent.mkdir(parents=True, exist_ok=True)
    paths.vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    rng = np.random.default_rng(seed)

    def instance():
        n = int(rng.integers(12, SEQ + 1))
        split = int(rng.integers(2, n - 3))
        ids = [101] + list(rng.integers(104, len(vocab), split - 1)) + [102]
        ids += list(rng.integers(104, len(vocab), n - split - 2)) + [102]
        segments = [0] * (split + 1) + [1] * (n - split - 1)
        candidates = [i for i, t in enumerate(ids) if t not in (101, 102)]
        count = PREDICTIONS if full_weights else min(PREDICTIONS, max(1, round(n * 0.15)))
        positions = sorted(rng.choice(candidates, count, replace=False).tolist())
        labels = [int(ids[p]) for p in positions]
        for p in positions:
            ids[p] = 103
        return dict(input_ids=[int(t) for t in ids], input_mask=[1] * n, segment_ids=segments,
                    masked_lm_positions=positions, masked_lm_ids=labels,
                    masked_lm_weights=[1.0] * count,
                    next_sentence_labels=[int(rng.integers(0, 2))])

    paths.data_dir.mkdir(parents=True, exist_ok=True)
    shards = [(f"train-{i:05d}-of-{train_files:05d}.tfrecord", records_per_file)
              for i in range(train_files)] + [("eval-00000-of-00001.tfrecord", eval_records)]
    for name, count in shards:
        with tf.io.TFRecordWriter(str(paths.data_dir / name)) as writer:
            for _ in range(count):
                writer.write(inputs.serialize(instance(), SEQ, PREDICTIONS))
    paths.data_stats.write_text(json.dumps({
        "settings": {"max_seq_length": SEQ, "max_predictions_per_seq": PREDICTIONS},
        "train": {"instances": train_files * records_per_file},
        "eval": {"instances": eval_records}}))
    return len(vocab)


def tiny_config(run_dir, *overrides):
    """configs/test_tiny.yaml (1 layer, hidden 32), dropout off, no peak probe, quick eval."""
    return config_lib.load("configs/test_tiny.yaml", [
        f"run_dir={run_dir}", "model.dropout=0", "train.peak_flops_seconds=0",
        "train.eval_batches=1", "train.log_every=1", *overrides])


def no_export(monkeypatch):
    """The SavedModel export takes ~10 s here and is tested elsewhere (test_pipeline_e2e)."""
    monkeypatch.setattr(pretrain, "export", lambda model, paths, lowercase: None)


class Killed(Exception):
    """A simulated kill -9 right after a checkpoint was written."""


def die_after_checkpoint(monkeypatch, when):
    """Makes `Checkpointer.save` raise Killed right after saving when `when(checkpointer)` holds;
    returns the function that puts the real `save` back."""
    save = callbacks.Checkpointer.save

    def save_then_die(self):
        save(self)
        if when(self):
            raise Killed

    monkeypatch.setattr(callbacks.Checkpointer, "save", save_then_die)
    return lambda: monkeypatch.setattr(callbacks.Checkpointer, "save", save)


@pytest.mark.slow
@pytest.mark.parametrize("dropout", ["0", "0.1"])
def test_resume_after_kill_reproduces_the_loss_curve(tmp_path, monkeypatch, caplog, dropout):
    """6 steps straight vs 3 steps, killed, resumed for 3: the same batches, losses and final
    weights; with dropout too (its random state is kept beside each checkpoint)."""
    no_export(monkeypatch)
    write_pretraining_data(tmp_path / "straight")
    write_pretraining_data(tmp_path / "killed")
    args = ["train.steps=6", "train.checkpoint_every=3", "train.warmup_steps=2",
            f"model.dropout={dropout}"]
    straight = pretrain.run(tiny_config(tmp_path / "straight", *args))

    revive = die_after_checkpoint(monkeypatch, lambda ckpt: checkpoints.global_step(ckpt.model) == 3)
    with pytest.raises(Killed):
        pretrain.run(tiny_config(tmp_path / "killed", *args))
    revive()
    caplog.set_level(logging.INFO, logger="pipeline")
    caplog.clear()
    resumed = pretrain.run(tiny_config(tmp_path / "killed", *args))
    lines = caplog.messages

    assert resumed["start_step"] == 3 and resumed["step"] == 6
    assert any("skipping the 3 batches consumed before step 3" in line for line in lines)
    expected = {step: m for step, m in straight["history"] if step > 3}
    assert [step for step, _ in resumed["history"]] == [4, 5, 6]
    for step, metrics in resumed["history"]:
        for key in ("loss", "mlm_loss", "nsp_loss", "grad_norm", "learning_rate"):
            np.testing.assert_allclose(metrics[key], expected[step][key], rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(resumed["eval_loss"], straight["eval_loss"], rtol=1e-5)
    assert resumed["weights_sha256"] == straight["weights_sha256"]


def test_checkpoint_rotation_keeps_the_newest_with_their_seeds(tmp_path):
    """train.keep_checkpoints = 2: after steps 1, 2, 3 and 10 only ckpt 3 and 10 remain,
    each with its seeds file (ordered by step, not by name length); latest.json says 10."""
    vocabulary_size = write_pretraining_data(tmp_path / "run")
    config = tiny_config(tmp_path / "run", "model.dropout=0.1")
    model = pretrainer.build_model(config, vocabulary_size)
    optimizer = pretrainer.build_optimizer(config.train)
    pretrainer.compile_model(model, optimizer)
    optimizer.build(model.trainable_variables)
    folder = tmp_path / "checkpoints"
    checkpointer = callbacks.Checkpointer(folder, 2, "train:\n  steps: 10\n", write=True)
    checkpointer.set_model(model)
    for step in (1, 2, 3, 10):
        optimizer.iterations.assign(step)
        checkpointer.save()
    assert sorted(p.name for p in folder.iterdir()) == [
        "ckpt-00000003.seeds.json", "ckpt-00000003.weights.h5",
        "ckpt-00000010.seeds.json", "ckpt-00000010.weights.h5", "config.yaml", "latest.json"]
    assert json.loads((folder / "latest.json").read_text())["step"] == 10
    assert checkpoints.latest_checkpoint(folder)[0] == 10
    assert json.loads((folder / "ckpt-00000010.seeds.json").read_text())  # dropout's states


def test_out_of_memory_names_the_knobs(tmp_path, monkeypatch):
    write_pretraining_data(tmp_path / "run")

    def out_of_memory(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")

    monkeypatch.setattr(models.BertPretrainer, "fit", out_of_memory)
    with pytest.raises(pretrainer.PretrainError) as err:
        pretrain.run(tiny_config(tmp_path / "run"))
    message = str(err.value)
    assert message.startswith("out of memory")
    for knob in ("train.batch_size=4 train.grad_accum_steps=2", "train.precision=mixed_bfloat16",
                 "data.max_seq_length"):
        assert knob in message


def test_stage_logs_throughput_grad_norm_and_mfu(tmp_path, monkeypatch, caplog):
    no_export(monkeypatch)
    write_pretraining_data(tmp_path / "run")
    caplog.set_level(logging.INFO, logger="pipeline")
    result = pretrain.run(tiny_config(tmp_path / "run", "train.steps=2", "train.warmup_steps=1",
                                      "train.grad_accum_steps=2", "train.peak_flops_seconds=0.2",
                                      "train.optimizer=lamb"))
    lines = caplog.messages
    assert any(line.startswith("pretrain: peak ") and "GFLOP/s" in line
               and line.endswith("oneDNN on)") for line in lines)  # on: tests/conftest.py
    assert any("batch 8 × 2 accumulated" in line for line in lines)
    assert [step for step, _ in result["history"]] == [1, 2]
    for _, metrics in result["history"]:
        for key in ("grad_norm", "examples_per_second", "tokens_per_second", "mfu"):
            assert metrics[key] > 0, key
        np.testing.assert_allclose(metrics["tokens_per_second"],
                                   metrics["examples_per_second"] * SEQ)
    assert len(result["weights_sha256"]) == 64


def test_flops_per_token_is_6n_plus_attention():
    from models.flops import training_flops_per_token

    L, H, I, V, S, P = 4, 512, 2048, 30522, 128, 20
    encoder = models_encoder_params(L, H, I)
    per_token = training_flops_per_token(num_layers=L, hidden_dim=H, intermediate_dim=I,
                                         vocabulary_size=V, seq_length=S, num_predictions=P)
    heads = 6 * (P * (H * H + H * V) + H * H + 2 * H) / S
    np.testing.assert_allclose(per_token, 6 * encoder + 12 * L * S * H + heads)


def models_encoder_params(layers, hidden, intermediate):
    """Matmul parameters of the Transformer layers (no embeddings, biases or LayerNorms)."""
    from models.bert import BertEncoder

    encoder = BertEncoder(vocabulary_size=10, num_layers=layers, num_heads=hidden // 64,
                          hidden_dim=hidden, intermediate_dim=intermediate,
                          max_sequence_length=8)
    return sum(int(np.prod(w.shape)) for w in encoder.weights
               if "transformer_layer" in w.path and "kernel" in w.path)


def test_strategy_helpers(monkeypatch):
    cluster = {"worker": ["a:1", "b:2"]}
    cases = [(None, True), ({"cluster": cluster, "task": {"type": "worker", "index": 0}}, True),
             ({"cluster": cluster, "task": {"type": "worker", "index": 1}}, False),
             ({"cluster": {"chief": ["c:0"], **cluster}, "task": {"type": "worker", "index": 0}},
              False),
             ({"cluster": {"chief": ["c:0"], **cluster}, "task": {"type": "chief", "index": 0}},
              True),
             ({"cluster": cluster, "task": {"type": "evaluator", "index": 0}}, False)]
    for tf_config, chief in cases:
        if tf_config is None:
            monkeypatch.delenv("TF_CONFIG", raising=False)
        else:
            monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
        assert strategy_lib.is_chief() is chief, tf_config
    assert strategy_lib.num_workers() == 2

    class ThreeReplicas:
        num_replicas_in_sync = 3

    assert strategy_lib.per_replica_batch(12, ThreeReplicas()) == 4
    with pytest.raises(strategy_lib.StrategyError, match="train.batch_size = 8 .* 3 replicas"):
        strategy_lib.per_replica_batch(8, ThreeReplicas())


def test_gpu_bench_runs_tiny_without_tensorflow():
    """bench/gpu_bench.py on a non-TensorFlow Keras backend, with TensorFlow made unimportable
    (as on the GPU machine): it must run from models/ alone."""
    backend = next((b for b in ("jax", "torch") if _importable(b)), None)
    assert backend is not None, ("torch (requirements-test.txt, installed by `make test`) is "
                                 "needed to run the GPU benchmark on a non-TensorFlow backend")
    code = ("import sys, runpy\n"
            "sys.modules['tensorflow'] = sys.modules['tensorflow_text'] = None\n"
            "sys.argv = ['gpu_bench.py', '--tiny']\n"
            "runpy.run_path('bench/gpu_bench.py', run_name='__main__')\n")
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=str(PROJECT))
    result = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert f"on {backend}" in lines[0] and "TensorFlow imported: False" in lines[0]
    assert lines[-1].startswith("gpu-bench: ") and " seq/s mfu " in lines[-1]
    # the steps timed in 3 windows (the default --repeat), the host's load before each
    windows = [line for line in lines if line.startswith("gpu-bench: window ")]
    assert [w.split()[2] for w in windows] == ["1/3", "2/3", "3/3"]
    assert all("host load average" in w for w in windows)
    assert any("seq/s median (min-max)" in line for line in lines)


@pytest.mark.slow
def test_pipeline_turns_onednn_on_before_tensorflow_loads():
    """TensorFlow picks oneDNN itself only on CPUs with AVX512_VNNI, AVX512_BF16 or AMX (Eigen
    on AVX2-only ones, ~1.4x slower at BERT's matmuls): importing `pipeline` or `models`
    first turns it on everywhere, and TF_ENABLE_ONEDNN_OPTS=0 keeps the user's choice."""
    code = ("import sys; import {} ; import tensorflow\n"
            "from pipeline.training.mfu import onednn_enabled; print(onednn_enabled())")
    for module, setting, expected in (("pipeline", None, "True"), ("models", None, "True"),
                                      ("pipeline", "0", "False")):
        env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
        if setting is not None:
            env["TF_ENABLE_ONEDNN_OPTS"] = setting
        result = subprocess.run([sys.executable, "-c", code.format(module)], cwd=PROJECT,
                                env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.split()[-1] == expected, (module, setting, result.stdout)


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


class _Improving:
    """A stand-in pretrainer whose held-out MLM accuracy rises 0.0, 0.25, 0.5, ... per probe
    (4 masked positions per batch, one more of them right each time); each call sleeps."""

    def __init__(self):
        self.optimizer = type("Optimizer", (), {"iterations": 0})()
        self.calls, self.stop_training = 0, False

    def __call__(self, x, training=False):
        import time

        time.sleep(0.05)  # probe time, to be excluded from the training seconds
        right = min(self.calls, 4)
        self.calls += 1
        logits = np.zeros((1, 4, 3), "float32")
        for i in range(4):
            logits[0, i, 1 if i < right else 2] = 1.0  # gold id is 1
        return {"mlm": logits}


def test_heldout_probe_records_time_to_accuracy(caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    model = _Improving()
    batch = ({}, {"mlm": np.ones((1, 4), "int32")}, {"mlm": np.ones((1, 4), "float32")})
    probe = callbacks.HeldOutProbe([batch], every=2, total_steps=9, to_mlflow=False,
                                   seconds_before=100.0)
    probe.set_model(model)
    probe.on_train_begin()
    for step in range(1, 10):
        model.optimizer.iterations = step
        probe.on_train_batch_end(step)
    # probed at steps 2, 4, 6, 8 and at the last step, 9
    assert [s for s, _, _ in probe.curve] == [2, 4, 6, 8, 9]
    assert [a for _, _, a in probe.curve] == [0.0, 0.25, 0.5, 0.75, 1.0]
    seconds = [t for _, t, _ in probe.curve]
    assert seconds == sorted(seconds) and seconds[0] >= 100.0  # continues a resumed run's clock
    assert seconds[-1] - 100.0 < 0.05  # the probes' own 5 x 0.05 s are not training time
    assert set(probe.reached) == {0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.72, 0.8, 0.9}
    assert probe.reached[0.2] == seconds[1] and probe.reached[0.9] == seconds[4]
    assert any("reached 0.5 at step 6" in line for line in caplog.messages)


def test_gpu_strategies_without_a_gpu_name_the_fix():
    import tensorflow as tf

    from pipeline.training import strategy as strategy_lib

    if tf.config.list_logical_devices("GPU"):  # a GPU machine: the strategies use it
        assert "GPU" in strategy_lib.make_strategy("one_device").extended.worker_devices[0]
        return
    for name in ("one_device", "mirrored"):
        with pytest.raises(strategy_lib.StrategyError, match="make setup GPU=1.*allow_cpu=true"):
            strategy_lib.make_strategy(name)
    assert strategy_lib.make_strategy("one_device", allow_cpu=True).num_replicas_in_sync == 1


def test_max_seconds_stops_training_then_probes_evaluates_and_stays_stopped(tmp_path,
                                                                          monkeypatch, caplog):
    no_export(monkeypatch)
    write_pretraining_data(tmp_path / "run")
    paths = artifacts.Artifacts(tmp_path / "run")
    config = tiny_config(tmp_path / "run", "train.steps=100000", "train.checkpoint_every=50",
                         "train.heldout_every=1000", "train.max_seconds=3")
    caplog.set_level(logging.INFO, logger="pipeline")
    result = pretrain.run(config)
    assert 1 <= result["step"] < 100000 and "eval_mlm_accuracy" in result
    assert any("stopped at step" in line and "train.max_seconds = 3" in line
               for line in caplog.messages)
    curve = json.loads(paths.heldout_curve.read_text())["curve"]
    assert curve[-1][0] == result["step"] and 3 <= curve[-1][1] < 30  # probed where it stopped
    step, _ = checkpoints.latest_checkpoint(paths.checkpoint_dir)
    assert step == result["step"]
    caplog.clear()
    again = pretrain.run(config)  # a re-run: its seconds are spent
    assert again["step"] == result["step"]
    assert any("not training further" in line for line in caplog.messages)


def test_decay_over_max_seconds_spends_the_rate_with_the_budget(tmp_path):
    """train.decay_over = max_seconds: the schedule's decay follows the training seconds that
    ScheduleClock hands it before each batch (or the steps, if they are further along)."""
    config = tiny_config(tmp_path, "train.steps=1000", "train.warmup_steps=10",
                         "train.learning_rate=0.001", "train.max_seconds=60",
                         "train.decay_over=max_seconds")
    optimizer = pretrainer.build_optimizer(config.train)
    schedule = pretrainer.learning_rate_schedule(optimizer)
    now = [0.0]
    clock = callbacks.ScheduleClock(schedule, lambda: now[0])
    rates = []
    for seconds in (0.0, 15.0, 30.0, 59.0, 60.0, 90.0):
        now[0] = seconds
        clock.on_train_batch_begin(0)
        rates.append(float(schedule(20)))
    assert rates[0] == pytest.approx(1e-3 * (1 - 10 / 990), rel=1e-4)  # the steps decide
    assert rates[1:] == pytest.approx([7.5e-4, 5e-4, 1e-3 / 60, 0.0, 0.0], abs=1e-7)
    by_steps = pretrainer.learning_rate_schedule(pretrainer.build_optimizer(
        tiny_config(tmp_path, "train.steps=1000", "train.warmup_steps=10",
                    "train.max_seconds=60").train))
    assert by_steps.seconds is None  # the default: steps only, no clock
    with pytest.raises(config_lib.ConfigError, match="train.decay_over = max_seconds needs"):
        tiny_config(tmp_path, "train.decay_over=max_seconds")
