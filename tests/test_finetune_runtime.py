"""Fine-tuning with pretraining's knobs (pipeline/finetuning/runtime.py): gradient accumulation,
mixed precision, steps per execution and XLA, checkpoints, and a finetune stage killed with
SIGKILL that resumes to the uninterrupted run's results.

The model is the classifier of the finetune stage (models/heads.py BertClassifier) on the tiny
encoder of tests/test_finetune.py (1 layer, hidden 32), on 64 synthetic examples whose label is
a function of one token; `train` runs the runtime's own pieces (policy, optimizer, compile
options, `runtime.fit`) as the stage does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from models import heads
from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.finetuning import runtime
from pipeline.finetuning.task_model import FinetuneError, load_backbone
from pipeline.finetuning.tasks.base import Split
from pipeline.config.load import CHOICES
from pipeline.training import pretrainer
from pipeline.training.callbacks import EpochEvaluator, StopAt

from tests.test_finetune import ANIMALS, PLACES, encoder_files, sentence  # noqa: F401 (fixture)
from tests.conftest import PipelineLines

N, SEQ = 64, 16
PROJECT = artifacts.PROJECT_ROOT


def synthetic_split(seed: int = 0) -> Split:
    """64 examples of 16 token ids of the 30-odd words of the tiny vocab; label = parity of the
    second token (learnable, so the loss falls)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(9, 40, (N, SEQ)).astype("int32")
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids)}
    return Split(examples=[], x=x, y={"logits": (ids[:, 1] % 2).astype("int32")})


def finetune_section(*overrides):
    return config_lib.load(None, ["finetune.learning_rate=0.001", "finetune.warmup_fraction=0",
                                  *overrides]).finetune


def train(encoder_path, *overrides, epochs=2, dropout=0.0, checkpoints=None, split=None,
          best_epoch=False):
    """(model, evaluator) after `epochs` epochs of the synthetic split (or `split`), built as
    the stage does: the encoder in finetune.precision, the runtime's optimizer and compile
    options; `runtime.fit`, or with `best_epoch` the stage's `fit_best_epoch`."""
    fc = finetune_section(*overrides)
    split = split or synthetic_split()
    keras.utils.set_random_seed(1)
    backbone = runtime.with_precision(load_backbone(encoder_path), fc.precision)
    model = heads.BertClassifier(backbone, 2, dropout=dropout)
    total = runtime.updates_per_epoch(N, fc) * epochs
    model.compile(optimizer=runtime.build_optimizer(fc, total),
                  loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
                  metrics={"logits": [keras.metrics.SparseCategoricalAccuracy("accuracy")]},
                  **runtime.compile_options(fc))

    def accuracy():
        logits = model.predict(split.x, batch_size=32, verbose=0)["logits"]
        return {"accuracy": float(np.mean(logits.argmax(-1) == split.y["logits"]))}

    evaluator = EpochEvaluator(accuracy, "accuracy", to_mlflow=False)
    plan = runtime.FitPlan(fc, total, epochs, checkpoints=checkpoints)
    if best_epoch:
        runtime.fit_best_epoch(model, split, plan, evaluator)
    else:
        runtime.fit(model, split, plan, evaluator, [StopAt(total), evaluator])
    return model, evaluator


def max_diff(a, b) -> float:
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a.get_weights(), b.get_weights()))


def steps(model) -> int:
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def test_accumulation_matches_the_large_batch(encoder_files):
    """Batches of 8 × 4 accumulated = batches of 32: the same 4 updates (2 epochs of 2), losses
    and weights; 8 × 1 (what ignoring the accumulation would train) is 16 other updates."""
    encoder = encoder_files[0]
    large, large_eval = train(encoder, "finetune.batch_size=32")
    accumulated, accumulated_eval = train(encoder, "finetune.batch_size=8",
                                          "finetune.grad_accum_steps=4")
    small, _ = train(encoder, "finetune.batch_size=8")
    assert steps(large) == steps(accumulated) == 4 and steps(small) == 16
    assert [h["step"] for h in accumulated_eval.history] == [2, 4]  # epochs count updates
    for a, b in zip(large_eval.history, accumulated_eval.history):
        np.testing.assert_allclose(b["train_loss"], a["train_loss"], rtol=1e-5)
    np.testing.assert_allclose(np.concatenate([w.ravel() for w in accumulated.get_weights()]),
                               np.concatenate([w.ravel() for w in large.get_weights()]),
                               rtol=1e-4, atol=1e-6)
    assert max_diff(large, small) > 1e-3  # 1,000× the tolerance: the test sees accumulation

    fc = finetune_section("finetune.batch_size=8", "finetune.grad_accum_steps=4")
    optimizer = runtime.build_optimizer(fc, 10)
    assert optimizer.gradient_accumulation_steps == 4
    schedule = pretrainer.learning_rate_schedule(optimizer)
    assert schedule.micro_steps_per_update == 4  # the schedule counts updates
    # 70 examples: 3 updates of 32 per epoch, the last filled up with the epoch's first examples.
    order = runtime.epoch_order(70, fc, epoch=0)
    assert runtime.updates_per_epoch(70, fc) == 3 and len(order) == 96
    assert sorted(order[:70]) == list(range(70)) and list(order[70:]) == list(order[:26])
    assert list(runtime.epoch_order(70, fc, 1)) != list(order)  # a new order every epoch


def test_mixed_bfloat16_trains_in_bfloat16_with_float32_variables(encoder_files):
    model, evaluator = train(encoder_files[0], "finetune.batch_size=8",
                             "finetune.precision=mixed_bfloat16", epochs=3)
    assert model.backbone.dtype_policy.name == "mixed_bfloat16"
    assert model.backbone.compute_dtype == "bfloat16"
    assert model.backbone.get_layer("token_embedding").compute_dtype == "bfloat16"
    assert model.output_dense.compute_dtype == "float32"  # logits and loss in float32
    assert {w.dtype for w in model.weights} == {"float32"}
    x = {k: v[:4] for k, v in synthetic_split().x.items()}
    assert model(x)["logits"].dtype == "float32"
    losses = [h["train_loss"] for h in evaluator.history]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_mixed_float16_scales_the_loss(encoder_files):
    model, evaluator = train(encoder_files[0], "finetune.batch_size=16",
                             "finetune.precision=mixed_float16", epochs=1)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.backbone.compute_dtype == "float16"
    assert {w.dtype for w in model.weights} == {"float32"}
    assert steps(model) == 4 and np.isfinite(evaluator.history[-1]["train_loss"])
    plain = runtime.build_optimizer(finetune_section("finetune.precision=mixed_float16"), 10,
                                    knobs=False)  # multitask and distill: no runtime knobs
    assert not isinstance(plain, keras.optimizers.LossScaleOptimizer)


@pytest.mark.slow
def test_steps_per_execution_and_xla_train_the_same_updates(encoder_files):
    """3 micro-batches per compiled call (8 per epoch: calls of 3, 3, 2; updates of 4 straddle
    them) and XLA with 4 per call: the weights of one batch per call without XLA."""
    encoder = encoder_files[0]
    args = ("finetune.batch_size=8", "finetune.grad_accum_steps=4")
    reference, _ = train(encoder, *args, "finetune.jit_compile=false")
    three, _ = train(encoder, *args, "finetune.steps_per_execution=3")
    xla, _ = train(encoder, *args, "finetune.steps_per_execution=4", "finetune.jit_compile=true")
    assert reference.jit_compile is False and xla.jit_compile is True
    assert three.steps_per_execution == 3 and steps(three) == steps(xla) == 4
    assert max_diff(reference, three) < 1e-6
    assert max_diff(reference, xla) < 1e-5
    # auto: pretraining's rule with a GPU, runtime.CPU_JIT_AUTO (measured) without.
    assert runtime.compile_options(finetune_section()) == {
        "jit_compile": runtime.CPU_JIT_AUTO, "steps_per_execution": 1}


class Killed(Exception):
    """A simulated kill right after a checkpoint was written."""


@pytest.mark.slow
def test_checkpoints_resume_to_the_uninterrupted_run_bit_for_bit(encoder_files, tmp_path,
                                                                 monkeypatch):
    """Killed after the checkpoint at step 3 (inside epoch 1, accumulation and head dropout on),
    re-run: resumes there and ends with the uninterrupted run's weights, history (train_loss =
    the whole epoch's mean) and best epoch; the newest 2 checkpoints kept; other settings set
    the checkpoints aside."""
    encoder = encoder_files[0]
    args = ("finetune.batch_size=4", "finetune.grad_accum_steps=2", "finetune.checkpoint_every=3")

    def checkpoints(*overrides):
        fc = finetune_section(*args, *overrides)
        return runtime.Checkpoints(tmp_path / "ckpt", {"finetune": dataclasses.asdict(fc)},
                                   fc.keep_checkpoints, fc.checkpoint_every)

    straight, straight_eval = train(encoder, *args, dropout=0.1)
    save = runtime.Checkpoints.save

    def save_then_die(self, model, evaluator):
        written = save(self, model, evaluator)
        if steps(model) == 3:
            raise Killed
        return written

    monkeypatch.setattr(runtime.Checkpoints, "save", save_then_die)
    with pytest.raises(Killed):
        train(encoder, *args, dropout=0.1, checkpoints=checkpoints())
    monkeypatch.setattr(runtime.Checkpoints, "save", save)
    assert [p.name for _, p in checkpoints().found()] == ["ckpt-00000003"]
    with PipelineLines() as lines:
        resumed, resumed_eval = train(encoder, *args, dropout=0.1, checkpoints=checkpoints())
    assert "finetune: resuming from ckpt-00000003 (step 3 of 16, epoch 1)" in lines
    assert steps(resumed) == 16
    assert resumed_eval.history == straight_eval.history  # exact, train_loss included
    assert resumed_eval.best_epoch == straight_eval.best_epoch
    assert max_diff(resumed, straight) == 0.0
    # Checkpoints at 3, 6, 8 (epoch end), 9, 12, 15, 16: the newest two kept.
    assert [p.name for _, p in checkpoints().found()] == ["ckpt-00000015", "ckpt-00000016"]

    with PipelineLines() as lines:
        assert checkpoints("finetune.learning_rate=0.002").prepare() is None
    assert "finetune.learning_rate: 0.001 -> 0.002" in lines[0] and "kept aside in" in lines[0]
    assert len(list(tmp_path.glob("ckpt.aside-*/ckpt/ckpt-00000016"))) == 1


def test_a_non_finite_loss_stops_in_one_line_keeping_the_last_good_checkpoint(encoder_files,
                                                                              tmp_path):
    """One example weighted NaN, in the 3rd batch of epoch 1: training stops at step 3 with a
    one-line error; the checkpoint of step 2 stays the newest, nothing after it is written or
    evaluated."""
    args = ("finetune.batch_size=8", "finetune.checkpoint_every=2")
    fc = finetune_section(*args)
    split = synthetic_split()
    weights = np.ones(N, "float32")
    weights[runtime.epoch_order(N, fc, 0)[2 * 8]] = np.nan  # the first example of batch 3
    split.sample_weight = {"logits": weights}
    checkpoints = runtime.Checkpoints(tmp_path / "ckpt", {"finetune": dataclasses.asdict(fc)},
                                      fc.keep_checkpoints, fc.checkpoint_every)
    with pytest.raises(FinetuneError) as err:
        train(encoder_files[0], *args, split=split, checkpoints=checkpoints, best_epoch=True)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("finetune: training stopped at step 3: the loss became nan (not "
                              "finite); the last good checkpoint ckpt-00000002 (step 2) is kept")
    assert "finetune.learning_rate (now 0.001)" in message
    assert [step for step, _ in checkpoints.found()] == [2]


def test_config_keys_take_train_values_and_rules():
    fc = config_lib.FinetuneConfig()
    assert (fc.grad_accum_steps, fc.precision, fc.jit_compile, fc.steps_per_execution,
            fc.checkpoint_every, fc.keep_checkpoints) == (1, "float32", "auto", 1, 0, 2)
    for key in ("precision", "jit_compile"):
        assert CHOICES[f"finetune.{key}"] is CHOICES[f"train.{key}"]  # declared once
    with pytest.raises(config_lib.ConfigError, match="finetune.precision = 'float8'"):
        config_lib.load(None, ["finetune.precision=float8"])
    with pytest.raises(config_lib.ConfigError, match="finetune.grad_accum_steps = 0"):
        config_lib.load(None, ["finetune.grad_accum_steps=0"])
    with pytest.raises(config_lib.ConfigError, match=r"finetune.steps_per_execution = 4: "
                       r"finetune.checkpoint_every × finetune.grad_accum_steps = 3 × 2"):
        config_lib.load(None, ["finetune.steps_per_execution=4", "finetune.checkpoint_every=3",
                               "finetune.grad_accum_steps=2"])
    assert config_lib.load(None, ["finetune.jit_compile=true"]).finetune.jit_compile == "true"


# ---------------------------------------------------------------------------
# The finetune stage killed with SIGKILL, run again
# ---------------------------------------------------------------------------
def stage_command(top, encoder_files):
    model, vocab = encoder_files
    return [sys.executable, "-m", "pipeline", "finetune", "--run-root", str(top),
            f"run_dir={top}/run", f"tracking.tracking_uri=sqlite:///{top}/mlflow.db",
            "tracking.experiment=resume", f"finetune.init_from={model}",
            f"finetune.vocab_file={vocab}", "finetune.dataset=csv",
            f"finetune.train_file={top.parent}/train.csv", "finetune.name=topic",
            "finetune.max_seq_length=24", "finetune.batch_size=4", "finetune.grad_accum_steps=2",
            "finetune.epochs=2", "finetune.learning_rate=0.001", "finetune.checkpoint_every=2",
            "finetune.baselines=false", "finetune.register_model=false",
            "finetune.export=false"]  # what is resumed is the training; the export is tested apart


def summary(top) -> dict:
    folder = top / "run" / "finetune" / "topic"
    metrics = json.loads((folder / "metrics.json").read_text())
    for key in ("seconds", "train_seconds"):
        metrics.pop(key)
    return {"metrics": metrics, "predictions": (folder / "test_predictions.jsonl").read_bytes()}


@pytest.mark.slow  # three runs of the stage (~20 s each: Python, TensorFlow, the training)
def test_finetune_stage_killed_with_sigkill_resumes_to_the_same_results(tmp_path,
                                                                        encoder_files):
    rng = random.Random(0)
    rows = ["text,label"] + [f"{sentence(rng, ANIMALS if i % 2 else PLACES)},"
                             f"{'animal' if i % 2 else 'place'}" for i in range(80)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    env = dict(os.environ, PYTHONPATH=str(PROJECT), TF_CPP_MIN_LOG_LEVEL="3")

    def run(top, kill_at_checkpoint=False):
        top.mkdir()
        log = open(top / "out.log", "w")
        proc = subprocess.Popen(stage_command(top, encoder_files), cwd=PROJECT, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        folder = top / "run" / "finetune" / ".checkpoints" / "topic"
        while kill_at_checkpoint and proc.poll() is None:
            if any(p.name.startswith("ckpt-") for p in folder.glob("ckpt-*")):
                os.killpg(proc.pid, signal.SIGKILL)  # our own child's group, by pid
                break
            time.sleep(0.01)
        proc.wait(timeout=600)
        log.close()
        return proc.returncode, (top / "out.log").read_text()

    code, out = run(tmp_path / "straight")
    assert code == 0, out[-3000:]
    code, out = run(tmp_path / "killed", kill_at_checkpoint=True)
    assert code == -signal.SIGKILL, out[-3000:]
    killed = tmp_path / "killed"
    assert not (killed / "run" / "finetune" / "topic").exists()  # no partial output folder
    code, out = (lambda p: (p.returncode, p.stdout + p.stderr))(subprocess.run(
        stage_command(killed, encoder_files), cwd=PROJECT, env=env, capture_output=True,
        text=True, timeout=600))
    assert code == 0, out[-3000:]
    resumed = [line for line in out.splitlines() if "finetune: resuming from ckpt-" in line]
    assert resumed and "(step " in resumed[0], out[-3000:]
    assert summary(killed) == summary(tmp_path / "straight")  # bit for bit
    assert not (killed / "run" / "finetune" / ".checkpoints" / "topic").exists()  # removed


def test_accumulation_under_a_mirrored_strategy_is_refused_in_one_line():
    """Keras' optimizer cannot accumulate inside a mirrored step (a RuntimeError deep in
    `fit`): the stage refuses it first, naming both keys; one device accumulates."""
    import tensorflow as tf

    from pipeline.finetuning import runtime
    from pipeline.finetuning.task_model import FinetuneError

    fc = config_lib.FinetuneConfig(grad_accum_steps=2)
    with pytest.raises(FinetuneError, match=r"finetune.grad_accum_steps = 2 under "
                                            r"train.strategy = MirroredStrategy") as err:
        runtime.check_strategy(fc, tf.distribute.MirroredStrategy(["/cpu:0"]))
    assert "\n" not in str(err.value)
    runtime.check_strategy(fc, tf.distribute.get_strategy())  # default: fine
    runtime.check_strategy(config_lib.FinetuneConfig(), tf.distribute.MirroredStrategy(["/cpu:0"]))


def test_the_random_init_baseline_is_a_fresh_model_trained_alone_and_leaves_the_weights(
        encoder_files):
    """The random-init baseline trains in the fine-tuned model (reusing its traced steps): its
    test metrics are those of a fresh model trained on its own, and the fine-tuned weights and
    optimizer state are put back after."""
    import tensorflow as tf

    from pipeline.finetuning import tasks
    from pipeline.finetuning import train as finetuning

    fc = finetune_section()
    split, task = synthetic_split(), tasks.get("classification", fc)
    ctx = dataclasses.make_dataclass("Context", ["fc", "task", "strategy", "data", "splits"])(
        fc, task, tf.distribute.get_strategy(),
        dataclasses.make_dataclass("Data", ["labels", "metric"])(["even", "odd"], "accuracy"),
        {"train": split, "validation": split, "test": split})
    backbone = load_backbone(encoder_files[0])
    plan = runtime.FitPlan(fc, runtime.updates_per_epoch(N, fc) * 2, 2)
    keras.utils.set_random_seed(0)
    model, encoder = finetuning.build_trainable(ctx, backbone, plan.total_steps)
    finetuning.train_best_epoch(ctx, (model, encoder), plan, to_mlflow=False)
    variables = [*model.variables, *model.optimizer.variables]
    state = [keras.ops.convert_to_numpy(v) for v in variables]

    result = finetuning.random_init_baseline(ctx, (model, encoder), backbone, plan)
    assert all(np.array_equal(keras.ops.convert_to_numpy(v), s)
               for v, s in zip(variables, state, strict=True))
    keras.utils.set_random_seed(fc.seed + 1)
    fresh = finetuning.build_trainable(
        ctx, type(backbone).from_config(backbone.get_config()), plan.total_steps)
    finetuning.train_best_epoch(ctx, fresh, plan, to_mlflow=False)
    assert result == task.evaluate(fresh[0], split, ctx.data, fresh[1])[0]
