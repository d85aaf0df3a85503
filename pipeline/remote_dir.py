"""`data.remote_dir`: the vocab and data stages on runners whose workers cannot see the run
directory (Dataflow, Flink, Spark, a portable job server).

The run directory stays a path of this machine: the stages' atomic renames, checksums and
markers need one. With `data.remote_dir` set to a URL the workers reach (gs://bucket/bert,
s3://...; any Beam filesystem, or a folder on a mount they all share), a Beam stage copies its
inputs below it, runs its job on those URLs, copies the job's outputs back into the stage's
temporary folder (renamed into place as always) and deletes its copies. Every copy goes
through Beam's FileSystems; the workers read and write only below `data.remote_dir`.

    >>> from pipeline.config import load
    >>> check(load(None, ['data.beam_args=["--runner=FlinkRunner"]']))
    Traceback (most recent call last):
    ...
    ValueError: data.beam_args runs the Beam jobs on FlinkRunner, whose workers cannot read \
the run directory on this machine; set data.remote_dir to a URL they reach (gs://bucket/bert, \
s3://...) or to a folder of a mount they share

Unset (the default), the jobs get the run directory's paths, as before: right for in-process
runners and for a Dask cluster that mounts the run directory at the same path.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from pathlib import Path

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs.runners import check_paths, expand_runner
from beam_jobs.worker_package import REMOTE_RUNNERS

_LOGGER = logging.getLogger(__name__)
_RAW = CompressionTypes.UNCOMPRESSED  # copies are byte for byte, .gz included


def remote_runner(beam_args) -> str:
    """The runner's short name if its workers run elsewhere (not with LOOPBACK), else ""."""
    options = PipelineOptions(expand_runner(beam_args)).get_all_options()
    runner = str(options.get("runner") or "").rsplit(".", 1)[-1]
    loopback = str(options.get("environment_type") or "").upper() == "LOOPBACK"
    return runner if runner in REMOTE_RUNNERS and not loopback else ""


def check(config) -> None:
    """ValueError (exit 2) before anything runs: a remote runner without data.remote_dir would
    hand its workers paths of this machine; a URL whose filesystem is not installed."""
    runner = remote_runner(config.data.beam_args)
    if runner and not config.data.remote_dir:
        raise ValueError(
            f"data.beam_args runs the Beam jobs on {runner}, whose workers cannot read the run "
            f"directory on this machine; set data.remote_dir to a URL they reach "
            f"(gs://bucket/bert, s3://...) or to a folder of a mount they share")
    if config.data.remote_dir:
        check_paths(**{"data.remote_dir": config.data.remote_dir})


def copy(source: str, destination: str) -> None:
    """One file, byte for byte, between any two Beam filesystems."""
    with FileSystems.open(source, compression_type=_RAW) as src, \
            FileSystems.create(destination, compression_type=_RAW) as dst:
        shutil.copyfileobj(src, dst, 8 << 20)


class Staging:
    """Where a stage's job reads and writes: below a fresh `<data.remote_dir>/<run>-<stage>-
    <id>/` when data.remote_dir is set, else the local paths themselves. Use as a context
    manager: the remote copies are deleted at the end, whatever happened."""

    def __init__(self, config, stage: str):
        remote = config.data.remote_dir
        if remote and "://" not in remote:
            remote = str(Path(remote).expanduser().resolve())
        self.root = (FileSystems.join(remote.rstrip("/"), f"{Path(config.run_dir).name}-{stage}-"
                                                          f"{uuid.uuid4().hex[:8]}")
                     if remote else "")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.root:
            return
        try:
            found = FileSystems.match([FileSystems.join(self.root, "**")])[0].metadata_list
            if found:
                FileSystems.delete([m.path for m in found])
            if FileSystems.exists(self.root):  # a local folder (a shared mount)
                FileSystems.delete([self.root])
        except Exception as err:  # noqa: BLE001 - the stage's outcome matters more
            _LOGGER.warning("could not delete the copies below %s (%s); delete them yourself",
                            self.root, err)

    def file(self, local: Path, name: str) -> str:
        """`local` copied to <root>/<name> (its URL), or `local` itself without a remote dir."""
        if not self.root:
            return str(local)
        url = FileSystems.join(self.root, name)
        copy(str(local), url)
        return url

    def files(self, local_files, pattern: str, folder: str) -> str:
        """The files copied into <root>/<folder>/ and `pattern`'s file name glob there, or
        `pattern` itself without a remote dir."""
        if not self.root:
            return pattern
        for path in local_files:
            self.file(Path(path), f"{folder}/{Path(path).name}")
        return FileSystems.join(self.root, folder, Path(pattern).name)

    def output(self, local_dir: Path, folder: str) -> str:
        """Where the job writes what ends up in `local_dir`: <root>/<folder>, or `local_dir`."""
        return FileSystems.join(self.root, folder) if self.root else str(local_dir)

    def download(self, output: str, local_dir: Path) -> list[Path]:
        """Copies every file below `output` (from `output()`) into `local_dir`, keeping the
        layout below it; nothing to do without a remote dir."""
        if not self.root:
            return []
        prefix = output.rstrip("/") + "/"
        found = FileSystems.match([prefix + "**"])[0].metadata_list
        copied = []
        for metadata in sorted(found, key=lambda m: m.path):
            target = Path(local_dir) / metadata.path[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            copy(metadata.path, str(target))
            copied.append(target)
        return copied
