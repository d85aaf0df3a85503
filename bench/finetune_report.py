"""The report of the fine-tuning race (bench/bench_finetune.py; bench/bench_checkpoint.py prints
its contenders and quality tables too): per start, the same-work comparison of both runs, where
the time goes (cut at the same steps) and the test-set quality (macro-F1, a paired bootstrap of
the gap); then the starts against bag-of-words, our memory by part of the run, the goals met or
missed, and result.json.

The race runs in rounds (bench/protocol.py), one seed each: the rounds table and the headline
line give each figure's median over the rounds (min-max beside it); the tables after it show
the round whose speed-ratio is the median one. Metric parity is judged only for a start where
both sides' median beats bag-of-words on the same split.
"""

from __future__ import annotations

import json
import random
from collections import Counter

from bench import protocol

GOALS = {"speed": 1.5, "metric": 0.01, "memory": 1.15}
# Memory per added training row must stay below one row's int32 features (token ids, segment
# ids, padding mask: 3 x 4 x seq_len bytes): a stage that held its split's features would grow
# by at least that much per row on top of what it holds now, and so miss it.
FEATURE_ARRAYS = 3
RSS_EVERY = 0.25  # seconds between samples of our stage's tree RSS (protocol.TreeSampler)
# The parts of our stage's run, cut at its log lines (bench_finetune.MARKS): memory by part.
PHASES = (("start-up", None, "data"), ("encoder, features", "data", "built"),
          ("steps + validation", "built", "epoch"), ("test", "epoch", "test"),
          ("export", "test", "wrote"))


def fit_segments(ours: dict, peer: dict):
    """The headline seconds of both cut at the same steps a and b, our first and last progress
    lines: {"ours"/"transformers": [set-up + steps 1..a, steps a+1..b, the rest + validation]},
    plus a, b; None without two of our progress lines."""
    progress = ours["marks"]["progress"]
    steps = sorted(progress)
    if len(steps) < 2 or steps[-1] > len(peer["step_ends"]):
        return None
    a, b = steps[0], steps[-1]
    ends, start = peer["step_ends"], peer["train_call"]
    return {"a": a, "b": b,
            "ours": [progress[a] - ours["marks"]["built"], progress[b] - progress[a],
                     ours["marks"]["epoch"] - progress[b]],
            "transformers": [ends[a - 1] - start, ends[b - 1] - ends[a - 1],
                             start + peer["times"]["train"] - ends[b - 1]]}


def our_parts(ours: dict, counts: dict) -> dict:
    """Our stage's wall time cut at its log lines; the validation pass estimated from the
    test pass (the same evaluation code on a split of similar size)."""
    m = ours["marks"]
    parts = {}
    if {"data", "built", "epoch", "test", "wrote"} <= set(m):
        test = m["test"] - m["epoch"]
        parts = {"start-up (imports, MLflow run, read files)": m["data"],
                 "encoder load, features, compile": m["built"] - m["data"],
                 "steps + validation": m["epoch"] - m["built"],
                 "test predictions + metrics": test,
                 "export (model.keras, SavedModel), write": m["wrote"] - m["test"],
                 "exit": ours["wall"] - m["wrote"]}
        parts["validation (estimate)"] = test * counts["validation"] / counts["test"] \
            * m["epochs"]
    return parts


def print_contenders(args, counts: dict, ours: dict, peer: dict) -> dict:
    examples = args.steps * args.batch_size
    ours_eps, peer_eps = examples / ours["fit"], examples / peer["times"]["train"]
    print(f"\nsame work: {args.steps} steps x batch {args.batch_size} = {examples:,} training "
          f"examples + {ours['marks'].get('epochs', '?')} (ours) / {len(peer['evaluations'])} "
          f"(theirs) end-of-epoch validation pass(es) on {counts['validation']:,} rows")
    print(f"{'':14}{'examples/s':>11}{'seconds':>9}{'test macro-F1':>15}{'accuracy':>10}"
          f"{'peak RSS':>11}{'process':>9}{'CPU':>8}{'load':>11}")
    for name, eps, side in (("ours", ours_eps, ours), ("transformers", peer_eps, peer)):
        fit = side["fit"] if side is ours else side["times"]["train"]
        print(f"{name:14}{eps:11.1f}{fit:9.1f}{side['macro_f1']:15.4f}{side['accuracy']:10.4f}"
              f"{side['peak_rss_mib']:7.0f} MiB{side['wall']:8.0f} s{side['cpu_s']:6.0f} s"
              f"{side['load'][0]:5.1f}-{side['load'][1]:.1f}")
    print("  seconds: steps + validation, from just before training to the last epoch's "
          "validation end; process: the whole child process (wall; CPU = user + system); load: "
          "the machine's 1-minute load average at its start and end (other users' work)")
    if ours["selection_metric"] not in (None, "accuracy") and len(peer["evaluations"]) > 1:
        print(f"  note: our stage kept its best epoch by {ours['selection_metric']}, the peer by "
              f"accuracy")
    return {"ours_eps": ours_eps, "peer_eps": peer_eps, "ratio": ours_eps / peer_eps}


def print_breakdown(args, counts: dict, ours: dict, peer: dict) -> dict:
    """Where each side's time goes, from the timings measured above."""
    parts, segments = our_parts(ours, counts), fit_segments(ours, peer)
    out = {"parts": parts, "segments": segments}
    t = peer["times"]
    print("\nwhere the time goes (seconds):")
    if parts:
        estimate = parts.pop("validation (estimate)")
        print("  ours:         " + "; ".join(f"{k} {v:.1f}" for k, v in parts.items()) +
              f"; process {ours['wall']:.1f}")
    print(f"  transformers: imports {t['imports']:.1f}; tokenize {t['tokenize']:.1f}; load "
          f"{t['load']:.1f}; steps + validation {t['train']:.1f} (validation "
          f"{peer['eval_seconds']:.1f}); test {t['test']:.1f}; process {peer['wall']:.1f}; "
          f"torch threads {peer['threads']}"
          + (f" (inter-op {peer['pools']['inter_op']})" if "pools" in peer else ""))
    if segments:
        print_segments(args, segments)
    if parts:
        measured = segments and segments["b"] == args.steps  # our last line: the last step
        validation = segments["ours"][2] if measured else estimate
        how = "after its last step (measured)" if measured else "estimated from its test pass"
        examples, ours_steps = args.steps * args.batch_size, ours["fit"] - validation
        peer_steps = t["train"] - peer["eval_seconds"]
        print(f"  steps only: ours {examples / ours_steps:.1f} examples/s (validation "
              f"{validation:.1f} s {how}), transformers {examples / peer_steps:.1f} (validation "
              f"{peer['eval_seconds']:.1f} s, measured): ratio {peer_steps / ours_steps:.2f}")
        print(f"  evaluation: ours {counts['test'] / parts['test predictions + metrics']:.0f} "
              f"rows/s (test pass), transformers "
              f"{counts['validation'] / max(peer['eval_seconds'], 1e-9):.0f} (validation) and "
              f"{counts['test'] / t['test']:.0f} (test)")
    return out


def print_segments(args, segments: dict) -> None:
    """The headline seconds of both, cut at the same steps, and the steady time per step."""
    a, b = segments["a"], segments["b"]
    rest = "validation" if b == args.steps else f"steps {b + 1}-{args.steps} + validation"
    print(f"  {'headline seconds':16}{'set-up + steps 1-' + str(a):>24}"
          f"{'steps ' + str(a + 1) + '-' + str(b):>16}{rest:>28}{'total':>8}")
    for name in ("ours", "transformers"):
        row = segments[name]
        print(f"  {name:16}{row[0]:24.1f}{row[1]:16.1f}{row[2]:28.1f}{sum(row):8.1f}")
    mine, theirs = segments["ours"][1] / (b - a), segments["transformers"][1] / (b - a)
    print(f"  steady steps: ours {mine * 1000:.0f} ms/step, transformers {theirs * 1000:.0f} "
          f"ms/step (ratio {theirs / mine:.2f})")


def memory_goal(peak_1x: float, peak_big: float, added_rows: int, seq_len: int) -> dict:
    """MiB per 10,000 added training rows (whole process tree, peak at `copies`x less at 1x)
    against the limit: the int32 features of 10,000 rows (FEATURE_ARRAYS x 4 x seq_len bytes
    each)."""
    per_10k = (peak_big - peak_1x) / max(added_rows, 1) * 10_000
    limit = FEATURE_ARRAYS * 4 * seq_len * 10_000 / 2 ** 20
    return {"mib_per_10k_rows": per_10k, "limit_mib_per_10k_rows": limit,
            "met": per_10k <= limit}


def print_memory(args, counts: dict, ours1: dict, ours_big: dict) -> tuple[float, dict]:
    """Our peak RSS (the whole process tree) at 1x and at `copies`x the training rows, in which
    part it grows, and per 10,000 added rows against the goal."""
    growth = ours_big["peak_tree_mib"] / ours1["peak_tree_mib"]
    added = counts["train_big"] - counts["train"]
    per_rows = memory_goal(ours1["peak_tree_mib"], ours_big["peak_tree_mib"], added,
                           args.seq_len)
    big = f"{args.copies}x ({counts['train_big']:,} rows)"
    held = " (--hold-in-memory: the stage holds the split's features)" \
        if args.hold_in_memory else ""
    print(f"\nmemory (ours, same steps; peak: the RSS of the stage's whole process tree, Beam "
          f"workers included, sampled every {RSS_EVERY} s; by part: the largest sample within "
          f"it){held}")
    print(f"  {'MiB':24}{'1x (' + format(counts['train'], ',') + ' rows)':>20}{big:>22}")
    for name, _, _ in PHASES:
        one, many = ours1["rss_by_phase"].get(name), ours_big["rss_by_phase"].get(name)
        if one is not None and many is not None:
            print(f"  {name:24}{one:20.0f}{many:22.0f}   x{many / one:.2f}")
    print(f"  {'peak (process tree)':24}{ours1['peak_tree_mib']:20.0f}"
          f"{ours_big['peak_tree_mib']:22.0f}   x{growth:.2f} (memory-growth)")
    print(f"  {'peak (stage process)':24}{ours1['peak_rss_mib']:20.0f}"
          f"{ours_big['peak_rss_mib']:22.0f}   x"
          f"{ours_big['peak_rss_mib'] / ours1['peak_rss_mib']:.2f}")
    print(f"  per 10,000 added training rows: {per_rows['mib_per_10k_rows']:+.1f} MiB (their "
          f"int32 features alone: {per_rows['limit_mib_per_10k_rows']:.1f} MiB; the goal)")
    return growth, per_rows


def macro_f1(gold: list, predicted: list, labels: list) -> float:
    """sklearn's f1_score(average="macro", labels=labels, zero_division=0), in plain Python."""
    pairs, scores = Counter(zip(gold, predicted)), []
    for label in labels:
        wanted = sum(n for (g, _), n in pairs.items() if g == label)
        given = sum(n for (_, p), n in pairs.items() if p == label)
        scores.append(2 * pairs[label, label] / (wanted + given) if wanted + given else 0.0)
    return sum(scores) / len(scores)


def paired_bootstrap(gold: list, ours: list, theirs: list, labels: list, rounds: int = 500,
                     seed: int = 0) -> tuple[float, float]:
    """The 2.5% and 97.5% points of macro-F1(ours) - macro-F1(theirs) over test sets resampled
    with replacement (the same rows for both): how much the test sample alone moves the gap."""
    rng, n, diffs = random.Random(seed), len(gold), []
    for _ in range(rounds):
        rows = [rng.randrange(n) for _ in range(n)]
        truth = [gold[i] for i in rows]
        diffs.append(macro_f1(truth, [ours[i] for i in rows], labels)
                     - macro_f1(truth, [theirs[i] for i in rows], labels))
    diffs.sort()
    return diffs[int(0.025 * rounds)], diffs[int(0.975 * rounds) - 1]


def print_quality(labels: list, test_rows: list, ours: dict, peer: dict) -> None:
    gold = [label for _, label in test_rows]
    low, high = paired_bootstrap(gold, ours["predicted"], peer["predicted"], labels)
    agree = sum(a == b for a, b in zip(ours["predicted"], peer["predicted"])) / len(gold)
    print(f"\nquality: test macro-F1 ours {ours['macro_f1']:.4f}, transformers "
          f"{peer['macro_f1']:.4f} (accuracy {ours['accuracy']:.4f} vs "
          f"{peer['accuracy']:.4f}); validation macro-F1 {ours['validation_macro_f1']:.4f} vs "
          f"{peer['validation_macro_f1']:.4f}")
    print(f"  the two predict the same label on {agree:.1%} of the test rows; resampling the "
          f"test rows (paired bootstrap) puts ours - theirs in [{low:+.4f}, {high:+.4f}] (95%)")
    for name, side in (("ours", ours), ("transformers", peer)):
        f1 = {label: macro_f1(gold, side["predicted"], [label]) for label in labels}
        print(f"  per-class F1, {name}: " + "  ".join(f"{k} {v:.3f}" for k, v in f1.items()))


def parity(ours: float, theirs: float, bag_of_words: float) -> dict:
    """The metric goal of one start: judged only where both sides' median test macro-F1 is
    above bag-of-words on the same split (parity of two models that learned less than word
    counts says little); then |ours - theirs| <= GOALS["metric"]."""
    below = [name for name, value in (("ours", ours), ("transformers", theirs))
             if not value > bag_of_words]
    diff = abs(ours - theirs)
    if below:
        return {"judged": False, "met": None, "diff": diff,
                "note": f"not judged: {' and '.join(below)} not above bag-of-words "
                        f"({bag_of_words:.4f})"}
    met = diff <= GOALS["metric"]
    return {"judged": True, "met": met, "diff": diff,
            "note": f"|ours - theirs| {diff:.4f} <= {GOALS['metric']} "
                    f"{'met' if met else 'MISSED'} (both above bag-of-words {bag_of_words:.4f})"}


def print_goals(starts: dict, headline: str, growth: float | None, per_rows: dict) -> None:
    """Per start: the speed-ratio and the metric parity (medians over the seeds); then the
    memory goals (the headline start's memory run; growth None: not run)."""
    verdict = lambda ok: "met" if ok else "MISSED"
    print("\ngoals (medians over the seeds):")
    for name, found in starts.items():
        ratio = found["spreads"]["ratio"]["median"]
        print(f"  {found['label']}: speed-ratio {ratio:.2f} >= {GOALS['speed']} "
              f"{verdict(ratio >= GOALS['speed'])}; metric {found['parity']['note']}")
    if growth is None:
        print("  memory: not measured (--copies 1: no memory run)")
    else:
        print(f"  memory-growth {growth:.2f} <= {GOALS['memory']} "
              f"{verdict(growth <= GOALS['memory'])}; memory per 10k added rows "
              f"{per_rows['mib_per_10k_rows']:.1f} <= {per_rows['limit_mib_per_10k_rows']:.1f} "
              f"MiB {verdict(per_rows['met'])}")
    found = starts[headline]
    seg = found["breakdown"]["segments"]
    if found["spreads"]["ratio"]["median"] < GOALS["speed"] and seg:
        gaps = [o - t for o, t in zip(seg["ours"], seg["transformers"])]
        print(f"  speed ({found['label']}, median round): of our {sum(gaps):+.1f} s against "
              f"theirs, {gaps[0]:+.1f} s are set-up and steps 1-{seg['a']} (our graph tracing and "
              f"tf.data set-up among them), {gaps[1]:+.1f} s the steady steps {seg['a'] + 1}-"
              f"{seg['b']} and {gaps[2]:+.1f} s the validation pass and any steps after "
              f"{seg['b']} (see 'evaluation' for the rates)")
    if any(f["parity"]["judged"] and not f["parity"]["met"] for f in starts.values()):
        print("  metric: the rounds table shows how far each side moves from seed to seed; "
              "'quality' how much of the median round's gap the test sample alone explains "
              "(bootstrap) and which classes differ")


def round_figures(args, rounds: list) -> list:
    """Per round: the load before it, both sides' examples/s and test macro-F1, the ratio."""
    examples = args.steps * args.batch_size
    out = []
    for r in rounds:
        ours, peer = r["results"]["ours"], r["results"]["transformers"]
        ours_eps, peer_eps = examples / ours["fit"], examples / peer["times"]["train"]
        out.append({"round": r["round"], "load": r["load"], "busy": r["busy"],
                    "ours_eps": ours_eps, "peer_eps": peer_eps, "ratio": ours_eps / peer_eps,
                    "ours_macro_f1": ours["macro_f1"], "peer_macro_f1": peer["macro_f1"],
                    "ours_seconds": ours["fit"], "peer_seconds": peer["times"]["train"]})
    return out


def print_rounds(figures: list, rounds: list, threads: int) -> dict:
    """The rounds table and each figure's median (min-max); returns the medians' spreads."""
    print(f"\nrounds ({len(figures)}, ours then transformers in each, {threads} thread(s) each "
          f"side; load: the 1-minute load average before the round)")
    print(f"  {'round':>5}{'load':>7}{'ours ex/s':>11}{'theirs ex/s':>13}{'ratio':>7}"
          f"{'ours F1':>9}{'theirs F1':>11}")
    for f in figures:
        print(f"  {f['round']:5d}{f['load']:7.2f}{f['ours_eps']:11.1f}{f['peer_eps']:13.1f}"
              f"{f['ratio']:7.2f}{f['ours_macro_f1']:9.4f}{f['peer_macro_f1']:11.4f}"
              + ("  BUSY" if f["busy"] else ""))
    keys = ("ours_eps", "peer_eps", "ratio", "ours_macro_f1", "peer_macro_f1", "ours_seconds",
            "peer_seconds")
    spreads = {k: protocol.spread([f[k] for f in figures]) for k in keys}
    text = lambda k, spec: protocol.spread_text([f[k] for f in figures], spec)
    print(f"  median (min-max): examples/s ours {text('ours_eps', '.1f')}, transformers "
          f"{text('peer_eps', '.1f')}; speed-ratio {text('ratio', '.2f')}; test macro-F1 ours "
          f"{text('ours_macro_f1', '.4f')}, transformers {text('peer_macro_f1', '.4f')}")
    note = protocol.busy_note(rounds)
    if note:
        print(f"  {note}")
    return spreads


def median_round(rounds: list, figures: list) -> dict:
    """The round whose speed-ratio is the median one (the lower middle for an even count)."""
    order = sorted(range(len(figures)), key=lambda i: figures[i]["ratio"])
    return rounds[order[(len(order) - 1) // 2]]


def report_start(args, split: dict, test_rows: list, rounds: list, label: str,
                 bag_of_words: float) -> dict:
    """One start's part of the report: its rounds (one seed each) with medians, the median
    round's same-work comparison, where the time goes and the quality; its figures."""
    counts = split["counts"]
    print(f"\n=== {label} ===")
    figures = round_figures(args, rounds)
    spreads = print_rounds(figures, rounds, args.threads)
    shown = median_round(rounds, figures)
    ours, peer = shown["results"]["ours"], shown["results"]["transformers"]
    if len(rounds) > 1:
        print(f"\nthe median round (by speed-ratio): round {shown['round']}")
    speed = print_contenders(args, counts, ours, peer)
    breakdown = print_breakdown(args, counts, ours, peer)
    print_quality(split["labels"], test_rows, ours, peer)
    metric, theirs = spreads["ours_macro_f1"]["median"], spreads["peer_macro_f1"]["median"]
    return {"label": label, "rounds": figures, "spreads": spreads, "median_round": shown["round"],
            "ours": ours, "transformers": peer, "speed": speed, "breakdown": breakdown,
            "parity": parity(metric, theirs, bag_of_words), "protocol":
            protocol.record(rounds, args.threads)}


def print_summary(starts: dict, baselines: dict) -> None:
    """The starts side by side with bag-of-words and the strongest classical baseline."""
    best = baselines["best"]
    print(f"\nsummary: test macro-F1, median (min-max) over the seeds; bag-of-words (counts + "
          f"logistic regression) {baselines['bow_lr']['macro_f1']:.4f} and the strongest "
          f"classical baseline ({best}) {baselines[best]['macro_f1']:.4f} on the same split")
    for found in starts.values():
        values = found["rounds"]
        text = lambda k: protocol.spread_text([f[k] for f in values], ".4f")
        print(f"  {found['label']:34} ours {text('ours_macro_f1')}, transformers "
              f"{text('peer_macro_f1')}; speed-ratio "
              f"{protocol.spread_text([f['ratio'] for f in values], '.2f')}")


def report(args, split: dict, test_rows: list, starts: dict, baselines: dict,
           ours_big: dict) -> str:
    """The race's report: each start's rounds (`starts`: {name: {"label", "init", "rounds"}},
    the first the headline's), the summary against the baselines, the memory run (of the
    headline start; None: not run), the goals and result.json; returns the headline line
    (medians of the first start)."""
    counts = split["counts"]
    bag_of_words = baselines["bow_lr"]["macro_f1"]
    found = {name: {**report_start(args, split, test_rows, s["rounds"], s["label"], bag_of_words),
                    "init": s["init"]} for name, s in starts.items()}
    headline = next(iter(starts))
    print_summary(found, baselines)
    growth, per_rows = (print_memory(args, counts, found[headline]["ours"], ours_big)
                        if ours_big else (None, {}))
    print_goals(found, headline, growth, per_rows)
    spreads = found[headline]["spreads"]
    line = (f"bench-finetune: metric {spreads['ours_macro_f1']['median']:.4f} transformers "
            f"{spreads['peer_macro_f1']['median']:.4f} speed-ratio "
            f"{spreads['ratio']['median']:.2f} memory-growth "
            f"{'n/a' if growth is None else format(growth, '.2f')}")
    (args.work / "result.json").write_text(json.dumps({
        "settings": {k: str(v) for k, v in vars(args).items()}, "counts": counts,
        "headline_start": headline, "starts": found, "baselines": baselines,
        "ours_big": ours_big, "memory_growth": growth, "memory_per_rows": per_rows,
        "line": line}, indent=2, default=str))
    return line
