"""What each config key allows: its choices, or its range (checked by validation.py).

    >>> CHOICES["train.optimizer"]
    ('adamw', 'lamb')
    >>> [r for r in RANGES if r[0] == "data.masked_lm_prob"]
    [('data.masked_lm_prob', 0.0, 1.0, False)]
"""

from __future__ import annotations

from models import presets

CHOICES = {
    "corpus.source": ("brown", "files"),
    "corpus.format": ("google", "text", "jsonl"),
    "corpus.documents": ("line", "blank_line"),
    "corpus.long_lines": ("error", "skip"),
    "model.preset": tuple(presets.PRESETS),
    "model.activation": ("gelu", "gelu_approximate", "relu"),
    "data.objective": ("nsp", "sop", "mlm"),
    "data.masking": ("static", "dynamic"),
    "train.strategy": ("default", "one_device", "mirrored", "multi_worker", "tpu"),
    "train.optimizer": ("adamw", "lamb"),
    "train.decay_over": ("steps", "max_seconds"),
    "train.precision": ("float32", "mixed_bfloat16", "mixed_float16"),
    "train.jit_compile": ("auto", "true", "false"),
    "train.data_sharding": ("auto", "file", "data", "off"),
    "train.resume_data": ("skip", "reseed"),
    "finetune.dataset": ("brown_genre", "brown_pos", "csv", "tsv", "jsonl", "conll", "squad",
                         "glue"),
    "finetune.brown_labels": ("genre", "group"),
    "finetune.freeze": ("none", "encoder", "all_but_last_n"),
    "finetune.long_doc_aggregation": ("none", "mean", "max", "attention"),
    "distill.init_from_teacher": ("auto", "true", "false"),
    "distill.hidden_loss": ("none", "mse", "cosine"),
    "distill.hidden_match": ("cls", "layers"),
}

# finetune.* keys that are pretraining's train.* knobs (pipeline/finetuning/runtime.py): the same
# choices and ranges, taken from the train.* entries (finetune.checkpoint_every: its own, below).
TRAIN_KNOBS_IN_FINETUNE = ("grad_accum_steps", "precision", "jit_compile", "steps_per_execution",
                           "keep_checkpoints")
CHOICES.update({f"finetune.{key}": CHOICES[f"train.{key}"] for key in TRAIN_KNOBS_IN_FINETUNE
                if f"train.{key}" in CHOICES})

# (key, lowest allowed, highest allowed, inclusive low?)
RANGES = [
    ("tracking.retry_seconds", 0.0, None, False),
    ("corpus.eval_fraction", 0.0, 0.5, False),
    ("corpus.max_line_chars", 1, None, True),
    ("vocab.size", 10, 1_000_000, True),
    ("vocab.min_word_count", 1, None, True),
    ("vocab.max_words", 10, None, True),
    ("vocab.spill_words", 1, None, True),
    ("vocab.merge_fan_in", 2, None, True),
    ("data.max_seq_length", 8, None, True),
    ("data.max_predictions_per_seq", 1, None, True),
    ("data.masked_lm_prob", 0.0, 1.0, False),
    ("data.short_seq_prob", 0.0, 1.0, True),
    ("data.dupe_factor", 1, None, True),
    ("train.nsp_weight", 0.0, None, True),
    ("data.num_shards", 1, None, True),
    ("data.group_size_mb", 0.0, None, False),
    ("data.workers", 0, None, True),
    ("model.num_layers", 0, None, True),
    ("model.hidden_dim", 0, None, True),
    ("model.num_heads", 0, None, True),
    ("model.intermediate_dim", 0, None, True),
    ("model.max_sequence_length", 8, None, True),
    ("model.num_segments", 1, None, True),
    ("model.dropout", 0.0, 1.0, True),
    ("model.layer_norm_epsilon", 0.0, 1.0, False),
    ("model.initializer_range", 0.0, 1.0, False),
    ("train.batch_size", 1, None, True),
    ("train.grad_accum_steps", 1, 1024, True),
    ("train.steps_per_execution", 1, 1000, True),
    ("train.masked_lm_prob", 0.0, 1.0, True),
    ("train.max_predictions_per_seq", 0, None, True),
    ("train.steps", 1, None, True),
    ("train.decay_power", 0.0, None, False),
    ("train.peak_flops_seconds", 0.0, 60.0, True),
    ("train.learning_rate", 0.0, None, False),
    ("train.warmup_steps", 0, None, True),
    ("train.end_learning_rate", 0.0, None, True),
    ("train.weight_decay", 0.0, None, True),
    ("train.clipnorm", 0.0, None, True),
    ("train.checkpoint_every", 1, None, True),
    ("train.keep_checkpoints", 1, None, True),
    ("train.log_every", 1, None, True),
    ("train.eval_batches", 0, None, True),
    ("train.heldout_every", 0, None, True),
    ("train.max_seconds", 0.0, None, True),
    ("train.heldout_batches", 0, None, True),
    ("train.shuffle_buffer", 1, None, True),
    ("finetune.sentences_per_example", 1, 1000, True),
    ("finetune.validation_fraction", 0.0, 0.5, True),
    ("finetune.test_fraction", 0.0, 0.5, True),
    ("finetune.max_examples", 0, None, True),
    ("finetune.max_seq_length", 8, 4096, True),
    ("finetune.max_query_length", 1, None, True),
    ("finetune.doc_stride", 1, None, True),
    ("finetune.max_answer_length", 1, None, True),
    ("finetune.n_best", 1, None, True),
    ("finetune.trainable_last_n", 1, None, True),
    ("finetune.dropout", 0.0, 1.0, True),
    ("finetune.learning_rate", 0.0, 0.01, False),
    ("finetune.batch_size", 1, 4096, True),
    ("finetune.epochs", 1, 1000, True),
    ("finetune.max_steps", 0, None, True),
    ("finetune.warmup_fraction", 0.0, 0.5, True),
    ("finetune.weight_decay", 0.0, 1.0, True),
    ("finetune.clipnorm", 0.0, None, True),
    ("finetune.similarity_scale", 0.0, None, False),
    ("finetune.window_stride", 1, None, True),
    ("finetune.max_windows", 1, 256, True),
    ("multitask.steps", 0, None, True),
    ("distill.num_layers", 0, None, True),
    ("distill.hidden_dim", 0, None, True),
    ("distill.num_heads", 0, None, True),
    ("distill.intermediate_dim", 0, None, True),
    ("distill.temperature", 0.0, None, False),
    ("distill.alpha", 0.0, 1.0, True),
    ("distill.hidden_weight", 0.0, None, True),
    ("distill.learning_rate", 0.0, 0.01, False),
    ("distill.batch_size", 1, 4096, True),
    ("distill.epochs", 1, 1000, True),
    ("distill.max_steps", 0, None, True),
    ("distill.warmup_fraction", 0.0, 0.5, True),
    ("distill.weight_decay", 0.0, 1.0, True),
    ("cycle.keep_cycles", 1, None, True),
    ("cycle.min_new_bytes", 0, None, True),
    ("cycle.settle_seconds", 0.0, None, True),
]
RANGES += [(f"finetune.{key[len('train.'):]}", *limits) for key, *limits in RANGES
           if key[len("train."):] in TRAIN_KNOBS_IN_FINETUNE and key.startswith("train.")]
RANGES.append(("finetune.checkpoint_every", 0, None, True))  # 0: at each epoch end only
