"""The race protocol (bench/protocol.py) and the machine facts (bench/machine.py) with real child
processes: contenders alternate, each in a fresh process; medians and min-max; the pinned
threads reach the child (torch's pools too); a round above the load limit is flagged."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

from bench import machine, protocol

ROOT = Path(__file__).resolve().parent.parent


def contender(name: str, log: Path, values: list, env: dict | None = None):
    """A contender that is a python child: appends its name and pid to `log`, prints the
    round's value and the pinned variables it sees."""
    def run(index: int) -> dict:
        code = ("import json, os, sys; "
                "open(sys.argv[1], 'a').write(sys.argv[2] + ' ' + str(os.getpid()) + '\\n'); "
                "print(json.dumps({'value': float(sys.argv[3]), 'env': {k: os.environ.get(k) "
                "for k in ('TF_NUM_INTRAOP_THREADS', 'TF_NUM_INTEROP_THREADS', "
                "'OMP_NUM_THREADS', 'BENCH_THREADS')}}))")
        done = protocol.run_command([sys.executable, "-c", code, str(log), name,
                                     str(values[index])], env=env)
        assert done["code"] == 0, done["stderr"]
        return json.loads(done["stdout"])
    return run


def test_contenders_alternate_each_in_a_fresh_process(tmp_path):
    log, lines = tmp_path / "order.txt", []
    rounds = protocol.run_rounds([("A", contender("A", log, [1, 2, 3])),
                                  ("B", contender("B", log, [4, 5, 6]))], 3, log=lines.append)
    order = [line.split() for line in log.read_text().splitlines()]
    assert [name for name, _ in order] == ["A", "B", "A", "B", "A", "B"]
    pids = [int(pid) for _, pid in order]
    assert len(set(pids)) == 6 and os.getpid() not in pids
    assert [r["round"] for r in rounds] == [1, 2, 3] and all(r["order"] == ["A", "B"]
                                                              for r in rounds)
    assert len(lines) == 3 and all(line.startswith(f"round {i + 1}/3: load average ")
                                   for i, line in enumerate(lines))


def test_median_and_min_max_of_each_figure(tmp_path):
    log = tmp_path / "order.txt"
    rounds = protocol.run_rounds([("A", contender("A", log, [5.0, 1.0, 3.0, 9.0, 2.0])),
                                  ("B", contender("B", log, [2.0, 2.5, 4.0, 1.0, 8.0]))], 5,
                                 log=lambda line: None)
    a = protocol.figure(rounds, "A", lambda r: r["value"])
    assert a == [5.0, 1.0, 3.0, 9.0, 2.0]
    assert protocol.spread(a) == {"median": 3.0, "min": 1.0, "max": 9.0, "n": 5, "values": a}
    assert protocol.spread_text(a) == "3.00 (1.00-9.00)"
    # a paired figure: B / A per round, then its median
    ratio = [b / x for x, b in zip(a, protocol.figure(rounds, "B", lambda r: r["value"]))]
    assert protocol.spread(ratio)["median"] == pytest.approx(4.0 / 3.0)  # round 3's
    assert protocol.spread([4.0, 1.0])["median"] == 2.5  # an even count: the middle two
    assert protocol.spread_text([0.5], ".1f") == "0.5"
    with pytest.raises(ValueError):
        protocol.spread([])


def test_the_pinned_threads_reach_the_child(tmp_path):
    env = protocol.child_env(3)
    rounds = protocol.run_rounds([("A", contender("A", tmp_path / "o", [0], env=env))], 1,
                                 log=lambda line: None)
    assert rounds[0]["results"]["A"]["env"] == {"TF_NUM_INTRAOP_THREADS": "3",
                                                "TF_NUM_INTEROP_THREADS": "3",
                                                "OMP_NUM_THREADS": "3", "BENCH_THREADS": "3"}
    pytest.importorskip("torch")
    code = ("import json, torch; from bench import protocol; "
            "print(json.dumps(protocol.pin_torch(torch)))")
    done = protocol.run_command([sys.executable, "-c", code],
                                env=protocol.child_env(1, PYTHONPATH=str(ROOT)))
    assert done["code"] == 0, done["stderr"][-2000:]
    assert json.loads(done["stdout"].strip().splitlines()[-1]) == {"intra_op": 1, "inter_op": 1}


def test_a_round_above_the_load_limit_is_flagged(tmp_path):
    lines = []
    run = contender("A", tmp_path / "o", [1, 1])
    # A limit below zero: every load average, even an idle machine's 0.00, is above it.
    busy = protocol.run_rounds([("A", run)], 2, log=lines.append, busy_above=-1.0)
    assert [r["busy"] for r in busy] == [True, True] and all("BUSY" in line for line in lines)
    kept = protocol.record(busy, 2)
    assert kept["busy_rounds"] == [1, 2] and kept["threads"] == 2
    assert kept["rounds"][0]["load"] == busy[0]["load"] >= 0
    assert "results" not in kept["rounds"][0]
    assert "round(s) 1, 2 of 2" in protocol.busy_note(busy)
    json.dumps(kept)  # goes into result.json as it is
    quiet = protocol.run_rounds([("A", run)], 2, log=lines.append, busy_above=1e9)
    assert not any(r["busy"] for r in quiet) and protocol.busy_note(quiet) == ""
    # the default limit is one per core
    assert protocol.run_rounds([("A", run)], 1, log=lambda line: None)[0]["busy_above"] == \
        machine.cores()


def test_the_flags_and_their_errors(capsys):
    parser = argparse.ArgumentParser()
    protocol.add_arguments(parser)
    args = parser.parse_args([])
    protocol.check_arguments(parser, args)
    assert args.repeat == 3 and args.threads == machine.cores()
    for bad in (["--repeat", "0"], ["--threads", "-1"]):
        with pytest.raises(SystemExit) as exit_:
            protocol.check_arguments(parser, parser.parse_args(bad))
        assert exit_.value.code == 2
        assert f"error: {bad[0]} must be" in capsys.readouterr().err.strip().splitlines()[-1]
    with pytest.raises(ValueError):
        protocol.run_rounds([], 0)


def test_quick_fills_only_what_the_command_line_left_out():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seq-len", type=int, default=128)
    machine.add_quick(parser, {"steps": 8, "seq_len": 64})
    argv = ["--quick", "--steps=20"]
    args = machine.apply_quick(parser.parse_args(argv), {"steps": 8, "seq_len": 64}, argv)
    assert (args.steps, args.seq_len) == (20, 64)
    argv = ["--steps", "5"]
    args = machine.apply_quick(parser.parse_args(argv), {"steps": 8, "seq_len": 64}, argv)
    assert (args.steps, args.seq_len) == (5, 128)


def test_the_cpu_facts_read_this_machine():
    model, flags = machine.cpu_facts()
    assert model and set(flags) == set(machine.CPU_FLAGS)
    listed = machine.cpu_flags()
    if Path("/proc/cpuinfo").is_file():
        assert listed and all(flags[f] == (f in listed) for f in flags)
    line = machine.machine_line()
    assert f"{machine.cores()} cores" in line and "load average" in line
    assert machine.versions(["pytest", "no-such-distribution-x"]) == {
        "pytest": pytest.__version__, "no-such-distribution-x": "not installed"}


def test_measure_counts_the_whole_tree_and_a_failure_names_its_log(tmp_path):
    # a child that starts a grandchild holding ~200 MB for a moment: the tree's peak counts it
    grandchild = "b = b'x' * (200 * 2 ** 20); import time; time.sleep(1.0)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])"
    found = protocol.measure([sys.executable, "-c", parent], tmp_path / "log.txt")
    assert found["peak_mb"] > 200 and found["max_process_rss_mb"] > 0
    assert found["wall_s"] >= 1.0 and found["cpu_s"] >= 0
    with pytest.raises(RuntimeError) as err:
        protocol.measure([sys.executable, "-c", "print('the end of it'); raise SystemExit(3)"],
                         tmp_path / "bad.txt")
    assert "failed (3)" in str(err.value) and "the end of it" in str(err.value)

