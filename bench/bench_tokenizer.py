"""Benchmark: tokenization speed of the tokenizer contract against its peers, same text, same ids.

    python bench/bench_tokenizer.py [--repeat N] [--threads N] [--sentences N] [--sides ...]
    python bench/bench_tokenizer.py --quick      # the first 2,000 sentences, 2 rounds

The text is the Brown demo corpus (57,340 sentences, 1.0 M whitespace words), the vocabulary
8,000 pieces learned from it by our vocab job's learner (uncased). Every contender turns every
sentence into WordPiece ids; the bench checks that they give the same ids (Google's rules; the
demo corpus has none of the cases where Hugging Face's tokenizers differ) before it times them.

Python side (the Beam workers' tokenizer, no TensorFlow), in batches of 4,096 sentences:
- ours: `models.tokenizer.Tokenizer`, pure Python, a cache of the words seen (starting empty);
- Rust + word cache: Hugging Face `tokenizers` behind the same kind of word cache (what the
  Beam jobs ran before the contract: the equal-work peer, headlined);
- Rust, whole sentences: `tokenizers`' `encode_batch_fast` on every sentence;
- Google: google-research/bert's `FullTokenizer` (pip `bert-tensorflow`), pure Python.
In-graph side (raw-text SavedModels, tf.data), a tf.function over batches of 1,024 and of 32:
- ours: `models.preprocessor.TokenizerLayer`;
- keras-hub: `keras_hub.tokenizers.WordPieceTokenizer` (lowercase, strip_accents: the in-graph
  tokenizer before the contract).

The race runs in `--repeat` rounds (bench/protocol.py, default 3): in each, every contender once,
each in a fresh process (the text and vocab from <work>/text.json), in the same order, its
thread pools pinned to `--threads` (TensorFlow intra/inter-op, OpenMP; the TensorFlow children
report theirs); the load average before each round is printed and a round above one per core
flagged BUSY (also in <work>/result.json). A child tokenizes everything once untimed (the
graph traced, the word cache filled) and then once timed. Figures are words per second, the
median over the rounds with its min-max; a contender whose ids differ from ours is not
counted. The last line reads `bench-tokenizer: python <ours / Rust + word cache> graph
<ours / keras-hub, batch 1024> graph-32 <the same at batch 32>`, each the median of the
per-round ratios.
"""

from __future__ import annotations

import argparse
import array
import collections
import datetime
import itertools
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import machine, protocol  # noqa: E402


def cpu_line() -> str:
    model, flags = machine.cpu_facts()
    have = " ".join(f"{f}={'yes' if on else 'no'}" for f, on in flags.items())
    return f"{model}, {machine.cores()} cores, {have}"


def python_contenders(vocab, lines):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from models.tokenizer import Tokenizer as Ours

    batches = [lines[i:i + 4096] for i in range(0, len(lines), 4096)]
    index = {t: i for i, t in enumerate(vocab)}

    def rust():
        tok = Tokenizer(models.WordPiece(index, unk_token="[UNK]", max_input_chars_per_word=200))
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                    strip_accents=True, lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        return tok

    def ours():
        tok = Ours(vocab, True, cache_words=100_000)
        return [ids for batch in batches for ids in tok.tokenize_packed(batch)]

    space = re.compile("[\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f"
                       "\u3000]+")

    def rust_cached():
        tok, cache, out = rust(), {"": b""}, []
        for batch in batches:
            words = [s.split() if s.isascii() else space.split(s) for s in batch]
            new = [w for w in set(itertools.chain.from_iterable(words)) if w not in cache]
            if new:
                encoded = tok.encode_batch_fast(new, add_special_tokens=False)
                cache.update(zip(new, (array.array("H", e.ids).tobytes() for e in encoded)))
            out.extend(b"".join(map(cache.__getitem__, s)) for s in words)
        return out

    def rust_whole():
        tok = rust()
        return [array.array("H", e.ids).tobytes() for batch in batches
                for e in tok.encode_batch_fast(batch, add_special_tokens=False)]

    def google():
        from bert import tokenization

        tokenization.FLAGS.mark_as_parsed()
        vocab_file = Path("/tmp") / f"bench-tokenizer-vocab-{id(vocab)}.txt"
        vocab_file.write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
        tok = tokenization.FullTokenizer(str(vocab_file), do_lower_case=True)
        return [array.array("H", tok.convert_tokens_to_ids(tok.tokenize(s))).tobytes()
                for s in lines]

    return {"ours": ours, "Rust + word cache": rust_cached, "Rust, whole sentences": rust_whole,
            "Google FullTokenizer": google}


def graph_contender(vocab, lines, batch: int, name: str):
    """The in-graph tokenizer `name` (ours or keras-hub) as a traced tf.function over batches
    of `batch` sentences."""
    import tensorflow as tf

    data = [tf.constant(lines[i:i + batch]) for i in range(0, len(lines), batch)]
    spec = [tf.TensorSpec([None], tf.string)]
    if name == "ours":
        from models.preprocessor import TokenizerLayer

        layer = TokenizerLayer(vocab, lowercase=True)
    else:
        import keras_hub

        layer = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=vocab, lowercase=True, strip_accents=True, oov_token="[UNK]")
    fn = tf.function(layer, input_signature=spec)
    fn(data[0])  # trace

    def run():
        return [ids for d in data for ids in fn(d).to_list()]
    return run


SIDES = {"python": ("ours", "Rust + word cache", "Rust, whole sentences", "Google FullTokenizer"),
         "graph-1024": ("ours", "keras-hub"), "graph-32": ("ours", "keras-hub")}
QUICK = {"sentences": 2000, "repeat": 2}


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=0, help="use the first N (0: all)")
    parser.add_argument("--sides", default=",".join(SIDES),
                        help=f"comma-separated, of {', '.join(SIDES)}")
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench-tokenizer"),
                        help="the text, the vocab and result.json")
    protocol.add_arguments(parser)
    machine.add_quick(parser, QUICK)
    protocol.add_contender_flags(parser, argparse.SUPPRESS, "--side", "--name")
    return parser


def contender_main(args) -> int:
    """(child) One tokenizer alone in this process, its pools pinned: every sentence once
    untimed (a trace, a cache filled: what a warm worker has), then once timed; the seconds
    and a digest of the ids (the parent checks that every contender of a side agrees)."""
    import hashlib
    import json

    text = json.loads((Path(args.work) / "text.json").read_text(encoding="utf-8"))
    vocab, lines = text["vocab"], text["lines"]
    pools = {}
    if args.side != "python" or args.name == "Google FullTokenizer":
        import tensorflow as tf

        pools["tensorflow"] = protocol.pin_tensorflow(tf)
    if args.side == "python":
        fn = python_contenders(vocab, lines)[args.name]
    else:
        fn = graph_contender(vocab, lines, int(args.side.split("-")[1]), args.name)
    ids = fn()
    digest = hashlib.sha256()
    for x in ids:
        digest.update(bytes(x) if isinstance(x, bytes) else array.array("H", x).tobytes())
        digest.update(b"|")
    started = time.perf_counter()
    fn()
    seconds = time.perf_counter() - started
    print("RESULT " + json.dumps({"seconds": seconds, "ids": digest.hexdigest(),
                                  "pools": pools}), flush=True)
    return 0


def run_contender(args, side: str, name: str) -> dict:
    return protocol.run_contender(
        [sys.executable, str(Path(__file__).resolve()), "--role", "contender", "--side", side,
         "--name", name, "--work", str(args.work)], args.threads, PYTHONPATH=str(ROOT),
        TF_CPP_MIN_LOG_LEVEL="3")


def main(argv=None) -> int:
    import json

    parser = build_parser()
    args = machine.apply_quick(parser.parse_args(argv), QUICK, argv)
    protocol.check_arguments(parser, args)
    sides = args.sides.split(",")
    if args.sentences < 0 or not sides or any(side not in SIDES for side in sides):
        parser.error(f"--sentences must be >= 0, --sides of {', '.join(SIDES)}; got "
                     f"{args.sentences}, {args.sides!r}")
    args.work = Path(args.work).resolve()
    if args.role:
        return contender_main(args)

    from beam_jobs.vocab import learn_wordpiece
    from models.tokenizer import basic_words
    from pipeline import artifacts
    from pipeline.text.sources import read_brown

    if not artifacts.BROWN_TARBALL.is_file():
        print(f"bench-tokenizer: {artifacts.BROWN_TARBALL} missing; run `make setup` first",
              file=sys.stderr)
        return 2
    lines = [s for _, doc in read_brown(artifacts.BROWN_TARBALL) for s in doc]
    lines = lines[:args.sentences] if args.sentences else lines
    words = sum(len(line.split()) for line in lines)
    counts = collections.Counter(w for line in lines for w in basic_words(line, True))
    vocab = learn_wordpiece(counts.items(), vocab_size=8000)
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "text.json").write_text(json.dumps({"vocab": vocab, "lines": lines}),
                                         encoding="utf-8")
    print(f"bench-tokenizer {datetime.date.today()}: {cpu_line()}")
    print(f"text: Brown, {len(lines):,} sentences, {words:,} words; vocab {len(vocab):,} (uncased)")
    print(f"protocol: {args.repeat} round(s), in each every contender once, each a fresh "
          f"process, in the same order; {protocol.threads_text(args.threads)}", flush=True)

    def contender(side: str, name: str):
        def run(index: int) -> dict:
            found = run_contender(args, side, name)
            if "error" in found:
                print(f"  {side} {name}: n/a ({found['error']})", flush=True)
            else:
                print(f"  {side:10s} {name:24s} {words / found['seconds']:12,.0f} words/s "
                      f"({found['seconds']:.2f} s)", flush=True)
            return found
        return run

    names = [(side, name) for side in sides for name in SIDES[side]]
    rounds = protocol.run_rounds([(f"{side} {name}", contender(side, name))
                                  for side, name in names], args.repeat,
                                 log=lambda line: print(line, flush=True))
    summary = report(rounds, names, words)
    pools = {}
    for r in rounds:
        for found in r["results"].values():
            pools.update(found.get("pools", {}))
    if pools:
        print("threads the TensorFlow children reported: " + "; ".join(
            f"{lib} {protocol.pools_text(p)}" for lib, p in pools.items()))
    note = protocol.busy_note(rounds)
    if note:
        print(note)
    ratio = lambda key: ("n/a" if key not in summary["ratios"]  # noqa: E731
                         else f"{summary['ratios'][key]['median']:.2f}")
    line = (f"bench-tokenizer: python {ratio('python')} graph {ratio('graph-1024')} "
            f"graph-32 {ratio('graph-32')}")
    (args.work / "result.json").write_text(json.dumps({
        "machine": machine.facts(("tokenizers", "tensorflow", "keras-hub", "bert-tensorflow")),
        "settings": {k: str(v) for k, v in vars(args).items()}, "words": words,
        "protocol": protocol.record(rounds, args.threads), "pools": pools, **summary,
        "line": line}, indent=2))
    print(line)
    return 0


def report(rounds: list, names: list, words: int) -> dict:
    """Words/s per contender, median (min-max) over the rounds where its ids agreed with the
    side's first contender's (ours); per side ours over its peer (Rust + word cache, keras-hub)
    as the median of the per-round ratios."""
    rates, ratios = {}, {}
    print(f"\nmedians (min-max) over {len(rounds)} round(s), words/s")
    for side, name in names:
        key, first = f"{side} {name}", f"{side} {SIDES[side][0]}"
        agreed = [r["results"][key] for r in rounds if "error" not in r["results"][key]
                  and r["results"][key]["ids"] == r["results"][first].get("ids")]
        differ = sum(1 for r in rounds if "error" not in r["results"][key]
                     and r["results"][key]["ids"] != r["results"][first].get("ids"))
        if differ:
            print(f"  {side:10s} {name:24s} tokenized differently from ours in {differ} "
                  f"round(s): not counted")
        if agreed:
            values = [words / f["seconds"] for f in agreed]
            rates[key] = protocol.spread(values)
            print(f"  {side:10s} {name:24s} {protocol.spread_text(values, ',.0f'):>34s}")
    for side in {side for side, _ in names}:
        ours, peer = f"{side} ours", f"{side} {SIDES[side][1]}"
        paired = [r["results"][peer]["seconds"] / r["results"][ours]["seconds"] for r in rounds
                  if "error" not in r["results"][ours] and "error" not in r["results"][peer]
                  and r["results"][ours]["ids"] == r["results"][peer]["ids"]]
        if paired:
            ratios[side] = protocol.spread(paired)
    return {"words_per_second": rates, "ratios": ratios}


if __name__ == "__main__":
    sys.exit(main())
