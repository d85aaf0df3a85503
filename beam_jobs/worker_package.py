"""The Beam workers' package: the jobs' code as one small wheel, staged with `--extra_package`
when the runner's workers run on other machines (Dataflow, Flink, Spark, a portable job server).

    >>> worker_args(["--runner=FnApiRunner"])  # in-process workers import what we import
    []
    >>> worker_args(["--runner=DataflowRunner", "--sdk_container_image=bert-pipeline:0.1.0"])
    []

A remote worker unpickles the jobs' DoFns by reference (`beam_jobs.pretraining_data.
CreateInstancesFn`, ...), so it must import `beam_jobs` and `models.tokenizer`. Why a wheel of
its own rather than the project (`--setup_file=pyproject.toml`, or the bert-pipeline wheel as an
extra package): Beam's worker boot installs a staged package *with* its dependencies, and the
project's are TensorFlow, Keras and MLflow (gigabytes, minutes per worker), none of which a
worker imports (the import contract in pyproject.toml). This wheel, `bert-pipeline-worker`,
holds beam_jobs/*.py, models/__init__.py (lazy: it imports nothing) and models/tokenizer.py, and
requires only `tokenizers` (the vocab learner) at the launcher's exact version, so that the
vocab is the same bytes as a local run's; Beam itself is the SDK container's (the launcher's
version, which Beam checks).

It is built from the files this process imports (a checkout or an installed bert-pipeline) with
`zipfile`: no `build` module, no network, the same bytes for the same code. The wheel is written
to this process's temp directory only for the runner's stager, which uploads it with the job
(Dataflow: to --staging_location; portable runners: through the job server's artifact
service); no worker reads the launcher's disk.

Not added when the workers already have the code: a runner in this process (Direct, FnApiRunner,
Prism, Dask: see beam_jobs/runners.py), `--environment_type=LOOPBACK`, or a packaging flag given
by the user (`--setup_file`, `--extra_package`, `--sdk_container_image` such as the image of
deploy/Dockerfile, `--environment_config` naming a Docker image).
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import importlib.util
import io
import logging
import shutil
import tempfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

NAME = "bert-pipeline-worker"
# Runners whose workers are other processes that install what the job stages (by the last part
# of --runner's value, which may also be a full class path).
REMOTE_RUNNERS = ("DataflowRunner", "TestDataflowRunner", "FlinkRunner", "SparkRunner",
                  "PortableRunner")
# What the workers need besides Beam, pinned to this process's version.
REQUIRES = ("tokenizers",)

_LOGGER = logging.getLogger(__name__)
_BUILT: dict[str, str] = {}  # content digest -> wheel path (one build per process and code)


def worker_files() -> dict[str, bytes]:
    """{path in the wheel: bytes}: beam_jobs/*.py, models/__init__.py and models/tokenizer.py,
    read from where this process imports them (without importing `models`)."""
    files = {}
    beam_jobs = Path(importlib.util.find_spec("beam_jobs").origin).parent
    for path in sorted(beam_jobs.glob("*.py")):
        files[f"beam_jobs/{path.name}"] = path.read_bytes()
    models = Path(importlib.util.find_spec("models").origin).parent
    for name in ("__init__.py", "tokenizer.py"):
        files[f"models/{name}"] = (models / name).read_bytes()
    return files


def _version(files: dict[str, bytes]) -> tuple[str, str]:
    """(the wheel's version: the project's + a digest of the code, that digest)."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name] + b"\0")
    try:
        base = metadata.version("bert-pipeline")
    except metadata.PackageNotFoundError:  # a checkout that was not installed
        pyproject = Path(importlib.util.find_spec("beam_jobs").origin).parents[1] / "pyproject.toml"
        base = (tomllib.loads(pyproject.read_text())["project"]["version"]
                if pyproject.is_file() else "0")
    return f"{base}+{digest.hexdigest()[:12]}", digest.hexdigest()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(
        b"=").decode()


def wheel_bytes(files: dict[str, bytes], version: str) -> bytes:
    """A pure-Python wheel (py3-none-any) of `files`, deterministic: sorted entries, fixed
    timestamps, and the METADATA / WHEEL / RECORD that pip checks."""
    dist_info = f"{NAME.replace('-', '_')}-{version}.dist-info"
    requires = []
    for name in REQUIRES:
        try:
            requires.append(f"Requires-Dist: {name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            requires.append(f"Requires-Dist: {name}")
    entries = dict(files)
    entries[f"{dist_info}/METADATA"] = "\n".join([
        "Metadata-Version: 2.1", f"Name: {NAME}", f"Version: {version}",
        "Summary: The Beam workers' code of bert-pipeline (beam_jobs, models.tokenizer)",
        "Requires-Python: >=3.11", *requires, ""]).encode()
    entries[f"{dist_info}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: beam_jobs.worker_package\n"
                                     "Root-Is-Purelib: true\nTag: py3-none-any\n").encode()
    record = [f"{name},{_record_hash(data)},{len(data)}" for name, data in sorted(entries.items())]
    entries[f"{dist_info}/RECORD"] = ("\n".join(record + [f"{dist_info}/RECORD,,"]) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name in list(sorted(files)) + [f"{dist_info}/{n}" for n in ("METADATA", "WHEEL",
                                                                        "RECORD")]:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, entries[name])
    return buffer.getvalue()


def build_wheel(directory: str | None = None) -> str:
    """Writes the workers' wheel (into `directory`, else a temp directory removed when this
    process exits) and returns its path; once per process for the same code."""
    files = worker_files()
    version, digest = _version(files)
    if directory is None and digest in _BUILT and Path(_BUILT[digest]).exists():
        return _BUILT[digest]
    if directory is None:
        directory = tempfile.mkdtemp(prefix="bert-pipeline-worker-")
        atexit.register(shutil.rmtree, directory, True)
    Path(directory).mkdir(parents=True, exist_ok=True)
    path = Path(directory) / f"{NAME.replace('-', '_')}-{version}-py3-none-any.whl"
    path.write_bytes(wheel_bytes(files, version))
    _BUILT[digest] = str(path)
    return str(path)


def runs_elsewhere(options: dict) -> bool:
    """Whether the workers of a runner (PipelineOptions.get_all_options()) are other processes
    that import only what the job stages, and no packaging flag was given."""
    runner = str(options.get("runner") or "").rsplit(".", 1)[-1]
    if runner not in REMOTE_RUNNERS:
        return False
    if str(options.get("environment_type") or "").upper() == "LOOPBACK":
        return False  # the workers are threads of this process
    if options.get("setup_file") or options.get("extra_packages"):
        return False
    if options.get("sdk_container_image"):
        return False
    if options.get("environment_config") and str(
            options.get("environment_type") or "DOCKER").upper() == "DOCKER":
        return False  # a Docker image named the portable way
    return True


def worker_args(beam_args) -> list[str]:
    """The flags to add to `beam_args` so that the workers import the jobs' code:
    `--extra_package=<the workers' wheel>` when the runner's workers run elsewhere and no
    packaging flag was given, else none."""
    from apache_beam.options.pipeline_options import PipelineOptions

    if not any(name in str(arg) for arg in beam_args for name in REMOTE_RUNNERS):
        return []  # not parsed: a local runner's flags may not be registered yet (Dask's)
    options = PipelineOptions(list(beam_args)).get_all_options()
    if not runs_elsewhere(options):
        return []
    wheel = build_wheel()
    _LOGGER.info("the %s workers get the jobs' code from %s (--extra_package; give "
                 "--sdk_container_image or --setup_file to package them yourself)",
                 str(options.get("runner")).rsplit(".", 1)[-1], wheel)
    return [f"--extra_package={wheel}"]


if __name__ == "__main__":  # python -m beam_jobs.worker_package DIR: the wheel, for an image
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m beam_jobs.worker_package DIR (where to write the wheel)")
    print(build_wheel(sys.argv[1]))
