"""bench/bench_data.py (make bench-data) in its quick mode, for real: the data stages and Google's
create_pretraining_data.py on the first documents of the demo corpus, alternating in rounds,
each a fresh process; medians (min-max), the pinned threads, the load before each round."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import bench_data
from pipeline import artifacts

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # several fresh TensorFlow processes: minutes on 2 busy cores
def test_quick_run_alternates_our_stages_and_the_reference_and_reports_medians(tmp_path):
    # `make test` installs both; without them this test fails rather than passing unseen.
    assert artifacts.BROWN_TARBALL.is_file(), f"{artifacts.BROWN_TARBALL} missing: run `make setup`"
    assert bench_data.default_reference(), \
        "bert-tensorflow is not installed: run `make test-setup` (requirements-test.txt)"
    done = subprocess.run(
        [sys.executable, "bench/bench_data.py", "--quick", "--threads", "1",
         "--work", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout.splitlines()
    assert [line.split()[1] for line in out if re.match(r"round \d/2: load average ", line)] \
        == ["1/2:", "2/2:"]
    assert any("threads pinned to 1 on every side" in line for line in out)
    ran = [line.split()[2] for line in out if re.match(r"  round \d ", line)]
    assert ran == ["corpus", "vocab", "data", "reference"] * 2  # A B A B, in that order
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["protocol"]["repeat"] == 2 and result["protocol"]["threads"] == 1
    assert all(r["load"] >= 0 and r["order"][-1] == "reference 1x"
               for r in result["protocol"]["rounds"])
    assert len(result["runs"]["data 1x"]) == len(result["runs"]["reference 1x"]) == 2
    assert result["corpora"]["1"]["documents"] == bench_data.QUICK["documents"]
    walls = [r["wall_s"] for r in result["runs"]["data 1x"]]
    speedup = result["speedup"]
    assert speedup["n"] == 2 and speedup["values"] == pytest.approx(
        [r["wall_s"] / w for r, w in zip(result["runs"]["reference 1x"], walls)])
    table = [line for line in out if line.startswith("data       1x")]
    low, high = min(walls), max(walls)
    assert len(table) == 1 and f"({low:.1f}-{high:.1f})" in table[0]
    assert out[-1] == result["line"] == (f"bench-data: speedup {speedup['median']:.2f} "
                                         f"memory-growth 1.00")


def test_bad_arguments_are_one_line_exit_2(capsys):
    for bad in (["--repeat", "0"], ["--sizes", "4,8"], ["--documents", "-1"],
                ["--sizes", "x"], ["--stages", "data,nope"]):
        with pytest.raises(SystemExit) as err:
            bench_data.main([*bad, "--ref", "none"])
        assert err.value.code == 2, bad
        assert "error:" in capsys.readouterr().err.strip().splitlines()[-1]
