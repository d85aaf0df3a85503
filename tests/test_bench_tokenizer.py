"""bench/bench_tokenizer.py (make bench-tokenizer) in its quick mode, for real: the Python-side
tokenizers on the first sentences of the demo corpus, each a fresh process in every round, the
same ids checked, words/s medians (min-max), the pinned threads, the load before each round."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import bench_tokenizer as bench
from pipeline import artifacts

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.skipif(not artifacts.BROWN_TARBALL.is_file(), reason="needs `make setup` (Brown)")
def test_quick_python_side_alternates_fresh_processes_and_reports_medians(tmp_path):
    import bert  # noqa: F401  Google's FullTokenizer (bert-tensorflow, requirements-test.txt)
    import tokenizers  # noqa: F401  (requirements-test.txt: `make test` installs both)
    done = subprocess.run(
        [sys.executable, "bench/bench_tokenizer.py", "--quick", "--sentences", "400", "--sides",
         "python", "--threads", "1", "--work", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout.splitlines()
    assert [line.split()[1] for line in out if re.match(r"round \d/2: load average ", line)] \
        == ["1/2:", "2/2:"]
    assert any("threads pinned to 1 on every side" in line for line in out)
    assert "threads the TensorFlow children reported: tensorflow intra-op 1, inter-op 1" in out
    timed = [m.group(1) for m in (re.match(r"  python\s+(.*?)\s+[\d,]+ words/s", line)
                                  for line in out) if m]
    assert timed == list(bench.SIDES["python"]) * 2  # A B A B: the same order each round
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["protocol"]["repeat"] == 2 and result["protocol"]["threads"] == 1
    rates = result["words_per_second"]
    assert set(rates) == {f"python {name}" for name in bench.SIDES["python"]}  # the same ids
    assert all(r["n"] == 2 and r["min"] <= r["median"] <= r["max"] for r in rates.values())
    ratio = result["ratios"]["python"]
    assert ratio["n"] == 2 and out[-1] == result["line"]
    assert out[-1] == f"bench-tokenizer: python {ratio['median']:.2f} graph n/a graph-32 n/a"


def test_bad_arguments_are_one_line_exit_2(capsys):
    for bad in (["--repeat", "0"], ["--sides", "python,rust"], ["--sentences", "-1"]):
        with pytest.raises(SystemExit) as err:
            bench.main(bad)
        assert err.value.code == 2, bad
        assert "error:" in capsys.readouterr().err.strip().splitlines()[-1]
