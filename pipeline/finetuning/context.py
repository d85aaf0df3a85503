"""The context of one fine-tuning run, built once and passed whole: the config, the task and
its data, the tokenizer (vocab, its file, the casing, the raw-text preprocessor), the encoder
file, the splits' features, the output folder and the tf.distribute strategy.

The finetune stage (and the sweep's and recipe's points) build it with `RunContext.build`;
distillation and multi-task training build theirs from the teacher or the shared encoder.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class TokenizerBundle:
    """The tokenizer a model was trained with: the vocab (tokens in id order), its file, its
    casing, and the raw-text preprocessor for `max_seq_length` (serving's, built on first
    use)."""
    vocab: list
    vocab_path: Path
    lowercase: bool
    max_seq_length: int

    @classmethod
    def read(cls, vocab_path, lowercase: bool, max_seq_length: int) -> "TokenizerBundle":
        """The vocab of `vocab_path` with the casing `lowercase`."""
        from pipeline.text import vocab as vocab_lib

        return cls(vocab_lib.read_vocab(vocab_path), Path(vocab_path), bool(lowercase),
                   max_seq_length)

    @classmethod
    def beside(cls, vocab_path, default_lowercase: bool, max_seq_length: int):
        """The vocab of `vocab_path`, its casing from the vocab.json beside it (else
        `default_lowercase`)."""
        from pipeline.text import vocab as vocab_lib

        return cls.read(vocab_path, vocab_lib.vocab_lowercase(vocab_path, default_lowercase),
                        max_seq_length)

    @functools.cached_property
    def preprocessor(self):
        """models.preprocessor.TextPreprocessor: raw strings -> model inputs (TensorFlow)."""
        from models import preprocessor

        return preprocessor.TextPreprocessor(self.vocab, self.lowercase, self.max_seq_length)


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What every step of a fine-tuning run reads: `config` (its finetune section: `fc`), the
    `task` class, its `data` (readers.TaskData), the `tokenizer`, the encoder file it starts
    from (`model_path`), the `splits`' features (records.RecordSplit by name), the output
    folder's `paths` and the `strategy`. Multi-task training leaves task, data and splits to
    each of its tasks."""
    config: object
    tokenizer: TokenizerBundle
    model_path: Path
    strategy: object = None
    paths: object = None
    task: object = None
    data: object = None
    splits: dict = None

    @property
    def fc(self):
        return self.config.finetune

    @classmethod
    def build(cls, config) -> "RunContext":
        """The finetune stage's context: the task of finetune.task, its data and seeded
        splits, the encoder and vocab (`task_model.resolve_init`), the strategy of train.*,
        the output folder <run_dir>/finetune/<name>/, and the splits' features (written once
        by the Beam job, else reused: records.write_or_reuse)."""
        from pipeline.artifacts import Artifacts
        from pipeline.finetuning import data as fd
        from pipeline.finetuning import runtime, tasks
        from pipeline.finetuning.task_model import output_name, resolve_init
        from pipeline.training import strategy as strategy_lib

        fc = config.finetune
        task, data = tasks.get(fc.task, fc), fd.load_task(fc)
        model_path, vocab_path = resolve_init(config)
        tokenizer = TokenizerBundle.beside(vocab_path, config.vocab.lowercase, fc.max_seq_length)
        strategy = strategy_lib.make_strategy(config.train.strategy, config.train.tpu,
                                             config.train.allow_cpu)
        runtime.check_strategy(fc, strategy)
        return cls(config, tokenizer, model_path, strategy,
                   Artifacts(config.run_dir).finetune(output_name(fc)), task, data)

    def with_features(self) -> "RunContext":
        """This context with `splits`: the features of every split of `data`
        (records.write_or_reuse)."""
        from pipeline.finetuning import records

        return dataclasses.replace(self, splits=records.write_or_reuse(
            self.config, self.task, self.data, self.tokenizer))
