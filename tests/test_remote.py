"""Ready for remote runners (issue 17 point 4): every path of the Beam jobs may be a URL, and
the workers get the jobs' code as a package.

URLs: `memfs://` below is an object store that lives in this process (a flat key space like
gs:// or s3://: no folders, `exists` of a prefix is False), registered with Beam's
FileSystems by subclassing. Both jobs run on the FnApiRunner (its workers share this process,
hence the store) with every path under memfs://, and give the bytes of a run on local paths;
a read or write that bypassed FileSystems (open(), os.path, pathlib) would fail on such a URL
or leave a local `memfs:` folder behind.

Packaging: the runner decides whether the workers' wheel is added, and the wheel installs in a
fresh venv where the jobs import without TensorFlow, Keras or the pipeline.
"""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("apache_beam")

from apache_beam.io.filesystem import (  # noqa: E402
    BeamIOError,
    CompressedFile,
    CompressionTypes,
    FileMetadata,
    FileSystem,
)
from apache_beam.io.filesystems import FileSystems  # noqa: E402

from beam_jobs import pretraining_data, runners, worker_package  # noqa: E402
from beam_jobs import vocab as vocab_job  # noqa: E402

RUNNER = ["--runner=FnApiRunner", "--direct_running_mode=in_memory"]
PROJECT = Path(__file__).resolve().parents[1]

_STORE: dict[str, bytes] = {}  # memfs://key -> bytes, shared by every MemFileSystem instance


class _Upload(io.BytesIO):
    """A write channel whose bytes appear in the store when it is closed (like an upload)."""

    def __init__(self, path):
        super().__init__()
        self._path = path

    def close(self):
        if not self.closed:
            _STORE[self._path] = self.getvalue()
        super().close()


class MemFileSystem(FileSystem):
    """An in-process object store under memfs:// (Beam finds it by its scheme)."""

    @classmethod
    def scheme(cls):
        return "memfs"

    def join(self, basepath, *paths):
        return "/".join([basepath.rstrip("/"), *(p.strip("/") for p in paths)])

    def split(self, path):
        head, _, tail = path.rstrip("/").rpartition("/")
        return head, tail

    def mkdirs(self, path):
        pass  # no folders in an object store

    def has_dirs(self):
        return False

    def _list(self, dir_or_prefix):
        for path in sorted(_STORE):
            if path.startswith(dir_or_prefix):
                yield FileMetadata(path, len(_STORE[path]), 0.0)

    def create(self, path, mime_type="application/octet-stream",
               compression_type=CompressionTypes.AUTO):
        handle = _Upload(path)
        compression_type = FileSystem._get_compression_type(path, compression_type)
        if compression_type == CompressionTypes.UNCOMPRESSED:
            return handle
        return CompressedFile(handle, compression_type=compression_type)

    def open(self, path, mime_type="application/octet-stream",
             compression_type=CompressionTypes.AUTO):
        if path not in _STORE:
            raise BeamIOError(f"{path} not found", {path: FileNotFoundError(path)})
        handle = io.BytesIO(_STORE[path])
        compression_type = FileSystem._get_compression_type(path, compression_type)
        if compression_type == CompressionTypes.UNCOMPRESSED:
            return handle
        return CompressedFile(handle, compression_type=compression_type)

    def copy(self, source_file_names, destination_file_names):
        for source, destination in zip(source_file_names, destination_file_names):
            _STORE[destination] = _STORE[source]

    def rename(self, source_file_names, destination_file_names):
        for source, destination in zip(source_file_names, destination_file_names):
            _STORE[destination] = _STORE.pop(source)

    def exists(self, path):
        return path in _STORE

    def size(self, path):
        return len(_STORE[path])

    def last_updated(self, path):
        return 0.0

    def checksum(self, path):
        return str(hash(_STORE[path]))

    def metadata(self, path):
        return FileMetadata(path, len(_STORE[path]), 0.0)

    def delete(self, paths):
        missing = {p: FileNotFoundError(p) for p in paths if p not in _STORE}
        for path in paths:
            _STORE.pop(path, None)
        if missing:
            raise BeamIOError("delete of missing objects", missing)


@pytest.fixture()
def store(tmp_path, monkeypatch):
    """The memfs store, empty; the working directory a fresh folder (a URL taken for a
    local path would create `memfs:` there)."""
    _STORE.clear()
    monkeypatch.chdir(tmp_path)
    yield _STORE
    assert not (tmp_path / "memfs:").exists()
    _STORE.clear()


WORDS = ("the a of and to in is was he she it that for on with as his her at by from this "
         "river stone light house water under over quick brown fox jumps lazy dog").split()


def write_corpus(folder: Path) -> list[Path]:
    """3 files of Google-format text (a sentence per line, blank lines between documents)."""
    rng = random.Random(3)
    folder.mkdir(parents=True)
    files = []
    for i in range(3):
        docs = ["\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))).
                          capitalize() + " ." for _ in range(rng.randint(2, 9)))
                for _ in range(20)]
        files.append(folder / f"part-{i}.txt")
        files[-1].write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return files


def upload(files, prefix: str) -> None:
    for path in files:
        _STORE[f"{prefix}/{path.name}"] = path.read_bytes()


def test_both_jobs_on_urls_give_the_bytes_of_local_paths(store, tmp_path):
    corpus = write_corpus(tmp_path / "local" / "corpus")
    upload(corpus, "memfs://bucket/run/corpus")
    vocab_args = ["--vocab_size", "150", "--min_word_count", "1", *RUNNER]

    local_vocab = tmp_path / "local" / "vocab" / "vocab.txt"
    local_meta = vocab_job.run(["--input", str(tmp_path / "local" / "corpus" / "*.txt"),
                                "--output", str(local_vocab), *vocab_args])
    # On the URLs, the count's run files too (a spill every 3 words, merges in levels).
    remote_meta = vocab_job.run(["--input", "memfs://bucket/run/corpus/*.txt",
                                 "--output", "memfs://bucket/run/vocab/vocab.txt", *vocab_args,
                                 "--spill_words", "3", "--merge_fan_in", "2",
                                 "--read_chunk_mb", "0.001"])
    assert remote_meta == local_meta
    assert sorted(k for k in store if "/vocab/" in k) == [
        "memfs://bucket/run/vocab/vocab.json", "memfs://bucket/run/vocab/vocab.txt"]
    assert store["memfs://bucket/run/vocab/vocab.txt"] == local_vocab.read_bytes()
    assert json.loads(store["memfs://bucket/run/vocab/vocab.json"]) == local_meta
    assert vocab_job.check_vocab("memfs://bucket/run/vocab/vocab.txt") == \
        vocab_job.check_vocab(str(local_vocab))

    data_args = ["--split", "train", "--max_seq_length", "32", "--max_predictions_per_seq", "5",
                 "--dupe_factor", "2", "--num_shards", "2", "--group_size_mb", "0.002",
                 "--read_chunk_mb", "0.001", "--phases", "16:3,32:5", *RUNNER]
    local_out = tmp_path / "local" / "data"
    local_stats = pretraining_data.run([
        "--input", str(tmp_path / "local" / "corpus" / "*.txt"), "--vocab_file", str(local_vocab),
        "--output_dir", str(local_out), *data_args])
    remote_stats = pretraining_data.run([
        "--input", "memfs://bucket/run/corpus/*.txt",
        "--vocab_file", "memfs://bucket/run/vocab/vocab.txt",
        "--output_dir", "memfs://bucket/run/data", *data_args])

    def without_paths(stats):
        return [{**phase, "settings": {k: v for k, v in phase["settings"].items()
                                       if k not in ("input", "vocab_file")}}
                for phase in stats["phases"]]

    assert without_paths(remote_stats) == without_paths(local_stats)
    assert local_stats["phases"][0]["instances"] > 20
    local_files = sorted(str(p.relative_to(local_out)) for p in local_out.rglob("*")
                         if p.is_file())
    remote_files = sorted(k[len("memfs://bucket/run/data/"):] for k in store
                          if k.startswith("memfs://bucket/run/data/"))
    # Every shard and stats file, and nothing else (the part files of .tmp-* are gone).
    assert remote_files == local_files == [
        f"phase{p}/{name}" for p in (1, 2) for name in (
            "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord", "train-stats.json")]
    for name in local_files:
        remote = store[f"memfs://bucket/run/data/{name}"]
        if name.endswith(".tfrecord"):
            assert remote == (local_out / name).read_bytes(), name
    assert store["memfs://bucket/run/data/phase1/train-stats.json"] == json.dumps(
        remote_stats["phases"][0], indent=2).encode()


def test_a_url_without_its_filesystem_is_one_line_exit_2(tmp_path):
    """gs:// needs apache-beam[gcp]; without it the job stops before any pipeline, naming the
    flag and what to install (Beam's own error comes from deep inside the first read)."""
    with pytest.raises(ValueError, match=r"--vocab_file nope://b/v.txt: Beam has no filesystem"):
        runners.check_paths(input=str(tmp_path), vocab_file="nope://b/v.txt")
    try:
        FileSystems.get_filesystem("gs://bucket/x")
        pytest.skip("apache-beam[gcp] is installed here")
    except ValueError:
        pass
    result = subprocess.run(
        [sys.executable, "-m", "beam_jobs.pretraining_data", "--input", "gs://bucket/corpus/*.txt",
         "--output_dir", str(tmp_path), "--vocab_file", str(tmp_path / "vocab.txt")],
        capture_output=True, text=True, cwd=PROJECT, timeout=120,
        env={**os.environ, "PYTHONPATH": str(PROJECT)})
    assert result.returncode == 2
    assert "--input gs://bucket/corpus/*.txt: Beam has no filesystem for gs://" in result.stderr
    assert "apache-beam[gcp]" in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("beam_args, packaged", [
    (["--runner=DirectRunner"], False),
    (["--runner=FnApiRunner"], False),
    (["--runner=PrismRunner"], False),
    (["--runner=DaskRunner"], False),
    (["--runner=DataflowRunner", "--project=p", "--region=europe-west1",
      "--temp_location=gs://b/tmp"], True),
    (["--runner=apache_beam.runners.dataflow.dataflow_runner.DataflowRunner"], True),
    (["--runner=FlinkRunner", "--flink_master=flink:8081"], True),
    (["--runner=SparkRunner", "--spark_master_url=spark://spark:7077"], True),
    (["--runner=PortableRunner", "--job_endpoint=localhost:8099"], True),
    (["--runner=PortableRunner", "--environment_type=LOOPBACK"], False),
    (["--runner=DataflowRunner", "--setup_file=./setup.py"], False),
    (["--runner=DataflowRunner", "--extra_package=dist/mine.whl"], False),
    (["--runner=DataflowRunner", "--sdk_container_image=europe-docker.pkg.dev/p/r/bert:0.1"],
     False),
    (["--runner=FlinkRunner", "--environment_type=DOCKER", "--environment_config=bert:0.1"],
     False),
    (["--runner=FlinkRunner", "--environment_type=EXTERNAL", "--environment_config=w:50000"],
     True),
])
def test_the_workers_package_is_added_for_remote_runners_only(beam_args, packaged):
    added = worker_package.worker_args(runners.expand_runner(beam_args))
    if not packaged:
        assert added == []
        return
    assert len(added) == 1 and added[0].startswith("--extra_package=")
    wheel = added[0].split("=", 1)[1]
    assert Path(wheel).name.startswith("bert_pipeline_worker-") and wheel.endswith(
        "-py3-none-any.whl")
    options = runners.pipeline_options(beam_args, check=False).get_all_options()
    assert options["extra_packages"] == [wheel]  # built once per process


def test_the_workers_wheel_installs_and_imports_without_tensorflow(tmp_path):
    wheel = Path(worker_package.build_wheel(str(tmp_path / "dist")))
    names = zipfile.ZipFile(wheel).namelist()
    code = sorted(n for n in names if ".dist-info/" not in n)
    assert code == sorted([f"beam_jobs/{p.name}" for p in (PROJECT / "beam_jobs").glob("*.py")]
                          + ["models/__init__.py", "models/tokenizer.py"])
    metadata = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith("METADATA"))).decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist")]
    assert len(requires) == 1 and requires[0].startswith("Requires-Dist: tokenizers==")
    # The same code gives the same bytes (a worker image or cache can key on them).
    again = Path(worker_package.build_wheel(str(tmp_path / "again")))
    assert again.name == wheel.name and again.read_bytes() == wheel.read_bytes()

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = Path(subprocess.run([python, "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
                    "--no-deps", "--no-index", str(wheel)],
                   check=True, env=env, timeout=300, capture_output=True)
    # Beam, tokenizers, ... from this venv (a worker's SDK container has them), after the
    # venv's own site-packages, and with TensorFlow, Keras and the pipeline made unimportable.
    (site / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('tensorflow', 'keras', 'keras_hub', 'pipeline',\n"
        "                                  'mlflow'):\n"
        "            raise ImportError('a worker imported ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import beam_jobs.pretraining_data, beam_jobs.vocab, models.tokenizer\n"
        "print(beam_jobs.pretraining_data.__file__)\n"
        "print(beam_jobs.vocab.learn_wordpiece([('low', 5), ('lower', 3)], 120)[104:106])\n")
    result = subprocess.run([python, "-c", probe], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.split("\n")
    assert lines[0].startswith(str(site))  # the wheel's copy, not the checkout's
    assert lines[1] == "['e', 'l']"


def test_the_stages_with_a_remote_dir_give_the_outputs_of_local_paths(store, tmp_path):
    """`data.remote_dir`: the vocab and data stages copy their inputs below the URL, run the
    jobs there and copy the outputs back; the run directory ends up with the same bytes, and
    the copies are gone."""
    from pipeline import config as config_lib
    from pipeline import remote_dir
    from pipeline.stages import data as data_stage
    from pipeline.stages import vocab as vocab_stage

    runs = {}
    for name, extra in (("local", []), ("remote", ["data.remote_dir=memfs://bucket/staging"])):
        run = tmp_path / name
        write_corpus(run / "corpus" / "train")
        (run / "corpus" / "eval").mkdir()
        (run / "corpus" / "eval" / "part-0.txt").write_bytes(
            (run / "corpus" / "train" / "part-2.txt").read_bytes())
        (run / "corpus" / "manifest.json").write_text("{}")
        config = config_lib.load("configs/test_tiny.yaml", [
            f"run_dir={run}", "vocab.size=150", "vocab.min_word_count=1",
            "data.max_seq_length=32", "data.max_predictions_per_seq=5", "data.num_shards=2",
            *extra])
        vocab_stage.run(config)
        stats = data_stage.run(config)
        runs[name] = run, stats
        assert not store  # every copy below the URL deleted
    (local, local_stats), (remote, remote_stats) = runs["local"], runs["remote"]
    for folder in ("vocab", "data"):
        names = sorted(str(p.relative_to(local / folder)) for p in (local / folder).rglob("*"))
        assert names == sorted(str(p.relative_to(remote / folder))
                               for p in (remote / folder).rglob("*"))
        for name in names:
            if name.endswith((".txt", ".tfrecord")):
                assert (local / folder / name).read_bytes() == \
                    (remote / folder / name).read_bytes(), name
    assert "data/train-00000-of-00002.tfrecord" in [
        str(p.relative_to(local)) for p in local.rglob("*.tfrecord")]
    for split in ("train", "eval"):
        assert {k: v for k, v in remote_stats[split].items() if k != "settings"} == \
            {k: v for k, v in local_stats[split].items() if k != "settings"}
        assert remote_stats[split]["settings"]["input"].startswith("memfs://bucket/staging/")
    assert json.loads((remote / "vocab" / "vocab.json").read_text()) == \
        json.loads((local / "vocab" / "vocab.json").read_text())

    # A remote runner without data.remote_dir stops before anything runs (exit 2).
    flink = config_lib.load("configs/test_tiny.yaml", [
        f"run_dir={local}", 'data.beam_args=["--runner=FlinkRunner"]'])
    with pytest.raises(ValueError, match="data.beam_args runs the Beam jobs on FlinkRunner.*"
                                         "set data.remote_dir"):
        data_stage.run(flink)
    assert remote_dir.remote_runner(["--runner=PortableRunner",
                                     "--environment_type=LOOPBACK"]) == ""


def test_the_worker_image_is_beams_sdk_image_plus_the_wheel(tmp_path):
    """deploy/Dockerfile.beam-worker: Beam's SDK image at this Beam and Python version (a
    worker's SDK must be the launcher's), and the wheel `python -m beam_jobs.worker_package`
    writes is the one it copies. (Not built here: no Docker.)"""
    from importlib import metadata

    text = (PROJECT / "deploy" / "Dockerfile.beam-worker").read_text()
    assert f"ARG BEAM_VERSION={metadata.version('apache-beam')}\n" in text
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"FROM apache/beam_python{python}_sdk:${{BEAM_VERSION}}\n" in text
    result = subprocess.run([sys.executable, "-m", "beam_jobs.worker_package", str(tmp_path)],
                            capture_output=True, text=True, cwd=PROJECT, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(PROJECT)})
    assert result.returncode == 0, result.stderr[-2000:]
    wheel = Path(result.stdout.strip())
    assert wheel.parent == tmp_path and wheel.is_file()
    assert wheel.match("bert_pipeline_worker-*.whl")
    assert "COPY dist/bert_pipeline_worker-*.whl" in text
