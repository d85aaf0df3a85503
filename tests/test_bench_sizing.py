"""bench/bench_sizing.py (make bench-sizing): the line fitted through the data part's sizes, the
tables docs/your-corpus.md shows, and a real vocab part on a slice of the demo corpus (the
learner stops where the text runs out of pieces; more pieces split fewer held-out words)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import bench_sizing as bench
from pipeline import artifacts

ROOT = Path(__file__).resolve().parent.parent


def test_fit_recovers_a_fixed_cost_and_a_slope():
    fixed, slope = bench._fit([1.0, 4.0, 16.0], [3.0 + 0.5 * x for x in (1.0, 4.0, 16.0)])
    assert fixed == pytest.approx(3.0) and slope == pytest.approx(0.5)


def test_tables_render_every_part_and_hours_from_the_measured_tokens():
    stage = {"wall_s": 10.0, "peak_mb": 1.0}
    result = {
        "data": {"rows": [{"size": 1, "mb": 2.0, "corpus": stage, "vocab": stage, "data": stage}],
                 "lines": {s: {"fixed_s": 9.5, "s_per_mb": 0.25}
                           for s in ("corpus", "vocab", "data")},
                 "document_tokens_per_mb": 360_000.0, "positions_per_mb": 1.0},
        "train": [{"preset": "tiny", "parameters": 10, "seq": 128, "batch": 32,
                   "tokens_per_second": 10_000.0, "seconds_per_step": 0.4}],
        "vocab": [{"fraction": 4, "mb": 1.5, "distinct_words": 900, "requested": 2000,
                   "learned": 1500, "pieces_per_word": 1.25, "split_share": 0.2}]}
    text = bench.tables(result)
    assert "| data | 10.0 s | 9.5 s | 0.25 s |" in text
    # 100 MB x 360,000 tokens / 10,000 tokens/s = 3,600 s: one hour
    assert "| tiny | 10 | 128 | 32 | 10,000 | 0.40 | 1.0 |" in text
    assert "| 1/4 (1.50 MB) | 900 | 2,000 | 1,500 | 1.250 | 20.0% |" in text


@pytest.mark.slow
@pytest.mark.skipif(not artifacts.BROWN_TARBALL.is_file(), reason="needs `make setup` (Brown)")
def test_vocab_part_on_a_slice_of_the_demo_corpus(tmp_path):
    work = tmp_path / "sizing"
    subprocess.run([sys.executable, "bench/bench_sizing.py", "--parts", "vocab",
                    "--fractions", "64", "--vocab-sizes", "1000,30000", "--work", str(work)],
                   cwd=ROOT, check=True, capture_output=True, text=True, timeout=600)
    rows = json.loads((work / "result.json").read_text())["vocab"]
    small, large = rows
    assert small["learned"] == 1000 and small["learned"] <= small["requested"]
    # 1/64 of Brown has ~3k distinct words: it cannot give 30,000 pieces (1,000 it can)
    assert large["learned"] < large["requested"]
    assert large["pieces_per_word"] < small["pieces_per_word"]
    assert large["split_share"] < small["split_share"]

