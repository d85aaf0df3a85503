"""Shared fixtures: a small Google-format corpus written by the tests themselves."""

from __future__ import annotations

import os
import random

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pipeline  # noqa: E402,F401  (before a test module loads TensorFlow: oneDNN on, as users)

WORDS = ("the cat dog bird sat ran flew over under near a big small red blue green house tree "
         "river hill road quickly slowly saw heard found kept old new happy sad garden window "
         "morning evening children teacher farmer city village letter story music").split()


def make_corpus(folder, documents=40, sentences=(3, 12), seed=0) -> list:
    """Writes Google-format files (sentence per line, blank line between documents)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    docs = []
    for d in range(documents):
        topic = WORDS[d % len(WORDS)]
        doc = []
        for _ in range(rng.randint(*sentences)):
            n = rng.randint(5, 14)
            words = [topic] + [rng.choice(WORDS) for _ in range(n)]
            doc.append(" ".join(words).capitalize() + ".")
        docs.append(doc)
    for f in range(2):
        part = docs[f::2]
        (folder / f"part-{f}.txt").write_text("\n\n".join("\n".join(doc) for doc in part) + "\n",
                                              encoding="utf-8")
    return docs


@pytest.fixture
def corpus_dir(tmp_path):
    folder = tmp_path / "raw"
    make_corpus(folder)
    return folder
