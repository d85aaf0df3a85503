"""Checkpoint files of pretraining: finding the latest, the global step, weight digests, and
starting a phase from the previous phase's weights. The callback that writes them is
`pipeline.training.callbacks.Checkpointer`.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import keras
import numpy as np

CHECKPOINT_RE = re.compile(r"ckpt-(\d{8})\.weights\.h5$")


def latest_checkpoint(checkpoint_dir: Path) -> tuple[int, Path] | None:
    found = []
    for path in Path(checkpoint_dir).glob("ckpt-*.weights.h5"):
        match = CHECKPOINT_RE.search(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return max(found) if found else None


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



def start_from_previous_phase(model, previous, log=print, prefix: str = "pretrain") -> None:
    """Copies the model weights (not the optimizer state) of the previous phase into `model`:
    the weights of the model trained in this process (a list of arrays), or those of the
    phase's final checkpoint (a path)."""
    if isinstance(previous, Path):
        from keras.src.saving import saving_lib

        saving_lib.load_weights_only(model, str(previous), objects_to_skip=[model.optimizer])
        log(f"{prefix}: starting from the previous phase's {previous.parent.name}/{previous.name} "
            f"(fresh optimizer and schedule)")
    else:
        model.set_weights(previous)
        log(f"{prefix}: starting from the previous phase's final weights (fresh optimizer and "
            f"schedule)")
