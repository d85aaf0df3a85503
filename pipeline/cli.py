"""Command line: `python -m pipeline STAGE [STAGE ...] --config FILE [section.key=value ...]`
(installed: `bert-pipeline STAGE ... --config NAME`, e.g. `bert-pipeline all --config pretrain_tiny`).

Stages, in order: corpus → vocab → data → pretrain; `all` runs the four. By name only:
finetune, and sweep (the finetune.sweep grid as nested runs, the best point reported),
multitask (one encoder, a head per task, mixed batches), distill (a smaller student),
glue (every GLUE task folder of finetune.glue_dir, or `--tasks cola,sst-2`: dev scores, the
GLUE score and the test-set submission files).
Other commands: fill-mask, nsp, attention, embed, params (`python -m pipeline fill-mask --help`);
cycle, the scheduled loop (`bert-pipeline cycle --help`, docs/scheduling.md); config show
[--config FILE] [key=value ...] | show --defaults | docs: the effective config as commented YAML.
Each invocation is one MLflow parent run with a nested run per stage.

A stage whose inputs, settings and code are unchanged since it last completed
is reused (recorded on the parent run as `stage.<name> = reused`, with the run
that produced it); `--force` runs it again. See pipeline/tracking/lineage.py. Training
that was interrupted resumes from its latest checkpoint and continues its MLflow run.
Under train.strategy = multi_worker run the same command on every worker: only the
chief takes the run directory's lock and records MLflow runs.

Exit codes: 0 success; 1 anything unexpected (traceback in the log file);
2 bad input (config, corpus, missing artifact), with a message naming the file
or key and how to fix it; 3 nothing to do (with --scheduled: every stage was up
to date); 4 already running (another invocation holds the run directory's lock);
5 out of disk space (a write failed; every earlier complete output is intact).
Every invocation also writes its log to <run_dir>/logs/: <time>-<pid>.log for the invocation,
<stage>.log for each stage's full log (Beam's workers, TensorFlow's start-up lines; also logged
to the stage's MLflow run). The console shows the pipeline's own lines, a line per stage start
and end, warnings and errors; `-v` shows everything.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import logging
import os
import sys
import traceback
from pathlib import Path

from pipeline.stage_spec import STAGES as SPECS

log = logging.getLogger(__name__)

STAGES = tuple(name for name, spec in SPECS.items() if spec.in_all)  # `all`
EXTRA_STAGES = tuple(name for name, spec in SPECS.items() if not spec.in_all)  # by name only

# Exit codes (stable: schedulers act on them).
EXIT_OK = 0               # the stages ran (or, without --scheduled, were up to date)
EXIT_FAILED = 1           # an unexpected error; the log file has the traceback
EXIT_BAD_INPUT = 2        # bad config, corpus or missing artifact; the message says how to fix it
EXIT_NOTHING_TO_DO = 3    # --scheduled only: every stage was up to date
EXIT_ALREADY_RUNNING = 4  # another invocation holds this run directory's lock
EXIT_NO_SPACE = 5         # a write ran out of disk space; the previous outputs are intact


# Commands that are not pipeline stages: name -> "module:function" taking argv, returning an exit code.
TOOLS = {
    "fill-mask": "pipeline.tools.inspect_model:main",
    "nsp": "pipeline.tools.inspect_model:main",
    "attention": "pipeline.tools.inspect_model:main",
    "embed": "pipeline.tools.inspect_model:main",
    "predict": "pipeline.tools.predict:main",
    "serve": "pipeline.tools.serve:main",  # a registered model over HTTP (MLflow's scoring server)
    "retrieval-eval": "pipeline.tools.retrieval_eval:main",  # symmetric vs passage-level search
    "params": "models.params:main",  # parameter breakdown of a .keras model or a preset
    # MLflow calls a run kept while the tracking store was down, sent now
    "tracking-sync": "pipeline.tools.tracking_sync:main",
    # the scheduled loop: new text -> pretrain -> fine-tune -> evaluate -> register -> promote
    "cycle": "pipeline.cycle:main",
    # task-adaptive pretraining on the task's training text, then fine-tuning (pipeline/adapt.py)
    "adapt": "pipeline.adapt:main",
    "server": "pipeline.tools.server:main",  # a team's MLflow server: PostgreSQL + basic auth
    "config": "pipeline.config.show:main",  # config show [--defaults] | docs: every key, its help
}


def _take_run_root(argv: list[str]) -> list[str]:
    """Removes `--run-root DIR` from argv and moves the run root there (any command takes it)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--run-root" and i + 1 < len(argv):
            root, i = argv[i + 1], i + 2
        elif argv[i].startswith("--run-root="):
            root, i = argv[i].split("=", 1)[1], i + 1
        else:
            out.append(argv[i])
            i += 1
            continue
        from pipeline import artifacts

        artifacts.set_run_root(root)
    return out


def build_parser(prog: str = "python -m pipeline") -> argparse.ArgumentParser:
    """The stages' parser (`python -m pipeline STAGE ...`; docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("stages", nargs="+", metavar="STAGE",
                        help=f"one or more of: {', '.join(STAGES)}, all (those four), "
                             f"{', '.join(EXTRA_STAGES)}; then key=value overrides")
    parser.add_argument("--config", default="configs/pretrain_tiny.yaml",
                        help="YAML config file, or a shipped config's name (pretrain_tiny, "
                             "finetune_brown, ...)")
    parser.add_argument("--run-root", metavar="DIR",
                        help="where relative run directories, the MLflow store (mlflow.db, "
                             "mlartifacts/) and downloads go (default: $BERT_PIPELINE_ROOT, "
                             "the checkout, or the current directory)")
    parser.add_argument("--force", action="store_true", help="re-run stages even if up to date")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show everything on the console: Beam's worker logging, "
                             "TensorFlow's start-up messages, every library's INFO lines "
                             "(otherwise only in <run_dir>/logs/<stage>.log)")
    parser.add_argument("--tasks", default="", metavar="TASK,...",
                        help="glue only: the GLUE tasks to run (cola, sst-2, mrpc, sts-b, qqp, "
                             "mnli, qnli, rte, wnli; default: every task folder in "
                             "finetune.glue_dir)")
    parser.add_argument("--scheduled", action="store_true",
                        help=f"for schedulers: exit {EXIT_NOTHING_TO_DO} when every stage was "
                             f"up to date")
    return parser


def main(argv=None) -> int:
    """`python -m pipeline ...` and the `bert-pipeline` command (the same subcommands)."""
    argv = _take_run_root(list(sys.argv[1:] if argv is None else argv))
    verbose = any(a in ("-v", "--verbose") for a in argv)
    argv = [a for a in argv if a not in ("-v", "--verbose")]
    if not verbose:  # TensorFlow's start-up lines (oneDNN, CUDA probing) stay off the console
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if argv and argv[0] in TOOLS:
        target = TOOLS[argv[0]]
        # the cycle and the commands under pipeline/tools take -v themselves
        if verbose and target.startswith(("pipeline.cycle:", "pipeline.adapt:",
                                          "pipeline.tools.")):
            argv = [*argv, "--verbose"]
        return _call(target, argv)
    command = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    parser = build_parser("bert-pipeline" if command == "bert-pipeline" else "python -m pipeline")
    args = parser.parse_intermixed_args(argv)
    overrides = [s for s in args.stages if "=" in s]
    names = [s for s in args.stages if "=" not in s]
    stages = list(STAGES) if "all" in names else names
    unknown = [s for s in stages if s not in STAGES + EXTRA_STAGES]
    if unknown or not stages:
        what = unknown[0] if unknown else ""
        if "." in what:  # section.key without a value
            print(f"error: override {what!r} must look like section.key=value (e.g. "
                  f"train.steps=500)", file=sys.stderr)
        else:
            print(f"error: unknown stage {what!r}; choose from "
                  f"{', '.join(STAGES + EXTRA_STAGES)} or all", file=sys.stderr)
        return EXIT_BAD_INPUT
    stages = [s for s in STAGES + EXTRA_STAGES if s in stages]  # always in pipeline order
    if args.tasks and "glue" not in stages:
        print("error: --tasks names GLUE tasks for the glue stage; add `glue` to the command "
              "(python -m pipeline glue --tasks ...) or drop --tasks", file=sys.stderr)
        return EXIT_BAD_INPUT

    from pipeline import artifacts, logs
    from pipeline import config as config_lib

    try:
        config = config_lib.load(args.config, overrides)
    except config_lib.ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    paths = artifacts.Artifacts(config.run_dir)
    paths.logs_dir.mkdir(parents=True, exist_ok=True)
    log_file = paths.logs_dir / f"{datetime.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}.log"

    logs.setup(log_file, verbose=verbose)
    with logs.stderr_to(log_file):  # fd 2 (C++ libraries, subprocesses) off the console
        return _run(config, args.config, stages, args.force, paths,
                    scheduled=args.scheduled,
                    options={"glue": {"tasks": args.tasks}} if args.tasks else None)


def _run(config, config_path, stages, force, paths, scheduled=False, options=None) -> int:
    """Runs `stages`; `options`: stage -> keyword arguments of its `run` (glue's --tasks)."""
    from pipeline import artifacts, logs
    from pipeline.tracking import lineage, outbox
    from pipeline.tracking import runs as tracking

    outbox.set_http_patience()  # a dead tracking server costs seconds, not minutes per call
    results, ran, current = {}, [], [""]
    # Under train.strategy = multi_worker every worker runs this command; only the chief takes
    # the run directory's lock, creates MLflow runs and writes stage markers (it also writes
    # the checkpoints and exports), the other workers only train.
    chief = _is_chief(config)
    try:
        with (RunLock(paths.root) if chief else contextlib.nullcontext(),
              tracking.pipeline_run(config, stages, str(config_path)) if chief
              else contextlib.nullcontext() as parent):
            if parent is not None:
                log.info(f"MLflow run {parent.info.run_id} ({tracking.tracking_uri(config)})")
            else:
                log.info("not the chief worker: no run lock, no MLflow runs "
                         "(the chief records them)")
            for stage in stages:
                current[0] = stage
                fp = lineage.fingerprint(stage, config, paths)
                marker = None if force else lineage.is_current(stage, paths, fp)
                # The outputs this stage reads (and its own, if reused) as their stages wrote
                # them, before anything is reused, set aside or run: a truncated or altered
                # file is exit 2, named, with the command that rebuilds it.
                for made_by in SPECS[stage].upstream + ((stage,) if marker else ()):
                    artifacts.verify_checksums(paths.output_dir(made_by),
                                               SPECS[made_by].rebuild)
                if marker:
                    log.info(f"{stage}: up to date, reused ({lineage.output_dir(stage, paths)}, "
                             f"made by MLflow run {marker.get('mlflow_run_id')})")
                    if chief:
                        outbox.set_tags({f"stage.{stage}": "reused",
                                         f"stage.{stage}.run_id": marker.get("mlflow_run_id", ""),
                                         f"stage.{stage}.link": tracking.run_link(
                                             marker.get("mlflow_run_id", ""))})
                    continue
                # The stage's log opens first: what loading its libraries prints (TensorFlow's
                # start-up lines) belongs to it. It is logged to the stage's MLflow run when
                # it closes, with the stage's outcome (and the error, if it failed).
                run_ids: list[str] = []
                keep = (lambda path: run_ids and _keep_log(path, run_ids[0])) if chief else None
                with logs.stage(stage, paths.logs_dir, keep):
                    if force and chief and SPECS[stage].fresh:  # old checkpoints set aside
                        _call(SPECS[stage].fresh, config)
                    # An interrupted training continues the MLflow run it recorded (pretrain).
                    resume = (_call(SPECS[stage].resumable, config) if SPECS[stage].resumable
                              else "")
                    with (tracking.stage_run(stage, config, SPECS[stage].description,
                                             tags=lineage.tags(stage, fp), resume_run_id=resume)
                          if chief else contextlib.nullcontext()) as run:
                        run_ids.extend([run.info.run_id] if chief else [])
                        results[stage] = _stage_run(stage, config, options)
                        # Inputs hashed again after the run: the stage may have created them.
                        if fp["key"] is None:
                            fp = lineage.fingerprint(stage, config, paths)
                        if chief:
                            outbox.set_tags(lineage.tags(stage, fp))
                            # Checksums and marker before the run ends: a kill between the two
                            # would leave a FINISHED run whose outputs the next invocation redoes.
                            if SPECS[stage].checksums:
                                artifacts.write_checksums(paths.output_dir(stage),
                                                          SPECS[stage].checksums_skip)
                            lineage.write_marker(stage, paths, fp, run.info.run_id)
                if chief:
                    outbox.set_tags({f"stage.{stage}": "ran",
                                     f"stage.{stage}.run_id": run.info.run_id})
                ran.append(stage)
    except AlreadyRunning as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ALREADY_RUNNING
    except Exception as err:  # noqa: BLE001 - reported, then mapped to an exit code
        return _failed(err, config, current[0])
    _summary(config, paths, results)
    if scheduled and not ran:
        log.info("nothing to do: every stage is up to date")
        return EXIT_NOTHING_TO_DO
    return EXIT_OK


def _failed(err: Exception, config, stage: str = "") -> int:
    """The exit code for an error that ended the invocation, with its one-line message (bad
    input, a full disk, a tracking store that does not answer) or its traceback (anything
    unexpected)."""
    from pipeline import artifacts, logs
    from pipeline.tracking import outbox
    from pipeline.tracking import runs as tracking

    full = artifacts.no_space(err)
    if full:
        # Every output is written aside and moved into place only when complete, so what the
        # run directory held before is still there and still verifies.
        print(f"error: out of disk space while the {stage or 'pipeline'} stage wrote its "
              f"outputs ({full}); the previous complete outputs in {config.run_dir} are "
              f"untouched: free some space (or set run_dir on a larger disk) and run again",
              file=sys.stderr)  # (not to the log file: the disk is full)
        return EXIT_NO_SPACE
    if _is_user_error(err):
        print(f"error: {err}", file=sys.stderr)  # one line; the traceback: the log file
        logs.to_file(f"error: {err}\n{traceback.format_exc()}")
        return EXIT_BAD_INPUT
    if outbox.is_outage(err):
        # Starting a run needs the store; nothing was lost (a stage already under way finishes
        # through the outbox instead: pipeline/tracking/outbox.py), so a re-run goes on.
        print(f"error: the tracking store {tracking.tracking_uri(config)} does not answer "
              f"({str(err).splitlines()[0][:160]}); start it (`make ui` serves the default "
              f"store) or point tracking.tracking_uri / MLFLOW_TRACKING_URI at one that "
              f"answers, then run again", file=sys.stderr)
        logs.to_file(f"error: {err}\n{traceback.format_exc()}")
        return EXIT_BAD_INPUT
    traceback.print_exc()
    logs.to_file(f"failed: {err!r}\n{traceback.format_exc()}")
    return EXIT_FAILED


def _stage_run(stage: str, config, options) -> dict:
    """Imports the stage's module (within its log: TensorFlow's start-up lines go there) and
    runs it; `options`: stage -> keyword arguments of its `run` (glue's --tasks)."""
    spec = SPECS[stage]
    return getattr(importlib.import_module(spec.module), spec.function)(
        config, **(options or {}).get(stage, {}))


def _keep_log(path: Path, run_id: str) -> None:
    """A stage's log file as an artifact of its MLflow run (its text goes through the outbox,
    so a tracking outage loses nothing; the last 8 MB of a larger one)."""
    from pipeline import logs
    from pipeline.tracking import outbox

    outbox.log_text(logs.tail(path), f"logs/{path.name}", run_id=run_id)


def _is_chief(config) -> bool:
    """False only on a non-chief worker of a multi_worker cluster (pipeline.training.strategy.is_chief)."""
    if config.train.strategy != "multi_worker":
        return True  # without importing TensorFlow (the data stages do not need it)
    from pipeline.training import strategy as strategy_lib

    return strategy_lib.is_chief()


def _call(target: str, *args):
    """Calls "module:function" (e.g. a stage spec's `resumable`)."""
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)(*args)


class AlreadyRunning(RuntimeError):
    pass


class RunLock:
    """An exclusive lock on a run directory: `filelock.FileLock` (flock on POSIX, released by
    the OS if the process dies), non-blocking; the holder's pid and start time are written
    into the lock file for the "already running" message of the next invocation."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / ".pipeline.lock"
        self.lock = None

    def __enter__(self):
        import filelock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        holder = f"pid {os.getpid()} since {datetime.datetime.now():%Y-%m-%d %H:%M:%S}"

        def write_holder(fd: int) -> None:  # filelock's descriptor, right after the flock
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode(), 0)

        # preserve_lock_file: the next invocation reads the holder from the same inode.
        self.lock = filelock.FileLock(str(self.path), timeout=0, preserve_lock_file=True,
                                      on_acquired=write_holder)
        try:
            self.lock.acquire()
        except filelock.Timeout:
            try:
                held_by = self.path.read_text().strip() or "another process"
            except OSError:
                held_by = "another process"
            raise AlreadyRunning(
                f"the pipeline is already running on {self.path.parent} ({held_by}); this "
                f"invocation stops without touching it (exit code {EXIT_ALREADY_RUNNING})") from None
        return self

    def __exit__(self, *exc):
        with open(self.path, "r+") as handle:  # the holder line goes before the lock does
            handle.truncate()
        self.lock.release()
        return False


def _is_user_error(err: Exception) -> bool:
    from pipeline import artifacts
    from pipeline import config as config_lib
    from pipeline.text import sources

    # A PretrainError exists only where its module (TensorFlow, Keras) was imported: do not
    # import it (seconds) just to answer "no".
    pretrainer = sys.modules.get("pipeline.training.pretrainer")
    if isinstance(err, (config_lib.ConfigError, sources.CorpusError, artifacts.MissingArtifact,
                        artifacts.AlteredArtifact,
                        *((pretrainer.PretrainError,) if pretrainer else ()))):
        return True
    # Errors raised inside Beam workers arrive wrapped; our messages say how to fix them.
    return isinstance(err, ValueError) or "vocab file" in str(err) or "not UTF-8" in str(err)


def _summary(config, paths, results) -> None:
    from pipeline.tracking import runs as tracking

    log.info("")
    log.info("done. outputs:")
    for label, path in (("corpus", paths.corpus_dir), ("vocab", paths.vocab_file),
                        ("TFRecords", paths.data_dir), ("model", paths.model_keras),
                        ("SavedModel", paths.saved_model)):
        if Path(path).exists():  # only what this run dir holds (a finetune-only run has no corpus)
            log.info(f"  {label:<12} {path}")
    for stage, result in results.items():
        if isinstance(result, dict) and result.get("output_dir"):
            log.info(f"  {stage:<12} {result['output_dir']}")
    uri = tracking.tracking_uri(config)
    served = uri.startswith(("http://", "https://"))
    log.info(f"  MLflow store {uri}   (browse it: {uri if served else 'make ui'})")
    if isinstance(results.get("sweep"), dict) and "best" in results["sweep"]:
        best = results["sweep"]["best"]
        metric = results["sweep"]["metric"]  # validation_<metric>
        log.info(f"  sweep        best {' '.join(f'{k}={v}' for k, v in best['point'].items())}: "
                 f"{metric} {best['validation'][metric.removeprefix('validation_')]:.4f} "
                 f"(MLflow run {best['mlflow_run_id']})")
    finetuned = results.get("finetune")
    recipe = finetuned.get("recipe") if isinstance(finetuned, dict) else None
    if recipe and recipe.get("line"):  # finetune.recipe = auto: what it tried and chose
        log.info(f"  recipe       {recipe['line'].removeprefix('recipe auto ')}")
    if paths.pretrain_eval.exists():
        ev = json.loads(paths.pretrain_eval.read_text())
        nsp = (f"{ev['eval_nsp_accuracy']:.4f}" if "eval_nsp_accuracy" in ev
               else "n/a (no NSP loss)")
        log.info(f"  held-out MLM accuracy {ev.get('eval_mlm_accuracy', float('nan')):.4f}   "
                 f"NSP accuracy {nsp}   "
                 f"(step {ev.get('step')})")
