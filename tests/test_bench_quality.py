"""bench/bench_quality.py's own helpers (the bench itself, `make bench-quality`, takes ~2 hours
and is not run here): the rounds' figures and medians, the headline's comparison, the argument
checks and what a peer's own process is given."""

import pytest

from bench import bench_quality as bench


def curve(*points):
    """[[step, seconds, accuracy], ...] from (seconds, accuracy) pairs."""
    return [[i * 10, float(t), float(a)] for i, (t, a) in enumerate(points)]


def test_medians_over_rounds_and_the_per_round_comparison():
    rounds = []
    for ours_end, peer_end in ((0.30, 0.10), (0.20, 0.12), (0.25, 0.11)):
        rounds.append({"results": {
            "ours": {"curve": curve((0, 0.0), (50, 0.15), (100, ours_end))},
            "same": {"curve": curve((0, 0.0), (80, peer_end * 0.5), (100, peer_end)),
                     "recipe": {"label": "(a) same recipe"}}}})

    class Recipe:
        name = "same"
    comparisons = bench.round_figures(rounds, [Recipe()], plateau=0.05)
    # each round's ratio: the peer's seconds to its final accuracy over ours to that accuracy
    assert [c["ratio"] for c in comparisons] == pytest.approx([2.0, 2.0, 2.0])
    medians = bench.medians_of(comparisons)
    assert medians["ours_final"]["median"] == pytest.approx(0.25)
    assert medians["theirs_final"] == {"median": 0.11, "min": 0.10, "max": 0.12, "n": 3,
                                       "values": [0.10, 0.12, 0.11]}
    # a peer that ends below the frequent-token plateau is said to
    low = bench.round_figures(rounds[:1], [Recipe()], plateau=0.2)
    assert "plateau" in low[0]["explanation"]


def test_arguments_keep_the_command_line_for_the_peer_process(capsys):
    args = bench.parse_args(["--budget-seconds", "30", "train.steps=5"])
    assert args.repeat == 3 and args.argv == ["--budget-seconds", "30", "train.steps=5"]
    assert args.overrides == ["train.steps=5"] and args.role is None
    for bad in (["--repeat", "0"], ["--budget-seconds", "0"], ["--threads", "-2"]):
        with pytest.raises(SystemExit) as err:
            bench.parse_args(bad)
        assert err.value.code == 2
        assert "error:" in capsys.readouterr().err.strip().splitlines()[-1]
