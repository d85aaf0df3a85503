"""bench/bench_train.py (make bench-train) in its quick mode, for real: BERT-tiny's training step,
ours and transformers' same-work peer (only those rows, no matmul peak: 4 processes), each
contender a fresh process in every round, the rounds' medians (min-max), the pinned thread
pools each side reports, the load before each round."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # several fresh TensorFlow processes: minutes on 2 busy cores
def test_quick_run_prints_medians_of_the_rounds_pinned_threads_and_the_load(tmp_path):
    pytest.importorskip("transformers")
    done = subprocess.run(
        [sys.executable, "bench/bench_train.py", "--quick", "--rows", "ours,transformers_same",
         "--peak-seconds", "0", "--threads", "1", "--work", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    rounds = [line for line in out if re.match(r"bench-train: round \d/2: load average ", line)]
    assert [line.split()[2] for line in rounds] == ["1/2:", "2/2:"]
    assert any("threads pinned to 1 on every side" in line for line in out)
    assert "bench-train: threads each side reported: tensorflow intra-op 1, inter-op 1; " \
           "torch intra-op 1, inter-op 1" in out
    # every contender ran once a round: its own line, twice
    for name in ("tiny ours float32", "tiny transformers same work"):
        assert sum(line.startswith(f"bench-train: {name}: ") for line in out) == 2, name
    assert not any("transformers stock" in line or "peak_float32" in line for line in out)
    result = json.loads((tmp_path / "result.json").read_text())
    protocol = result["protocol"]
    assert protocol["repeat"] == 2 and protocol["threads"] == 1
    assert [r["round"] for r in protocol["rounds"]] == [1, 2]
    assert all(r["load"] >= 0 and isinstance(r["busy"], bool) for r in protocol["rounds"])
    assert protocol["busy_rounds"] == [r["round"] for r in protocol["rounds"] if r["busy"]]
    ours = result["results"]["tiny"]["ours"]["tokens_per_second"]
    assert ours["n"] == 2 and ours["min"] <= ours["median"] <= ours["max"] > 0
    vs = result["results"]["tiny"]["vs_transformers"]
    assert vs["n"] == 2 and vs["min"] <= vs["median"] <= vs["max"]
    table = [line for line in out if line.startswith("tiny   ours float32 ")]
    assert len(table) == 1 and f"{ours['median']:,.0f} ({ours['min']:,.0f}-{ours['max']:,.0f})" \
        in table[0]
    assert out[-1] == result["line"] == f"bench-train: vs-transformers {vs['median']:.2f} mfu n/a"
    if protocol["busy_rounds"]:
        assert any(line.startswith("bench-train: BUSY: round(s) ") for line in out)
