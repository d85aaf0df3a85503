"""Time to accuracy: our pretraining vs Hugging Face transformers on the same data and cores.

    make bench-quality                    # 600 s per contender, 3 rounds: ~2 hours on 2 cores
    python bench/bench_quality.py --budget-seconds 60 --eval-every-seconds 10 --reuse-data
    python bench/bench_quality.py --repeat 1  # one round: ~40 min
    python bench/bench_quality.py train.steps=4000      # key=value: overrides for our stages

Needs torch, transformers and accelerate (transformers' Trainer), from requirements-test.txt.

Pretraining systems are judged by the wall time they need to reach a masked-LM accuracy
(MLPerf BERT); this bench measures that on this machine. Each contender trains for the same
budget of training seconds (`--budget-seconds`), one after the other, on the same cores, and
its held-out MLM accuracy is measured along the way on the same instances:

- data, shared: our corpus → vocab → data stages write <run>/corpus/{train,eval}/*.txt (the
  eval documents are held out), <run>/vocab/vocab.txt and <run>/data/{train,eval}-*.tfrecord.
  The held-out set of BOTH sides is the masked instances of <run>/data/eval-*.tfrecord as
  our probes see them (records.heldout_data: the written masks, or with data.masking:
  dynamic the masks tf.data draws for the held-out batches, seeded), read here; accuracy =
  correct argmax predictions at the masked positions with weight > 0 / their number.
  Neither side ever trains on a held-out document: we train on the train records,
  the peer on corpus/train/*.txt only.
- ours: the pretrain stage as a subprocess, with its held-out probe on (`train.heldout_every`
  optimizer steps, `train.heldout_batches=0` = all held-out records); the stage writes
  <run>/pretrain/heldout_curve.json = {"curve": [[step, train_seconds, accuracy], ...],
  "reached": {"0.2": seconds, ...}}, train_seconds = training wall time without the probes.
  Ours trains its recipe (the config + the key=value overrides, e.g. train.steps) and stops at
  the budget (`train.max_seconds`, with a last probe there): if it ends before the budget its
  last accuracy holds for the rest of the budget. The subprocess's whole wall time (start-up, export) is reported too.
- the peer: transformers as its users run it: `BertForMaskedLM` (`--peer-model mlm`, the
  default; it does LESS work than ours, no NSP, which favours it) or `BertForPreTraining`
  (`--peer-model pretraining`, MLM + NSP on sentence pairs built here), the shape of our
  config (layers, hidden, heads, intermediate, max positions, dropout, gelu variant), our
  vocab.txt through `BertTokenizerFast` (same ids), run_mlm-style data (the training
  documents tokenized, concatenated, cut into [CLS] ... [SEP] blocks of max_seq_length),
  `DataCollatorForLanguageModeling` (dynamic masking at the recipe's rate), `Trainer` on
  the CPU with a callback that stops it at the budget of training seconds and, every
  `--eval-every-seconds` of them, measures the held-out accuracy (time excluded). Two recipes,
  both measured, the headline being the one with the higher final accuracy:
    (a) "same recipe": our learning rate, warmup, decay, batch, AdamW betas/epsilon, weight
        decay and clipping, dropout and training masking rate (train.masked_lm_prob, else
        data.masked_lm_prob) from our config;
    (b) "documented": BERT's pretraining recipe (see quality_peer.DOCUMENTED_RECIPE), batch 32.
  Both decay linearly to 0 over the steps that fit in the budget: a short untimed run of
  the same Trainer measures the seconds per step first (`--peer-steps N` fixes the number).

Why the comparison is fair, and where it is not exactly even (and for whom):
- the same: training documents, held-out instances and metric, vocab and token ids (checked
  at start), model shape, cores, budget of training seconds with evaluations excluded on
  both sides; the contenders run one after the other, never together.
- for the peer: by default it trains MLM only (no NSP: less work per step); its accuracy at a
  table point is measured at the first step end at or after the point (up to one step late),
  ours at its last probe at or before it (up to --heldout-every steps early); the MLM-only
  peer reads the held-out instances with token type 0 (it never trains type 1; ours and the
  pretraining peer see the records' segment ids); it sees a new masking of its blocks every
  epoch, as ours does with data.masking: dynamic (static: the dupe_factor written maskings).
- for us: nothing stretches our schedule to the budget: train.steps decides (the bench prints
  the train.steps that would fill it), while the peer's schedule is sized to the budget.
- run-to-run: the machine's load moves both; run the contenders on an idle machine, and
  compare a plateau-free accuracy: at the frequent-token plateau (printed) the ratio only
  says who gets there first.

The race runs in `--repeat` rounds (bench/protocol.py, default 3): in each, ours and then each
peer recipe, each in a fresh process (the peer scores the held-out instances this process saved
in <out>/heldout.npz), its thread pools pinned to `--threads` (TensorFlow intra/inter-op, torch,
OpenMP; the peer reports torch's); the load average before each round is printed and a round
above one per core flagged BUSY (also in bench_quality.json). The final accuracies and the
time-ratio are medians over the rounds (min-max printed); the curves, table and plot are the
median round's (by time-ratio).

The last line reads `bench-quality: mlm-acc <ours> transformers <theirs> time-ratio <r>`:
the held-out accuracies at the end of the budget (theirs: the headline peer's), and r = the
seconds the peer needs to reach its final accuracy / the seconds we need to reach that same
accuracy (> 1: we get there faster); `<x (not reached)` when we never do (the line before
says why). The curves, sampled every --eval-every-seconds, are printed as a table, plotted
(PNG) and saved (JSON) in --out, and logged to MLflow (experiment "bench-quality", in
the store of the run: sqlite <run>/bench.db).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The transformers peer: its data, recipes and Trainer run (bench/quality_peer.py).
from bench import machine, protocol  # noqa: E402
from bench.quality_peer import Peer, peer_missing, peer_recipes, table_points  # noqa: E402

# ---- the contract with the pretrain stage's held-out probe -------------------------------
HELDOUT_CURVE = "pretrain/heldout_curve.json"  # relative to the run directory
HELDOUT_EVERY_KEY = "train.heldout_every"      # probe every N optimizer steps
HELDOUT_BATCHES_KEY = "train.heldout_batches"  # 0: all the held-out records

EXPERIMENT = "bench-quality"


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides for our stages (corpus, vocab, data, pretrain)")
    parser.add_argument("--budget-seconds", type=float, default=600.0,
                        help="training seconds per contender (evaluations excluded)")
    parser.add_argument("--config", default="configs/pretrain_tiny.yaml")
    parser.add_argument("--run-dir", default="runs/bench-quality",
                        help="the run directory our stages use (data, pretrain, bench.db)")
    parser.add_argument("--out", default="runs/bench-quality",
                        help="folder of bench_quality.json and bench_quality.png")
    parser.add_argument("--reuse-data", action="store_true",
                        help="skip corpus/vocab/data if the run directory has their outputs")
    parser.add_argument("--skip-ours", action="store_true")
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--eval-every-seconds", type=float, default=60.0,
                        help="table points and the peer's held-out evaluations")
    parser.add_argument("--heldout-every", type=int, default=250,
                        help=f"our probe: {HELDOUT_EVERY_KEY} (optimizer steps)")
    parser.add_argument("--peer-model", choices=("mlm", "pretraining"), default="mlm",
                        help="BertForMaskedLM (MLM only) or BertForPreTraining (MLM + NSP)")
    parser.add_argument("--peer-recipes", default="same,documented",
                        help="which peer recipes to run: same, documented or both")
    parser.add_argument("--peer-steps", type=int, default=0,
                        help="the peer's schedule length (0: the steps that fit in the budget, "
                             "measured by a short untimed run)")
    parser.add_argument("--seed", type=int, default=12345, help="the peer's seed")
    protocol.add_arguments(parser)
    parser.add_argument("--role", choices=("peer",), help=argparse.SUPPRESS)
    parser.add_argument("--recipe", default="", help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=1, help=argparse.SUPPRESS)
    return parser


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_intermixed_args(argv)  # flags and key=value in any order
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        parser.error(f"not a key=value override: {bad[0]}")
    args.peer_recipes = [r.strip() for r in args.peer_recipes.split(",") if r.strip()]
    if not set(args.peer_recipes) <= {"same", "documented"} or not args.peer_recipes:
        parser.error("--peer-recipes: same, documented or same,documented")
    if args.budget_seconds <= 0 or args.eval_every_seconds <= 0:
        parser.error("--budget-seconds and --eval-every-seconds must be > 0")
    protocol.check_arguments(parser, args)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for the peer's own process
    return args


# ---------------------------------------------------------------------------
# Machine facts
# ---------------------------------------------------------------------------
def machine_facts() -> dict:
    """CPU model, cores, the SIMD/matrix flags that matter for float32/bf16 training, versions."""
    model, flags = machine.cpu_facts()
    facts = {"cpu": model, "cores": machine.cores(), "flags": flags,
             "python": platform.python_version()}
    for name in ("torch", "transformers", "tensorflow", "keras"):
        try:
            facts[name] = __import__(name).__version__
        except ImportError:
            facts[name] = "not installed"
    return facts


# ---------------------------------------------------------------------------
# Data: our stages, and the held-out instances both sides are measured on
# ---------------------------------------------------------------------------
def stream(command: list[str], prefix: str, log_file: Path, threads: int = 0) -> int:
    """Runs `command`, echoing its output with `prefix` and keeping it in `log_file`; its
    thread pools pinned to `threads` when given (bench/protocol.py)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1",
               **(protocol.thread_env(threads) if threads else {}))
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "w", encoding="utf-8") as log, subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True) as process:
        log.write(" ".join(command) + "\n")
        for line in process.stdout:
            log.write(line)
            if not line.startswith(("I0000", "W0000", "E0000", "WARNING: All log")):  # TF noise
                print(f"{prefix}{line}", end="", flush=True)
    return process.returncode


def prepare_data(args, paths, tracking_uri: str) -> float:
    """corpus → vocab → data in the run directory; returns the seconds it took (0: reused)."""
    have = (paths.vocab_file.exists() and paths.data_stats.exists() and paths.shards("eval")
            and paths.corpus_files("train"))
    if args.reuse_data and have:
        print(f"bench-quality: data: reusing {paths.root}", flush=True)
        return 0.0
    started = time.perf_counter()
    code = stream([sys.executable, "-m", "pipeline", "corpus", "vocab", "data", "--config",
                   args.config, f"run_dir={paths.root}", f"tracking.tracking_uri={tracking_uri}",
                   *args.overrides], "  data| ", Path(args.out) / "logs" / "data.log")
    if code:
        raise SystemExit(f"bench-quality: the data stages failed (exit {code}); see "
                         f"{Path(args.out) / 'logs' / 'data.log'}")
    return time.perf_counter() - started


def read_heldout(config, paths) -> dict:
    """Every held-out instance as numpy arrays, masked as our probes mask them (the records'
    masks, or with data.masking: dynamic the masks tf.data draws for the held-out batches:
    records.heldout_data, the function the probes call): the instances both sides score."""
    import numpy as np

    from pipeline.training import records

    names = {"token_ids": "input_ids", "padding_mask": "input_mask",
             "segment_ids": "segment_ids", "mask_positions": "masked_lm_positions"}
    columns = {name: [] for name in [*names.values(), "masked_lm_ids", "masked_lm_weights"]}
    for x, y, weights in records.heldout_data(config, paths):
        for key, name in names.items():
            columns[name].append(x[key].numpy())
        columns["masked_lm_ids"].append(y["mlm"].numpy())
        columns["masked_lm_weights"].append(weights["mlm"].numpy())
    heldout = {name: np.concatenate(parts) for name, parts in columns.items()}
    labels = heldout["masked_lm_ids"][heldout["masked_lm_weights"] > 0]
    heldout["predictions"] = int(labels.size)
    # The frequent-token plateau: the accuracy of always predicting the commonest masked token
    # ("the"), where every model sits for a while before it learns any context.
    heldout["plateau"] = float(np.bincount(labels).max() / max(labels.size, 1))
    return heldout


# ---------------------------------------------------------------------------
# Ours: the pretrain stage and its held-out curve
# ---------------------------------------------------------------------------
def run_ours(args, paths, tracking_uri: str, index: int = 0) -> dict:
    """Our pretrain stage from scratch, probe on (round `index`); returns its curve and
    timings."""
    shutil.rmtree(paths.pretrain_dir, ignore_errors=True)  # no resuming from an earlier run
    stage = [sys.executable, "-m", "pipeline"]
    command = stage + ["pretrain", "--force", "--config", args.config, f"run_dir={paths.root}",
                       f"tracking.tracking_uri={tracking_uri}", *args.overrides,
                       f"{HELDOUT_EVERY_KEY}={args.heldout_every}", f"{HELDOUT_BATCHES_KEY}=0",
                       f"train.max_seconds={args.budget_seconds:g}"]
    started = time.perf_counter()
    log = Path(args.out) / "logs" / f"ours-r{index + 1}.log"
    code = stream(command, "  ours| ", log, args.threads)
    wall = time.perf_counter() - started
    if code:
        raise SystemExit(f"bench-quality: our pretrain stage failed (exit {code}); see {log}")
    curve_file = paths.root / HELDOUT_CURVE
    if not curve_file.exists():
        raise SystemExit(f"bench-quality: the pretrain stage wrote no {curve_file}")
    written = json.loads(curve_file.read_text())
    curve = sorted([int(s), float(t), float(a)] for s, t, a in written["curve"])
    # It stops at the budget (train.max_seconds) and probes there: that last probe lands a
    # step past it (as the peer's last evaluation does), so 1% of slack.
    kept = [row for row in curve if row[1] <= args.budget_seconds * 1.01]
    return {"curve": kept, "all_probes": curve, "reached": written.get("reached", {}),
            "wall_seconds": wall,
            "train_seconds": curve[-1][1] if curve else 0.0,
            "steps": curve[-1][0] if curve else 0, "command": command}


# ---------------------------------------------------------------------------
# Comparing the curves
# ---------------------------------------------------------------------------
def at_or_before(curve: list, seconds: float):
    """The accuracy of the last probe at or before `seconds` (None before the first)."""
    rows = [row for row in curve if row[1] <= seconds + 1e-9]
    return rows[-1][2] if rows else None


def first_reaching(curve: list, accuracy: float):
    """The training seconds of the first probe at or above `accuracy` (None: never)."""
    return next((row[1] for row in curve if row[2] >= accuracy - 1e-12), None)


def compare(ours: dict | None, peers: dict) -> dict:
    """Final accuracies, the headline peer and the time ratio, with the words to print."""
    result = {"ours_final": ours["curve"][-1][2] if ours and ours["curve"] else None}
    if peers:
        headline = max(peers, key=lambda name: peers[name]["curve"][-1][2])
        peer = peers[headline]
        theirs = peer["curve"][-1][2]
        peer_seconds = first_reaching(peer["curve"], theirs)
        result.update(headline=headline, theirs_final=theirs, peer_seconds=peer_seconds)
    if result["ours_final"] is None or not peers:
        result.update(ratio=None, ratio_text="n/a", explanation="")
        return result
    ours_seconds = first_reaching(ours["curve"], theirs)
    result["ours_seconds"] = ours_seconds
    if ours["curve"][0][0] == 0 and ours["curve"][0][2] >= theirs:  # no better than step 0
        result.update(ratio=None, ratio_text="n/a", explanation=(
            f"the peer's final accuracy {theirs:.3f} is no better than our untrained model's "
            f"({ours['curve'][0][2]:.3f}): no time to compare"))
    elif ours_seconds is not None:
        ratio = peer_seconds / ours_seconds
        result.update(ratio=ratio, ratio_text=f"{ratio:.2f}",
                      explanation=(f"the peer reaches its final {theirs:.3f} after "
                                   f"{peer_seconds:.0f} s, we reach it after {ours_seconds:.0f} s"))
    elif not ours["curve"][-1][1]:
        result.update(ratio=None, ratio_text="n/a (not reached)", explanation=(
            f"we have no probe after training started within the budget (our first comes "
            f"later): lower --heldout-every ({HELDOUT_EVERY_KEY}) or raise the budget"))
    else:
        last = ours["curve"][-1][1]
        bound = peer_seconds / last
        result.update(ratio=None, ratio_bound=bound, ratio_text=f"<{bound:.2f} (not reached)",
                      explanation=(
                          f"we never reach the peer's final accuracy {theirs:.3f} (it needs "
                          f"{peer_seconds:.0f} s): our best is "
                          f"{max(r[2] for r in ours['curve']):.3f} after {last:.0f} s of "
                          f"training, so the ratio is below {peer_seconds:.0f} / {last:.0f}"))
    return result


def accuracy_text(value, missing: str = "-") -> str:
    return f"{value:.3f}" if value is not None else missing


def plot(path: Path, ours, peers, budget: float, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    if ours and ours["curve"]:
        rows = ours["curve"]
        axes.step([r[1] for r in rows] + [budget], [r[2] for r in rows] + [rows[-1][2]],
                  where="post", marker="o", markersize=3, label="ours (pretrain stage)")
    for peer in peers.values():
        rows = peer["curve"]
        axes.plot([r[1] for r in rows], [r[2] for r in rows], marker=".",
                  label=f"transformers {peer['recipe']['label']}")
    axes.set_xlabel("training seconds (evaluations excluded)")
    axes.set_ylabel("held-out masked-LM accuracy")
    axes.set_xlim(0, budget * 1.02)
    axes.set_title(title, fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def log_to_mlflow(tracking_uri: str, db_dir: Path, args, facts: dict, result: dict,
                  files: list[Path]) -> str:
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name(EXPERIMENT)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(
        EXPERIMENT, artifact_location=(db_dir / "mlartifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment_id, run_name="bench-quality") as run:
        mlflow.log_params({
            "budget_seconds": args.budget_seconds, "config": args.config,
            "overrides": " ".join(args.overrides) or "-", "eval_every_seconds":
            args.eval_every_seconds, "heldout_every": args.heldout_every,
            "peer_model": args.peer_model, "peer_recipes": ",".join(args.peer_recipes),
            "cpu": facts["cpu"][:250], "cores": facts["cores"],
            **{f"cpu.{flag}": present for flag, present in facts["flags"].items()},
            **{f"version.{name}": facts[name] for name in
               ("torch", "transformers", "tensorflow", "keras")}})
        metrics = {key: value for key, value in (
            ("ours_final_accuracy", result["comparison"].get("ours_final")),
            ("transformers_final_accuracy", result["comparison"].get("theirs_final")),
            ("time_ratio", result["comparison"].get("ratio")),
            ("time_ratio_upper_bound", result["comparison"].get("ratio_bound")),
            ("total_seconds", result["total_seconds"])) if value is not None}
        for name, peer in result["peers"].items():
            metrics[f"transformers_{name}_final_accuracy"] = peer["curve"][-1][2]
        if result.get("ours"):
            metrics["ours_wall_seconds"] = result["ours"]["wall_seconds"]
            metrics["ours_train_seconds"] = result["ours"]["train_seconds"]
        mlflow.log_metrics(metrics)
        for path in files:
            mlflow.log_artifact(str(path))
        return run.info.run_id


# ---------------------------------------------------------------------------
# The peer, in a process of its own
# ---------------------------------------------------------------------------
def peer_main(args) -> int:
    """(child) One peer recipe's Trainer run on the held-out instances the parent saved
    (<out>/heldout.npz); its result to <out>/peer-<recipe>-r<round>.json."""
    import numpy as np

    from pipeline import config as config_lib
    from pipeline.artifacts import Artifacts

    config = config_lib.load(args.config, [*args.overrides, f"run_dir={args.run_dir}"])
    paths = Artifacts(config.run_dir)
    with np.load(Path(args.out) / "heldout.npz") as saved:
        heldout = {name: saved[name] for name in saved.files}
    (recipe,) = peer_recipes(config, [args.recipe])
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as workdir:
        peer = Peer(args, config, paths, heldout, Path(workdir))
        found = peer.run(recipe, args.budget_seconds, args.eval_every_seconds)
    found.update(data_seconds=peer.data_seconds, examples=len(peer.examples),
                 tokens=peer.tokens, pools=peer.pools)
    out = Path(args.out) / f"peer-{args.recipe}-r{args.round}.json"
    out.write_text(json.dumps(found, default=str))
    return 0


def run_peer(args, recipe, index: int) -> dict:
    """The peer's `recipe` in a fresh process (round `index`), its threads pinned."""
    log = Path(args.out) / "logs" / f"peer-{recipe.name}-r{index + 1}.log"
    command = [sys.executable, str(Path(__file__).resolve()), *args.argv, "--out", args.out,
               "--role", "peer", "--recipe", recipe.name, "--round", str(index + 1)]
    code = stream(command, f"  {recipe.name}| ", log, args.threads)
    if code:
        raise SystemExit(f"bench-quality: the peer ({recipe.label}) failed (exit {code}); "
                         f"see {log}")
    found = json.loads((Path(args.out) / f"peer-{recipe.name}-r{index + 1}.json").read_text())
    found["points"] = {float(k): v for k, v in found["points"].items()}
    print(f"bench-quality: peer {recipe.label}: {found['steps']} steps, "
          f"{found['train_seconds']:.0f} s of training, {found['eval_seconds']:.0f} s of "
          f"evaluations, final accuracy {found['curve'][-1][2]:.4f} (torch "
          f"{protocol.pools_text(found['pools'])})", flush=True)
    return found


def round_figures(rounds: list, recipes: list, plateau: float) -> list:
    """Per round: compare() of its ours and peers, with the plateau note."""
    out = []
    for r in rounds:
        peers = {recipe.name: r["results"][recipe.name] for recipe in recipes}
        comparison = compare(r["results"].get("ours"), peers)
        if peers and comparison["theirs_final"] < plateau + 0.005:
            comparison["explanation"] = (
                f"{comparison['explanation']}; NOTE: the peer's final accuracy is not above "
                f"the frequent-token plateau ({plateau:.3f}: the commonest token everywhere), "
                f"so the ratio says at most who reaches that plateau first, not who learns "
                f"more; a larger --budget-seconds compares more").lstrip("; ")
        out.append(comparison)
    return out


def medians_of(comparisons: list) -> dict:
    """Each figure's median (min-max) over the rounds that have it."""
    found = {}
    for key in ("ours_final", "theirs_final", "ratio"):
        values = [c[key] for c in comparisons if c.get(key) is not None]
        if values:
            found[key] = protocol.spread(values)
    return found


# ---------------------------------------------------------------------------
# ---------------------------------------------------------------------------
def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.role:
        return peer_main(args)
    begun = time.perf_counter()
    facts = machine_facts()
    print(f"bench-quality: CPU {facts['cpu']}, {facts['cores']} cores; flags "
          + ", ".join(f"{flag} {'yes' if on else 'no'}" for flag, on in facts["flags"].items())
          + f"; torch {facts['torch']}, transformers {facts['transformers']}, tensorflow "
          f"{facts['tensorflow']}, keras {facts['keras']}", flush=True)

    from pipeline import config as config_lib
    from pipeline.artifacts import Artifacts

    config = config_lib.load(args.config, [*args.overrides, f"run_dir={args.run_dir}"])
    paths = Artifacts(config.run_dir)
    out = Path(args.out)
    out = out if out.is_absolute() else ROOT / out
    args.out = str(out)
    paths.root.mkdir(parents=True, exist_ok=True)
    tracking_uri = f"sqlite:///{paths.root / 'bench.db'}"
    if config.data.phases:
        raise SystemExit("bench-quality: needs a config without data.phases (the held-out "
                         "instances of one data folder)")
    recipes = [] if args.skip_peer else peer_recipes(config, args.peer_recipes)
    if recipes and peer_missing():
        raise SystemExit(f"bench-quality: {peer_missing()}")
    budget, every = args.budget_seconds, args.eval_every_seconds
    evaluations = len(table_points(budget, every))
    contenders = len(recipes) + (not args.skip_ours)
    recipe_names = ", ".join(r.name for r in recipes) or "none"
    print(f"bench-quality: budget {budget:.0f} training seconds for each of {contenders} "
          f"contender(s) (ours: at most; transformers recipes: {recipe_names}) in each of "
          f"{args.repeat} round(s), held-out accuracy every {every:g} s ({evaluations} points). "
          f"Expect up to {args.repeat * contenders * budget / 60:.0f} min of training, plus "
          f"start-ups (~1 min each), "
          f"the data stages (~1 min) and the peer's {evaluations} evaluations per recipe "
          f"(~10-30 s each on 2 cores)", flush=True)

    timings = {"data": prepare_data(args, paths, tracking_uri)}
    heldout = read_heldout(config, paths)
    masks = ("their written masks" if config.data.masking == "static" else
             f"masks drawn as our probes draw them: seed {config.train.seed}, batch "
             f"{config.train.batch_size}")
    print(f"bench-quality: held-out set: {len(heldout['input_ids']):,} instances, "
          f"{heldout['predictions']:,} masked positions ({paths.data_dir}/eval-*.tfrecord, "
          f"{masks}); "
          f"always predicting the commonest token scores {heldout['plateau']:.3f}", flush=True)

    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "heldout.npz", **{k: v for k, v in heldout.items()  # each peer scores these
                                     if k not in ("predictions", "plateau")})
    print(f"bench-quality: protocol: {args.repeat} round(s), in each ours then each peer "
          f"recipe, every one a fresh process; {protocol.threads_text(args.threads)}",
          flush=True)

    def ours_round(index: int) -> dict:
        found = run_ours(args, paths, tracking_uri, index)
        print(f"bench-quality: ours: {found['steps']} steps, {found['train_seconds']:.0f} s of "
              f"training (probes excluded), {found['wall_seconds']:.0f} s for the whole stage",
              flush=True)
        if found["train_seconds"] < budget * 0.9:
            fill = int(found["steps"] * budget / max(found["train_seconds"], 1))
            print(f"bench-quality: note: our recipe ended after {found['train_seconds']:.0f} "
                  f"of the {budget:.0f} s; its last accuracy holds for the rest (to fill the "
                  f"budget: train.steps≈{fill})", flush=True)
        elif found["train_seconds"] > budget * 1.01:
            print(f"bench-quality: note: our recipe trained {found['train_seconds']:.0f} s, "
                  f"past the budget: its probes after {budget:.0f} s are ignored", flush=True)
        return found

    if recipes:
        what = ("BertForMaskedLM: MLM only, NO NSP: the peer does LESS work than ours "
                "(which trains MLM + NSP), in its favour" if args.peer_model == "mlm" else
                "BertForPreTraining: MLM + NSP on sentence pairs, as ours")
        print(f"bench-quality: peer: {what}; its training sequences from "
              f"{paths.corpus_train_dir}, made in each of its processes", flush=True)
    contenders = ([] if args.skip_ours else [("ours", ours_round)]) + [
        (recipe.name, lambda index, recipe=recipe: run_peer(args, recipe, index))
        for recipe in recipes]
    rounds = protocol.run_rounds(contenders, args.repeat,
                                 log=lambda line: print(f"bench-quality: {line}", flush=True))
    comparisons = round_figures(rounds, recipes, heldout["plateau"])
    medians = medians_of(comparisons)
    by_ratio = sorted(range(len(rounds)), key=lambda i: (comparisons[i].get("ratio") or 0.0,
                                                          comparisons[i].get("ours_final") or 0.0))
    shown = by_ratio[(len(by_ratio) - 1) // 2]  # the median round (by time-ratio)
    ours = rounds[shown]["results"].get("ours")
    peers = {recipe.name: rounds[shown]["results"][recipe.name] for recipe in recipes}
    timings["ours"] = ours["wall_seconds"] if ours else 0.0
    for name, peer in peers.items():
        timings[f"peer_{name}"] = peer["train_seconds"] + peer["eval_seconds"]
    every_round = {key for key, spread in medians.items() if spread["n"] == len(rounds)}
    comparison = {**comparisons[shown],  # the medians of the figures every round has
                  **{key: medians[key]["median"] for key in every_round}}
    if len(rounds) > 1:
        print(f"\nrounds ({len(rounds)}; load: the 1-minute load average before the round)")
        for r, c in zip(rounds, comparisons):
            print(f"  round {r['round']}  load {r['load']:5.2f}  ours "
                  f"{accuracy_text(c.get('ours_final'))}  transformers "
                  f"{accuracy_text(c.get('theirs_final'))}  time-ratio "
                  f"{c['ratio_text']}" + ("  BUSY" if r["busy"] else ""))
        print("  median (min-max): " + ", ".join(
            f"{key} {protocol.spread_text(spread['values'], '.3f')}"
            for key, spread in medians.items()))
        print(f"the curves below: the median round (by time-ratio), round {shown + 1}")
    note = protocol.busy_note(rounds)
    if note:
        print(f"bench-quality: {note}")
    if "ratio" in every_round:
        comparison["ratio_text"] = f"{medians['ratio']['median']:.2f}"
    elif recipes and not args.skip_ours:
        comparison["explanation"] = (f"{comparison['explanation']}; the time-ratio is the "
                                     f"median round's: not every round has one").lstrip("; ")
    points = table_points(budget, every)
    names = list(peers)
    header = f"{'seconds':>8}  {'ours':>6}" + "".join(
        f"  {peers[n]['recipe']['label']:>18}" for n in names)
    print("\n" + header)
    rows = []
    for point in points:
        row = {"seconds": point, "ours": at_or_before(ours["curve"], point) if ours else None,
               **{n: peers[n]["points"].get(point) for n in names}}
        rows.append(row)
        print(f"{point:>8.0f}  {accuracy_text(row['ours']):>6}"
              + "".join(f"  {accuracy_text(row[n]):>18}" for n in names))
    if peers:
        print(f"headline peer: {peers[comparison['headline']]['recipe']['label']} (the higher "
              f"final held-out accuracy)")

    total = time.perf_counter() - begun
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "bench_quality.json", out / "bench_quality.png"
    result = {"machine": facts, "args": vars(args), "budget_seconds": budget,
              "protocol": protocol.record(rounds, args.threads), "rounds": comparisons,
              "medians": medians, "median_round": shown + 1,
              "heldout": {"instances": len(heldout["input_ids"]),
                          "predictions": heldout["predictions"], "plateau": heldout["plateau"]},
              "ours": ours, "peers": peers, "table": rows, "comparison": comparison,
              "timings": timings, "total_seconds": total}
    json_path.write_text(json.dumps(result, indent=1, default=str))
    plot(png_path, ours, peers, budget,
         f"held-out MLM accuracy, {config.model.preset} BERT, {facts['cores']} cores "
         f"({facts['cpu'][:40]}); peer: {args.peer_model}")
    run_id = log_to_mlflow(tracking_uri, paths.root, args, facts, result, [json_path, png_path])
    print(f"bench-quality: {png_path}, {json_path}; MLflow run {run_id} ({tracking_uri}, "
          f"experiment {EXPERIMENT})")
    print(f"bench-quality: total {total:.0f} s (" + ", ".join(
        f"{k} {v:.0f} s" for k, v in timings.items()) + ")")
    if comparison.get("explanation"):
        print(f"bench-quality: {comparison['explanation']}")
    print(f"bench-quality: mlm-acc {accuracy_text(comparison.get('ours_final'), 'n/a')} "
          f"transformers {accuracy_text(comparison.get('theirs_final'), 'n/a')} time-ratio "
          f"{comparison['ratio_text']}", flush=True)
    return result


if __name__ == "__main__":
    main()
