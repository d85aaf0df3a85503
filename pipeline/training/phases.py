"""Pretraining phases (`data.phases` / `train.phases`): what each phase trains on, where it
checkpoints, and its MLflow run (a child of the pipeline run, reopened on resume).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import logging

from pipeline import config as config_lib
from pipeline.artifacts import Artifacts
from pipeline.config import Config
from pipeline.tracking import runs as tracking
from pipeline.training.checkpoints import CHECKPOINT_RE, set_aside

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Phase:
    """One pretraining phase: its config (data.max_seq_length / max_predictions_per_seq and
    train.* of the phase), where its records are and where its checkpoints go.

    index 0 is the single phase of a run without data.phases (data/, pretrain/checkpoints/);
    with data.phases, phase i (1-based) reads data/phase<i>/ and checkpoints to
    pretrain/checkpoints/phase<i>/ (pipeline/artifacts.py).
    """
    index: int
    config: Config
    data_dir: Path
    checkpoint_dir: Path

    @property
    def name(self) -> str:
        return f"phase{self.index}" if self.index else ""

    @property
    def prefix(self) -> str:
        """How the log lines of this phase start."""
        return f"pretrain {self.name}" if self.index else "pretrain"

    @property
    def shape(self) -> str:
        return f"{self.config.data.max_seq_length}/{self.config.data.max_predictions_per_seq}"


def plan_phases(config: Config, paths: Artifacts) -> list[Phase]:
    """The phases `run` trains, in order: one without data.phases, else one per data phase
    with its train.phases entry applied (config.train_phases)."""
    if not config.data.phases:
        return [Phase(0, config, paths.data_dir, paths.checkpoint_dir)]
    out = []
    for i, ((seq, pred), tc) in enumerate(zip(config_lib.data_phases(config),
                                              config_lib.train_phases(config)), start=1):
        data = dataclasses.replace(config.data, max_seq_length=seq, max_predictions_per_seq=pred)
        out.append(Phase(i, dataclasses.replace(config, data=data, train=tc),
                         paths.data_phase_dir(i), paths.phase_checkpoint_dir(i)))
    return out


def resumable_run_id(config: Config) -> str:
    """The MLflow run of the pretrain stage that an interrupted training recorded beside its
    checkpoints ("" if there are no checkpoints yet or no record for this store): the CLI
    reopens it (tracking.stage_run) instead of starting a new run."""
    paths = Artifacts(config.run_dir)
    if not any(CHECKPOINT_RE.search(p.name) for p in paths.checkpoint_dir.rglob("ckpt-*")):
        return ""
    return tracking.read_run_file(paths.pretrain_run_file)


def set_checkpoints_aside(config: Config):
    """`--force` on pretrain: the run's checkpoints (every phase's) and its saved config move
    into pretrain/checkpoints.aside-<UTC time>, so training starts from scratch (a new MLflow
    run, too) and nothing is deleted."""
    paths = Artifacts(config.run_dir)
    aside = set_aside(paths.checkpoint_dir, paths.pretrain_config)
    if aside is not None:
        log.info(f"--force: the previous checkpoints are kept aside in {aside}; "
                 f"training starts over")
    return aside


def phase_run(phase: Phase, stage_run: str, resume: bool):
    """The MLflow run of one phase: a child of the pipeline run (the parent of the stage run,
    id `stage_run`), or the phase's recorded run reopened when it resumes from a checkpoint."""
    parent = tracking.parent_run_id(stage_run)
    resume_id = tracking.read_run_file(Artifacts.run_file(phase.checkpoint_dir)) if resume else ""
    return tracking.child_run(
        f"pretrain {phase.name}", parent, resume_run_id=resume_id,
        tags={"pipeline.stage": f"pretrain.{phase.name}", "pretrain.phase": str(phase.index),
              "pretrain.stage_run_id": stage_run,
              "mlflow.source.git.commit": tracking.git_commit(),
              "mlflow.note.content": f"Pretraining {phase.name}: sequences of "
                                     f"{phase.config.data.max_seq_length} tokens, "
                                     f"{phase.config.train.steps} steps, from "
                                     f"{phase.data_dir}."})
