"""Beam flags -> PipelineOptions, with the Dask runner by its short name and checked first.

    >>> options = pipeline_options(["--runner=DaskRunner", "--dask_npartitions=4"], check=False)
    >>> options.get_all_options()["runner"]
    'apache_beam.runners.dask.dask_runner.DaskRunner'

Beam 2.77 knows `DaskRunner` only by its full name (`--runner=DaskRunner` is "Unexpected
pipeline runner"); here the short name works too. With `--dask_client_address`, the scheduler
is checked before the pipeline is built: an unreachable one, or a cluster whose scheduler or
workers cannot import this project's code (the task graph holds references to `beam_jobs` and
`models`), is a one-line `RunnerUnavailable` (a ValueError: the CLI's exit 2) naming the address
and the fix, instead of a 30 s connection timeout or "Error during deserialization of the task
graph" deep in Dask.

What the jobs avoid, so that they run on every runner (Beam 2.77's DaskRunner translates only
Create, ParDo, GroupByKey and Flatten, see apache_beam/runners/dask/transform_evaluator.py):
a ParDo's tagged outputs (Dask merges them into the main output), DoFns that emit in
finish_bundle (Dask drops that output: Top.Of, BatchElements), side inputs (Dask recomputes the
side input's whole graph inside each task that reads it) and more than one sink (Dask computes
only the last transform applied, and what it depends on). `TaggedOutputs` and `Collect` are the
runner-neutral replacements.
"""

from __future__ import annotations

import os
import socket
import threading
from urllib.parse import urlparse

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs import worker_package

DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
SHORT_NAMES = {"DaskRunner": DASK_RUNNER}
# What the scheduler and every worker must import to run the jobs' task graphs.
JOB_MODULES = "import beam_jobs.vocab, beam_jobs.pretraining_data, models.tokenizer"


def absolute(paths: str) -> str:
    """Comma-separated paths or globs with the local ones made absolute (those with a scheme,
    gs://..., as they are): a worker resolves a relative path against its own working
    directory, which is not the launcher's (a Dask worker's is wherever it was started)."""
    return ",".join(p.strip() if "://" in p or not p.strip() else os.path.abspath(p.strip())
                    for p in paths.split(","))


# The Beam extra that brings each object store's filesystem (gs:// without it: "Unable to get
# filesystem from specified path" from deep inside the first read).
FILESYSTEM_EXTRAS = {"gs": "gcp", "s3": "aws", "azfs": "azure", "hdfs": "hadoop"}


def check_paths(**paths: str) -> None:
    """Raises ValueError, one line naming the flag, if a path's URL scheme (gs://, s3://) has
    no Beam filesystem in this process, with the package to install. `paths`: flag name ->
    path(s), comma-separated."""
    from apache_beam.io.filesystems import FileSystems

    for flag, value in paths.items():
        for path in (p.strip() for p in value.split(",")):
            if "://" not in path:
                continue
            scheme = path.split("://", 1)[0]
            try:
                FileSystems.get_filesystem(path)
            except ValueError:
                extra = FILESYSTEM_EXTRAS.get(scheme)
                install = (f"pip install 'apache-beam[{extra}]' (the same version as "
                           f"apache-beam here)" if extra else "use a local path or another URL")
                raise ValueError(f"--{flag} {path}: Beam has no filesystem for {scheme}:// "
                                 f"in this environment; {install}") from None


class RunnerUnavailable(ValueError):
    """The runner named in the Beam flags cannot run the job (the message says how to fix it)."""


def expand_runner(beam_args) -> list[str]:
    """The flags with `--runner=<short name>` replaced by the runner's full name."""
    out, args = [], list(beam_args)
    for i, arg in enumerate(args):
        if arg.startswith("--runner=") and arg.split("=", 1)[1] in SHORT_NAMES:
            arg = "--runner=" + SHORT_NAMES[arg.split("=", 1)[1]]
        elif i and args[i - 1] == "--runner" and arg in SHORT_NAMES:
            arg = SHORT_NAMES[arg]
        out.append(arg)
    return out


def pipeline_options(beam_args, check: bool = True) -> PipelineOptions:
    """PipelineOptions from Beam flags (short runner names expanded, the workers' package
    added for a runner whose workers run elsewhere: beam_jobs/worker_package.py); with
    `check`, a Dask scheduler named by --dask_client_address must answer and import the
    jobs' code."""
    beam_args = expand_runner(beam_args)
    beam_args += worker_package.worker_args(beam_args)
    if any(DASK_RUNNER in arg for arg in beam_args):
        # Registers DaskOptions (--dask_client_address, ...); unregistered flags are dropped
        # ("Discarding unparseable args") and the runner starts a LocalCluster instead.
        try:
            import apache_beam.runners.dask.dask_runner  # noqa: F401
        except ImportError:
            pass  # check_dask says what to install
    options = PipelineOptions(beam_args)
    all_options = options.get_all_options()
    if check and str(all_options.get("runner") or "").endswith("DaskRunner"):
        check_dask(all_options.get("address"), all_options.get("timeout"))
    return options


def check_dask(address: str | None, timeout=None) -> None:
    """Raises RunnerUnavailable if Dask is not installed, the scheduler at `address` does not
    answer, or its scheduler or workers cannot import the jobs. No address: the DaskRunner
    starts a LocalCluster itself (worker processes started from this one, with its
    environment, so they import the same code)."""
    where = "data.beam_args --dask_client_address"
    try:
        import dask.distributed  # noqa: F401
    except ImportError:
        raise RunnerUnavailable(
            "the DaskRunner needs dask and distributed: `pip install -r requirements.lock` "
            "(apache-beam[dask])") from None
    if not address:
        return
    url = urlparse(address if "://" in address else f"tcp://{address}")
    try:
        with socket.create_connection((url.hostname, url.port or 8786), timeout=5):
            pass
    except (OSError, ValueError) as err:
        raise RunnerUnavailable(
            f"no Dask scheduler answers at {address} ({where}): {err}; start one (`dask "
            f"scheduler --host {url.hostname} --port {url.port or 8786}`, then `dask worker "
            f"{address}` per machine) or fix the address") from None
    from dask.distributed import Client

    seconds = timeout if isinstance(timeout, int) else 10
    outcome: dict = {}

    def probe():
        try:
            with Client(address, timeout=seconds, set_as_default=False) as client:
                outcome["connected"] = True
                if not client.scheduler_info().get("workers"):
                    client.wait_for_workers(1, timeout=seconds)
                outcome["workers"] = True
                client.run_on_scheduler(exec, JOB_MODULES)
                client.run(exec, JOB_MODULES)
            outcome["ok"] = True
        except BaseException as err:  # noqa: BLE001 - reported below
            outcome["error"] = err

    # In a thread with a deadline: a server that is not a Dask scheduler (e.g. its HTTP
    # port, 8787) accepts the connection and never answers, and Client's own timeout
    # does not end that wait.
    deadline = 2 * seconds + 5
    thread = threading.Thread(target=probe, daemon=True, name="dask-scheduler-check")
    thread.start()
    thread.join(deadline)
    err = outcome.get("error")
    if "ok" in outcome:
        return
    if isinstance(err, ImportError):
        raise RunnerUnavailable(
            f"the Dask cluster at {address} cannot import this project's code ({err}): start "
            f"its scheduler and workers with PYTHONPATH=<this checkout>, or install the "
            f"package on them (the same versions as here)") from None
    if "connected" not in outcome:
        raise RunnerUnavailable(
            f"{address} ({where}) does not answer as a Dask scheduler "
            f"({err or f'no reply in {deadline} s'}): give the scheduler's address (its "
            f"comm port, 8786 by default, not the dashboard's)") from None
    if "workers" not in outcome:
        raise RunnerUnavailable(
            f"the Dask scheduler at {address} has no worker ({err or 'timed out'}): start "
            f"`dask worker {address}` on each machine") from None
    raise RunnerUnavailable(
        f"the Dask cluster at {address} failed a check run on its scheduler and workers "
        f"({err!r}); see their logs") from None


def release(result) -> None:
    """After a pipeline finished: closes the DaskRunner's client (Beam 2.77 leaves it open),
    and with it the LocalCluster it started when no scheduler was named; other runners'
    results are left as they are. The vocab and data stages run three pipelines in one
    process: without this, three clusters' worker processes stay until it exits."""
    client = getattr(result, "client", None)
    if client is not None and hasattr(client, "close"):
        client.close()


class _Tagged(beam.DoFn):
    """Runs `fn`; emits (tag, value): (main, v) for its main outputs, (t, v) for
    TaggedOutput(t, v). Only setup, teardown and process are passed on (what the jobs use)."""

    def __init__(self, fn: beam.DoFn, main: str):
        self._fn, self._main = fn, main

    def setup(self):
        self._fn.setup()

    def teardown(self):
        self._fn.teardown()

    def process(self, element):
        for item in self._fn.process(element):
            if isinstance(item, beam.pvalue.TaggedOutput):
                yield item.tag, item.value
            else:
                yield self._main, item


class TaggedOutputs(beam.PTransform):
    """ParDo(fn) whose outputs are separate PCollections on every runner: `fn` may yield
    TaggedOutput(tag, value); the result is a dict {main: ..., tag: ...} (like
    `.with_outputs(*tags, main=main)`, which Beam 2.77's DaskRunner merges into one)."""

    def __init__(self, fn: beam.DoFn, tags, main: str):
        super().__init__()
        self._fn, self._tags, self._main = fn, tuple(tags), main

    def expand(self, pcoll):
        tagged = pcoll | "Run" >> beam.ParDo(_Tagged(self._fn, self._main))
        return Outputs({tag: tagged | f"Only_{tag}" >> beam.FlatMap(_only, tag)
                        for tag in (self._main, *self._tags)})


class Outputs(dict):
    """{tag: PCollection}, also by attribute (`read.documents`), like a DoOutputsTuple."""

    def __getattr__(self, tag):
        try:
            return self[tag]
        except KeyError:
            raise AttributeError(tag) from None


def _only(item, tag):
    if item[0] == tag:
        yield item[1]


class Collect(beam.PTransform):
    """PCollection -> one element: the list of all its elements, sorted (with `key`).

    Instead of a side input (AsList), which Beam 2.77's DaskRunner recomputes in every task
    that reads it: everything under one key, one GroupByKey. For small collections only.
    """

    def __init__(self, key=None):
        super().__init__()
        self._key = key

    def expand(self, pcoll):
        return (pcoll
                | "KeyWithNone" >> beam.Map(lambda item: (None, item))
                | "Group" >> beam.GroupByKey()
                | "Sort" >> beam.Map(lambda kv, key: sorted(kv[1], key=key), key=self._key))
