"""Shared fixtures: a small Google-format corpus written by the tests themselves."""

from __future__ import annotations

import logging
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


class PipelineLines(list):
    """The messages of the "pipeline" logger (and its children) at INFO and above, while
    installed, but for those meant for the log file only: what the console shows of a stage,
    for tests that call libraries directly."""

    def __init__(self):
        super().__init__()
        self.handler = logging.Handler(logging.INFO)
        self.handler.emit = lambda record: (None if getattr(record, "file_only", False)
                                            else self.append(record.getMessage()))

    def __enter__(self):
        ours = logging.getLogger("pipeline")
        self.level = ours.level
        ours.setLevel(logging.INFO)
        ours.addHandler(self.handler)
        return self

    def __exit__(self, *exc):
        ours = logging.getLogger("pipeline")
        ours.removeHandler(self.handler)
        ours.setLevel(self.level)


@pytest.fixture
def pipeline_lines():
    """A list that collects the pipeline's log lines during the test."""
    with PipelineLines() as lines:
        yield lines


@pytest.fixture(autouse=True)
def _run_root_as_found():
    """A test that moves the run root (`artifacts.set_run_root`, as tests/test_cycle.py
    does) leaves the next test in the same process the paths it found (the Brown tarball's)."""
    from pipeline import artifacts

    root, variable = artifacts.RUN_ROOT, os.environ.get(artifacts.RUN_ROOT_VARIABLE)
    yield
    if variable is None:
        os.environ.pop(artifacts.RUN_ROOT_VARIABLE, None)
    else:
        os.environ[artifacts.RUN_ROOT_VARIABLE] = variable
    if artifacts.RUN_ROOT != root:
        artifacts._move(root)
