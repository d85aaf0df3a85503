"""Benchmark: tokenization speed of the tokenizer contract against its peers, same text, same ids.

    python bench/bench_tokenizer.py [--repeat N] [--sentences N]

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

Figures are words per second, the best of `--repeat` runs. The last line reads
`bench-tokenizer: python <ours / Rust + word cache> graph <ours / keras-hub, batch 1024>
graph-32 <the same at batch 32>`.
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

from bench import machine  # noqa: E402


def cpu_line() -> str:
    model, flags = machine.cpu_facts()
    have = " ".join(f"{f}={'yes' if on else 'no'}" for f, on in flags.items())
    return f"{model}, {machine.cores()} cores, {have}"


def best_of(repeat: int, fn) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


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


def graph_contenders(vocab, lines, batch: int):
    import keras_hub
    import tensorflow as tf

    from models.preprocessor import TokenizerLayer

    data = [tf.constant(lines[i:i + batch]) for i in range(0, len(lines), batch)]
    spec = [tf.TensorSpec([None], tf.string)]
    layers = {"ours": TokenizerLayer(vocab, lowercase=True),
              "keras-hub": keras_hub.tokenizers.WordPieceTokenizer(
                  vocabulary=vocab, lowercase=True, strip_accents=True, oov_token="[UNK]")}
    out = {}
    for name, layer in layers.items():
        fn = tf.function(layer, input_signature=spec)
        fn(data[0])  # trace

        def run(fn=fn):
            return [ids for d in data for ids in fn(d).to_list()]
        out[name] = run
    return out


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=0, help="use the first N (0: all)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

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
    print(f"bench-tokenizer {datetime.date.today()}: {cpu_line()}")
    print(f"text: Brown, {len(lines):,} sentences, {words:,} words; vocab {len(vocab):,} (uncased)")

    def measure(title, contenders):
        results, reference = {}, None
        for name, fn in contenders.items():
            ids = fn()
            normalized = [bytes(x) if isinstance(x, bytes) else array.array("H", x).tobytes()
                          for x in ids]
            if reference is None:
                reference = normalized
            elif normalized != reference:
                wrong = sum(a != b for a, b in zip(normalized, reference))
                print(f"  {name}: {wrong} sentences tokenize differently: not timed")
                continue
            seconds = best_of(args.repeat, fn)
            results[name] = words / seconds
            print(f"  {title} {name:24s} {words / seconds:12,.0f} words/s ({seconds:.2f} s)")
        return results

    python = measure("python", python_contenders(vocab, lines))
    graph = measure("graph-1024", graph_contenders(vocab, lines, 1024))
    graph32 = measure("graph-32", graph_contenders(vocab, lines, 32))
    ratio = python["ours"] / python["Rust + word cache"]
    print(f"bench-tokenizer: python {ratio:.2f} graph {graph['ours'] / graph['keras-hub']:.2f} "
          f"graph-32 {graph32['ours'] / graph32['keras-hub']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
