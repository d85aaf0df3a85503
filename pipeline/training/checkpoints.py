"""Checkpoint files of pretraining: finding the latest, the global step, weight digests, and
starting a phase from the previous phase's weights. They are written (and the newest
train.keep_checkpoints kept) by `pipeline.training.callbacks.Checkpointer`.

A checkpoint is `ckpt-<step>.weights.h5` (Keras' own weights file: model and optimizer
variables, readable on every Keras backend) with `ckpt-<step>.seeds.json` beside it (the
dropout seed states, which .weights.h5 does not hold), plus `latest.json` and the run's
`config.yaml` in the folder. Why not `tf.train.CheckpointManager` for their rotation: it
manages what `tf.train.Checkpoint` writes, and only that. It saves through the checkpoint's
private `_write` (TensorFlow's format: `<prefix>.index` + `<prefix>.data-*-of-*`, not a
.weights.h5 a JAX or torch run can read), deletes exactly those two patterns when it rotates
(a `.seeds.json` would stay behind forever), keeps its own list in a `checkpoint` state file
(which would disagree with the files after a kill between a write and its rotation, or after
`--force` set checkpoints aside), and names files `<name>-<n>` with no zero padding (ours
are `ckpt-<8-digit step>`, which sort by name and which resume parses). Ours, shared with
fine-tuning (`callbacks.prune`): once the new checkpoint is complete, delete the oldest beyond
the newest `keep`, seeds included (tests/test_training.py
`test_checkpoint_rotation_keeps_the_newest_with_their_seeds`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

import keras
import numpy as np

from models import keras_compat

log = logging.getLogger(__name__)

CHECKPOINT_RE = re.compile(r"ckpt-(\d{8})\.weights\.h5$")


def latest_checkpoint(checkpoint_dir: Path) -> tuple[int, Path] | None:
    found = []
    for path in Path(checkpoint_dir).glob("ckpt-*.weights.h5"):
        match = CHECKPOINT_RE.search(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return max(found) if found else None


# Keras does not save the state of its random seed generators (dropout's) in .weights.h5: a
# resumed training would draw the dropout masks of step 1 again and part from the
# uninterrupted run. The states go beside each checkpoint, in ckpt-<step>.seeds.json.
SEED_STATE = "seed_generator_state"


def seeds_file(checkpoint: Path) -> Path:
    return Path(checkpoint).with_name(Path(checkpoint).name.replace(".weights.h5", ".seeds.json"))


def seed_states(model) -> list:
    """[[variable path, state]] of every random seed generator of `model`, in order."""
    return [[v.path, np.asarray(keras.ops.convert_to_numpy(v)).tolist()]
            for v in model.variables if v.path.endswith(SEED_STATE)]


def restore_seed_states(model, checkpoint: Path) -> bool:
    """Puts back the seed generator states saved beside `checkpoint` (False if none were, as
    with checkpoints written before they were kept)."""
    try:
        saved = json.loads(seeds_file(checkpoint).read_text())
    except (OSError, ValueError):
        return False
    # By order (the model is built the same way; its layers' names may be numbered otherwise
    # when another model was built in this process before).
    variables = [v for v in model.variables if v.path.endswith(SEED_STATE)]
    if len(saved) != len(variables) or any(
            np.shape(state) != tuple(v.shape) for (_, state), v in zip(saved, variables)):
        return False
    for variable, (_, state) in zip(variables, saved):
        variable.assign(np.asarray(state, dtype=keras.backend.standardize_dtype(variable.dtype)))
    return True


def checkpoint_seconds(checkpoint: Path) -> float:
    """The training seconds recorded with the newest checkpoint in `checkpoint`'s folder
    (latest.json), 0 if none: a resumed run's clock for time to accuracy continues from it."""
    try:
        latest = json.loads((Path(checkpoint).parent / "latest.json").read_text())
    except (OSError, ValueError):
        return 0.0
    return float(latest.get("train_seconds", 0.0)) if latest.get("step") == int(
        CHECKPOINT_RE.search(Path(checkpoint).name).group(1)) else 0.0


def global_step(model) -> int:
    """Optimizer updates so far (Keras' `iterations` counts updates, not micro-batches)."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def weights_digest(model) -> str:
    """sha256 of every weight's bytes, in order (equal on all workers of a synchronous run)."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    return digest.hexdigest()



def start_from_previous_phase(model, previous, prefix: str = "pretrain") -> None:
    """Copies the model weights (not the optimizer state) of the previous phase into `model`:
    the weights of the model trained in this process (a list of arrays), or those of the
    phase's final checkpoint (a path)."""
    if isinstance(previous, Path):
        keras_compat.load_weights_skipping(model, previous, skip=[model.optimizer])
        log.info(f"{prefix}: starting from the previous phase's "
                 f"{previous.parent.name}/{previous.name} (fresh optimizer and schedule)")
    else:
        model.set_weights(previous)
        log.info(f"{prefix}: starting from the previous phase's final weights (fresh optimizer and "
                 f"schedule)")


# ---------------------------------------------------------------------------
# The settings a checkpoint belongs to.
# ---------------------------------------------------------------------------
# Every key of these sections shapes what the checkpoints hold (the text, its pieces, the
# instances, the model, the optimizer, the schedule, the batch order) except the ones below,
# which say how or where it runs, or how often it reports.
SHAPING_SECTIONS = ("corpus", "vocab", "data", "model", "train")
NOT_SHAPING = frozenset({
    "data.beam_args", "train.strategy", "train.allow_cpu", "train.tpu", "train.jit_compile",
    "train.steps_per_execution",
    "train.checkpoint_every", "train.keep_checkpoints", "train.log_every", "train.eval_batches",
    "train.heldout_every", "train.heldout_batches", "train.general_heldout",
    "train.peak_flops_seconds",
    "train.data_sharding", "train.resume_data", "train.max_seconds",
})


def shaping_settings(config_dict: dict, defaults: dict) -> dict:
    """The settings that shape training, flat ("train.learning_rate": 0.002), from a config
    as a dict; keys it lacks (added since it was written) take `defaults`' values.
    train.max_seconds shapes training only when the schedule decays over it."""
    flat = {}
    for section in SHAPING_SECTIONS:
        values = {**defaults.get(section, {}), **(config_dict.get(section) or {})}
        for key in defaults.get(section, {}):
            flat[f"{section}.{key}"] = values[key]
    budget = {"train.max_seconds"} if flat.get("train.decay_over") == "max_seconds" else set()
    return {k: v for k, v in flat.items() if k not in NOT_SHAPING - budget}


def settings_changes(saved: dict, current: dict, defaults: dict) -> list[str]:
    """`key: old -> new` for every shaping setting that differs between a checkpoint's config
    (`saved`) and this run's (`current`); empty when the checkpoint belongs to this run."""
    before = shaping_settings(saved, defaults)
    after = shaping_settings(current, defaults)
    return [f"{key}: {before.get(key)!r} -> {after[key]!r}" for key in after
            if before.get(key) != after[key]]


def set_aside(checkpoint_dir: Path, config_file: Path) -> Path | None:
    """Moves a training's checkpoints (with the settings they were trained with) into a new
    folder beside them, `checkpoints.aside-<UTC time>`, so that the next run starts from
    scratch and nothing is deleted; returns that folder (None when there was nothing to move).
    The finished model's config (`config_file`) is copied there too, not moved: the model
    beside it stays complete until a new one replaces it."""
    checkpoint_dir, config_file = Path(checkpoint_dir), Path(config_file)
    if not checkpoint_dir.exists():
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = checkpoint_dir.parent / f"{checkpoint_dir.name}.aside-{stamp}"
    suffix = 1
    while aside.exists():
        aside = checkpoint_dir.parent / f"{checkpoint_dir.name}.aside-{stamp}-{suffix}"
        suffix += 1
    aside.mkdir(parents=True)
    os.replace(checkpoint_dir, aside / checkpoint_dir.name)
    if config_file.exists():
        shutil.copyfile(config_file, aside / config_file.name)
    return aside
