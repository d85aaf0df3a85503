"""What a stage is, in one place: the table the CLI, lineage (caching) and artifacts read.

    >>> STAGES["data"].upstream
    ('corpus', 'vocab')
    >>> [s.name for s in STAGES.values() if s.in_all]
    ['corpus', 'vocab', 'data', 'pretrain']

A stage is a module `pipeline.stages.<name>` with `run(config: Config, **options) -> dict`
(the CLI passes the validated config and the stage's own options, e.g. glue's `tasks`), or, when
that function would only call a library's, its spec's `run` naming the library function; it only
orchestrates (reads top to bottom, calls the libraries in pipeline/training, finetuning,
serving, text, tracking) and imports no other stage (checked by import-linter, see
pyproject.toml). Its code hash covers every project module it imports, found from its real
imports (pipeline/tracking/lineage.py `code_files`), so no list here names source files.

This module imports nothing from the project, so anything may read it.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class StageSpec:
    name: str
    # The MLflow note of the stage's run.
    description: str
    # Config sections or keys its output depends on (its config hash); "vocab.lowercase"
    # is one key, "data" a whole section.
    config: tuple[str, ...]
    # Stages whose outputs it reads (their MLflow runs are recorded as its lineage).
    upstream: tuple[str, ...]
    # The `Artifacts` attribute of its output folder; its marker file is written there.
    output: str
    # Part of `python -m pipeline all` (else run by name only).
    in_all: bool = False
    # Reused when its key is unchanged (False: it always runs; fine-tuning takes any model and
    # any labelled set, so its inputs are not fingerprinted).
    cached: bool = True
    # "module:function" naming the MLflow run an interrupted run continues ("" if none).
    resumable: str = ""
    # "module:function" that `--force` calls (with the config) before the stage runs again:
    # pretraining and fine-tuning set their old checkpoints aside so that training starts over
    # ("" if none).
    fresh: str = ""
    # Its marker's file name inside `output` (the sweep shares finetune/ and keeps its own).
    marker: str = ".stage.json"
    # The CLI writes <output>/checksums.json once the stage completed (before its marker) and
    # checks it before the output is reused or read by a later stage. (The data stage writes
    # its own, inside the folder aside; fine-tuning one per task folder.)
    checksums: bool = False
    # Top-level entries of `output` the checksums leave out (state that keeps changing).
    checksums_skip: tuple[str, ...] = ()
    # The Makefile target that runs it (the rebuild command an error names).
    make_target: str = ""
    # "module:function" the CLI calls with (config, **options) when the stage has no module of
    # its own in pipeline/stages/ ("": that module's `run`).
    run: str = ""

    @property
    def rebuild(self) -> str:
        """The command that makes the stage's output again."""
        return (f"make {self.make_target or self.name} ARGS=--force  (or: python -m pipeline "
                f"{self.name} --config <your config> --force)")

    @property
    def module(self) -> str:
        """The module that runs it (its code hash starts there)."""
        return self.run.split(":")[0] if self.run else f"pipeline.stages.{self.name}"

    @property
    def function(self) -> str:
        return self.run.split(":")[1] if self.run else "run"


_SPECS = (
    StageSpec("corpus", "Prepared the corpus: Google format, held-out documents split off.",
              config=("corpus",), upstream=(), output="corpus_dir", in_all=True,
              checksums=True),
    # corpus.source/path: which corpus, not its contents (a vocabulary stays fixed when new text
    # arrives, so models keep their ids); see pipeline/tracking/lineage.py.
    StageSpec("vocab", "Trained the WordPiece vocabulary (Beam word count + WordPiece learner).",
              config=("vocab", "corpus.source", "corpus.path"), upstream=("corpus",),
              output="vocab_dir", in_all=True, checksums=True),
    StageSpec("data", "Beam job: documents → NSP pairs → masked instances → TFRecords.",
              config=("data", "vocab.lowercase"), upstream=("corpus", "vocab"),
              output="data_dir", in_all=True),
    StageSpec("pretrain", "Pretrained BERT (MLM + NSP), evaluated on held-out data, exported.",
              config=("model", "train", "data.max_seq_length", "data.max_predictions_per_seq",
                      "data.phases", "data.objective"),
              upstream=("data",), output="pretrain_dir", in_all=True,
              resumable="pipeline.training.phases:resumable_run_id",
              fresh="pipeline.training.phases:set_checkpoints_aside",
              checksums=True, checksums_skip=("checkpoints",), make_target="train"),
    StageSpec("finetune", "Fine-tuned the pretrained encoder on a labelled task, evaluated, "
                          "exported.",
              config=("finetune",), upstream=("pretrain",), output="finetune_root", cached=False,
              fresh="pipeline.finetuning.runtime:set_checkpoints_aside",
              run="pipeline.finetuning.recipe:fine_tune_as_configured"),
    StageSpec("sweep", "Fine-tuning hyperparameter grid (finetune.sweep): one nested run per "
                       "point, the best by the validation metric.",
              config=("finetune",), upstream=("pretrain",), output="finetune_root", cached=False,
              marker=".sweep.stage.json", run="pipeline.finetuning.sweep:sweep"),
    StageSpec("multitask", "Multi-task fine-tuning: one encoder, a head per task, batches mixed "
                           "by ratio; compared with single-task runs (nested).",
              config=("finetune", "multitask"), upstream=("pretrain",), output="multitask_root",
              cached=False),
    StageSpec("distill", "Distilled a fine-tuned classifier into a smaller student (soft "
                         "targets); student vs teacher metric, size and speed.",
              config=("distill",), upstream=("finetune",), output="distill_root", cached=False),
    # Results and submission files in <run_dir>/glue/, the task models in finetune/glue_<task>/.
    StageSpec("glue", "GLUE: every task folder fine-tuned with the BERT paper's settings, dev "
                      "scores and the GLUE score, test-set predictions for the server.",
              config=("finetune",), upstream=("pretrain",), output="finetune_root", cached=False,
              marker=".glue.stage.json"),
)

# Every stage by name, in pipeline order (the order the CLI runs them in).
STAGES: dict[str, StageSpec] = {spec.name: spec for spec in _SPECS}
