"""The declaration of every config key: one dataclass per section, one `key(...)` per key.

A key's declaration is its only statement of type (the annotation), default, allowed values
(`choices`) or range (`ge`, `gt`, `le`) and one-line help. From it come the parsing and the
checks (pipeline/config/keys.py, load.py), `bert-pipeline config show` with the reference
docs/configuration.md (pipeline/config/show.py), and the Beam jobs' flags: the keys those jobs
read are declared with them (beam_jobs/settings.py: `vocab.*`, most of `data.*`), and the
`vocab` and `data` sections here subclass that declaration.

A config file is a nested mapping whose sections mirror the dataclasses below (`corpus`,
`vocab`, `data`, `model`, `train`, `tracking`, `finetune`, `multitask`, `distill`, `cycle`)
plus `run_dir`. Anything not given keeps its default. Command-line overrides use dotted keys:

    python -m pipeline pretrain --config configs/pretrain_tiny.yaml train.steps=50

Rules that compare keys stay functions (pipeline/config/load.py). `to_flat_dict` flattens
the config for MLflow params; `dump_yaml` writes the exact config a stage used.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import yaml

from beam_jobs.settings import INPUT_FORMATS, DataSettings, VocabSettings, same_as
from beam_jobs.settings import setting as key
from models import presets

from pipeline.config import task_registry

GLUE_TASK_NAMES = ("cola", "sst-2", "mrpc", "qqp", "sts-b", "mnli", "qnli", "rte", "wnli")
# The train.* keys a phase of train.phases may set; the others are shared by all phases.
TRAIN_PHASE_KEYS = ("steps", "batch_size", "grad_accum_steps", "learning_rate", "warmup_steps",
                    "end_learning_rate", "decay_power", "checkpoint_every")


def _registered_tasks() -> str:
    """finetune.task's values, for the docs: the built-in tasks (pipeline/finetuning/tasks/)."""
    return " | ".join(task_registry.builtin_names())


@dataclass
class CorpusConfig:
    """The text to pretrain on (`make corpus`; docs/stages.md)."""

    source: str = key("brown", "brown: the Brown corpus fetched by `make setup`; files: the "
                               "files of corpus.path", choices=("brown", "files"))
    path: str = key("", "with source files: a glob, or comma-separated globs, of plain, .gz or "
                        ".bz2 files (read as a stream) in corpus.format",
                    allowed="a glob (needed with source files)")
    format: str = key("google", "google: one sentence per line, a blank line between documents, "
                                "used as it is; text: raw text, split into sentences; jsonl: a "
                                "JSON document per line, its text in corpus.text_key",
                      choices=INPUT_FORMATS)
    documents: str = key("line", "format text: a document per line (line), or documents "
                                 "separated by blank lines, the lines of one joined (blank_line: "
                                 "hard-wrapped text, paragraphs)", choices=("line", "blank_line"))
    text_key: str = key("text", "format jsonl: the field of each record that holds its text",
                        allowed="not empty with format jsonl")
    eval_fraction: float = key(0.05, "share of the documents held out (chosen by hashing each "
                                     "document's id with corpus.seed)", gt=0.0, le=0.5)
    seed: int = key(12345, "seed of the held-out choice")
    max_line_chars: int = key(20_000, "lines (google) or sentences (text, jsonl) longer than this "
                                      "are handled as corpus.long_lines says", ge=1)
    long_lines: str = key("error", "error: refuse the corpus, naming the file and line; skip: "
                                   "leave such lines out, counted in the manifest",
                          choices=("error", "skip"))


@dataclass
class VocabConfig(VocabSettings):
    """The WordPiece vocabulary (`make vocab`). The keys the Beam job reads (size, lowercase,
    min_word_count, max_words, spill_words, merge_fan_in) are declared in beam_jobs/settings.py."""

    from_file: str = key("", "use this vocab.txt instead of learning one (e.g. an imported "
                             "checkpoint's, to continue pretraining it); vocab.lowercase must "
                             "match its casing", allowed="empty, or an existing file")


@dataclass
class DataConfig(DataSettings):
    """The pretraining TFRecords (`make data`). The keys the Beam job reads are declared in
    beam_jobs/settings.py; the runner's keys here (docs/scaling-out.md)."""

    phases: list = key(  # noqa: RUF009 (key() makes the field)
        [], 'several outputs from one command, e.g. `["128/20", "512/80"]` (max_seq_length/'
            "max_predictions_per_seq): data/phase1/, data/phase2/, each with its shards and "
            "stats; empty: one output in data/ with the two keys above",
        allowed="LENGTH/PREDICTIONS items, 8 <= LENGTH <= model.max_sequence_length, "
                "1 <= PREDICTIONS <= LENGTH - 3")
    beam_args: list = key(  # noqa: RUF009 (key() makes the field)
        ["--runner=DirectRunner"], "extra Apache Beam flags of the vocab and data jobs, e.g. "
                                   '`["--runner=DataflowRunner", "--project=..."]`')
    workers: int = key(0, "direct-runner processes of the vocab and data jobs; 0: every core "
                          "once the input holds two groups of data.group_size_mb, else one", ge=0)
    remote_dir: str = key("", "a URL the Beam workers reach (gs://bucket/bert, s3://...): the "
                              "vocab and data stages copy their inputs there, run the jobs on it "
                              "and copy the outputs back (runners whose workers run elsewhere); "
                              "empty: the run directory's paths")


@dataclass
class ModelConfig:
    """The model's sizes and switches (docs/models.md); 0 sizes come from the preset."""

    preset: str = key("tiny", "Google's published BERT sizes; the sizes below override it",
                      choices=tuple(presets.PRESETS))
    num_layers: int = key(0, "Transformer layers; 0: the preset's", ge=0)
    hidden_dim: int = key(0, "hidden size; 0: the preset's", ge=0)
    num_heads: int = key(0, "attention heads; 0: the preset's", ge=0,
                         allowed="a divisor of the hidden size")
    intermediate_dim: int = key(0, "feed-forward width; 0: the preset's (4 × hidden_dim when "
                                   "hidden_dim is set)", ge=0)
    max_sequence_length: int = key(512, "rows of the position table: the longest sequence the "
                                        "model takes", ge=8)
    num_segments: int = key(2, "segment (token type) embeddings", ge=1)
    dropout: float = key(0.1, "dropout rate of the encoder", ge=0.0, le=1.0)
    activation: str = key("gelu_approximate", "gelu: exact (erf; Hugging Face configs); "
                                              "gelu_approximate: tanh (Google's BERT code, "
                                              "keras-hub's BertBackbone); relu",
                          choices=("gelu", "gelu_approximate", "relu"))
    layer_norm_epsilon: float = key(1e-12, "LayerNorm epsilon", gt=0.0, le=1.0)
    initializer_range: float = key(0.02, "standard deviation of the truncated-normal "
                                         "initialisation of every weight matrix and embedding "
                                         "(BERT's; 0.02 was chosen for hidden 768: "
                                         "docs/quality.md)", gt=0.0, le=1.0)
    embedding_size: int | None = key(None, "ALBERT's factorized embeddings: their "
                                                     "width, projected to the hidden size by a "
                                                     "Dense; null: the hidden size (BERT)",
                                               allowed="null, or 1 to the hidden size")
    share_layers: bool = key(False, "ALBERT's cross-layer sharing: one Transformer layer's "
                                    "weights used by all num_layers layers")
    init_from: str = key("", "start from a checkpoint, not random weights: a .keras file "
                             "(python -m models.convert, or a pretrain run), a Hugging Face or a "
                             "Google BERT directory; its sizes, vocab and casing fill the config "
                             "(docs/checkpoints.md); used only when the run has no checkpoint yet",
                         allowed="empty, or an existing .keras file or checkpoint directory")


@dataclass
class TrainConfig:
    """Pretraining (`make pretrain`); the schedule counts optimizer updates."""

    strategy: str = key("default", "default | one_device | mirrored (all local GPUs, else all "
                                   "logical CPU devices) | multi_worker (the cluster of "
                                   "$TF_CONFIG: run the same command on every worker) | tpu",
                        choices=("default", "one_device", "mirrored", "multi_worker", "tpu"))
    allow_cpu: bool = key(False, "one_device / mirrored with no GPU visible: true runs on the "
                                 "CPU (mirrored over logical CPU devices); false refuses "
                                 "(docs/gpu.md)")
    tpu: str = key("", "strategy tpu: the TPU to connect to (empty: the default)")
    batch_size: int = key(32, "the global batch of one forward/backward pass, split across "
                              "every replica of every worker (it must divide by their number)",
                          ge=1)
    grad_accum_steps: int = key(1, "batches per optimizer update: the effective batch is "
                                   "batch_size × grad_accum_steps", ge=1, le=1024)
    steps: int = key(1000, "optimizer updates, not micro-batches (the schedule, checkpoint_every, "
                           "log_every and MLflow's steps count them)", ge=1)
    optimizer: str = key("adamw", "adamw: BERT's Adam with decoupled weight decay; lamb: "
                                  "layer-wise adaptive, for large batches (You et al. 2019); both "
                                  "skip decay on LayerNorm parameters and biases",
                         choices=("adamw", "lamb"))
    learning_rate: float = key(1e-3, "the peak learning rate, reached after warmup", gt=0.0)
    warmup_steps: int = key(100, "updates of linear warmup (at most train.steps)", ge=0)
    end_learning_rate: float = key(0.0, "the rate at the end of the decay", ge=0.0)
    decay_power: float = key(1.0, "after warmup the rate decays as (1 - progress) ** "
                                  "decay_power; 1 = linear (BERT)", gt=0.0)
    decay_over: str = key("steps", "what the decay's progress counts: steps (of train.steps; "
                                   "BERT) | max_seconds (the training seconds of "
                                   "train.max_seconds, or the steps if further along: the rate "
                                   "ends with the time budget; not bit-reproducible)",
                          choices=("steps", "max_seconds"))
    weight_decay: float = key(0.01, "decoupled weight decay", ge=0.0)
    beta_1: float = key(0.9, "the optimizer's first-moment decay")
    beta_2: float = key(0.999, "the optimizer's second-moment decay")
    epsilon: float = key(1e-6, "the optimizer's epsilon")
    clipnorm: float = key(1.0, "clip by the global norm (all replicas and accumulated "
                               "micro-batches); 0: no clipping", ge=0.0)
    precision: str = key("float32", "float32 | mixed_bfloat16 (CPU, TPU, Ampere+ GPUs) | "
                                    "mixed_float16 (GPUs; dynamic loss scaling); variables stay "
                                    "float32",
                         choices=("float32", "mixed_bfloat16", "mixed_float16"))
    jit_compile: str = key("auto", "XLA for the train step: auto (one replica: on a GPU; on a CPU "
                                   "only the update, with bfloat16 or fused_kernels; else Keras' "
                                   "choice, off) | true | false",
                           choices=("auto", "true", "false"))
    fused_kernels: bool = key(True, "GELU, LayerNorm and the MLM loss as fused XLA kernels and "
                                    "attention projections as 2-D matmuls in the train step "
                                    "(models/fused.py: same math, TensorFlow only); false: "
                                    "Keras' own ops")
    steps_per_execution: int = key(1, "updates per call of the compiled step (Keras'); "
                                      "checkpoint_every × grad_accum_steps, log_every and "
                                      "heldout_every must be multiples of it", ge=1, le=1000)
    masked_lm_prob: float = key(0.0, "data.masking dynamic: the share of pieces masked in the "
                                     "training batches; 0: data.masked_lm_prob (held-out masks "
                                     "keep the data keys)", ge=0.0, le=1.0)
    max_predictions_per_seq: int = key(0, "data.masking dynamic: most masks per training "
                                          "sequence; 0: data.max_predictions_per_seq", ge=0)
    nsp_weight: float = key(1.0, "the sentence-level (NSP/SOP) loss's weight in the total; 0: "
                                 "MLM only on the same pairs (data.objective mlm: always 0)",
                            ge=0.0)
    checkpoint_every: int = key(200, "updates between checkpoints", ge=1)
    keep_checkpoints: int = key(3, "the newest checkpoints kept", ge=1)
    log_every: int = key(20, "updates between logged training metrics", ge=1)
    eval_batches: int = key(0, "held-out batches evaluated at the end; 0: the whole held-out "
                               "set", ge=0)
    heldout_every: int = key(100, "updates between probes of the held-out MLM accuracy "
                                  "(heldout_mlm_accuracy; time_to_mlm_acc_<level> when it first "
                                  "reaches 0.2, 0.3, ...); 0: never", ge=0)
    max_seconds: float = key(0.0, "stop after this many training seconds (a resumed run counts "
                                  "its earlier ones), then checkpoint, evaluate and export as "
                                  "after the last step; 0: no limit", ge=0.0)
    heldout_batches: int = key(8, "held-out batches per probe; 0: all", ge=0)
    general_heldout: str = key("", "general text scored beside the domain's with every held-out "
                                   "probe (general_mlm_accuracy; what adapting costs): brown "
                                   "(the demo corpus) | a glob of raw-text files | '' (off)")
    shuffle_buffer: int = key(10_000, "records in the training data's shuffle buffer", ge=1)
    seed: int = key(12345, "seed of the initialisation and the data order")
    data_sharding: str = key("auto", "how multi_worker workers split the training data: auto "
                                     "(by file when there are at least as many files as "
                                     "workers, else by record) | file | data (every worker "
                                     "reads all files, keeps its share of each global batch) | "
                                     "off", choices=("auto", "file", "data", "off"))
    resume_data: str = key("skip", "on resume: skip (the data restarts from the seed and skips "
                                   "the consumed batches: an uninterrupted run's batches) | "
                                   "reseed (a fresh shuffle seeded with seed + step: instant, "
                                   "another order)", choices=("skip", "reseed"))
    peak_flops_seconds: float = key(1.0, "seconds timing a large float32 matmul at start-up: "
                                         "the peak FLOP/s the logged mfu is relative to; 0: no "
                                         "measurement, no mfu", ge=0.0, le=60.0)
    head_warmup_steps: int = key(-1, "with model.init_from whose checkpoint has no MLM (or "
                                     "NSP) head: updates that train only the new heads, the "
                                     "encoder and its token embedding frozen, before the "
                                     "schedule starts (with max_seconds: at most a quarter of "
                                     "it); -1: 300 when heads are new, else 0; 0: no warm-up",
                                 ge=-1)
    head_learning_rate: float = key(1e-3, "the constant learning rate of the head warm-up",
                                    gt=0.0)
    head_warmup_until_plateau: bool = key(True, "also end the head warm-up at the first "
                                                "held-out probe (train.heldout_every) whose MLM "
                                                "accuracy is not above the previous probe's")
    new_weights_lr_multiplier: float = key(1.0, "after the head warm-up, the learning rate of "
                                                "the weights model.init_from did not hold (new "
                                                "heads) is this times the schedule's", gt=0.0)
    phases: list[dict] = key(  # noqa: RUF009 (key() makes the field)
        [], f"with data.phases: one mapping per data phase, in order, overriding some of "
            f"{', '.join(TRAIN_PHASE_KEYS)}; a phase starts from the previous one's weights "
            f"with a fresh optimizer and schedule; empty: every phase trains with train.*",
        allowed="one mapping per data phase")


@dataclass
class TrackingConfig:
    """MLflow (docs/operations.md)."""

    experiment: str = key("bert-pipeline", "the MLflow experiment")
    tracking_uri: str = key("", "the MLflow tracking URI; empty: $MLFLOW_TRACKING_URI if set, "
                                "else a SQLite file in the project")
    register_encoder: bool = key(True, "log the pretrained encoder as an MLflow model (text -> "
                                       "embedding) and register it")
    attention_maps: bool = key(True, "pretraining also draws attention maps of a few probe "
                                     "sentences for reviewers (plots/attention; a few seconds)")
    encoder_name: str = key("", "its registered name; empty: bert-encoder-<run> (the run directory's "
                                "name); finetune.init_from takes models:/<name>@<alias>")
    retry_seconds: float = key(30.0, "while the tracking store does not answer, what stages log "
                                     "waits in <run_dir>/tracking/outbox.jsonl and the store is "
                                     "tried again after this many seconds", gt=0.0)


@dataclass
class FinetuneConfig:
    """`python -m pipeline finetune`: a task head on the pretrained encoder (docs/finetuning.md)."""

    task: str = key("classification", "the task: a label per text or pair, a number, a tag per "
                                      "word, SQuAD spans, or a bi-encoder (docs/finetuning.md)",
                    allowed=_registered_tasks)
    dataset: str = key("brown_genre", "brown_genre | brown_pos (the Brown corpus of make setup) "
                                      "| csv | tsv | jsonl (the columns below) | conll | squad | "
                                      "glue (glue_dir + glue_task); each task takes some",
                       choices=("brown_genre", "brown_pos", "csv", "tsv", "jsonl", "conll",
                                "squad", "glue"))
    name: str = key("", "output folder <run_dir>/finetune/<name>; empty: brown_genre / "
                        "brown_pos, the GLUE task, or the task")
    train_file: str = key("", "the training file (file datasets)",
                          allowed="needed by csv, tsv, jsonl, conll, squad")
    validation_file: str = key("", "the validation file; empty: split off train by group, "
                                   "seeded (recorded in splits.json)")
    test_file: str = key("", "the test file; empty: split off train as validation is")
    text_column: str = key("text", "the text's column or field")
    text_pair_column: str = key("", "the second text's, for pairs ([CLS] A [SEP] B [SEP]); "
                                    "empty: single texts")
    label_column: str = key("label", "the label's column or field")
    conll_word_column: int = key(0, "conll: the word's column")
    conll_label_column: int = key(-1, "conll: the tag's column (-1: the last)")
    glue_dir: str = key("", "the GLUE download (glue_data/) or one task's folder")
    glue_task: str = key("", "dataset glue: the task",
                         allowed=f"with dataset glue: {' | '.join(GLUE_TASK_NAMES)}")
    labels: list = key(  # noqa: RUF009 (key() makes the field)
        [], "the label set in id order; empty: the sorted labels found in the training data")
    brown_labels: str = key("genre", "brown_genre's labels: genre (the 15 Brown genres) | group "
                                     "(press, nonfiction, learned, fiction)",
                            choices=("genre", "group"))
    sentences_per_example: int = key(3, "brown_genre: consecutive sentences per example",
                                     ge=1, le=1000)
    validation_fraction: float = key(0.1, "share split off train for validation (no "
                                          "validation_file)", ge=0.0, le=0.5)
    test_fraction: float = key(0.1, "share split off train for testing (no test_file); with "
                                    "validation_fraction below 0.9", ge=0.0, le=0.5)
    split_seed: int = key(12345, "seed of those splits")
    max_examples: int = key(0, "cap on each split (0: all), for quick runs", ge=0)
    max_seq_length: int = key(128, "pieces per example (per window with long_doc_aggregation)",
                              ge=8, le=4096)
    max_query_length: int = key(64, "question_answering: question pieces kept", ge=1)
    doc_stride: int = key(128, "question_answering: pieces between context windows' starts",
                          ge=1)
    max_answer_length: int = key(30, "question_answering: the longest answer, in pieces", ge=1)
    n_best: int = key(20, "question_answering: candidate spans per window", ge=1)
    version_2: bool = key(False, "question_answering: SQuAD v2.0 (a question may have no answer)")
    null_score_threshold: str = key("auto", 'SQuAD v2: the answer is `""` when the null score '
                                            "minus the best span's exceeds this; auto: the "
                                            "official script's best-F1 threshold on the "
                                            "validation split, saved with the model "
                                            "(docs/squad.md)", allowed="auto, or a number")
    long_doc_aggregation: str = key("none", "single-text classification of long documents: none "
                                            "(truncate to one window) | mean | max (of the "
                                            "windows' logits) | attention (learned, over the "
                                            "windows' [CLS]); docs/long-documents.md",
                                    choices=("none", "mean", "max", "attention"))
    window_stride: int = key(64, "windows of max_seq_length - 2 pieces start every this many "
                                 "pieces", ge=1, allowed="at most max_seq_length - 2")
    max_windows: int = key(8, "most windows per document", ge=1, le=256)
    init_from: str = key("", "the encoder: a .keras file (a pretrainer, a fine-tuned model, a "
                             "BertEncoder), a Hugging Face or Google BERT directory, or "
                             "models:/<name>@<alias>; empty: <run_dir>/pretrain/model.keras")
    vocab_file: str = key("", "its vocab (the casing: vocab.json beside it); empty: the "
                              "vocab.txt beside init_from (every .keras the stages write has "
                              "one), else <run_dir>/vocab/vocab.txt")
    freeze: str = key("none", "none: train everything | encoder: only the head | "
                              "all_but_last_n: the head, the pooler and the last "
                              "trainable_last_n Transformer blocks",
                      choices=("none", "encoder", "all_but_last_n"))
    trainable_last_n: int = key(1, "freeze all_but_last_n: Transformer blocks trained", ge=1)
    dropout: float = key(0.1, "dropout rate while fine-tuning", ge=0.0, le=1.0)
    learning_rate: float = key(5e-5, "the peak learning rate (BERT-Base/Large: 2e-5..5e-5; "
                                     "outside 1e-5..3e-4 a warning)", gt=0.0, le=0.01)
    batch_size: int = key(32, "examples per forward/backward pass", ge=1, le=4096)
    epochs: int = key(3, "passes over the training split (counted in updates)", ge=1, le=1000)
    max_steps: int = key(0, "stop after this many updates; 0: epochs decide", ge=0)
    max_seconds: float = key(0.0, "stop training after this many seconds (the per-epoch "
                                  "validation included), keep the best epoch so far, then "
                                  "evaluate and write as after the last epoch; with recipe auto "
                                  "the search and the final run share it; 0: no limit", ge=0.0)
    recipe: str = key("fixed", "fixed: train with learning_rate and epochs as given | auto: "
                               "first try each of recipe_learning_rates on the validation split "
                               "(each as many epochs as finetune.epochs says, at most; no test, "
                               "no baselines), then train the best rate for its best number of "
                               "epochs (docs/finetuning.md#a-recipe-that-finds-itself)",
                      choices=("fixed", "auto"))
    recipe_learning_rates: list = key(  # noqa: RUF009 (key() makes the field)
        ["2e-5", "5e-5", "1e-4", "3e-4"], "recipe auto: the learning rates tried (BERT-Base/"
                                          "Large do best at 2e-5..5e-5, Google's small BERTs at "
                                          "1e-4..3e-4)", allowed="numbers > 0 and <= 0.01, "
                                                             "at least one")
    recipe_search_fraction: float = key(0.5, "recipe auto with max_seconds: the share of the "
                                             "budget the search gets (split evenly over the "
                                             "points not yet run); the final run gets the rest",
                                        gt=0.0, le=0.9)
    warmup_fraction: float = key(0.1, "share of the updates spent warming up", ge=0.0, le=0.5)
    weight_decay: float = key(0.01, "decoupled weight decay", ge=0.0, le=1.0)
    clipnorm: float = key(1.0, "clip by the global norm; 0: no clipping", ge=0.0)
    seed: int = key(12345, "seed of the head's initialisation and the data order")
    grad_accum_steps: int = same_as(TrainConfig, "grad_accum_steps",
                                    help="batches per update: the effective batch is batch_size "
                                         "× grad_accum_steps (epochs and max_steps count "
                                         "updates)")
    precision: str = same_as(TrainConfig, "precision",
                             help="float32 | mixed_bfloat16 | mixed_float16 (dynamic loss "
                                  "scaling): the encoder computes in it; variables and the "
                                  "heads' outputs and losses stay float32")
    jit_compile: str = same_as(TrainConfig, "jit_compile",
                               help="XLA: auto (with a GPU as train.jit_compile; on a CPU off: "
                                    "it measured no faster there, docs/gpu.md) | true | false")
    steps_per_execution: int = same_as(TrainConfig, "steps_per_execution",
                                       help="micro-batches per call of the compiled step "
                                            "(Keras')")
    checkpoint_every: int = key(0, "a checkpoint every this many updates (0: at epoch ends "
                                   "only) in <run_dir>/finetune/.checkpoints/<name>/: the same "
                                   "command after a kill resumes there", ge=0)
    keep_checkpoints: int = same_as(TrainConfig, "keep_checkpoints", default=2)
    similarity_scale: float = key(20.0, "semantic_search: cosine × this before the softmax",
                                  gt=0.0)
    baselines: bool = key(True, "also classical baselines on the test split, their settings "
                                "chosen on validation (TF-IDF linear models, a CRF, BM25, a "
                                "sliding window: docs/finetuning.md#baselines); the summary "
                                "states the margin against the strongest")
    baseline_max_train: int = key(50000, "the baselines train on at most this many training "
                                         "examples (a seeded sample; 0: all)", ge=0)
    baseline_crf_algorithm: str = key("ap", "token classification: how the CRF baseline is "
                                            "trained: ap (averaged perceptron, seconds a pass) "
                                            "| lbfgs (the probabilistic CRF; minutes with "
                                            "hundreds of tags)", choices=("ap", "lbfgs"))
    baseline_crf_iterations: int = key(6, "the CRF baseline's passes (ap: iterations/2 and "
                                          "iterations tried) or L-BFGS iterations (lbfgs)",
                                       ge=1)
    random_init_baseline: bool = key(True, "with baselines: also this architecture from random "
                                           "initialisation, same budget (what pretraining "
                                           "bought; doubles the time)")
    export: bool = key(True, "write the raw-text SavedModel (saved_model/), checked against the "
                             "in-memory model; false: model.keras only, no serving or "
                             "registration (the glue stage predicts from model.keras)")
    register_model: bool = key(True, "log the raw-text SavedModel to MLflow as a model and "
                                     "register it (the files are written either way)")
    registered_model: str = key("", "its registry name; empty: bert-<name>, _ as -")
    sweep: list = key(  # noqa: RUF009 (key() makes the field)
        [], "make sweep's grid: KEY=V1,V2 items over finetune keys, e.g. "
            '`["learning_rate=1e-4,3e-4"]`', allowed="KEY=V1,V2 items")


@dataclass
class MultitaskConfig:
    """`python -m pipeline multitask`: one shared encoder, a head per task, batches mixed across
    tasks; optimizer and schedule from `finetune` (docs/multitask-distillation.md)."""

    name: str = key("multitask", "output folder <run_dir>/multitask/<name>")
    tasks: list[dict] = key(  # noqa: RUF009 (key() makes the field)
        [], "one mapping per task: name (required), weight (its loss weight, >= 0, default 1), "
            "sampling_ratio (its share of the batches, > 0, default 1) and any finetune data "
            "key (task, dataset, train_file, ...) overriding finetune.*")
    steps: int = key(0, "mixed training steps; 0: finetune.epochs × the batches of all tasks",
                     ge=0)
    compare_single_task: bool = key(True, "also train each task alone (same steps), as nested "
                                          "runs")


@dataclass
class DistillConfig:
    """`python -m pipeline distill`: a smaller student trained on a fine-tuned classifier's soft
    targets; data and splits: the teacher's (docs/multitask-distillation.md)."""

    teacher: str = key("", "a finetune output folder; empty: <run_dir>/finetune/brown_genre")
    name: str = key("", "output <run_dir>/distill/<name>; empty: <teacher folder name>_student")
    student_preset: str = key("", "the student's size; empty: the teacher's with the sizes "
                                  "below, or with none of them half its layers",
                              allowed=f"empty, or {' | '.join(presets.PRESETS)}")
    num_layers: int = key(0, "the student's layers; 0: see student_preset", ge=0)
    hidden_dim: int = key(0, "the student's hidden size; 0: the teacher's", ge=0)
    num_heads: int = key(0, "the student's attention heads; 0: the teacher's", ge=0,
                         allowed="a divisor of hidden_dim")
    intermediate_dim: int = key(0, "the student's feed-forward width; 0: the teacher's", ge=0)
    init_from_teacher: str = key("auto", "auto: copy the embeddings, pooler and every other "
                                         "teacher layer when the sizes match | true: require "
                                         "it | false: random initialisation",
                                 choices=("auto", "true", "false"))
    temperature: float = key(2.0, "the soft targets' softmax temperature T", gt=0.0)
    alpha: float = key(0.5, "weight of the soft-target loss KL·T²; 1 - alpha on the hard labels",
                       ge=0.0, le=1.0)
    hidden_loss: str = key("none", "a loss on hidden states too: none | mse | cosine",
                           choices=("none", "mse", "cosine"))
    hidden_match: str = key("cls", "cls ([CLS] of the last layer) | layers (mapped layer by "
                                   "layer)", choices=("cls", "layers"))
    hidden_weight: float = key(1.0, "the hidden loss's weight", ge=0.0)
    learning_rate: float = key(5e-4, "the peak learning rate", gt=0.0, le=0.01)
    batch_size: int = key(32, "examples per batch", ge=1, le=4096)
    epochs: int = key(3, "passes over the training split", ge=1, le=1000)
    max_steps: int = key(0, "stop after this many updates; 0: epochs decide", ge=0)
    warmup_fraction: float = key(0.1, "share of the updates spent warming up", ge=0.0, le=0.5)
    weight_decay: float = key(0.01, "decoupled weight decay", ge=0.0, le=1.0)
    seed: int = key(12345, "seed of the student's initialisation and the data order")
    register_model: bool = key(False, "log the student's raw-text SavedModel to MLflow and "
                                      "register it")


@dataclass
class CycleConfig:
    """`bert-pipeline cycle`: pretraining continued on the text that arrived since the last cycle,
    each task fine-tuned, evaluated, registered, promoted (docs/scheduling.md)."""

    incoming: str = key("", "where new text arrives: a glob, or comma-separated globs (read as "
                            "corpus.format says)")
    tasks: list[dict] = key(  # noqa: RUF009 (key() makes the field)
        [], "one mapping per task: config (a finetune config file), and optional name "
            "(default: the file's stem), metric (the test metric that decides promotion; "
            "default: the task's own), registered_model, overrides (finetune.key=value items)")
    continued: list = key(  # noqa: RUF009 (key() makes the field)
        [], "section.key=value overrides for the cycles after the first")
    keep_cycles: int = key(3, "cycle folders kept in <run_dir>/cycles/ (MLflow keeps every run)",
                           ge=1)
    min_new_bytes: int = key(1, "less new text than this: nothing to do (exit 3)", ge=0)
    settle_seconds: float = key(60.0, "files changed this recently are left for the next cycle",
                                ge=0.0)


@dataclass
class Config:
    """The whole config: `run_dir` and one section per dataclass above."""

    run_dir: str = key("runs/default", "the run directory: every stage's outputs (a relative "
                                       "path is below the run root)")
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
    for name in ("num_layers", "hidden_dim", "num_heads", "intermediate_dim"):
        value = getattr(config.model, name)
        if value:
            arch[name] = value
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
        for name, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{name}.")
            else:
                if isinstance(value, list) and not all(isinstance(v, str) for v in value):
                    value = json.dumps(value, sort_keys=True)  # e.g. multitask.tasks
                flat[prefix + name] = " ".join(value) if isinstance(value, list) else value

    walk(to_dict(config), "")
    return flat


def dump_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)
