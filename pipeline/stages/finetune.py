"""Stage `finetune`: pretrained encoder + task head, trained on labelled data, evaluated, exported.

The steps (data and splits, encoder and features, task model, training with the best epoch
kept, metrics and baselines, outputs written and registered) are one fine-tuning run of
`pipeline.finetuning.train.fine_tune`, which the sweep stage also runs once per grid point.
Output: <run_dir>/finetune/<name>/ (pipeline/artifacts.py FinetuneArtifacts).
"""

from __future__ import annotations

from pipeline.config import Config
from pipeline.finetuning.train import fine_tune


def run(config: Config) -> dict:
    """Fine-tunes `finetune.*` on the pretrained encoder, evaluates, writes and logs the model."""
    return fine_tune(config, write_outputs=True)

import logging

log = logging.getLogger(__name__)