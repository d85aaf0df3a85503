"""Stage `sweep`: the `finetune.sweep` grid, one fine-tuning run per point as a nested MLflow run.

Each point is the finetune stage's run with the point's `finetune.*` values and no outputs
written; the best point by the validation metric is reported, logged on this stage's run and
written to <run_dir>/finetune/<name>.sweep.json (pipeline/finetuning/sweep.py).
"""

from __future__ import annotations

from pipeline.config import Config
from pipeline.finetuning.sweep import sweep


def run(config: Config) -> dict:
    """Runs every point of `finetune.sweep`; returns {"points": [...], "best": ..., "metric"}."""
    return sweep(config)
