"""The pretraining records as training input: checks that the TFRecords fit the config, and
the tf.data pipelines positioned for a (resumed) run, with dynamic masking when the records
are unmasked.
"""

from __future__ import annotations

import json
from pathlib import Path

import logging
import tensorflow as tf
import yaml

from beam_jobs import vocab as vocab_job
from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.artifacts import Artifacts
from pipeline.config import Config
from pipeline.training import checkpoints, inputs
from pipeline.training import strategy as strategy_lib
from pipeline.training.pretrainer import PretrainError, normalize_mlm_weights

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# The stage.
# ---------------------------------------------------------------------------
def check_inputs(config: Config, paths: Artifacts) -> tuple[int, dict]:
    artifacts.require(paths.vocab_file, "the vocab", "vocab")
    vocab_job.check_vocab(str(paths.vocab_file))
    vocabulary_size = sum(1 for _ in open(paths.vocab_file, encoding="utf-8"))
    stats = json.loads(artifacts.require(paths.data_stats, "the pretraining data", "data").read_text())
    made = stats["settings"]
    keys = ("max_seq_length", "max_predictions_per_seq", "masking")
    if config.data.phases:  # the shape of each phase, against data.phases
        made_phases = [f"{p['max_seq_length']}/{p['max_predictions_per_seq']}"
                       for p in stats.get("phases", [])]
        wanted = [f"{seq}/{pred}" for seq, pred in config_lib.data_phases(config)]
        if made_phases != wanted:
            raise PretrainError(
                f"the TFRecords in {paths.data_dir} were made with data.phases = "
                f"{made_phases or '[] (one phase)'}, but the config says {wanted}; run `make data` "
                f"again with this config")
        keys = ("masking",)
    for key in keys:
        if made.get(key, "static") != getattr(config.data, key):
            raise PretrainError(
                f"the TFRecords in {paths.data_dir} were made with data.{key} = {made.get(key, 'static')}, but the "
                f"config says {getattr(config.data, key)}; run `make data` again with this config")
    check_enough_instances(config, paths, stats)
    if not config.data.phases and config.data.max_seq_length > config.model.max_sequence_length:
        raise PretrainError(f"data.max_seq_length {config.data.max_seq_length} exceeds "
                            f"model.max_sequence_length {config.model.max_sequence_length}")
    # The checkpoints belong to the settings that trained them: resuming under others would
    # mix two trainings (and record parameters that did not produce the model).
    # (The finished model's config.yaml stands for them where an older layout kept none.)
    saved_path = next((p for p in (paths.checkpoint_dir / "config.yaml", paths.pretrain_config)
                       if p.exists() and paths.checkpoint_dir.is_dir()), None)
    if saved_path is not None:
        saved = yaml.safe_load(saved_path.read_text()) or {}
        changes = checkpoints.settings_changes(saved, config_lib.to_dict(config),
                                               config_lib.to_dict(Config()))
        if changes:
            shown = "; ".join(changes[:6]) + (f"; and {len(changes) - 6} more"
                                              if len(changes) > 6 else "")
            raise PretrainError(
                f"the checkpoints in {paths.pretrain_dir} were trained with other settings "
                f"({shown}); run again with --force to start over (they are kept aside, not "
                f"deleted), use another run_dir, or go back to the settings in {saved_path}")
    return vocabulary_size, stats


def check_enough_instances(config: Config, paths: Artifacts, stats: dict) -> None:
    """A corpus too small for one training batch is refused: its few instances would be
    repeated in every batch (a model that memorises them, no held-out signal)."""
    made = (stats.get("train") or {}).get("instances")
    batch = config.train.batch_size
    if made is None or made >= batch:
        return
    corpus = (config.corpus.path if config.corpus.source == "files"
              else f"the {config.corpus.source} corpus")
    raise PretrainError(
        f"the corpus {corpus} makes {made} training instance(s) ({paths.data_stats}), fewer "
        f"than one batch of train.batch_size = {batch}; give more text (corpus.path), or "
        f"lower train.batch_size to at most {max(made, 1)} (data.dupe_factor = "
        f"{config.data.dupe_factor} makes more instances of the same text)")


def masking_args(config: Config, paths: Artifacts, training: bool = False) -> dict:
    """`masking=` for inputs.pretraining_dataset when the records are unmasked
    (data.masking = dynamic): tf.data masks each batch, seeded by the batch's index, so
    skipping consumed batches on resume also reproduces their masks. `training`: the
    training batches' rate and count (train.masked_lm_prob / max_predictions_per_seq when
    set); the held-out batches always use the data keys."""
    dc, tc = config.data, config.train
    if dc.masking != "dynamic":
        return {}
    prob, predictions = dc.masked_lm_prob, 0
    if training:  # 0 predictions: as many as the records have slots
        prob, predictions = config_lib.training_masks(config)[0], tc.max_predictions_per_seq
    return {"masking": inputs.DynamicMasking.from_vocab(
        str(paths.vocab_file), masked_lm_prob=prob,
        whole_word=dc.whole_word_masking, seed=tc.seed,
        max_predictions_per_seq=predictions)}


def training_data(config: Config, paths: Artifacts, start_step: int,
                  data_dir: Path | None = None, prefix: str = "pretrain"):
    """The repeated, shuffled training batches, positioned after `start_step` updates.

    resume_data = skip: the same seed as a fresh run, minus the batches already consumed
    (start_step × grad_accum_steps global batches), so a resumed run continues the
    uninterrupted run's batch sequence (exact on one worker and with data sharding).
    reseed: a fresh order seeded with seed + start_step. `data_dir`: a phase's records
    (default data/).
    """
    tc, dc = config.train, config.data
    reseed = tc.resume_data == "reseed"
    pattern = paths.shard_pattern("train", data_dir)
    data = inputs.pretraining_dataset(
        pattern, tc.batch_size, dc.max_seq_length, dc.max_predictions_per_seq,
        training=True, seed=tc.seed + (start_step if reseed else 0),
        shuffle_buffer=tc.shuffle_buffer, **masking_args(config, paths, training=True))
    consumed = start_step * tc.grad_accum_steps
    if consumed and not reseed and start_step < tc.steps:
        log.info(f"{prefix}: skipping the {consumed:,} batches consumed before step {start_step}")
        data = data.skip(consumed)
    data = data.map(normalize_mlm_weights, num_parallel_calls=tf.data.AUTOTUNE)
    files = len(tf.io.gfile.glob(pattern))
    return data.with_options(strategy_lib.shard_options(tc.data_sharding, files))


def heldout_data(config: Config, paths: Artifacts, data_dir: Path | None = None):
    """The held-out batches every probe and evaluation scores, in one ordered pass: the
    records' masks, or (dynamic) masks drawn with the data keys, seeded by train.seed and the
    batch index at train.batch_size, so every reader of this function scores the same
    instances (make bench-quality evaluates its peer on them too)."""
    tc, dc = config.train, config.data
    return inputs.pretraining_dataset(
        paths.shard_pattern("eval", data_dir), tc.batch_size, dc.max_seq_length,
        dc.max_predictions_per_seq, training=False, **masking_args(config, paths))
