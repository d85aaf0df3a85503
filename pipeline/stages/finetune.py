"""Stage `finetune`: pretrained encoder + task head, trained on labelled data, evaluated, exported.

The steps (data and splits, encoder and features, task model, training with the best epoch
kept, metrics and baselines, outputs written and registered) are one fine-tuning run of
`pipeline.finetuning.train.fine_tune`, which the sweep stage also runs once per grid point.
With `finetune.recipe: auto` the learning rate and epochs are first chosen on the validation
split within the time budget (pipeline/finetuning/recipe.py), and that run uses them.
Output: <run_dir>/finetune/<name>/ (pipeline/artifacts.py FinetuneArtifacts).
"""

from __future__ import annotations

from pipeline.config import Config
from pipeline.finetuning import recipe
from pipeline.finetuning.train import fine_tune


def run(config: Config) -> dict:
    """Fine-tunes `finetune.*` on the pretrained encoder, evaluates, writes and logs the model."""
    if config.finetune.recipe == "auto":
        choice = recipe.choose(config)  # the points: validation only, nothing written
        return fine_tune(choice.config, write_outputs=True, recipe=choice.report)
    return fine_tune(config, write_outputs=True)
