"""How a race is run: rounds, alternation, pinned threads, the load, medians.

- `--repeat N` (default 3) rounds; in each round every contender runs once, in a fresh process,
  in the same order (A B A B ...): a drift of the machine's speed touches both sides alike.
- `--threads N` (default: the machine's cores) pinned equal on every side through the child
  processes' environment (`thread_env`): TensorFlow's intra-op and inter-op pools
  (TF_NUM_INTRAOP_THREADS, TF_NUM_INTEROP_THREADS, which TensorFlow reads when it starts),
  OpenMP/MKL/OpenBLAS (OMP_NUM_THREADS, ...), and BENCH_THREADS, from which a torch child calls
  torch.set_num_threads and torch.set_num_interop_threads (`pin_torch`) and a TensorFlow child
  tf.config.threading's setters (`pin_tensorflow`); each child reports the pools it got.
- before each round the 1-minute load average is read and printed; a round that starts above a
  load of one per core is flagged (BUSY) in the output and in the result's rounds. The average
  decays over about a minute, so the previous contender's own work shows in it too.
- every figure is reported as its median over the rounds with the min-max beside it
  (`spread`, `spread_text`); a headline line reports medians.
- memory is the whole process tree's: the resident sets of a contender and of every process
  below it (Beam workers, tokenizer pools) summed (`tree_rss`), sampled while it runs
  (`TreeSampler`), its peak the largest sum seen; `measure` runs one command so.
"""

from __future__ import annotations

import collections
import os
import statistics
import subprocess
import threading
import time
from typing import Callable, Sequence

from bench import machine

DEFAULT_REPEAT = 3
THREADS_VARIABLE = "BENCH_THREADS"


# ---------------------------------------------------------------------------
# The flags
# ---------------------------------------------------------------------------
def add_arguments(parser, repeat: int | None = DEFAULT_REPEAT) -> None:
    """--repeat (left out with repeat=None: a bench whose rounds are something else, such as
    its seeds) and --threads."""
    if repeat is not None:
        parser.add_argument("--repeat", type=int, default=repeat,
                            help="rounds; in each, every contender runs once in a fresh "
                                 "process, alternating (A B A B ...); figures are medians "
                                 "(min-max)")
    parser.add_argument("--threads", type=int, default=0,
                        help="threads pinned equal on every side (TensorFlow intra/inter-op, "
                             "torch, OpenMP); 0: the machine's cores")


def check_arguments(parser, args) -> None:
    """--repeat >= 1 and --threads >= 0 (else the parser's one-line error, exit 2); --threads 0
    becomes the core count."""
    if getattr(args, "repeat", 1) < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    if args.threads < 0:
        parser.error(f"--threads must be >= 0 (0: the machine's cores), got {args.threads}")
    args.threads = args.threads or machine.cores()


# ---------------------------------------------------------------------------
# Pinned threads
# ---------------------------------------------------------------------------
def thread_env(threads: int) -> dict[str, str]:
    """The environment that pins a child's thread pools to `threads` (intra-op and inter-op)."""
    n = str(int(threads))
    return {"TF_NUM_INTRAOP_THREADS": n, "TF_NUM_INTEROP_THREADS": n, "OMP_NUM_THREADS": n,
            "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, THREADS_VARIABLE: n}


def child_env(threads: int, **extra: str) -> dict[str, str]:
    """This process's environment with the pinned threads (and `extra`) for a child."""
    return {**os.environ, **thread_env(threads), **extra}


def threads_text(threads: int) -> str:
    return (f"threads pinned to {threads} on every side (TensorFlow intra-op and inter-op "
            f"{threads}, torch set_num_threads / set_num_interop_threads {threads}, "
            f"OMP_NUM_THREADS {threads})")


def pin_torch(torch) -> dict:
    """(in a torch child) torch's pools as BENCH_THREADS says; what torch then reports."""
    wanted = int(os.environ.get(THREADS_VARIABLE) or 0)
    if wanted:
        torch.set_num_threads(wanted)
        try:
            torch.set_num_interop_threads(wanted)
        except RuntimeError:  # already set, or parallel work already started: torch keeps it
            pass
    return {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}


def pin_tensorflow(tf) -> dict:
    """(in a TensorFlow child, before its first op) TensorFlow's pools as BENCH_THREADS says
    (TensorFlow also reads TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS itself); what it
    then reports (0: its own default, the core count)."""
    wanted = int(os.environ.get(THREADS_VARIABLE) or 0)
    if wanted:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(wanted)
            tf.config.threading.set_inter_op_parallelism_threads(wanted)
        except RuntimeError:  # the runtime already started: it keeps its pools
            pass
    return {"intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op": tf.config.threading.get_inter_op_parallelism_threads()}


def pools_text(pools: dict) -> str:
    """'intra-op 2, inter-op 2' from pin_torch's or pin_tensorflow's dict."""
    return f"intra-op {pools['intra_op']}, inter-op {pools['inter_op']}"


# ---------------------------------------------------------------------------
# Rounds
# ---------------------------------------------------------------------------
def run_rounds(contenders: Sequence[tuple[str, Callable[[int], dict]]], repeat: int,
               log=print, busy_above: float | None = None) -> list[dict]:
    """`repeat` rounds of `contenders` ((name, run) pairs; run(round index) runs one fresh
    process and returns its figures), in the given order each round. A round is busy when the
    load before it is above `busy_above` (default: the core count, one per core). Returns per
    round: {"round", "load" (before it), "cores", "busy", "order", "results"}."""
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    rounds, cores = [], machine.cores()
    limit = cores if busy_above is None else busy_above
    for index in range(repeat):
        load = machine.load()
        busy = load > limit
        log(f"round {index + 1}/{repeat}: load average {load:.2f} on {cores} cores"
            + (f"  BUSY (above {limit:g}): its figures are suspect" if busy else ""))
        results = {}
        for name, run in contenders:
            results[name] = run(index)
        rounds.append({"round": index + 1, "load": load, "cores": cores, "busy_above": limit,
                       "busy": busy,
                       "order": [name for name, _ in contenders], "results": results})
    return rounds


def add_contender_flags(parser, hidden, *flags: str) -> None:
    """The flags of a contender's own process, hidden from --help (`hidden`: the parsers'
    SUPPRESS): --role contender and each of `flags` (e.g. "--side"), a string."""
    parser.add_argument("--role", choices=("contender",), help=hidden)
    for flag in flags:
        parser.add_argument(flag, default="", help=hidden)


def run_contender(command: Sequence[str], threads: int, **env: str) -> dict:
    """One contender in a fresh process with the pinned threads (and `env`); the figures it
    printed as its last `RESULT {json}` line, or {"error"}."""
    import json

    done = run_command(command, timeout=3600, env=child_env(threads, **env))
    results = [line for line in done["stdout"].splitlines() if line.startswith("RESULT ")]
    if done["code"] or not results:
        lines = [line for line in done["stderr"].splitlines() if line.strip()] or ["no output"]
        return {"error": f"exit {done['code']}: {lines[-1][:160]}"}
    return json.loads(results[-1][len("RESULT "):])


def run_command(command: Sequence[str], env: dict | None = None, timeout: float = 600) -> dict:
    """A contender that is one command: runs it (a fresh process) and returns its exit code,
    wall seconds and output."""
    started = time.perf_counter()
    done = subprocess.run(list(command), env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    return {"code": done.returncode, "wall": time.perf_counter() - started,
            "stdout": done.stdout, "stderr": done.stderr}


def measure(command: Sequence[str], log_path, env: dict | None = None, cwd=None,
            every: float = 0.02) -> dict:
    """Runs `command` (a fresh process, its output to `log_path`): wall seconds, the peak RSS
    of its whole process tree (MB, sampled every `every` seconds), its own largest RSS and CPU
    seconds (wait4: user + system, with its waited-for children). A failure raises
    RuntimeError with the end of the log."""
    with open(log_path, "w") as log:
        started = time.perf_counter()
        process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                   env=env)
        with TreeSampler(process.pid, every, started) as tree:
            _, status, usage = os.wait4(process.pid, 0)
            wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        with open(log_path, errors="replace") as log:
            tail = log.read()[-3000:]
        raise RuntimeError(f"{' '.join(map(str, command[:4]))} ... failed "
                           f"({process.returncode}); end of {log_path}:\n{tail}")
    return {"wall_s": wall, "peak_mb": tree.peak_mib,
            "max_process_rss_mb": usage.ru_maxrss / 1024,
            "cpu_s": usage.ru_utime + usage.ru_stime}


def figure(rounds: list[dict], name: str, pick: Callable[[dict], float]) -> list[float]:
    """`pick` of contender `name`'s results, one per round."""
    return [float(pick(r["results"][name])) for r in rounds]


def spread(values: Sequence[float]) -> dict:
    """{"median", "min", "max", "n", "values"} of one figure over the rounds."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("no values")
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values), "values": values}


def spread_text(values: Sequence[float], spec: str = ".2f") -> str:
    """'median (min-max)' of a figure, or the one value for one round."""
    s = spread(values)
    if s["n"] == 1:
        return format(s["median"], spec)
    return f"{s['median']:{spec}} ({s['min']:{spec}}-{s['max']:{spec}})"


def busy_rounds(rounds: list[dict]) -> list[int]:
    return [r["round"] for r in rounds if r["busy"]]


def record(rounds: list[dict], threads: int) -> dict:
    """The protocol's part of a result.json: repeats, threads, each round's load and flag."""
    return {"repeat": len(rounds), "threads": threads, "thread_env": thread_env(threads),
            "rounds": [{k: r[k] for k in ("round", "load", "cores", "busy_above", "busy",
                                          "order")}
                       for r in rounds],
            "busy_rounds": busy_rounds(rounds)}


def busy_note(rounds: list[dict]) -> str:
    """'' or a line naming the rounds that started above one load per core."""
    busy = busy_rounds(rounds)
    if not busy:
        return ""
    return (f"BUSY: round(s) {', '.join(map(str, busy))} of {len(rounds)} started above a load "
            f"of {rounds[0]['busy_above']:g}: their figures are suspect")


# ---------------------------------------------------------------------------
# Whole-process memory
# ---------------------------------------------------------------------------
def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and all its descendants, summed (read from /proc; 0 where the
    process is gone)."""
    children, rss = collections.defaultdict(list), {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            children[int(fields[1])].append(int(entry))
            rss[int(entry)] = int(fields[21]) * page
        except (OSError, IndexError, ValueError):
            continue
    total, stack, seen = 0, [pid], set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        total += rss.get(current, 0)
        stack.extend(children.get(current, []))
    return total


class TreeSampler:
    """Samples tree_rss(pid) every `every` seconds in a thread, from `with` until its end:
    `samples` [(seconds since `started`, MiB)], `peak_mib` the largest."""

    def __init__(self, pid: int, every: float = 0.25, started: float | None = None):
        self.pid, self.every = pid, every
        self.started = time.perf_counter() if started is None else started
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            resident = tree_rss(self.pid)
            if resident:
                self.samples.append((time.perf_counter() - self.started, resident / 2 ** 20))
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> "TreeSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mib(self) -> float:
        return max((mib for _, mib in self.samples), default=0.0)
