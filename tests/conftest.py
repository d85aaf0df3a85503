"""Shared fixtures: a small Google-format corpus written by the tests themselves."""

from __future__ import annotations

import contextlib
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


@pytest.fixture(scope="session", autouse=True)
def _new_sqlite_stores_from_one_migration(tmp_path_factory):
    """Every test that tracks makes a new SQLite store, and MLflow makes one by running its
    schema migrations (~3 s each on two busy cores, a hundred-odd times in the suite). Here they
    run once per test process, into a template; a new, empty SQLite store then gets the
    template's contents (SQLite's backup API), which is what the migrations would have written:
    the same MLflow, the same schema and alembic revision, a real store. A file that already
    holds tables (a creation killed half-way, as the fault tests make) goes to MLflow's own
    code, as does every other database. Child processes (`python -m pipeline`) migrate as
    users do."""
    import sqlite3

    import mlflow.store.db.utils as db_utils
    from mlflow.store.model_registry import sqlalchemy_store as registry_store

    migrate = db_utils._initialize_tables
    template = tmp_path_factory.mktemp("mlflow-template") / "migrated.db"

    def has_tables(path) -> bool:
        with contextlib.closing(sqlite3.connect(path)) as db:
            return db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] > 0

    def initialize_tables(engine):
        path = engine.url.database if engine.url.get_backend_name() == "sqlite" else None
        if not path or path == ":memory:" or not os.path.isfile(path) or has_tables(path):
            return migrate(engine)
        if not template.exists():
            import sqlalchemy

            made = sqlalchemy.create_engine(f"sqlite:///{template}")
            try:
                migrate(made)
            finally:
                made.dispose()
        engine.dispose()  # no pooled connection of MLflow's keeps the old (empty) schema
        with contextlib.closing(sqlite3.connect(template)) as source, \
                contextlib.closing(sqlite3.connect(path)) as target:
            source.backup(target)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(db_utils, "_initialize_tables", initialize_tables)
        if hasattr(registry_store, "_initialize_tables"):
            patch.setattr(registry_store, "_initialize_tables", initialize_tables)
        yield


def pytest_collection_modifyitems(items):
    """Files with the most slow tests first. `make test` hands whole files to its workers in
    this order (`--dist loadfile --no-loadscope-reorder`: without the second flag xdist
    re-sorts the files by their number of tests), so the long files start early and the
    short ones fill the gaps at the end instead of one worker finishing a long file alone."""
    slow = {}
    for item in items:
        slow[item.fspath] = slow.get(item.fspath, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.fspath])  # stable: a file's own order is kept
