"""Sizing your own corpus on this machine: data stages' seconds per MB, training tokens/s per
preset and sequence length, and the vocabulary size a corpus of a given size supports.

    make bench-sizing                                   # ~15 minutes on 2 cores
    python bench/bench_sizing.py --parts data,vocab     # only some parts
    python bench/bench_sizing.py --presets tiny,mini --seqs 128 --steps 2

Text: the Brown demo corpus (`make setup`), through the corpus stage once.

- data: the corpus, vocab and data stages (`python -m pipeline <stage>`, a subprocess each, as
  the pipeline runs them, the default recipe's data settings) on the demo corpus' training
  documents taken 1x, 4x and 16x (documents repeated: the work per MB is the same as for new
  text; the vocabulary is not, see the vocab part). Per stage, a least-squares line
  `seconds = fixed + slope x MB` over the three sizes: the fixed cost (Python, imports, the
  MLflow run, Beam's start) and the seconds per MB of text.
- train: the pretraining step of each preset (`pipeline.training.pretrainer`: the pretrain
  stage's model, optimizer and compiled train step, float32, the pipeline's defaults) on
  synthetic batches (random ids, 15% of the positions predicted; the speed does not depend on
  the text) at each sequence length, batch 32 at 128 and 8 at 512 (4,096 positions a step
  either way): tokens/s over `--steps` timed steps after `--warmup` untimed ones (a fresh
  process per preset and length), and the hours one pass over 100 MB of text takes (its
  WordPiece tokens, from the data part's 1x run, or 240,000 per MB; each `data.dupe_factor`
  beyond 1 adds a pass).
- vocab: the vocabulary job (`python -m beam_jobs.vocab`, the vocab stage's job) on the first
  1/16, 1/4 and all of the training documents, at each `--vocab-sizes`; per run, the distinct
  words counted, the pieces learned, and on the held-out documents the pieces per word and the
  share of words split into two or more pieces (Hugging Face `tokenizers`' BERT WordPiece over
  the learned vocab.txt, lowercased as the default recipe).

The CPU's model, flags and load average are printed first and saved in `result.json`
(`runs/bench_sizing/`). These figures are a machine's, not a race: one round by default;
`--repeat N` (bench/protocol.py) measures the data and train parts in N rounds (every
measurement a fresh process, in the same order each round) and keeps each figure's median,
printing its min-max. Every child's thread pools are pinned to `--threads` (TensorFlow
intra/inter-op, OpenMP) and printed; the load average before each round is printed and a round
above one per core flagged BUSY (also in result.json). The last line reads
`bench-sizing: data <s/MB> s/MB + <s> s, tiny-128 <tok/s> tok/s, base-512 <tok/s> tok/s`
(the three stages' slopes and fixed costs summed; the first and last presets measured).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench import machine, protocol  # noqa: E402  (the CPU facts; rounds, threads, measure)

CONFIG = "configs/pretrain_tiny.yaml"
BATCH_POSITIONS = 4096  # positions per training step: batch 32 at seq 128, 8 at 512
MB = 1_000_000
TOKENS_PER_MB = 240_000  # WordPiece tokens per MB of the demo corpus' text (8,000-piece vocab)
STAGES = ("corpus", "vocab", "data")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="data,train,vocab",
                        help="comma-separated: data, train, vocab")
    parser.add_argument("--sizes", default="1,4,16", help="corpus multiples for the data part")
    parser.add_argument("--presets", default="tiny,mini,small,medium,base")
    parser.add_argument("--seqs", default="128,512", help="sequence lengths for the train part")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per preset and length")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed steps first (the first traces and compiles; the second "
                             "is still slower)")
    parser.add_argument("--vocab-sizes", default="2000,4000,8000,16000,32000")
    parser.add_argument("--fractions", default="16,4,1",
                        help="the vocab part's corpora: 1/N of the training documents")
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench_sizing"))
    parser.add_argument("--tables", metavar="RESULT_JSON", default="",
                        help="print the Markdown tables of earlier runs' result.json files "
                             "(comma-separated: parts measured apart); run nothing")
    protocol.add_arguments(parser, repeat=1)
    return parser


def machine_facts() -> dict:
    model, flags = machine.cpu_facts()
    return {"cpu": model, "cores": machine.cores(), "flags": [f for f, on in flags.items() if on],
            "load_before": machine.load()}


def _stage(stage: str, work: Path, run: str, corpus_glob: str, threads: int) -> dict:
    # No --run-root: the demo corpus is the one `make setup` fetched under the project's root;
    # every path the stage writes is given absolute.
    command = [sys.executable, "-m", "pipeline", stage, "--config", CONFIG, "--force",
               f"run_dir={work / run}",
               f"tracking.tracking_uri=sqlite:///{work / 'mlflow.db'}",
               "tracking.experiment=bench-sizing"]
    if corpus_glob:
        command += ["corpus.source=files", f"corpus.path={corpus_glob}", "corpus.format=google"]
    env = protocol.child_env(threads, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    return protocol.measure(command, work / f"log-{run}-{stage}.txt", env, cwd=ROOT)


def _documents(corpus_dir: Path) -> list[str]:
    """The Google-format documents (blank-line separated) of a corpus stage's split."""
    docs = []
    for path in sorted(corpus_dir.glob("part-*.txt")):
        docs += [d.strip("\n") for d in path.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    return docs


def _write(path: Path, docs: list[str]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n\n".join(docs) + "\n"
    path.write_text(text, encoding="utf-8")
    return len(text.encode("utf-8"))


def _fit(xs, ys) -> tuple[float, float]:
    """Least squares y = a + b x; returns (a, b)."""
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(intercept), float(slope)


def data_part(work: Path, docs: list[str], sizes: list[int], repeat: int, threads: int) -> dict:
    mbs = {size: _write(work / f"text-{size}x" / "docs.txt", docs * size) / MB for size in sizes}

    def stage_run(size: int, stage: str):
        def run(index: int) -> dict:
            found = _stage(stage, work, f"run-{size}x", str(work / f"text-{size}x" / "*.txt"),
                           threads)
            print(f"  data: {size:>2}x {mbs[size]:6.1f} MB {stage:<6} {found['wall_s']:6.1f} s "
                  f"peak {found['peak_mb']:,.0f} MB", flush=True)
            return found
        return run

    rounds = protocol.run_rounds(
        [(f"{size}x {stage}", stage_run(size, stage)) for size in sizes for stage in STAGES],
        repeat, log=lambda line: print(f"  data: {line}", flush=True))
    rows = []
    for size in sizes:
        row = {"size": size, "mb": mbs[size]}
        for stage in STAGES:  # the medians over the rounds (min-max kept beside)
            walls = protocol.figure(rounds, f"{size}x {stage}", lambda f: f["wall_s"])
            peaks = protocol.figure(rounds, f"{size}x {stage}", lambda f: f["peak_mb"])
            row[stage] = {"wall_s": protocol.spread(walls)["median"],
                          "peak_mb": protocol.spread(peaks)["median"],
                          "wall": protocol.spread(walls)}
        stats = json.loads((work / f"run-{size}x" / "data" / "stats.json").read_text())
        manifest = json.loads((work / f"run-{size}x" / "corpus" / "manifest.json").read_text())
        train_mb = manifest["train"]["characters"] / MB  # the training split's text
        row["positions_per_mb"] = (stats["train"]["instances"]
                                   * stats["settings"]["max_seq_length"]) / train_mb
        row["document_tokens_per_mb"] = stats["train"]["document_tokens"] / train_mb
        rows.append(row)
    lines = {}
    for stage in STAGES:
        fixed, slope = _fit([r["mb"] for r in rows], [r[stage]["wall_s"] for r in rows])
        lines[stage] = {"fixed_s": fixed, "s_per_mb": slope}
    return {"rows": rows, "lines": lines, "protocol": protocol.record(rounds, threads),
            "positions_per_mb": rows[0]["positions_per_mb"],
            "document_tokens_per_mb": rows[0]["document_tokens_per_mb"]}


def train_one(preset: str, seq: int, steps: int, warmup: int = 2) -> dict:
    """bench-train's measurement of our pretraining step (bench_train.bench_ours: the pretrain
    stage's model, optimizer and compiled step on a cached synthetic batch) at `seq`."""
    import bench_train

    batch = BATCH_POSITIONS // seq
    bench_train.SEQ, bench_train.PREDICTIONS = seq, max(1, round(0.15 * seq))
    result = bench_train.bench_ours(preset, bench_train.synthetic(batch), steps, warmup)
    return {"preset": preset, "seq": seq, "batch": batch, "parameters": result["parameters"],
            "seconds_per_step": result["seconds_per_step"],
            "tokens_per_second": result["tokens_per_second"]}


def train_part(work: Path, presets, seqs, steps: int, warmup: int, repeat: int,
               threads: int) -> tuple[list[dict], dict]:
    def run_one(preset: str, seq: int):
        def run(index: int) -> dict:
            # A fresh process each: one preset's graphs and memory do not slow the next.
            out = work / f"train-{preset}-{seq}-r{index + 1}.json"
            code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); "
                    f"import pipeline, tensorflow as tf; from bench import protocol; "
                    f"pools = protocol.pin_tensorflow(tf); import bench_sizing as b; "
                    f"json.dump({{**b.train_one({preset!r}, {seq}, {steps}, {warmup}), "
                    f"'pools': pools}}, open({str(out)!r}, 'w'))")
            env = protocol.child_env(threads, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
            subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            row = json.loads(out.read_text())
            print(f"  train: {preset:<6} seq {seq:>3} batch {row['batch']:>2} "
                  f"{row['parameters']:>11,} params {row['tokens_per_second']:9,.0f} tok/s "
                  f"{row['seconds_per_step']:6.2f} s/step", flush=True)
            return row
        return run

    names = [(preset, seq) for preset in presets for seq in seqs]
    rounds = protocol.run_rounds([(f"{p} {q}", run_one(p, q)) for p, q in names], repeat,
                                 log=lambda line: print(f"  train: {line}", flush=True))
    rows = []
    for preset, seq in names:  # the medians over the rounds
        found = [r["results"][f"{preset} {seq}"] for r in rounds]
        tps = protocol.spread([f["tokens_per_second"] for f in found])
        rows.append({**found[0], "tokens_per_second": tps["median"], "tokens": tps,
                     "seconds_per_step": protocol.spread(
                         [f["seconds_per_step"] for f in found])["median"]})
        if repeat > 1:
            print(f"  train: {preset:<6} seq {seq:>3} median (min-max) "
                  f"{protocol.spread_text(tps['values'], ',.0f')} tok/s", flush=True)
    return rows, protocol.record(rounds, threads)


def _pieces_per_word(vocab_file: Path, words: list[str]) -> tuple[float, float]:
    from tokenizers import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(str(vocab_file), lowercase=True, strip_accents=True)
    counts = [len(e.tokens) for e in tokenizer.encode_batch(words, add_special_tokens=False)]
    counts = np.asarray(counts)
    return float(counts.mean()), float((counts > 1).mean())


def vocab_part(work: Path, docs: list[str], heldout: list[str], fractions,
               vocab_sizes, threads: int) -> list[dict]:
    from tokenizers.pre_tokenizers import BertPreTokenizer

    words = [w for doc in heldout for w, _ in BertPreTokenizer().pre_tokenize_str(doc)]
    rows = []
    for fraction in fractions:
        part = docs[: max(1, len(docs) // fraction)]
        text_dir = work / f"vocab-text-1of{fraction}"
        mb = _write(text_dir / "docs.txt", part) / MB
        for size in vocab_sizes:
            out = work / f"vocab-1of{fraction}-{size}" / "vocab.txt"
            out.parent.mkdir(parents=True, exist_ok=True)
            command = [sys.executable, "-m", "beam_jobs.vocab", "--input", str(text_dir / "*.txt"),
                       "--output", str(out), "--vocab_size", str(size), "--lowercase", "true"]
            env = protocol.child_env(threads, PYTHONPATH=str(ROOT))
            wall = protocol.measure(command, out.parent / "log.txt", env, cwd=ROOT)["wall_s"]
            info = json.loads(out.with_name("vocab.json").read_text()) \
                if out.with_name("vocab.json").exists() else {}
            learned = sum(1 for _ in out.open(encoding="utf-8"))
            per_word, split = _pieces_per_word(out, words)
            row = {"fraction": fraction, "mb": mb, "requested": size, "learned": learned,
                   "distinct_words": info.get("distinct_words_used"), "wall_s": wall,
                   "pieces_per_word": per_word, "split_share": split}
            rows.append(row)
            print(f"  vocab: 1/{fraction:<2} {mb:5.2f} MB asked {size:>6,} learned {learned:>6,} "
                  f"distinct words {row['distinct_words'] or 0:>7,} pieces/word {per_word:.3f} "
                  f"split {split:.1%} ({wall:.1f} s)", flush=True)
    return rows


def tables(result: dict) -> str:
    """The Markdown tables docs/your-corpus.md shows, from a result.json."""
    out = []
    if "data" in result:
        data = result["data"]
        out += ["| stage | " + " | ".join(f"{r['size']}x ({r['mb']:.1f} MB)" for r in data["rows"])
                + " | fixed | per MB |",
                "|---|" + "---|" * (len(data["rows"]) + 2)]
        for stage in ("corpus", "vocab", "data"):
            line = data["lines"][stage]
            walls = " | ".join(f"{r[stage]['wall_s']:.1f} s" for r in data["rows"])
            out.append(f"| {stage} | {walls}"
                       + f" | {line['fixed_s']:.1f} s | {line['s_per_mb']:.2f} s |")
        out += ["", f"WordPiece tokens per MB of text: {data['document_tokens_per_mb']:,.0f}; "
                    f"training positions per MB (seq and dupe_factor of the default recipe): "
                    f"{data['positions_per_mb']:,.0f}.", ""]
    if "train" in result:
        per_mb = result.get("data", {}).get("document_tokens_per_mb", TOKENS_PER_MB)
        for row in result["train"]:  # one pass over the text's tokens (dupe_factor 1)
            row["hours_per_100mb"] = 100 * per_mb / row["tokens_per_second"] / 3600
        out += ["| preset | parameters | seq | batch | tokens/s | s per step | hours per 100 MB |",
                "|---|---|---|---|---|---|---|"]
        out += [f"| {r['preset']} | {r['parameters']:,} | {r['seq']} | {r['batch']} | "
                f"{r['tokens_per_second']:,.0f} | {r['seconds_per_step']:.2f} | "
                f"{r['hours_per_100mb']:,.1f} |" for r in result["train"]]
        out.append("")
    if "vocab" in result:
        out += ["| corpus | distinct words | vocab asked | learned | pieces per held-out word | "
                "held-out words split |", "|---|---|---|---|---|---|"]
        out += [f"| 1/{r['fraction']} ({r['mb']:.2f} MB) | {r['distinct_words'] or 0:,} | "
                f"{r['requested']:,} | {r['learned']:,} | {r['pieces_per_word']:.3f} | "
                f"{r['split_share']:.1%} |" for r in result["vocab"]]
    return "\n".join(out)


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    protocol.check_arguments(parser, args)
    if args.tables:
        result = {}
        for path in args.tables.split(","):
            result.update(json.loads(Path(path).read_text()))
        print(tables(result))
        return result
    parts = set(args.parts.split(","))
    work = Path(args.work)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    facts = machine_facts()
    print(f"machine: {facts['cpu']}, {facts['cores']} cores, flags {' '.join(facts['flags'])}, "
          f"load {facts['load_before']:.2f}", flush=True)
    print(f"protocol: {args.repeat} round(s) of the data and train parts (each figure the "
          f"median, min-max beside it), each measurement a fresh process; the vocab part once "
          f"(counts, not times); {protocol.threads_text(args.threads)}", flush=True)
    result = {"machine": facts, "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    _stage("corpus", work, "brown", "", args.threads)
    docs = _documents(work / "brown" / "corpus" / "train")
    heldout = _documents(work / "brown" / "corpus" / "eval")
    save = lambda: (work / "result.json").write_text(json.dumps(result, indent=2))  # noqa: E731
    if "data" in parts:
        result["data"] = data_part(work, docs, [int(s) for s in args.sizes.split(",")],
                                   args.repeat, args.threads)
        save()
    if "train" in parts:
        result["train"], result["train_protocol"] = train_part(
            work, args.presets.split(","), [int(s) for s in args.seqs.split(",")], args.steps,
            args.warmup, args.repeat, args.threads)
        save()
    if "vocab" in parts:
        result["vocab"] = vocab_part(work, docs, heldout,
                                     [int(f) for f in args.fractions.split(",")],
                                     [int(s) for s in args.vocab_sizes.split(",")],
                                     args.threads)
    result["load_after"] = machine.load()
    save()
    for part in ("data", "train"):
        record = (result.get("data", {}).get("protocol") if part == "data"
                  else result.get("train_protocol"))
        if record and record["busy_rounds"]:
            print(f"bench-sizing: {part}: BUSY: round(s) "
                  f"{', '.join(map(str, record['busy_rounds']))} of {record['repeat']} started "
                  f"above a load of one per core: their figures are suspect", flush=True)
    summary = []
    if "data" in result:
        lines = result["data"]["lines"]
        summary.append(f"data {sum(v['s_per_mb'] for v in lines.values()):.2f} s/MB + "
                       f"{sum(v['fixed_s'] for v in lines.values()):.1f} s")
    if "train" in result:
        first, last = result["train"][0], result["train"][-1]
        summary += [f"{r['preset']}-{r['seq']} {r['tokens_per_second']:,.0f} tok/s"
                    for r in (first, last)]
    print(tables(result), flush=True)
    print("bench-sizing: " + ", ".join(summary), flush=True)
    return result


if __name__ == "__main__":
    main()
