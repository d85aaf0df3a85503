"""`bert-pipeline cycle --config configs/nightly.yaml`: the scheduled loop (docs/scheduling.md).

One cycle = pretraining continued on the text that arrived since the last cycle (all of it the
first time) → each task of `cycle.tasks` fine-tuned on the new encoder → evaluated on its fixed
test split against the registered `champion` (cycle_report.html on the cycle's MLflow run) → registered
→ promoted to `champion` only when it beats the holder on the same split, the comparison written
on the new model version (tags and description).

    bert-pipeline cycle --config configs/nightly.yaml [key=value ...]     every step
    ... --step pretrain | finetune [--task NAME] | evaluate | promote     one step (Airflow)
    ... -v                                  everything on the console, not only each step's
                                            start and end (its log: <cycle>/logs/steps/)

Exit codes (pipeline/cli.py EXIT_*): 0 a cycle (or the step) ran; 3 nothing new (no new text
since the last cycle and no cycle under way: nothing trained, no MLflow run); 4 already running
(another invocation holds the run directory's lock); 2 bad input (one line); 5 out of disk.

Each cycle has its folder <run_dir>/cycles/<NNNN>/, the run_dir of its stages, and one MLflow
parent run ("cycle N") under which each step's pipeline run is nested (the stage runs under
those). Each step (pretrain, finetune-<task>, evaluate, promote) runs as the CLI runs a stage
(pipeline/logs.py `stage`): its full log in <cycle>/logs/steps/<step>.log, also on the cycle's
run as logs/<step>.log; the console shows its start and end, warnings and errors. A cycle killed at any point is continued by the next invocation with the same files; its
completed steps are not done again (the pretraining resumes from its checkpoint).

Why beside cli.py: it runs stages through the CLI's own runner (`cli._run`: the lock, caching,
lineage, checksums, resume, MLflow runs, exit codes), which no library may import (pyproject.toml);
cli.py names it by string in TOOLS.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import logging
import os
import sys
import time
from pathlib import Path

from pipeline import artifacts, cli, logs
from pipeline import config as config_lib
from pipeline.config.load import cycle_tasks, find_config
from pipeline.tools import cycle_state

STEPS = ("all", "pretrain", "finetune", "evaluate", "promote")

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The cycle's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(
        prog="bert-pipeline cycle", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1].split("\n\nWhy")[0])
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="overrides of the config (section.key=value)")
    parser.add_argument("--config", default="configs/nightly.yaml",
                        help="the cycle's config (its cycle section: incoming text, tasks)")
    parser.add_argument("--step", choices=STEPS, default="all",
                        help="one step of the cycle under way (schedulers such as Airflow run "
                             "them as separate tasks); all: every step")
    parser.add_argument("--task", default="", help="finetune step: this task only")
    parser.add_argument("--force", action="store_true",
                        help="do the steps of the cycle under way again, even if done")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show everything on the console: each step's lines, Beam's worker "
                             "logging, TensorFlow's start-up messages, every library's INFO "
                             "lines (otherwise only in the step's log, <cycle>/logs/steps/)")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv[1:] if argv and argv[0] == "cycle" else argv)
    if not args.verbose:  # as the CLI: TensorFlow's start-up lines stay off the console
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.task and args.step != "finetune":
        print("error: --task names the task of `--step finetune`; add --step finetune or drop "
              "--task", file=sys.stderr)
        return cli.EXIT_BAD_INPUT
    try:
        config = config_lib.load(args.config, args.overrides)
        tasks = _check(config, args)
    except config_lib.ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return cli.EXIT_BAD_INPUT
    root = artifacts.Artifacts(config.run_dir).root
    (root / "logs").mkdir(parents=True, exist_ok=True)
    log_file = root / "logs" / f"{datetime.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}-cycle.log"
    logs.setup(log_file, verbose=args.verbose)
    step = [args.step]
    try:
        with cli.RunLock(root), logs.stderr_to(log_file):
            return Cycle(config, args, tasks, root).run(step)
    except cli.AlreadyRunning as err:
        print(f"error: {err}", file=sys.stderr)
        return cli.EXIT_ALREADY_RUNNING
    except Exception as err:  # noqa: BLE001 - reported, then mapped to an exit code
        return cli._failed(err, config, f"cycle's {step[0]}")


class _StepLines(logging.Filter):
    """On the console's handlers while a step runs: its warnings and errors, and the heartbeat
    (pipeline/logs.py: `<stage>: running, ...` when nothing was said for a while) go through;
    its other lines go to its log file only."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.threadName.startswith("heartbeat-")


class StepFailed(Exception):
    """A step whose stages' runner returned an exit code other than 0 (its error line already
    said why)."""

    def __init__(self, step: str, code: int):
        super().__init__(f"{step} ended with exit code {code}")
        self.code = code


def _check(config, args) -> list:
    """The cycle section and each task's config, loaded now: a bad one is exit 2 before any
    training."""
    source = str(args.config)
    if not config.cycle.incoming:
        raise config_lib.ConfigError(f"{source}: key cycle.incoming is empty; set it to the glob "
                                     f"where new text arrives (e.g. data/incoming/*.txt)")
    tasks = cycle_tasks(config, source)
    for task in tasks:
        task_config(config, task, None)
    if args.task and args.task not in [t.name for t in tasks]:
        raise config_lib.ConfigError(f"{source}: --task {args.task!r} is not a task of "
                                     f"cycle.tasks; choose one of: "
                                     f"{', '.join(t.name for t in tasks) or '(none)'}")
    return tasks


def task_config(config, task, cycle_dir: Path | None, direct: str = ""):
    """The config of one task's fine-tuning in `cycle_dir`: the cycle's config with the task
    file's finetune section (plus its overrides), the cycle's new encoder, one output folder per
    task, no registration (the promote step registers). `direct`: the published checkpoint the
    cycles started from, fine-tuned as it is (its own vocab and casing) into
    finetune/<task>_direct/: the first champion an adapted model must beat."""
    import yaml

    from pipeline.finetuning.outputs import registered_name

    where = f"{task.config} (cycle task {task.name})"
    try:
        path = find_config(task.config)
    except config_lib.ConfigError:
        raise config_lib.ConfigError(
            f"cycle task {task.name}: config = {task.config!r}: no such file; cycle.tasks names "
            f"finetune config files (e.g. configs/finetune_brown.yaml) or shipped configs' "
            f"names") from None
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise config_lib.ConfigError(f"{path}: not valid YAML: {err}") from err
    section = raw.get("finetune") if isinstance(raw, dict) else None
    if not isinstance(section, dict):
        raise config_lib.ConfigError(f"{path}: no finetune section; cycle.tasks names finetune "
                                     f"config files (e.g. configs/finetune_brown.yaml)")
    for item in task.overrides:
        key, _, value = item.partition("=")
        section[key.split(".", 1)[1]] = yaml.safe_load(value) if value.strip() else ""
    full = config_lib.to_dict(config)
    full["finetune"] = section
    own = config_lib.from_dict(full, where).finetune  # the task's keys, checked
    section.update(name=task.name, register_model=False,
                   registered_model=task.registered_model or registered_name(own))
    if cycle_dir is not None and direct:
        section.update(init_from=direct, vocab_file="", name=direct_name(task.name))
        full["run_dir"] = str(cycle_dir)
    elif cycle_dir is not None:  # the encoder and vocab this cycle's pretraining wrote
        at = artifacts.Artifacts(cycle_dir)
        section.update(init_from=str(at.model_keras), vocab_file=str(at.vocab_file))
        full["run_dir"] = str(cycle_dir)
    return config_lib.from_dict(full, where)


def direct_name(task: str) -> str:
    """The output folder (finetune.name) of a task's direct fine-tune of the checkpoint."""
    return f"{task}_direct"


class Cycle:
    def __init__(self, config, args, tasks, root: Path):
        self.config, self.args, self.tasks, self.root = config, args, tasks, root
        self.cycles = cycle_state.Cycles(root)
        self.record: dict = {}
        self.runner_said = ""  # what the CLI's runner wrote on stderr (its error line)

    # -- the steps ------------------------------------------------------------------------------
    def run(self, step: list) -> int:
        args = self.args
        record = self.cycles.open_cycle()
        if args.step in ("all", "pretrain") and record is None:
            cc = self.config.cycle
            new, settling = self.cycles.scan(cc.incoming, cc.settle_seconds, artifacts.RUN_ROOT)
            if settling:
                log.info(f"cycle: {len(settling)} file(s) changed in the last "
                         f"{cc.settle_seconds:g} s left for the next cycle: {settling[0]} ...")
            size = sum(f["bytes"] for f in new)
            if not new or size < cc.min_new_bytes:
                log.info(f"nothing new: no new text in {cc.incoming} (below "
                         f"{artifacts.RUN_ROOT} if relative) since the last cycle"
                         + (f" ({size:,} bytes < cycle.min_new_bytes)" if new else "")
                         + "; nothing trained")
                return cli.EXIT_NOTHING_TO_DO
            record = self.cycles.open_new(new)
            log.info(f"cycle {record['number']}: opened on {len(new)} new file(s), {size:,} "
                     f"bytes ({sum(f['changed'] for f in new)} changed since trained on), "
                     f"copied to {self.cycles.folder(record) / 'incoming'}")
        elif record is None:
            log.info("nothing to do: no cycle is under way (`--step pretrain` opens one when "
                     "new text arrived)")
            return cli.EXIT_NOTHING_TO_DO
        else:
            log.info(f"cycle {record['number']}: under way since {record['opened']}; "
                     f"continuing (steps done: {', '.join(record['steps']) or 'none'})")
        self.record, self.dir = record, self.cycles.folder(record)
        self._tracking()
        for name in ("pretrain", "finetune", "evaluate", "promote"):
            if args.step not in ("all", name):
                continue
            step[0] = name
            self._require(name)
            for label, work in self._todo(name):
                step[0] = label
                try:
                    with self._step(label):
                        code = work()
                        if code:
                            raise StepFailed(label, code)
                except StepFailed as failed:
                    self._failed(label)
                    sys.stderr.write(_error_of(self.runner_said))  # now on the console
                    return failed.code
                except BaseException:
                    self._failed(label)
                    raise
                self._said(label)
        return cli.EXIT_OK

    def _todo(self, name: str) -> list:
        """(step label, what it runs) for the work of step `name` not done yet: one per task
        for finetune (`finetune-<task>`); what is done already is said and skipped."""
        if name == "finetune":
            todo = []
            for task in self.tasks:
                if self.args.task and task.name != self.args.task:
                    continue
                entry = self.record["tasks"].get(task.name, {})
                if self.direct_start(task) and not (entry.get("direct", {}).get("done")
                                                    and not self.args.force):
                    todo.append((f"finetune-{direct_name(task.name)}",
                                 lambda task=task: self.finetune(task, direct=True)))
                if entry.get("done") and not self.args.force:
                    log.info(f"cycle {self.record['number']}: {task.name} already fine-tuned, "
                             f"not again (--force does it again)")
                    continue
                todo.append((f"finetune-{task.name}", lambda task=task: self.finetune(task)))
            return todo
        if name in ("pretrain", "evaluate") and self._done(name):
            return []
        return [(name, getattr(self, name))]

    @contextlib.contextmanager
    def _step(self, label: str):
        """One step as the CLI runs a stage (pipeline/logs.py `stage`): a line when it starts
        and when it ends on the console, warnings and errors; everything else, with what the
        libraries and TensorFlow print, in <cycle>/logs/steps/<label>.log, also logged on the
        cycle's MLflow run (logs/<label>.log). -v: everything on the console too."""
        keep = lambda path: cli._keep_log(path, self.record["mlflow_run_id"])
        with logs.stage(label, self.dir / "logs" / "steps", keep):
            quiet = None if self.args.verbose else _StepLines()
            consoles = list(logging.getLogger(logs.NAME).handlers) if quiet else []
            for handler in consoles:
                handler.addFilter(quiet)
            try:
                yield
            finally:
                for handler in consoles:
                    handler.removeFilter(quiet)

    def _said(self, label: str) -> None:
        """After a step, on the console: what it decided (the step's log has the rest)."""
        number = self.record["number"]
        if label not in ("evaluate", "promote"):
            return
        for task in self.tasks:
            entry = self.record["tasks"].get(task.name, {})
            said = entry.get("decision" if label == "promote" else "comparison")
            if said:
                log.info(f"cycle {number}: {task.name}: {said}")
        if label == "evaluate":
            log.info(f"cycle {number}: report {self.dir / 'report' / 'cycle_report.html'}")
        else:
            log.info(f"cycle {number}: done ({self.dir}; the report: "
                     f"report/cycle_report.html there and on MLflow run "
                     f"{self.record['mlflow_run_id']})")

    def _failed(self, step: str) -> None:
        """The cycle's run says which step failed (FAILED until a re-run continues it)."""
        from pipeline.tracking import outbox

        run_id = self.record.get("mlflow_run_id")
        try:
            if run_id:
                outbox.set_tags({"cycle.failed_step": step}, run_id)
                outbox.terminate(run_id, "FAILED")
        except Exception as err:  # noqa: BLE001 - the store may be why it failed
            log.warning(f"cycle: could not mark run {run_id} FAILED ({str(err)[:120]})")

    def _require(self, step: str) -> None:
        before = {"finetune": ["pretrain"], "evaluate": ["pretrain", "finetune"],
                  "promote": ["pretrain", "finetune", "evaluate"]}.get(step, [])
        for needed in before:
            tasks = self.record["tasks"]
            missing = ([t.name for t in self.tasks if not tasks.get(t.name, {}).get("done")] +
                       [direct_name(t.name) for t in self.tasks
                        if tasks.get(t.name, {}).get("direct", {}).get("wanted")
                        and not tasks[t.name]["direct"].get("done")]
                       if needed == "finetune" else [needed] * (needed not in self.record["steps"]))
            if missing:
                task = missing[0].removesuffix("_direct")
                what = (f"`--step finetune --task {task}`" if needed == "finetune"
                        else f"`--step {needed}`")
                raise artifacts.MissingArtifact(
                    f"cycle {self.record['number']} has not done {needed} yet "
                    f"({', '.join(missing)}); run bert-pipeline cycle {what} first (or the "
                    f"whole cycle without --step)")

    def _done(self, step: str) -> bool:
        if step in self.record["steps"] and not self.args.force:
            log.info(f"cycle {self.record['number']}: {step} already done, not again "
                     f"(--force does it again)")
            return True
        return False

    def pretrain(self) -> int:
        if self._done("pretrain"):
            return 0
        record, cc = self.record, self.config.cycle
        base = self.cycles.cycles_dir / f"{record['base']:04d}" if record["base"] else None
        extra = []
        if base is not None:
            previous = artifacts.Artifacts(base)
            for path in (previous.model_keras, previous.vocab_file):
                artifacts.require(path, f"cycle {record['base']}'s encoder (this cycle "
                                        f"continues it)", "pretrain")
            extra = [*cc.continued, f"model.init_from={previous.model_keras}",
                     f"vocab.from_file={previous.vocab_file}"]
        if self.config.tracking.register_encoder and not self.config.tracking.encoder_name:
            extra.append(f"tracking.encoder_name=bert-encoder-{self.root.name}")
        config = config_lib.load(self.args.config, [
            *self.args.overrides, *extra, f"run_dir={self.dir}", "corpus.source=files",
            f"corpus.path={self.dir / 'incoming'}/*"])
        code = self._stages(config, "pretrain", list(cli.STAGES), scheduled=True)
        if code not in (cli.EXIT_OK, cli.EXIT_NOTHING_TO_DO):  # 3: every stage already done
            return code
        record["steps"]["pretrain"] = {"done": _now(), "mlflow_run_id": self.last_run}
        self.cycles.save(record)
        return 0

    def direct_start(self, task) -> str:
        """The published checkpoint to fine-tune `task` on directly ("" if none): in the first
        cycle of cycles started from one (`model.init_from` in the cycle's config), for a task
        whose registered model has no champion yet (the direct fine-tune becomes it)."""
        start = self.config.model.init_from
        if not start or self.record["base"] is not None:
            return ""
        entry = self.record["tasks"].get(task.name, {})
        if "direct" in entry:  # decided when the cycle first got here
            return start if entry["direct"].get("wanted") else ""
        from pipeline.tools import cycle_report

        name = task_config(self.config, task, None).finetune.registered_model
        wanted = cycle_report.champion(name, "accuracy") is None
        if not wanted:
            log.info(f"cycle {self.record['number']}: {task.name}: {name} has a champion "
                     f"already; {start} is not fine-tuned directly")
        self.record["tasks"].setdefault(task.name, {})["direct"] = {"wanted": wanted,
                                                                   "checkpoint": start}
        self.cycles.save(self.record)
        return start if wanted else ""

    def finetune(self, task, direct: bool = False) -> int:
        """One task of the finetune step (`_todo` skips those done); `direct`: the published
        checkpoint fine-tuned as it is, beside the adapted model."""
        entry = self.record["tasks"].setdefault(task.name, {})
        config = task_config(self.config, task, self.dir,
                             direct=self.config.model.init_from if direct else "")
        label = f"finetune-{direct_name(task.name) if direct else task.name}"
        code = self._stages(config, label, ["finetune"])
        if code:
            return code
        if direct:
            entry["direct"].update(finetune_run_id=self.last_run, done=_now(),
                                   output=config.finetune.name)
        else:
            entry.update(finetune_run_id=self.last_run, done=_now(),
                         registered_model=config.finetune.registered_model)
        self.cycles.save(self.record)
        return 0

    def evaluate(self) -> int:
        """Each task's test metric against the champion's on the same split; the report."""
        from pipeline.tools import cycle_report

        if self._done("evaluate"):
            return 0
        for i, task in enumerate(self.tasks):
            entry = self.record["tasks"][task.name]
            result = cycle_report.task_result(
                artifacts.Artifacts(self.dir).finetune(task.name).dir, task.metric,
                f"cycle.tasks[{i}] ({task.name})")
            holder = cycle_report.champion(entry["registered_model"], result["metric"])
            entry.update(metric=result["metric"], value=result["value"],
                         split_id=result["split_id"], champion=holder,
                         comparison=cycle_report.compare(result, holder))
            direct = entry.get("direct", {})
            if direct.get("done"):  # the first champion-to-be: the checkpoint, not adapted
                mine = cycle_report.task_result(
                    artifacts.Artifacts(self.dir).finetune(direct["output"]).dir,
                    result["metric"], f"cycle.tasks[{i}] ({task.name}, direct)")
                direct.update(value=mine["value"], split_id=mine["split_id"])
                if holder is None:
                    entry["comparison"] = cycle_report.compare_direct(result, mine)
            log.info(f"cycle {self.record['number']}: {task.name}: {entry['comparison']}")
        self._report(final=False)
        self.record["steps"]["evaluate"] = {"done": _now()}
        self.cycles.save(self.record)
        return 0

    def promote(self) -> int:
        """Registers each task's model (on the cycle's run) and moves `champion` only to a
        better one; the comparison on the new version; the report again; the cycle closed."""
        from pipeline.tools import cycle_report
        from pipeline.tracking import outbox
        from pipeline.tracking import runs as tracking

        record, run_id = self.record, self.record["mlflow_run_id"]
        for task in self.tasks:
            entry = record["tasks"][task.name]
            # The champion now (another run may have been promoted since the evaluate step);
            # already this version's (a re-run of a promote step killed after it): as it was.
            holder = cycle_report.champion(entry["registered_model"], entry["metric"])
            if not (holder and holder["version"] == str(entry.get("version"))):
                entry.update(champion=holder, comparison=_compare(entry, holder))
            out = artifacts.Artifacts(self.dir).finetune(task.name)
            if not out.saved_model.is_dir():
                entry["decision"] = "not registered: the task has no raw-text model to serve"
                continue
            name = entry["registered_model"]
            if entry.get("direct", {}).get("done") and not holder:
                holder = self._register_direct(task, entry)
                entry.update(champion=holder, comparison=_compare(entry, holder))
            version = self._register(entry, out, name)
            if holder and holder["version"] == str(version):
                promoted = True
            else:
                promoted = tracking.promote_if_better(
                    name, version, f"test_{entry['metric']}", entry["value"], entry["split_id"],
                    cycle_report.higher_is_better(entry["metric"]))
            reason = tracking.version_tag(name, version, "promotion")
            entry.update(promoted=promoted, decision=(
                f"v{version} promoted to champion ({reason})" if promoted
                else f"v{version} not promoted ({reason})"))
            link = tracking.run_link(run_id)
            tracking.describe_version(name, version, description=(
                f"Cycle {record['number']} ({record['opened'][:10]}), task {task.name}: "
                f"{'promoted to champion' if promoted else 'not promoted'}: {reason}. Review "
                f"page: cycle_report.html on run {run_id} ({link})."), tags={
                "cycle.number": record["number"], "cycle.run_id": run_id,
                "cycle.finetune_run_id": entry["finetune_run_id"], "cycle.arm": "adapted",
                "cycle.comparison": entry["comparison"]})
            outbox.set_tags({f"cycle.{task.name}.decision": entry["decision"]}, run_id)
        self._report(final=True)
        record["steps"]["promote"] = {"done": _now()}
        outbox.terminate(run_id, "FINISHED")
        self.cycles.close(record, self.config.cycle.keep_cycles)
        return 0

    def _register_direct(self, task, entry: dict) -> dict:
        """Registers the direct fine-tune of the checkpoint (once) and makes it the champion:
        the score every adapted model of these cycles must beat on the same test split."""
        from pipeline.tools import cycle_report
        from pipeline.tracking import runs as tracking

        direct, name = entry["direct"], entry["registered_model"]
        version = self._register(direct, artifacts.Artifacts(self.dir).finetune(direct["output"]),
                                 name)
        tracking.promote_if_better(name, version, f"test_{entry['metric']}", direct["value"],
                                   direct["split_id"],
                                   cycle_report.higher_is_better(entry["metric"]))
        reason = (f"the published checkpoint {direct['checkpoint']} fine-tuned directly: the "
                  f"first champion; an adapted model is promoted only if it beats it")
        tracking.describe_version(name, version, description=(
            f"Cycle {self.record['number']}, task {task.name}: {reason}."), tags={
            "promotion": reason, "cycle.arm": "direct", "cycle.number": self.record["number"],
            "cycle.run_id": self.record["mlflow_run_id"],
            "cycle.finetune_run_id": direct["finetune_run_id"]})
        return cycle_report.champion(name, entry["metric"])

    def _register(self, entry: dict, out, name: str) -> str:
        """The version of `out`'s model under `name`, registered on the cycle's run the first
        time (kept in `entry`, so a re-run after a kill registers it once)."""
        from pipeline.serving import mlflow_model
        from pipeline.tracking import runs as tracking

        if not entry.get("version"):
            with tracking.active(self.record["mlflow_run_id"]):  # the version's source run
                uri, version = mlflow_model.log_to_mlflow(
                    out.dir, json.loads(out.task_json.read_text()), name)
            entry.update(version=version, model_uri=uri)
            self.cycles.save(self.record)
        return entry["version"]

    # -- MLflow ---------------------------------------------------------------------------------
    def _tracking(self) -> None:
        """The store, and the cycle's parent run (created when the cycle opens, RUNNING until its
        promote step ends)."""
        from pipeline.tracking import runs as tracking

        self.experiment = tracking.use_store(self.config)
        record = self.record
        if record["mlflow_run_id"]:
            tracking.mark_running(record["mlflow_run_id"])
            return
        files = record["files"]
        base = f"cycle {record['base']}" if record["base"] else "scratch"
        tasks = ", ".join(t.name for t in self.tasks) or "no task"
        record["mlflow_run_id"] = tracking.create_run(
            self.experiment, f"cycle {record['number']}", tags={
                "cycle.number": str(record["number"]), "cycle.run_dir": str(self.dir),
                "cycle.base": str(record["base"] or ""), "cycle.new_files": str(len(files)),
                "cycle.new_bytes": str(sum(f["bytes"] for f in files)),
                "mlflow.source.git.commit": tracking.git_commit(),
                "mlflow.note.content": (
                    f"Cycle {record['number']}: pretraining continued on {len(files)} new "
                    f"file(s) (from {base}), then {tasks} fine-tuned, evaluated against the "
                    f"champion, registered, promoted if better. The review page: "
                    f"cycle_report.html.")},
            params={"cycle.incoming": self.config.cycle.incoming,
                    "cycle.tasks": " ".join(t.name for t in self.tasks),
                    "cycle.config_file": str(self.args.config)})
        self.cycles.save(record)

    def _stages(self, config, label: str, stages: list, scheduled: bool = False) -> int:
        """Runs `stages` with the CLI's runner, its config written to configs/<label>.yaml; its
        pipeline run is then nested under the cycle's run (`self.last_run`)."""
        from pipeline.tracking import runs as tracking

        path = self.dir / "configs" / f"{label}.yaml"
        artifacts.write_text_atomic(path, config_lib.dump_yaml(config))
        since = int(time.time() * 1000) - 1000
        # What it prints on stderr (its error line, for bad input) to the step's log and, if the
        # step fails, to the console (`run`); with -v, straight to the console.
        said = io.StringIO()
        with contextlib.nullcontext() if self.args.verbose else contextlib.redirect_stderr(said):
            code = cli._run(config, str(path), stages, self.args.force,
                            artifacts.Artifacts(config.run_dir), scheduled=scheduled)
        self.runner_said = said.getvalue()
        if self.runner_said.strip():
            logs.to_file(self.runner_said.rstrip("\n"))  # the step's log
        self.last_run = tracking.adopt_runs(self.experiment, self.dir, since,
                                            self.record["mlflow_run_id"])
        return code

    def _report(self, final: bool) -> None:
        from pipeline.tools import cycle_report

        page = cycle_report.write(self.dir, self.record, [t.name for t in self.tasks])
        log.info(f"cycle {self.record['number']}: report {page}{' (final)' if final else ''}")


def _compare(entry: dict, holder) -> str:
    """The comparison of a task's result (its entry) with the champion `holder`."""
    from pipeline.tools import cycle_report

    return cycle_report.compare({k: entry[k] for k in ("metric", "value", "split_id")}, holder)


def _error_of(said: str) -> str:
    """The runner's error out of what it wrote on stderr: from its `error: ` line or traceback
    on (the rest went to the step's log)."""
    lines = said.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines)
              if line.startswith(("error: ", "Traceback (most recent call last)"))]
    return "".join(lines[starts[0]:]) if starts else ""


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")
