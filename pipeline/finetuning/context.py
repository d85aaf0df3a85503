"""The context of one fine-tuning run, built once and passed whole: the config, the task and
its data, the tokenizer (vocab, its file, the casing, the raw-text preprocessor), the encoder
file, the splits' features, the output folder and the tf.distribute strategy.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class TokenizerBundle:
    """The tokenizer a model was trained with: the vocab (tokens in id order), its file, its
    casing, and the raw-text preprocessor for `max_seq_length` (built on first use)."""
    vocab: list
    vocab_path: Path
    lowercase: bool
    max_seq_length: int

    @classmethod
    def read(cls, vocab_path, lowercase: bool, max_seq_length: int) -> TokenizerBundle:
        from pipeline.text import vocab as vocab_lib

        return cls(vocab_lib.read_vocab(vocab_path), Path(vocab_path), bool(lowercase),
                   max_seq_length)

    @functools.cached_property
    def preprocessor(self):
        """models.preprocessor.TextPreprocessor: raw strings -> model inputs (TensorFlow)."""
        from models import preprocessor

        return preprocessor.TextPreprocessor(self.vocab, self.lowercase, self.max_seq_length)


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What every step of a fine-tuning run reads: `config` (its finetune section: `fc`), the
    `tokenizer`, the encoder file it starts from (`model_path`), the `strategy`, the output
    folder's `paths`, the `task` class, its `data` (readers.TaskData) and the `splits`'
    features (records.RecordSplit by name). Multi-task training leaves task, data and splits
    to each of its tasks."""
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
    def shared(cls, config, paths) -> RunContext:
        """The encoder and vocab of finetune.init_from (`task_model.resolve_init`; the casing
        from the vocab.json beside the vocab), the strategy of train.*, the output `paths`."""
        from pipeline.finetuning.task_model import resolve_init
        from pipeline.text import vocab as vocab_lib
        from pipeline.training import strategy as strategy_lib

        model_path, vocab_path = resolve_init(config)
        tokenizer = TokenizerBundle.read(
            vocab_path, vocab_lib.vocab_lowercase(vocab_path, config.vocab.lowercase),
            config.finetune.max_seq_length)
        strategy = strategy_lib.make_strategy(config.train.strategy, config.train.tpu,
                                             config.train.allow_cpu)
        return cls(config, tokenizer, model_path, strategy, paths)

    @classmethod
    def build(cls, config) -> RunContext:
        """The finetune stage's: the task of finetune.task and its data and seeded splits,
        then `shared` with the output folder <run_dir>/finetune/<name>/ (no features yet:
        `with_features`)."""
        from pipeline.artifacts import Artifacts
        from pipeline.finetuning import data as fd
        from pipeline.finetuning import runtime, tasks
        from pipeline.finetuning.task_model import output_name

        fc = config.finetune
        task, data = tasks.get(fc.task, fc), fd.load_task(fc)
        ctx = cls.shared(config, Artifacts(config.run_dir).finetune(output_name(fc)))
        runtime.check_strategy(fc, ctx.strategy)
        return dataclasses.replace(ctx, task=task, data=data)

    def with_features(self) -> RunContext:
        """This context with the features of every split of `data` (written once by the Beam
        job, else reused: records.write_or_reuse)."""
        from pipeline.finetuning import records

        return dataclasses.replace(self, splits=records.write_or_reuse(
            self.config, self.task, self.data, self.tokenizer))

    def load_encoder(self, max_seq_length: int, precision: str | None = None):
        """The encoder of `model_path` loaded in the strategy's scope (rebuilt to compute in
        `precision` when given), checked against the vocab and the longest `max_seq_length`
        the run asks for (FinetuneError)."""
        from pipeline.finetuning import runtime
        from pipeline.finetuning.task_model import FinetuneError, load_backbone

        vocab, vocab_path = self.tokenizer.vocab, self.tokenizer.vocab_path
        with self.strategy.scope():
            backbone = load_backbone(self.model_path)
            if precision is not None:
                backbone = runtime.with_precision(backbone, precision)
        if backbone.vocabulary_size != len(vocab):
            raise FinetuneError(f"the encoder in {self.model_path} has {backbone.vocabulary_size}"
                                f" token embeddings but {vocab_path} has {len(vocab)} tokens; "
                                f"give the vocab it was trained with (finetune.vocab_file)")
        if max_seq_length > backbone.max_sequence_length:
            raise FinetuneError(f"finetune.max_seq_length = {max_seq_length} exceeds the "
                                f"encoder's {backbone.max_sequence_length} positions "
                                f"({self.model_path}); lower it")
        return backbone
